{{/*
The relay's processes share the outbox's 16 partitions: each registers in
{{.Claimers}} and leases a contiguous range of {{.Partitions}}, renewed at
every sync. Durations are in microseconds.
*/}}

{{define "claimer_join"}}
INSERT INTO {{.Claimers}} (claimer, expires_at) VALUES ($1, now() + $2 * interval '1 microsecond')
ON CONFLICT (claimer) DO UPDATE SET expires_at = excluded.expires_at
{{end}}

{{define "claimers_expire"}}
DELETE FROM {{.Claimers}} WHERE expires_at < now()
{{end}}

{{define "claimers"}}
SELECT claimer FROM {{.Claimers}} ORDER BY claimer
{{end}}

{{define "partitions_lock"}}
-- Every sync locks all the partitions, in order: one process decides at a
-- time.
SELECT part, coalesce(owner, ''), coalesce(expires_at < now(), true), floor, now()
FROM {{.Partitions}} ORDER BY part FOR UPDATE
{{end}}

{{define "partitions_write"}}
-- An owner renews its partitions (and records its floor in them); a
-- partition given up has no owner, and keeps the floor where its next
-- owner starts.
UPDATE {{.Partitions}} AS p SET
    owner = nullif(u.owner, ''),
    expires_at = CASE WHEN u.owner = '' THEN NULL ELSE now() + $4 * interval '1 microsecond' END,
    floor = u.floor
FROM unnest($1::int[], $2::text[], $3::bigint[]) AS u(part, owner, floor)
WHERE p.part = u.part
{{end}}

{{define "claimer_leave"}}
-- A process that stops gives its partitions up at once, with its floor.
WITH gone AS (DELETE FROM {{.Claimers}} WHERE claimer = $1)
UPDATE {{.Partitions}} SET owner = NULL, expires_at = NULL, floor = $2
WHERE owner = $1
{{end}}
