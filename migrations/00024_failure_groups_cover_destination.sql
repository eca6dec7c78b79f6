-- The failure groups of one destination or reason (a destination's page in
-- the console, 'outbox-relay dlq groups --destination'): the groups' index
-- carries both, so that they are counted from the index alone, as all the
-- groups are, rather than by reading every dead letter's row.
--
-- Built concurrently, outside a transaction, beside the index it replaces,
-- which goes only once the new one is valid: producers are never blocked
-- and the groups never lose their index. If it is interrupted, 'migrate
-- up' runs it again whole. Older relays read the same index by its name.

-- +goose NO TRANSACTION
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_failure_group_next_idx;
CREATE INDEX CONCURRENTLY outbox_failure_group_next_idx ON {{.Schema}}.outbox
    (error_group, dead_lettered_at, id) INCLUDE (status, destination, dead_letter_reason)
    WHERE status IN ('dead_lettered', 'discarded');
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_failure_group_idx;
ALTER INDEX {{.Schema}}.outbox_failure_group_next_idx RENAME TO outbox_failure_group_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_failure_group_next_idx;
CREATE INDEX CONCURRENTLY outbox_failure_group_next_idx ON {{.Schema}}.outbox
    (error_group, dead_lettered_at, id) INCLUDE (status)
    WHERE status IN ('dead_lettered', 'discarded');
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_failure_group_idx;
ALTER INDEX {{.Schema}}.outbox_failure_group_next_idx RENAME TO outbox_failure_group_idx;
