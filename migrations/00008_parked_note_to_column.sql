-- Rows deferred behind a parked key before the previous migration carry a
-- note in last_error instead ('waiting: key parked by dead-lettered row N'):
-- move it to parked_behind and give them back their own last error. Row
-- locks only, outside a transaction that holds stronger ones, so producers
-- and the relay go on writing while it runs.

-- +goose NO TRANSACTION
-- +goose Up
UPDATE {{.Schema}}.outbox
SET parked_behind = substr(last_error, 42)::bigint,
    last_error = error_history -> -1 ->> 'error'
WHERE status = 'pending' AND starts_with(last_error, 'waiting: key parked by dead-lettered row ');

-- +goose Down
UPDATE {{.Schema}}.outbox
SET last_error = 'waiting: key parked by dead-lettered row ' || parked_behind
WHERE status = 'pending' AND parked_behind IS NOT NULL;
