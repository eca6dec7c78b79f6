{{/*
Outcomes written back after a claim or a leased delivery. Delivered rows
are deleted, or marked sent when kept (KeepSent: the _mark forms).
*/}}

{{define "sent_delete"}}
DELETE FROM {{.Outbox}} WHERE id = ANY($1)
{{end}}

{{define "sent_mark"}}
UPDATE {{.Outbox}} SET status = 'sent', sent_at = statement_timestamp(),
       last_attempt_at = statement_timestamp(), lease_token = NULL
WHERE id = ANY($1)
{{end}}

{{/*
One failed, deferred or dead-lettered row per array element. A row given
a token ($11) is written only while it still holds that lease.
*/}}
{{define "fail_update"}}
UPDATE {{.Outbox}} AS o SET
    status = f.status,
    retry_count = o.retry_count + f.inc,
    next_attempt_at = CASE WHEN f.status = 'pending'
                           THEN statement_timestamp() + f.delay_us * interval '1 microsecond'
                           ELSE o.next_attempt_at END,
    last_error = f.err,
    last_attempt_at = CASE WHEN f.attempted THEN statement_timestamp() ELSE o.last_attempt_at END,
    dead_letter_reason = f.reason,
    dead_lettered_at = CASE WHEN f.status = 'dead_lettered' THEN statement_timestamp() END,
    error_group = CASE WHEN f.status = 'dead_lettered'
                       THEN {{.Group}}(coalesce(f.dest, o.destination), f.reason, f.err) END,
    key_parked = f.park,
    parked_behind = NULL,
    lease_token = NULL,
    destination = coalesce(f.dest, o.destination),
    error_history = (
        SELECT coalesce(jsonb_agg(h.e ORDER BY h.n), '[]')
        FROM jsonb_array_elements(o.error_history || jsonb_build_array(jsonb_build_object(
                 'at', statement_timestamp(), 'attempt', o.retry_count + f.inc,
                 'class', f.class, 'error', f.err)))
             WITH ORDINALITY AS h(e, n)
        WHERE h.n > jsonb_array_length(o.error_history) + 1 - $10)
FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::text[],
            $7::text[], $8::bool[], $9::bool[], $11::uuid[], $12::text[])
     AS f(id, status, inc, delay_us, err, class, reason, park, attempted, token, dest)
WHERE o.id = f.id AND (f.token IS NULL OR o.lease_token = f.token)
{{end}}

{{define "fail"}}{{template "fail_update" .}}{{end}}

{{define "leased_fail"}}
{{- template "fail_update" .}}
-- A leased write-back learns which rows still held its lease.
RETURNING o.id
{{end}}

{{define "lease"}}
-- A lease counts the attempt when it is taken, so a row that crashes the
-- relay every time still runs out of attempts.
UPDATE {{.Outbox}} AS o SET
    next_attempt_at = statement_timestamp() + l.vt_us * interval '1 microsecond',
    lease_token = l.token, retry_count = o.retry_count + 1, last_attempt_at = statement_timestamp()
FROM unnest($1::bigint[], $2::uuid[], $3::bigint[]) AS l(id, token, vt_us)
WHERE o.id = l.id
RETURNING o.id, o.next_attempt_at
{{end}}

{{define "leased_sent_delete"}}
DELETE FROM {{.Outbox}} AS o USING unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE o.id = l.id AND o.lease_token = l.token
RETURNING o.id
{{end}}

{{define "leased_sent_mark"}}
-- retry_count counts failed attempts: the lease's is given back.
UPDATE {{.Outbox}} AS o SET status = 'sent', sent_at = statement_timestamp(), lease_token = NULL,
    retry_count = o.retry_count - 1
FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE o.id = l.id AND o.lease_token = l.token
RETURNING o.id
{{end}}

{{define "unlease"}}
-- A leased row that was never sent gives its attempt back.
UPDATE {{.Outbox}} AS o SET next_attempt_at = statement_timestamp(), lease_token = NULL,
    retry_count = o.retry_count - 1
FROM unnest($1::bigint[], $2::uuid[]) AS l(id, token)
WHERE o.id = l.id AND o.lease_token = l.token
{{end}}

{{define "pull_forward"}}
-- Rows deferred behind a row of their key wait until its moment: a leased
-- row's lease end, or the end of a deferral while its destination was
-- down. Once it is done, or ready again, they may go at once. Only rows
-- deferred to exactly that moment are moved, never a producer's own delay.
UPDATE {{.Outbox}} AS o SET next_attempt_at = statement_timestamp()
FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS p(key, id, until)
WHERE o.key = p.key AND o.status = 'pending' AND o.id > p.id AND o.next_attempt_at = p.until
{{end}}

{{/*
Rows a destination, topic or partition held while it was down ($1, with
their retry counts then, $2) go at once once it answers again, with the
rows of their keys deferred behind them, to exactly their moment. A row
attempted since (its retry count moved), already due, or no longer pending
is left alone; so is a row a claim holds now: that claim settles it. It
returns the keyed rows it made ready, with the moment rows behind them
were deferred to (claims under way may still defer more there: see
pull_forward), and how many rows it made ready in all.
*/}}
{{define "release_held"}}
WITH held AS (
    SELECT o.id, o.key, o.next_attempt_at AS until
    FROM {{.Outbox}} AS o JOIN unnest($1::bigint[], $2::int[]) AS h(id, retries) ON o.id = h.id
    WHERE o.status = 'pending' AND o.retry_count = h.retries AND o.next_attempt_at > statement_timestamp()
    FOR UPDATE OF o SKIP LOCKED
), behind AS (
    SELECT f.id
    FROM held JOIN {{.Outbox}} AS f ON f.key = held.key AND f.id > held.id
    WHERE f.status = 'pending' AND f.next_attempt_at = held.until
    FOR UPDATE OF f SKIP LOCKED
), ready AS (
    UPDATE {{.Outbox}} AS o SET next_attempt_at = statement_timestamp()
    WHERE o.id IN (SELECT id FROM held UNION SELECT id FROM behind)
    RETURNING o.id
)
SELECT held.key, held.id, held.until, (SELECT count(*) FROM ready)
FROM held WHERE held.key IS NOT NULL
UNION ALL
-- The count, when no keyed row was released.
SELECT NULL, 0, NULL, (SELECT count(*) FROM ready)
WHERE NOT EXISTS (SELECT FROM held WHERE held.key IS NOT NULL)
{{end}}
