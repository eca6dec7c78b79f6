-- Strict per-key order (relay.strict_order) needs every transaction that
-- inserts outbox rows to have its transaction id before it takes their
-- ids: then a transaction still able to commit an id below a sequence
-- value the relay read has a transaction id below the next one PostgreSQL
-- had to give when the relay looked, and the relay can tell when all such
-- transactions have ended (docs/ordering.md).
--
-- An INSERT takes its ids from the sequence while it builds its rows, and
-- gets a transaction id only when it writes the first one. This trigger's
-- WHEN condition asks for the transaction id before the statement builds
-- any row; the condition is never true, so its function never runs and
-- the cost is one function call per statement, not per row.
--
-- Only the catalog changes; CREATE TRIGGER waits for transactions that
-- are writing to the table, and producers would queue behind it, so it
-- gives up after two seconds rather than stall them ('migrate up' tries
-- again).

-- +goose Up
SET LOCAL lock_timeout = '2s';

-- +goose StatementBegin
CREATE FUNCTION {{.Schema}}.outbox_xid_first() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_xid_first
    BEFORE INSERT ON {{.Schema}}.outbox
    FOR EACH STATEMENT
    WHEN (pg_current_xact_id() IS NULL)
    EXECUTE FUNCTION {{.Schema}}.outbox_xid_first();

-- +goose Down
SET LOCAL lock_timeout = '2s';
DROP TRIGGER outbox_xid_first ON {{.Schema}}.outbox;
DROP FUNCTION {{.Schema}}.outbox_xid_first();
