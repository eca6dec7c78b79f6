-- Autovacuum throttled again on the outbox table, as on the rest of the
-- server (migration 13 had made it unthrottled). While a snapshot is held
-- elsewhere in the cluster (a long report, pg_dump, a slot, a standby's
-- feedback), vacuum can remove none of the delivered rows, yet runs again
-- at every autovacuum_naptime, as their count stays over its threshold:
-- unthrottled, each run read the whole growing table at full speed, and
-- the database's CPU per delivered row grew by the minute (266 to 500 µs
-- in 12 minutes on two cores, commit-to-ack p99 up to 62 ms), where
-- throttled it stayed flat (300 to 350 µs, p99 under 10 ms). Claims read
-- from their frontier and floor, not from the head of the pending index,
-- so the dead head that unthrottling kept short no longer slows them.
-- Only a setting of 0, as migration 13 left it, is reset: one an operator
-- chose is kept. The lock it takes does not conflict with producers'
-- writes; it waits for a running vacuum, and gives up after two seconds
-- ('migrate up' tries again). Additive: older relays ignore it.

-- +goose Up
SET LOCAL lock_timeout = '2s';
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_class WHERE oid = '{{.Schema}}.outbox'::regclass
               AND 'autovacuum_vacuum_cost_delay=0' = ANY (reloptions)) THEN
        ALTER TABLE {{.Schema}}.outbox RESET (autovacuum_vacuum_cost_delay);
    END IF;
END $$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '2s';
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_options_to_table(
        (SELECT reloptions FROM pg_class WHERE oid = '{{.Schema}}.outbox'::regclass))
        WHERE option_name = 'autovacuum_vacuum_cost_delay') THEN
        ALTER TABLE {{.Schema}}.outbox SET (autovacuum_vacuum_cost_delay = 0);
    END IF;
END $$;
-- +goose StatementEnd
