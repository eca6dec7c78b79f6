-- Wake-up notifications for the relay's LISTEN. One NOTIFY per statement, not
-- per row: every NOTIFY serialises committing transactions behind a global
-- lock, and PostgreSQL folds identical notifications of one transaction into
-- one. The channel is "<schema>.outbox", so relays of other schemas sleep on.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION {{.Schema}}.outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.outbox', '');
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
