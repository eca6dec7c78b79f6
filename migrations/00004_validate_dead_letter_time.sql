-- Check the existing rows against the dead-letter time constraint that the
-- previous migration added unchecked. VALIDATE CONSTRAINT takes a lock that
-- lets producers and the relay go on writing while it scans, so it runs on
-- its own, outside a transaction that holds stronger locks.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE {{.Schema}}.outbox VALIDATE CONSTRAINT outbox_dead_lettered_at_check;

-- +goose Down
-- Nothing to undo: the constraint goes with the previous migration.
SELECT 1;
