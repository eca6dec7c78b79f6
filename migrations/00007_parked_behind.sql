-- Rows deferred behind a parked key record the dead letter that parks it
-- in a column of their own, rather than in a note written over their last
-- error: releasing the key finds them by it, and their own last error
-- stays as it was.
--
-- Adding a nullable column without a default changes only the catalog; it
-- waits for transactions writing to the table, and producers would queue
-- behind it, so it gives up after two seconds rather than stall them
-- ('migrate up' tries again).

-- +goose Up
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox ADD COLUMN parked_behind bigint;

-- +goose Down
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox DROP COLUMN parked_behind;
