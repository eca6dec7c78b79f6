{{/*
Finding a message: a row by id or event id, wherever it is (pending,
leased, kept as sent, dead-lettered, discarded), with what holds it; and
a key's rows.
*/}}

{{define "found_columns"}}{{template "letter_columns"}}, error_history, sent_at, discarded_at, lease_token IS NOT NULL, now(){{end}}

{{/*
A row by id ($1) or event id ($2), and for a pending row with a key the
first earlier row of its key that holds it back: pending, or parked.
*/}}
{{define "find_row"}}
SELECT {{template "found_columns"}}, ahead.ahead_id, ahead.ahead_topic, ahead.ahead_status, ahead.ahead_parked
FROM {{.Outbox}} AS o
LEFT JOIN LATERAL (
    SELECT a.id AS ahead_id, a.topic AS ahead_topic, a.status AS ahead_status, a.key_parked AS ahead_parked
    FROM (
        (SELECT id, topic, status, key_parked FROM {{.Outbox}}
         WHERE key = o.key AND id < o.id AND status = 'pending' ORDER BY id LIMIT 1)
        UNION ALL
        (SELECT id, topic, status, key_parked FROM {{.Outbox}}
         WHERE key = o.key AND id < o.id AND key_parked ORDER BY id LIMIT 1)
    ) AS a
    WHERE o.status = 'pending'
    ORDER BY a.id LIMIT 1
) AS ahead ON true
WHERE {{template "ref_match"}}
{{end}}

{{/*
A key's ($1) pending, dead-lettered and discarded rows in id order, up to
$2, each from its index. Rows kept as sent are not among them: no index
leads with their key.
*/}}
{{define "key_rows"}}
SELECT {{template "found_columns"}} FROM (
    (SELECT * FROM {{.Outbox}} WHERE key = $1 AND status = 'pending' ORDER BY id LIMIT $2)
    UNION ALL
    (SELECT * FROM {{.Outbox}} WHERE key = $1 AND status IN ('dead_lettered', 'discarded') ORDER BY id LIMIT $2)
) AS k
ORDER BY id LIMIT $2
{{end}}
