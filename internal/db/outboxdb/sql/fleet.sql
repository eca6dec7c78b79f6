{{/*
The fleet's coordination tables, through which replicas share flow
control: the live replicas ({{.Replicas}}), each destination's breaker
({{.Breakers}}) and each replica's share of its in-flight slots
({{.Shares}}). Package fleet runs these in batches of its own, every sync.
Durations are in microseconds.
*/}}

{{/*
claims = 1: this replica leases the outbox's partitions for its claims;
older relays leave it empty. The entry is renewed only once less than $3
of it is left: each renewal leaves a row version that a snapshot held
elsewhere keeps, and every sync reads them.
*/}}
{{define "fleet_heartbeat"}}
INSERT INTO {{.Replicas}} AS r (replica, expires_at, claims)
VALUES ($1, now() + $2 * interval '1 microsecond', 1)
ON CONFLICT (replica) DO UPDATE SET expires_at = excluded.expires_at, claims = excluded.claims
WHERE r.expires_at < now() + $3 * interval '1 microsecond' OR r.claims IS DISTINCT FROM excluded.claims
{{end}}

{{define "fleet_forget"}}
DELETE FROM {{.Replicas}} WHERE expires_at < now()
{{end}}

{{define "fleet_members"}}
SELECT count(*), count(*) FILTER (WHERE replica < $1), count(*) FILTER (WHERE claims IS NULL),
       now(), coalesce((extract(epoch FROM max(expires_at) FILTER (WHERE replica = $1) - now()) * 1e6)::bigint, 0)
FROM {{.Replicas}}
{{end}}

{{define "fleet_ensure"}}
INSERT INTO {{.Breakers}} (destination)
SELECT unnest($1::text[]) ON CONFLICT DO NOTHING
{{end}}

{{/*
Every sync locks its destinations' rows, in one order: the rows serialize
the breaker rules and the shares of their destination.
*/}}
{{define "fleet_breakers"}}
SELECT destination, state = 'open', coalesce(open_until, now()), streak, generation,
       coalesce(probe_by, ''), coalesce(probe_until, now()), coalesce(last_error, '')
FROM {{.Breakers}}
WHERE destination = ANY($1) ORDER BY destination FOR UPDATE
{{end}}

{{define "fleet_update"}}
UPDATE {{.Breakers}} SET
    state = CASE WHEN $2 THEN 'open' ELSE 'closed' END,
    open_until = CASE WHEN $2 THEN $3::timestamptz END,
    streak = $4, generation = $5, probe_by = nullif($6, ''),
    probe_until = CASE WHEN $6 <> '' THEN $7::timestamptz END,
    last_error = nullif($8, ''), changed_by = $9, changed_at = now()
WHERE destination = $1
{{end}}

{{define "fleet_shares"}}
SELECT destination, coalesce(sum(slots), 0), coalesce(sum(slots) FILTER (WHERE NOT wants), 0),
       count(*) FILTER (WHERE wants), count(*) FILTER (WHERE wants AND replica < $2)
FROM {{.Shares}}
WHERE destination = ANY($1) AND replica <> $2 GROUP BY destination
{{end}}

{{define "fleet_leave"}}
DELETE FROM {{.Replicas}} WHERE replica = $1
{{end}}

{{define "fleet_release"}}
UPDATE {{.Breakers}} SET probe_by = NULL, probe_until = NULL WHERE probe_by = $1
{{end}}

{{/* A share that did not change is not written again: no new row version every sync. */}}
{{define "fleet_share"}}
INSERT INTO {{.Shares}} AS s (destination, replica, slots, wants)
SELECT unnest($1::text[]), $2, unnest($3::int[]), unnest($4::bool[])
ON CONFLICT (destination, replica) DO UPDATE SET slots = excluded.slots, wants = excluded.wants
WHERE (s.slots, s.wants) <> (excluded.slots, excluded.wants)
{{end}}

{{/* A destination's ($1) shares of its in-flight limit, by live replica. */}}
{{define "fleet_destination_shares"}}
SELECT s.replica, s.slots, s.wants
FROM {{.Shares}} AS s JOIN {{.Replicas}} AS r USING (replica)
WHERE s.destination = $1 AND r.expires_at > now()
ORDER BY s.replica
{{end}}
