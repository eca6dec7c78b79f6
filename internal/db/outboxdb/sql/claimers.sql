{{/*
The relay's processes share the outbox's 16 partitions: each registers in
{{.Claimers}}, renewing its registration once less than a share of its
lease is left, and holds a contiguous range of {{.Partitions}} for as
long as its registration lasts. A partition's row is written when its
owner changes and, with the owner's floor, every few seconds: rarely,
because a snapshot held elsewhere keeps every row version written, and
every sync reads them. Durations are in microseconds.
*/}}

{{define "claimer_join"}}
INSERT INTO {{.Claimers}} AS c (claimer, expires_at) VALUES ($1, now() + $2 * interval '1 microsecond')
ON CONFLICT (claimer) DO UPDATE SET expires_at = excluded.expires_at
WHERE c.expires_at < now() + $3 * interval '1 microsecond'
{{end}}

{{define "claimers_expire"}}
DELETE FROM {{.Claimers}} WHERE expires_at < now()
{{end}}

{{define "claimers"}}
-- The live claimers, and how long the registration of $1 lasts.
SELECT claimer, CASE WHEN claimer = $1 THEN (extract(epoch FROM expires_at - now()) * 1e6)::bigint ELSE 0 END
FROM {{.Claimers}} ORDER BY claimer
{{end}}

{{define "partitions_lock"}}
-- Every sync locks all the partitions, in order: one process decides at a
-- time. It reads the claimers and the partitions only once it holds the
-- lock, in statements of their own: a statement sees what was committed
-- when it began, and one that waited for the lock would miss what the
-- process that held it committed: the claimer it registered would seem
-- gone, and the partitions it took free, and both would claim them.
SELECT FROM {{.Partitions}} ORDER BY part FOR UPDATE
{{end}}

{{define "partitions"}}
-- A partition is free when it has no owner or its owner's registration
-- ended (claimers_expire, just before, forgot it).
SELECT p.part, coalesce(p.owner, ''),
    p.owner IS NULL OR NOT EXISTS (SELECT FROM {{.Claimers}} c WHERE c.claimer = p.owner AND c.expires_at >= now()),
    p.floor, now()
FROM {{.Partitions}} AS p ORDER BY p.part
{{end}}

{{define "partitions_write"}}
-- An owner records its partitions (and its floor in them); a partition
-- given up has no owner, and keeps the floor where its next owner starts.
-- expires_at is for relays that read a partition's lease from it rather
-- than from its owner's registration: it outlasts the next record.
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
