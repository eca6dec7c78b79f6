{{/*
Dead letters: looked up, listed and counted, and every operator action on
them. Statements marked "dynamic" are rendered per call with .Where (the
conditions of a filter, numbered from $1) and .Limit (the next parameter).
*/}}

{{define "letter_columns"}}id, event_id, topic, key, coalesce(destination, ''), status,
    coalesce(dead_letter_reason, ''), key_parked, parked_behind, retry_count, coalesce(last_error, ''),
    created_at, next_attempt_at, last_attempt_at, dead_lettered_at, octet_length(payload), headers{{end}}

{{/* A row by id ($1) or event id ($2); the other is 0 or NULL and matches nothing. */}}
{{define "ref_match"}}(id = $1 OR event_id = $2){{end}}

{{define "get_row"}}
SELECT {{template "letter_columns"}}, payload, error_history
FROM {{.Outbox}} WHERE {{template "ref_match"}}
{{end}}

{{define "list_dead_letters"}}
-- dynamic
SELECT {{template "letter_columns"}} FROM {{.Outbox}}
WHERE {{.Where}}
ORDER BY dead_lettered_at DESC, id DESC
LIMIT {{.Limit}}
{{end}}

{{define "parked_keys"}}
SELECT {{template "letter_columns"}},
    (SELECT count(*) FROM {{.Outbox}} AS w WHERE w.key = o.key AND w.status = 'pending' AND w.id > o.id)
FROM {{.Outbox}} AS o
WHERE key_parked
ORDER BY dead_lettered_at, id
LIMIT $1
{{end}}

{{define "dead_letter_counts"}}
SELECT status, topic, coalesce(destination, ''), coalesce(dead_letter_reason, ''),
    count(*), min(dead_lettered_at), max(dead_lettered_at),
    (extract(epoch FROM now() - min(dead_lettered_at)) * 1e6)::bigint
FROM {{.Outbox}}
WHERE status IN ('dead_lettered', 'discarded')
GROUP BY 1, 2, 3, 4
{{end}}

{{/*
Failure groups: dead letters of one destination and reason whose errors
have the same fingerprint, named by error_group (migration 14). The groups
are counted on their index alone; destination, reason, fingerprint and an
example come from each group's latest row (the highest id). A relay that
predates migration 14 leaves error_group empty: group_rows fills it in
before groups are read or selected.
*/}}

{{define "group_rows"}}
-- At most 10000 a call: the rest at the next.
UPDATE {{.Outbox}} SET error_group = {{.Group}}(destination, dead_letter_reason, last_error)
WHERE id IN (SELECT id FROM {{.Outbox}}
             WHERE status IN ('dead_lettered', 'discarded') AND error_group IS NULL LIMIT 10000)
{{end}}

{{define "failure_groups"}}
-- dynamic; .Where applies to the dead letters
WITH g AS (
    SELECT error_group AS id, count(*) AS n, min(dead_lettered_at) AS first, max(dead_lettered_at) AS last,
           max(id) AS latest
    FROM {{.Outbox}}
    WHERE status = 'dead_lettered' AND error_group IS NOT NULL AND {{.Where}}
    GROUP BY 1),
top AS (
    SELECT *, count(*) OVER () AS total FROM g
    ORDER BY n DESC, last DESC, id
    LIMIT {{.Limit}})
SELECT top.id, coalesce(o.destination, ''), coalesce(o.dead_letter_reason, ''),
       coalesce({{.Fingerprint}}(o.last_error), ''), top.n, top.first, top.last, top.total,
       coalesce(o.last_error, '')
FROM top JOIN {{.Outbox}} AS o ON o.id = top.latest
ORDER BY top.n DESC, top.last DESC, top.id
{{end}}

{{define "parked_key_count"}}SELECT count(DISTINCT key) FROM {{.Outbox}} WHERE key_parked{{end}}

{{/*
Operators' statements never lock a pending row that never waited: claims
pass over a locked row and, if they come back short, take it for read, and
the relay's floor rises past it, where only rows on the waiting rows'
indexes are found again. Such a row is no dead letter either, so it is
only looked at; a row that waited, or any other, is locked.
*/}}

{{define "unwaited"}}status = 'pending' AND next_attempt_at = created_at{{end}}

{{define "lock_refs"}}
SELECT * FROM (
    SELECT id, event_id, status, key, key_parked, coalesce(dead_lettered_at, now())
    FROM {{.Outbox}} WHERE (id = ANY($1) OR event_id = ANY($2)) AND NOT ({{template "unwaited"}})
    ORDER BY id FOR UPDATE) AS locked
