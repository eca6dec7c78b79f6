-- Wake-up notifications for the relay's LISTEN, on channel "<schema>.outbox"
-- so relays of other schemas sleep on.
--
-- A transaction that has notified holds a database-wide lock from its commit
-- until the commit is flushed, so notifying transactions cannot share a WAL
-- flush: with every insert notifying, producers lose about 40% of their
-- throughput. So the trigger is statement-level (PostgreSQL folds the
-- identical notifications of one transaction into one), and only one
-- transaction at a time notifies: the others skip, since a notification is
-- already on its way. The relay keeps claiming while it finds rows and polls
-- as a fallback, so a skipped transaction that commits just after the
-- notifier is picked up by the next claim. The two-key advisory lock form
-- keeps clear of applications' single-key advisory locks.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION {{.Schema}}.outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_xact_lock(1869903970, hashtext(TG_TABLE_SCHEMA || '.outbox')) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '.outbox', '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify
    AFTER INSERT ON {{.Schema}}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Schema}}.outbox_notify();

-- +goose Down
DROP TRIGGER outbox_notify ON {{.Schema}}.outbox;
DROP FUNCTION {{.Schema}}.outbox_notify();
