-- A key's dead-lettered and discarded rows, for finding a message by its
-- key (the console's key page, 'outbox-relay find --key'): with the
-- pending rows' index on (key, id), every row of a key but those kept as
-- sent is found without reading the table. Rows enter it only when they
-- are dead-lettered, so delivery does not pay for it.
--
-- Built concurrently, outside a transaction, so that producers are never
-- blocked; if it is interrupted, 'migrate up' runs it again. Additive:
-- older relays ignore it.

-- +goose NO TRANSACTION
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_key_settled_idx;
CREATE INDEX CONCURRENTLY outbox_key_settled_idx ON {{.Schema}}.outbox (key, id)
    WHERE status IN ('dead_lettered', 'discarded') AND key IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_key_settled_idx;
