{{/*
The claim and its key check: the relay's hot path. Each define is one
statement; {{.Outbox}} is the quoted outbox table.
*/}}

{{define "claim_columns"}}id, event_id, topic, key,
       CASE WHEN octet_length(payload) <= $2 THEN payload END,
       octet_length(payload), headers::text, created_at, retry_count,
       CASE WHEN last_attempt_at IS NOT NULL
            THEN (extract(epoch FROM next_attempt_at - last_attempt_at) * 1e6)::bigint END,
       statement_timestamp(){{end}}

{{define "claim_filter"}}status = 'pending' AND next_attempt_at <= statement_timestamp()
    AND {{.Partition}}(key, id) BETWEEN $7 AND $8
    AND (key IS NULL OR NOT key = ANY($3::text[]))
    AND NOT topic = ANY($4::text[])
    AND id <= $5{{end}}

{{define "claim"}}
-- Due by the statement's clock, not the transaction's: a row committed by
-- a transaction that began after this one's did is due, and must not be
-- passed over as if it waited (it is on no waiting index).
-- Two parts, read in turn until the limit: the rows that waited and are
-- due now, on the waiting rows' index (they may lie anywhere, below the
-- floor too), then the pending rows above $6, in id order, on the claim
-- index, whose second column, the partition, keeps the scan to the
-- caller's range ($7 to $8) without reading other processes' rows. A
-- waiting row above $6 comes back from both. The plain forms keep their
-- plans after ANALYZE; IN (SELECT ... LIMIT) and CTE forms flip to
-- generic plans that scan the whole table. $9 leaves the first part out
-- (a claim from the table's start, which reads every row anyway). $10
-- caps the first part below $1, so that rows that never waited always get
-- the rest: due rows that wait again and again (behind a paused topic's
-- rows, say) never crowd out a probe's rows, the rows they wait for, or
-- other destinations' new rows.
SELECT * FROM (
    SELECT {{template "claim_columns" .}}, true FROM {{.Outbox}}
    WHERE {{template "claim_filter" .}} AND next_attempt_at <> created_at AND $9
    ORDER BY next_attempt_at
    LIMIT $10
    FOR UPDATE SKIP LOCKED) AS waited
UNION ALL
SELECT * FROM (
    SELECT {{template "claim_columns" .}}, false FROM {{.Outbox}}
    WHERE {{template "claim_filter" .}} AND id > $6
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED) AS fresh
LIMIT $1
{{end}}

{{/*
stranded is the lowest pending row below the floor ($1) that never
waited, in the partitions $2 to $3: one given its id by its producer below
ids already delivered. It reads every entry from the index's start, dead
ones too.
*/}}
{{define "stranded"}}
SELECT min(id) FROM {{.Outbox}}
WHERE status = 'pending' AND next_attempt_at = created_at AND id <= $1
  AND {{.Partition}}(key, id) BETWEEN $2 AND $3
{{end}}

{{define "min_pending"}}
-- The lowest pending id, from the start of the pending rows' index: for a
-- store that cannot trust its floor (another process may hold any row).
SELECT coalesce(min(id), 0) FROM {{.Outbox}} WHERE status = 'pending'
{{end}}

{{/*
Rows outside a claim that hold its keys: pending rows from the floor ($3)
up, waiting rows below it, or parked dead letters, below the key's last
claimed row. Most claims have none, and only they come back: the claimed
rows are dropped here against a hash of the claim's ids. Starting at the
floor skips the index entries of delivered rows, dead until vacuum, which
a snapshot held anywhere in the database keeps: below it, only rows that
wait can be pending, and they are on an index of their own. Two forms find
the same blockers (the caller picks one). The span's may also return rows
of a key above its last claimed row, below the claim's last: they hold
back none of the key's claimed rows, all below them.

holding_by_span reads the claim's own id span once, on the claim index
(or the primary key, if stale statistics say so, bounded by the span
either way), and keeps the rows whose key is claimed. That is one entry
per row in the span: the claim's rows and those it passed over (locked,
waiting, or of an excluded topic); other processes' rows are skipped on
the index's second column ($5 to $6, the caller's partitions). The key set
is a hashed NOT IN under a NOT: as IN, the planner would make it a join,
free to probe the pending rows once per key. ORDER BY id, with sorts
priced out (see the claim's BEGIN), keeps the scan on an id index whatever
the statistics.

holding_by_key probes each key on the key index instead, for a claim that
passed over many rows, or holds few keys. Per key, in id order, as many
rows as the claim holds of the key: if a blocker exists it is among them,
and the last claimed row ends the scan. The bounds are row comparisons on
(key, id), and nothing else: the probe wants (key, id) order, which only
the key index gives without a sort. With key = beside them the planner
would drop the key from that order, and the scan would start at the key's
first entry. The index stops early on a row comparison's first column
only, so the upper bound is inclusive, and does not end the scan: LIMIT,
reached at the last claimed row, does. The LATERAL probe keeps the work
bounded for a dominant key too, where a plain join flips to hashing the
whole pending index.

Where no LIMIT can end a scan (a probe for a row that may not exist, a
range read whole), the bounds are key = and id ranges instead: with the
key fixed, the index stops at the id bound. A row comparison there would
read the key's entries on to its last, the rest of a hot key's backlog.

Both return key, id, parked, next_attempt_at, waiting, topic, leased,
unsorted.

The scoped forms, holding_in_span and holding_in_range, serve an order
scope narrower than the key (a destination, or a topic): only rows of the
claimed row's scope hold it back, and the caller tells them apart by
topic. A key's lowest row is then no longer enough: the lowest of each
scope is. Rows that wait below the floor are found per topic, on the
waiting rows' (key, topic, id) index: a skip scan takes the key's next
topic, one descent each, and a probe its lowest row. Above the floor,
the key form reads each key's whole range of the claim's span, without a
LIMIT: rows of other scopes may come first. The planner pulls that range
up into a join, a probe a key or one pass over the span hashed against
the keys, whichever is cheaper; the claim's last id ($4) bounds the pass,
which would otherwise read every pending row above the floor, the whole
backlog.
*/}}

{{define "claimed_keys"}}(SELECT c.key, max(c.id) AS max_id, count(*) AS n
      FROM unnest($1::text[], $2::bigint[]) AS c(key, id) GROUP BY c.key) AS c{{end}}

{{define "span_holders"}}
(SELECT p.key, p.id, false, p.next_attempt_at, p.next_attempt_at > statement_timestamp(), p.topic, p.lease_token IS NOT NULL
FROM {{.Outbox}} AS p
WHERE p.status = 'pending' AND p.id >= $3 AND p.id < $4 AND p.key IS NOT NULL
  AND {{.Partition}}(p.key, p.id) BETWEEN $5 AND $6
  AND NOT p.key NOT IN (SELECT unnest($1::text[]))
  AND p.id NOT IN (SELECT unnest($2::bigint[]))
ORDER BY p.id)
{{end}}

{{define "parked_holders"}}
UNION ALL
-- Parked dead letters of the claimed keys, below each key's last claimed
-- row.
SELECT p.key, p.id, true, p.next_attempt_at, false, p.topic, false
FROM {{template "claimed_keys" .}}
JOIN {{.Outbox}} AS p ON p.key = c.key AND p.id < c.max_id AND p.key_parked
{{end}}

{{define "other_holders"}}
UNION ALL
-- The lowest waiting row of each key below the floor, on the waiting rows'
-- key index: one probe a key, which reads the key's rows that waited, not
-- those delivered.
SELECT c.key, w.id, false, w.next_attempt_at, w.next_attempt_at > statement_timestamp(), w.topic, w.lease_token IS NOT NULL
FROM {{template "claimed_keys" .}}
CROSS JOIN LATERAL (
    SELECT p.id, p.next_attempt_at, p.topic, p.lease_token FROM {{.Outbox}} AS p
    WHERE p.status = 'pending' AND p.key IS NOT NULL AND p.next_attempt_at <> p.created_at
      AND p.key = c.key AND p.id < least($3, c.max_id)
      AND p.id NOT IN (SELECT unnest($2::bigint[]))
    ORDER BY p.key, p.id LIMIT 1) AS w
{{- template "parked_holders" .}}
{{end}}

{{define "holding_by_span"}}
{{- template "span_holders" .}}
{{- template "other_holders" .}}
{{end}}

{{define "holding_by_key"}}
SELECT c.key, h.id, false, h.next_attempt_at, h.next_attempt_at > statement_timestamp(), h.topic, h.lease_token IS NOT NULL
FROM {{template "claimed_keys" .}}
CROSS JOIN LATERAL (
    SELECT p.id, p.next_attempt_at, p.topic, p.lease_token FROM {{.Outbox}} AS p
    WHERE p.status = 'pending' AND p.key IS NOT NULL
      AND (p.key, p.id) >= (c.key, $3) AND (p.key, p.id) <= (c.key, c.max_id)
    ORDER BY p.key, p.id LIMIT c.n) AS h
WHERE h.id NOT IN (SELECT unnest($2::bigint[]))
{{- template "other_holders" .}}
{{end}}

{{define "defer"}}
-- Rows held back behind a waiting row of their key, without counting an
-- attempt.
UPDATE {{.Outbox}} AS o SET next_attempt_at = d.at, parked_behind = NULL
FROM unnest($1::bigint[], $2::timestamptz[]) AS d(id, at)
WHERE o.id = d.id
{{end}}

{{define "defer_parked"}}
-- Rows held back behind a parked key remember the dead letter that parks
-- it: releasing the key makes them ready.
UPDATE {{.Outbox}} AS o SET next_attempt_at = d.at, parked_behind = d.parker
FROM unnest($1::bigint[], $2::timestamptz[], $3::bigint[]) AS d(id, at, parker)
WHERE o.id = d.id
{{end}}

{{define "still_leased"}}
-- After a claim that deferred rows behind a leased row commits: is the row
-- still leased as the key check saw it? A write-back under way is waited
-- for (a short statement batch, never a publish), then seen as it ends.
-- One row per statement, so no lock is held while waiting for another:
-- write-backs lock their rows in an order of their own. A lease already
-- past its end is over without a look, so a claim that took its row again
-- is never waited for.
SELECT count(*) FROM (
    SELECT 1 FROM {{.Outbox}}
    WHERE id = $1 AND $2 > now()
      AND status = 'pending' AND lease_token IS NOT NULL AND next_attempt_at = $2
    FOR SHARE) AS o
{{end}}

{{define "lease_over"}}
-- Rows deferred to the end of a lease that is over: ready now. Rows whose
-- deferral has passed are ready already, and may be locked by a claim:
-- they are left alone.
UPDATE {{.Outbox}} AS o SET next_attempt_at = statement_timestamp()
FROM unnest($1::bigint[], $2::timestamptz[]) AS d(id, until)
WHERE o.id = d.id AND d.until > now() AND o.status = 'pending' AND o.next_attempt_at = d.until
{{end}}

{{define "other_holders_scoped"}}
UNION ALL
-- The lowest waiting row of each topic of each key below the floor: one
-- descent a topic that has waiting rows of the key, and one for the key.
-- A key without waiting rows ends at its first descent: the skip scan's
-- first step is a LATERAL, not a scalar subquery, so such a key yields
-- no row to recurse on (the subquery's NULL cost a claim of 2000 keys
-- a millisecond).
SELECT t.key, w.id, false, w.next_attempt_at, w.next_attempt_at > statement_timestamp(), w.topic, w.lease_token IS NOT NULL
FROM (
    WITH RECURSIVE t(key, max_id, topic) AS (
        SELECT c.key, c.max_id, f.topic
        FROM {{template "claimed_keys" .}}
        CROSS JOIN LATERAL (
            SELECT p.topic FROM {{.Outbox}} AS p
            WHERE p.status = 'pending' AND p.key IS NOT NULL AND p.next_attempt_at <> p.created_at
              AND p.key = c.key
            ORDER BY p.key, p.topic LIMIT 1) AS f
      UNION ALL
        SELECT t.key, t.max_id, n.topic
        FROM t CROSS JOIN LATERAL (
            SELECT p.topic FROM {{.Outbox}} AS p
            WHERE p.status = 'pending' AND p.key IS NOT NULL AND p.next_attempt_at <> p.created_at
              AND p.key = t.key AND p.topic > t.topic
            ORDER BY p.key, p.topic LIMIT 1) AS n)
    SELECT * FROM t) AS t
CROSS JOIN LATERAL (
    SELECT p.id, p.next_attempt_at, p.topic, p.lease_token FROM {{.Outbox}} AS p
    WHERE p.status = 'pending' AND p.key IS NOT NULL AND p.next_attempt_at <> p.created_at
      AND p.key = t.key AND p.topic = t.topic AND p.id < least($3, t.max_id)
      AND p.id NOT IN (SELECT unnest($2::bigint[]))
    ORDER BY p.key, p.topic, p.id LIMIT 1) AS w
{{- template "parked_holders" .}}
{{end}}

{{define "holding_in_span"}}
{{- template "span_holders" .}}
{{- template "other_holders_scoped" .}}
{{end}}

{{define "holding_in_range"}}
SELECT c.key, h.id, false, h.next_attempt_at, h.next_attempt_at > statement_timestamp(), h.topic, h.lease_token IS NOT NULL
FROM {{template "claimed_keys" .}}
CROSS JOIN LATERAL (
    SELECT p.id, p.next_attempt_at, p.topic, p.lease_token FROM {{.Outbox}} AS p
    WHERE p.status = 'pending' AND p.key IS NOT NULL
      AND p.key = c.key AND p.id >= $3 AND p.id <= c.max_id AND p.id <= $4) AS h
WHERE h.id NOT IN (SELECT unnest($2::bigint[]))
{{- template "other_holders_scoped" .}}
{{end}}

{{/*
free_rows locks, of the ids $1, those no other transaction holds, without
waiting; the caller takes them in a savepoint and gives them back, to
learn which rows are free.
*/}}
{{define "free_rows"}}
SELECT id FROM {{.Outbox}} WHERE id = ANY($1) FOR UPDATE SKIP LOCKED
{{end}}

{{/*
claim_begin opens a claim's transaction (see ClaimBegin): read committed,
sorts and JIT off, commits without waiting for the WAL flush, and, with
.IdleMS, ended by the server after that long without a statement. Every
setting is for the transaction only.
*/}}
{{define "claim_begin"}}
BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL enable_sort = off; SET LOCAL jit = off; SET LOCAL synchronous_commit = off; SET LOCAL plan_cache_mode = force_generic_plan
{{- if .IdleMS}}; SET LOCAL idle_in_transaction_session_timeout = {{.IdleMS}}{{end}}
{{end}}
