{{/*
Retention and measurement, run by one replica at a time under the
maintenance lock.
*/}}

{{define "try_maintenance_lock"}}SELECT pg_try_advisory_xact_lock($1){{end}}

{{/*
A bounded delete under retention: up to $2 rows matching .Cond, oldest by
.Order first. The condition stands in the outer WHERE too: PostgreSQL
checks that one again on a row changed meanwhile (a dead letter replayed
while the delete waited for its lock), the subquery's it does not.
*/}}
{{define "bounded_delete"}}
DELETE FROM {{.Outbox}}
WHERE id = ANY(ARRAY(
    SELECT id FROM {{.Outbox}} WHERE {{.Cond}}
    ORDER BY {{.Order}} LIMIT $2)) AND {{.Cond}}
{{end}}

{{define "delete_sent"}}
{{- template "bounded_delete" (dict "Outbox" .Outbox "Order" "sent_at"
    "Cond" "status = 'sent' AND sent_at < now() - $1 * interval '1 microsecond'")}}
{{end}}

{{/*
Unhandled dead letters, by when they were dead-lettered. A row that parks
its key is kept: deleting it would release the key.
*/}}
{{define "delete_expired_dead"}}
{{- template "bounded_delete" (dict "Outbox" .Outbox "Order" "dead_lettered_at"
    "Cond" "status = 'dead_lettered' AND dead_lettered_at < now() - $1 * interval '1 microsecond' AND NOT key_parked")}}
{{end}}

{{/*
Discarded rows, by when they were discarded (rows discarded before that was
recorded, by when they were dead-lettered). The dead-letter index orders
them.
*/}}
{{define "delete_discarded"}}
{{- template "bounded_delete" (dict "Outbox" .Outbox "Order" "dead_lettered_at"
    "Cond" "status = 'discarded' AND coalesce(discarded_at, dead_lettered_at) < now() - $1 * interval '1 microsecond'")}}
{{end}}

{{define "delete_audit"}}
DELETE FROM {{.Audit}}
WHERE id = ANY(ARRAY(
    SELECT id FROM {{.Audit}} WHERE at < now() - $1 * interval '1 microsecond'
    ORDER BY at, id LIMIT $2))
{{end}}

{{/*
The pending rows by topic. They are read from the lowest floor that the
processes claiming the outbox recorded in its partitions: below it, only
rows that waited can be pending, and those are read on their own index.
The entries of rows delivered before the floor, which a snapshot held
elsewhere keeps, are not read. Without processes that lease partitions,
the floor is 0: every pending entry is read.
*/}}
{{define "backlog"}}
SELECT topic, count(*), (extract(epoch FROM now() - min(created_at)) * 1e6)::bigint
FROM (
    SELECT o.topic, o.created_at FROM {{.Outbox}} AS o
    WHERE o.status = 'pending' AND o.id > (SELECT coalesce(min(floor), 0) FROM {{.Partitions}})
    UNION ALL
    SELECT o.topic, o.created_at FROM {{.Outbox}} AS o
    WHERE o.status = 'pending' AND o.next_attempt_at <> o.created_at
      AND o.id <= (SELECT coalesce(min(floor), 0) FROM {{.Partitions}})
) AS p
GROUP BY topic
{{end}}
