-- Failure groups: the groups of rows dead-lettered before migration 14,
-- and an index that counts a group's rows, and lists them newest first,
-- without reading the rest (nor the pending rows, however many).
--
-- Outside a transaction, so that neither statement blocks producers: the
-- update locks only dead letters, in batches along the dead letters'
-- index, and the indexes are built concurrently. If it is interrupted,
-- 'migrate up' runs it again whole: the update leaves rows already done
-- alone, and an index left invalid is dropped first.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    at timestamptz := '-infinity';
    last bigint := 0;
    upto_at timestamptz;
    upto bigint;
BEGIN
    -- Through the dead letters once, in the order of their index, 5000 at
    -- a time, each batch committed.
    LOOP
        SELECT b.dead_lettered_at, b.id INTO upto_at, upto
        FROM (SELECT dead_lettered_at, id FROM {{.Schema}}.outbox
              WHERE status IN ('dead_lettered', 'discarded') AND (dead_lettered_at, id) > (at, last)
              ORDER BY dead_lettered_at, id LIMIT 5000) AS b
        ORDER BY b.dead_lettered_at DESC, b.id DESC LIMIT 1;
        EXIT WHEN upto IS NULL;
        UPDATE {{.Schema}}.outbox
        SET error_group = {{.Schema}}.outbox_error_group(destination, dead_letter_reason, last_error)
        WHERE status IN ('dead_lettered', 'discarded') AND error_group IS NULL
          AND (dead_lettered_at, id) > (at, last) AND (dead_lettered_at, id) <= (upto_at, upto);
        COMMIT;
        at := upto_at;
        last := upto;
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