UNION ALL
SELECT id, event_id, status, key, key_parked, now()
FROM {{.Outbox}} WHERE (id = ANY($1) OR event_id = ANY($2)) AND {{template "unwaited"}}
ORDER BY 1
{{end}}

{{define "lock_dead_letters"}}
-- dynamic; .Lock is FOR UPDATE, or empty to only look
SELECT id, key, key_parked, dead_lettered_at FROM {{.Outbox}}
WHERE {{.Where}}
ORDER BY dead_lettered_at, id LIMIT {{.Limit}}{{.Lock}}
{{end}}

{{/*
The columns a row gets back when it becomes pending again, as if new apart
from its error history: after a replay, and after an edit.
*/}}
{{define "reset_to_pending"}}status = 'pending', retry_count = 0,
    next_attempt_at = coalesce($2, now()), dead_letter_reason = NULL, dead_lettered_at = NULL, error_group = NULL,
    key_parked = false, parked_behind = NULL, lease_token = NULL, last_attempt_at = NULL{{end}}

{{define "replay"}}
UPDATE {{.Outbox}} SET {{template "reset_to_pending"}}
WHERE id = ANY($1) AND status = 'dead_lettered'
{{end}}

{{define "reroute"}}
-- $3 is the new topic; it returns the topics the rows had, once each.
WITH old AS (
    SELECT id, topic FROM {{.Outbox}} WHERE id = ANY($1) AND status = 'dead_lettered'
), moved AS (
    UPDATE {{.Outbox}} AS o SET topic = $3, {{template "reset_to_pending"}}
    FROM old WHERE o.id = old.id
    RETURNING old.topic
)
SELECT DISTINCT topic FROM moved ORDER BY topic
{{end}}

{{define "discard"}}
UPDATE {{.Outbox}} SET status = 'discarded', key_parked = false, discarded_at = now()
WHERE id = ANY($1) AND status = 'dead_lettered'
{{end}}

{{define "lock_for_edit"}}
SELECT * FROM (
    SELECT id, status, topic, headers, payload, key, key_parked FROM {{.Outbox}}
    WHERE {{template "ref_match"}} AND NOT ({{template "unwaited"}})
    ORDER BY id FOR UPDATE) AS locked
UNION ALL
SELECT id, status, topic, headers, payload, key, key_parked FROM {{.Outbox}}
WHERE {{template "ref_match"}} AND {{template "unwaited"}}
{{end}}

{{define "edit"}}
UPDATE {{.Outbox}} SET
    topic = coalesce($3, topic), headers = coalesce($4::jsonb, headers), payload = coalesce($5, payload),
    {{template "reset_to_pending"}}
WHERE id = $1
{{end}}

{{define "release_key"}}
-- $2 is dead_lettered, to keep the row, or discarded.
UPDATE {{.Outbox}} SET key_parked = false, status = $2,
    discarded_at = CASE WHEN $2::text = 'discarded' THEN now() END
WHERE key = $1 AND key_parked RETURNING id
{{end}}

{{define "lock_behind_keys"}}
-- Waits for claims that hold the keys' rows: one that saw a key parked may
-- be deferring them behind it right now, and the unpark that follows must
-- see that. It locks the keys' rows that never waited too: the unpark
-- puts them on the waiting rows' index, where claims find them whatever
-- passed them over meanwhile.
SELECT 1 FROM {{.Outbox}} WHERE key = ANY($1) AND status = 'pending' ORDER BY id FOR UPDATE
{{end}}

{{define "unpark"}}
-- Rows deferred behind the keys' parked rows are ready at once, and so are
-- those that never waited, now on the waiting rows' index.
UPDATE {{.Outbox}} SET next_attempt_at = now(), parked_behind = NULL
WHERE key = ANY($1) AND status = 'pending' AND lease_token IS NULL
  AND (parked_behind IS NOT NULL OR next_attempt_at = created_at)
{{end}}

{{define "insert_audit"}}
INSERT INTO {{.Audit}} (actor, source, action, reason, row_ids, details, credential, role)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
{{end}}

{{define "audited_rows"}}
-- Which of these rows an operator acted on before.
SELECT DISTINCT r FROM {{.Audit}} AS a, unnest(a.row_ids) AS r
WHERE a.row_ids && $1::bigint[] AND r = ANY($1)
{{end}}

{{define "list_audit"}}
-- dynamic
SELECT id, at, actor, source, coalesce(credential, ''), action, coalesce(reason, ''), row_ids, details, coalesce(role, '')
FROM {{.Audit}} WHERE {{.Where}} ORDER BY id DESC LIMIT {{.Limit}}
{{end}}
