-- The outbox table: producers insert rows in their own transactions; the relay
-- claims ready rows in id order, delivers them and writes the outcome back.
-- {{.Schema}} is the quoted, configured schema name.

-- +goose Up
CREATE TABLE {{.Schema}}.outbox (
    -- Columns the producer writes.
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           uuid        NOT NULL DEFAULT gen_random_uuid(),
    topic              text        NOT NULL,
    key                text,
    payload            bytea       NOT NULL,
    headers            jsonb       NOT NULL DEFAULT '{}',
    created_at         timestamptz NOT NULL DEFAULT now(),
    next_attempt_at    timestamptz NOT NULL DEFAULT now(),

    -- Columns the relay owns.
    status             text        NOT NULL DEFAULT 'pending',
    retry_count        integer     NOT NULL DEFAULT 0,
    last_error         text,
    last_attempt_at    timestamptz,
    sent_at            timestamptz,
    dead_letter_reason text,
    dead_lettered_at   timestamptz,
    -- A dead-lettered row of a destination with on_dead_letter: block holds
    -- its key until an operator releases it.
    key_parked         boolean     NOT NULL DEFAULT false,
    -- Set while a leased delivery is in flight; the write-back must match it.
    lease_token        uuid,
    -- The most recent failures, newest last, bounded by the relay.
    error_history      jsonb       NOT NULL DEFAULT '[]',

    CONSTRAINT outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT outbox_topic_check CHECK (topic <> ''),
    CONSTRAINT outbox_headers_check CHECK (jsonb_typeof(headers) = 'object'),
    CONSTRAINT outbox_status_check
        CHECK (status IN ('pending', 'sent', 'dead_lettered', 'discarded')),
    CONSTRAINT outbox_retry_count_check CHECK (retry_count >= 0),
    CONSTRAINT outbox_dead_letter_reason_check CHECK (dead_letter_reason IN (
        'permanent', 'retries_exhausted', 'max_age_exceeded', 'too_large',
        'no_route', 'invalid_message')),
    CONSTRAINT outbox_dead_letter_check
        CHECK (dead_letter_reason IS NULL OR status IN ('dead_lettered', 'discarded')),
    CONSTRAINT outbox_key_parked_check
        CHECK (NOT key_parked OR (status = 'dead_lettered' AND key IS NOT NULL))
);

-- The claim: pending rows in id order. Partial, so sent and dead rows never
-- slow it down.
CREATE INDEX outbox_pending_idx ON {{.Schema}}.outbox (id) WHERE status = 'pending';

-- Per-key order: "is an earlier row of this key still pending, or parked?"
CREATE INDEX outbox_key_pending_idx ON {{.Schema}}.outbox (key, id)
    WHERE status = 'pending' AND key IS NOT NULL;
CREATE INDEX outbox_key_parked_idx ON {{.Schema}}.outbox (key, id) WHERE key_parked;

-- Dead-letter listing, filtering and retention.
CREATE INDEX outbox_dead_letter_idx ON {{.Schema}}.outbox (dead_lettered_at, id)
    WHERE status IN ('dead_lettered', 'discarded');

-- Cleanup of rows kept as sent (sent_retention > 0).
CREATE INDEX outbox_sent_idx ON {{.Schema}}.outbox (sent_at) WHERE status = 'sent';

-- +goose Down
-- Never drop user data: refuse while any row is left.
LOCK TABLE {{.Schema}}.outbox IN ACCESS EXCLUSIVE MODE;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{.Schema}}.outbox) THEN
        RAISE EXCEPTION 'refusing to drop {{.SchemaText}}.outbox: it still holds rows'
            USING HINT = 'Deliver, export or delete the rows first; migrate down never drops data.';
    END IF;
END
$$;
-- +goose StatementEnd
DROP TABLE {{.Schema}}.outbox;
