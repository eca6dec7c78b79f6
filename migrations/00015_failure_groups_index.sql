-- Failure groups: the groups of rows dead-lettered before migration 14,
-- and an index that counts a group's rows, and lists them newest first,
-- without reading the rest (nor the pending rows, however many).
--
-- Outside a transaction, so that neither statement blocks producers: the
-- update locks only dead letters, in batches, and the index is built
-- concurrently. If it is interrupted, 'migrate up' runs it again whole:
-- the update skips rows already done and an index left invalid is dropped
-- first.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE n bigint;
BEGIN
    LOOP
        UPDATE {{.Schema}}.outbox
        SET error_group = {{.Schema}}.outbox_error_group(destination, dead_letter_reason, last_error)
        WHERE id IN (SELECT id FROM {{.Schema}}.outbox
                     WHERE status IN ('dead_lettered', 'discarded') AND error_group IS NULL
                     LIMIT 5000);
        GET DIAGNOSTICS n = ROW_COUNT;
        EXIT WHEN n = 0;
        COMMIT;
    END LOOP;
END $$;
-- +goose StatementEnd

DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_failure_group_idx;
CREATE INDEX CONCURRENTLY outbox_failure_group_idx ON {{.Schema}}.outbox
    (error_group, dead_lettered_at, id) INCLUDE (status)
    WHERE status IN ('dead_lettered', 'discarded');

-- Dead letters without a group: none as a rule, so an empty index that
-- finds them at once however large the table.
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_ungrouped_idx;
CREATE INDEX CONCURRENTLY outbox_ungrouped_idx ON {{.Schema}}.outbox (id)
    WHERE status IN ('dead_lettered', 'discarded') AND error_group IS NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_ungrouped_idx;
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_failure_group_idx;
