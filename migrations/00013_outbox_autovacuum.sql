-- Autovacuum unthrottled on the outbox table. Delivered rows leave dead
-- entries at the head of the pending rows' index until a vacuum removes
-- them, and each claim's look-up of the lowest pending id passes over
-- them. Throttled (the server's autovacuum_vacuum_cost_delay, 2 ms by
-- default), a pass over a 10M-row backlog took about two minutes while
-- the dead head grew, and the backlog drained at 45k rows/s; unthrottled,
-- passes took under a minute and it drained at 112k. Outside backlogs the
-- table is small and its passes short. Only this table's setting changes:
-- ALTER TABLE ... RESET (autovacuum_vacuum_cost_delay) gives it back the
-- server's. The lock it takes does not conflict with producers' writes;
-- it waits for a running vacuum, and gives up after two seconds
-- ('migrate up' tries again). Additive: older relays ignore it.

-- +goose Up
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox SET (autovacuum_vacuum_cost_delay = 0);

-- +goose Down
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox RESET (autovacuum_vacuum_cost_delay);
