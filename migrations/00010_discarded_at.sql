-- When an operator discarded a row: discarded rows are kept for their own
-- retention from then, while unhandled dead letters are kept until handled.
-- Rows discarded before this migration count from when they were
-- dead-lettered. Additive: older relays ignore the column.
--
-- Adding a nullable column without a default changes only the catalog; it
-- gives up after two seconds rather than queue producers behind it
-- ('migrate up' tries again).

-- +goose Up
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox ADD COLUMN discarded_at timestamptz;

-- +goose Down
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox DROP COLUMN discarded_at;
