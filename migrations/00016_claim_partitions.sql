-- Claims that never read the rows the relay already delivered, and
-- replicas that never meet each other's rows.
--
-- A delivered row is deleted, but its index entries stay until vacuum can
-- remove them, which it cannot while any snapshot older than the delete
-- is open (a long report, pg_dump, a replication slot, a standby's
-- feedback). A claim that reads the pending rows from their start passes
-- over all of them, and grows slower by the minute. The relay now reads
-- from a floor it keeps itself (docs/design.md), which needs:
--
-- * outbox_waiting_idx and outbox_key_waiting_idx: the rows that wait
--   (for a retry, a producer's delay, a lease's end, a key ahead of them),
--   which are the only pending rows below the floor. A row waits when its
--   next_attempt_at differs from its created_at: both default to the
--   inserting transaction's now(), and every deferral moves the first.
--   Rows that never waited are not in them, so a steady flow of rows
--   costs them nothing.
-- * outbox_partition(key, id) and outbox_claim_idx: the rows fall into 16
--   partitions by a hash of their key (by id without one), and each relay
--   process claims a contiguous range of partitions leased to it in
--   outbox_claim_partitions. A key's rows are all in one partition, so no
--   other process has rows of the keys a process claims in flight: its
--   floor bounds its key checks. The index leads with the id, so a range
--   of partitions is read in id order, and the partition, the second
--   column, skips other processes' rows without reading them.
-- * outbox_claimers: the processes that claim, so that each knows its
--   share; and outbox_fleet_replicas.claims, set by relays that lease
--   partitions: a relay that finds a live replica without it (an older
--   relay, during a rolling upgrade) checks keys from the lowest pending
--   row, as before, since that one claims from anywhere.
--
-- Outside a transaction, so that the indexes are built concurrently and no
-- statement blocks producers. If it is interrupted, 'migrate up' runs it
-- again whole: every statement can run twice. Additive: older relays keep
-- running during a rolling upgrade.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{.Schema}}.outbox_partition(key text, id bigint) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN key IS NULL THEN (id % 16)::integer ELSE (hashtextextended(key, 0) & 15)::integer END
$$;
-- +goose StatementEnd

CREATE TABLE IF NOT EXISTS {{.Schema}}.outbox_claim_partitions (
    part       integer     PRIMARY KEY CHECK (part >= 0 AND part < 16),
    owner      text,
    expires_at timestamptz,
    -- No pending row of the partition below it is unknown to its owner,
    -- except rows that wait: where its next owner starts.
    floor      bigint      NOT NULL DEFAULT 0
);
INSERT INTO {{.Schema}}.outbox_claim_partitions (part) SELECT g FROM generate_series(0, 15) g ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS {{.Schema}}.outbox_claimers (
    claimer    text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

ALTER TABLE {{.Schema}}.outbox_fleet_replicas ADD COLUMN IF NOT EXISTS claims integer;

DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_claim_idx;
CREATE INDEX CONCURRENTLY outbox_claim_idx ON {{.Schema}}.outbox (id, {{.Schema}}.outbox_partition(key, id))
    WHERE status = 'pending';

DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_waiting_idx;
CREATE INDEX CONCURRENTLY outbox_waiting_idx ON {{.Schema}}.outbox (next_attempt_at, {{.Schema}}.outbox_partition(key, id))
    WHERE status = 'pending' AND next_attempt_at <> created_at;

DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_key_waiting_idx;
CREATE INDEX CONCURRENTLY outbox_key_waiting_idx ON {{.Schema}}.outbox (key, id)
    WHERE status = 'pending' AND key IS NOT NULL AND next_attempt_at <> created_at;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_key_waiting_idx;
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_waiting_idx;
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_claim_idx;
ALTER TABLE {{.Schema}}.outbox_fleet_replicas DROP COLUMN IF EXISTS claims;
DROP TABLE IF EXISTS {{.Schema}}.outbox_claimers;
DROP TABLE IF EXISTS {{.Schema}}.outbox_claim_partitions;
DROP FUNCTION IF EXISTS {{.Schema}}.outbox_partition(text, bigint);
