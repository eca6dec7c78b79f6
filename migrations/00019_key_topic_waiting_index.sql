-- Order kept per destination or per topic rather than per key: a key's
-- rows that wait (for a retry, a deferral, a lease's end) hold back only
-- the later rows of their own scope. A claim's key check looks for the
-- lowest waiting row of each topic of a key below its floor, which this
-- index serves with one descent a topic: a skip scan over the key's
-- topics, then each topic's lowest row. Like outbox_key_waiting_idx, it
-- holds only rows that wait, so a steady flow of rows costs it nothing.
--
-- Outside a transaction, so that the index is built concurrently and
-- producers are never blocked; if interrupted, 'migrate up' runs it again.
-- Additive: older relays keep running during a rolling upgrade.

-- +goose NO TRANSACTION
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_key_topic_waiting_idx;
CREATE INDEX CONCURRENTLY outbox_key_topic_waiting_idx ON {{.Schema}}.outbox (key, topic, id)
    WHERE status = 'pending' AND key IS NOT NULL AND next_attempt_at <> created_at;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{.Schema}}.outbox_key_topic_waiting_idx;
