-- Messages written into the write-ahead log rather than the outbox table,
-- for an outbox captured from the log (capture: log): producers call
-- outbox_emit in their transactions, and the relay reads the messages
-- from the outbox's replication slot in commit order. They
-- exist only if the transaction commits, and touch no table.
--
-- outbox_capture_slot() names the slot: slot names are unique in the whole
-- cluster, so it names the database too, hashed with the schema.
--
-- The message is a logical decoding message with the prefix
-- '{{.Prefix}}', and content, version 1:
--   1 byte   the version, 1
--   16 bytes the event id
--   8 bytes  created_at: microseconds since 1970-01-01 UTC (the
--            transaction's start, as the table's default)
--   4 bytes  the topic's length, then the topic (UTF-8)
--   4 bytes  the key's length, -1 without a key, then the key
--   4 bytes  the headers' length, then the headers (a JSON object)
--   the rest the payload
-- Lengths are big-endian. The function refuses to emit while the slot
-- does not exist: a message written before it would never be read. It
-- looks once a transaction, noting it in a setting of the transaction.
-- Additive: older relays ignore it.

-- +goose Up
CREATE FUNCTION {{.Schema}}.outbox_capture_slot() RETURNS text
LANGUAGE sql STABLE
AS $$ SELECT 'outbox_' || left(lower('{{.SchemaText}}'), 38) || '_' || left(md5(current_database() || '.{{.SchemaText}}'), 8) $$;

-- +goose StatementBegin
CREATE FUNCTION {{.Schema}}.outbox_emit(topic text, key text, payload bytea,
    headers jsonb DEFAULT '{}', event_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id uuid := coalesce(event_id, gen_random_uuid());
    t bytea := convert_to(topic, 'UTF8');
    h bytea;
    k bytea := convert_to(key, 'UTF8');
    at pg_lsn;
BEGIN
    IF topic IS NULL OR topic = '' THEN
        RAISE EXCEPTION 'outbox_emit: topic is empty' USING ERRCODE = 'check_violation';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'outbox_emit: payload is null' USING ERRCODE = 'not_null_violation';
    END IF;
    IF headers IS NULL THEN
        headers := '{}';
    ELSIF jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox_emit: headers must be a JSON object' USING ERRCODE = 'check_violation';
    END IF;
    -- Once a transaction: the look at the slots costs more than the rest.
    IF current_setting('outbox_relay.slot_seen_{{.Publication}}', true) IS DISTINCT FROM 'on' THEN
        IF NOT EXISTS (SELECT FROM pg_replication_slots s
                       WHERE s.slot_name = {{.Schema}}.outbox_capture_slot() AND s.database = current_database()) THEN
            RAISE EXCEPTION 'outbox_emit: the replication slot % does not exist, so a message written now would never be read',
                {{.Schema}}.outbox_capture_slot()
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Run ''outbox-relay capture setup'' for schema {{.SchemaText}}.';
        END IF;
        PERFORM set_config('outbox_relay.slot_seen_{{.Publication}}', 'on', true);
    END IF;
    h := convert_to(headers::text, 'UTF8');
    -- An assignment rather than PERFORM: a simple expression, without a
    -- query's start and end.
    at := pg_logical_emit_message(true, '{{.Prefix}}',
        '\x01'::bytea || uuid_send(id)
        || int8send((extract(epoch FROM now()) * 1000000)::bigint)
        || int4send(octet_length(t)) || t
        || CASE WHEN k IS NULL THEN int4send(-1) ELSE int4send(octet_length(k)) || k END
        || int4send(octet_length(h)) || h
        || payload);
    RETURN id;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS {{.Schema}}.outbox_emit(text, text, bytea, jsonb, uuid);
DROP FUNCTION IF EXISTS {{.Schema}}.outbox_capture_slot();
