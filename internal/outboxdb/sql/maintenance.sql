{{/*
Retention and measurement, run by one replica at a time under the
maintenance lock.
*/}}

{{define "try_maintenance_lock"}}SELECT pg_try_advisory_xact_lock($1){{end}}

{{/*
The conditions stand in the outer WHERE too: PostgreSQL checks that one
again on a row changed meanwhile (a dead letter replayed while the delete
waited for its lock), the subquery's it does not.
*/}}
{{define "old_sent"}}status = 'sent' AND sent_at < now() - $1 * interval '1 microsecond'{{end}}

{{define "delete_sent"}}
DELETE FROM {{.Outbox}}
WHERE id = ANY(ARRAY(
    SELECT id FROM {{.Outbox}} WHERE {{template "old_sent"}}
    ORDER BY sent_at LIMIT $2)) AND {{template "old_sent"}}
{{end}}

{{/* A row that parks its key is kept: deleting it would release the key. */}}
{{define "expired_dead"}}status IN ('dead_lettered', 'discarded')
      AND dead_lettered_at < now() - $1 * interval '1 microsecond' AND NOT key_parked{{end}}

{{define "delete_expired_dead"}}
DELETE FROM {{.Outbox}}
WHERE id = ANY(ARRAY(
    SELECT id FROM {{.Outbox}} WHERE {{template "expired_dead"}}
    ORDER BY dead_lettered_at LIMIT $2)) AND {{template "expired_dead"}}
{{end}}

{{define "backlog"}}
SELECT topic, count(*), (extract(epoch FROM now() - min(created_at)) * 1e6)::bigint
FROM {{.Outbox}}
WHERE status = 'pending'
GROUP BY topic
{{end}}
