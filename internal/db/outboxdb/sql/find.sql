{{/*
Finding a message: a row by id or event id, wherever it is (pending,
leased, kept as sent, dead-lettered, discarded), with what holds it; and
a key's rows.
*/}}

{{define "found_columns"}}{{template "letter_columns"}}, error_history, sent_at, discarded_at, lease_token IS NOT NULL, now(){{end}}

{{/* A row by id ($1) or event id ($2). */}}
{{define "find_row"}}
SELECT {{template "found_columns"}} FROM {{.Outbox}} WHERE {{template "ref_match"}}
{{end}}

{{/*
The rows of a key ($1) below an id ($2) that can hold a later row back,
pending or parked, in id order: up to $3 of each, from their indexes.
*/}}
{{define "key_holders"}}
SELECT id, topic, status, key_parked FROM (
    (SELECT id, topic, status, key_parked FROM {{.Outbox}}
     WHERE key = $1 AND id < $2 AND status = 'pending' ORDER BY id LIMIT $3)
    UNION ALL
    (SELECT id, topic, status, key_parked FROM {{.Outbox}}
     WHERE key = $1 AND id < $2 AND key_parked ORDER BY id LIMIT $3)
) AS h
ORDER BY id
{{end}}

{{/*
A key's ($1) rows: its first $2 pending rows and its latest $2
dead-lettered and discarded ones, each from its index, in id order. Rows
kept as sent are not among them: no index leads with their key.
*/}}
{{define "key_rows"}}
SELECT {{template "found_columns"}} FROM (
    (SELECT * FROM {{.Outbox}} WHERE key = $1 AND status = 'pending' ORDER BY id LIMIT $2)
    UNION ALL
    (SELECT * FROM {{.Outbox}} WHERE key = $1 AND status IN ('dead_lettered', 'discarded') ORDER BY id DESC LIMIT $2)
) AS k
ORDER BY id
{{end}}
