-- Dead-letter operations: where a row failed, an audit trail of what
-- operators did about it, and a view to query dead letters with.

-- +goose Up
-- Dead letters are listed, paged and expired by when they were
-- dead-lettered: every one must have that time. The backfill runs before
-- any ALTER, whose lock would otherwise block producers for its whole scan;
-- the constraint is added unchecked here (instantly) and validated by the
-- next migration without blocking writes.
UPDATE {{.Schema}}.outbox SET dead_lettered_at = coalesce(last_attempt_at, created_at)
WHERE status IN ('dead_lettered', 'discarded') AND dead_lettered_at IS NULL;
ALTER TABLE {{.Schema}}.outbox ADD CONSTRAINT outbox_dead_lettered_at_check
    CHECK (status NOT IN ('dead_lettered', 'discarded') OR dead_lettered_at IS NOT NULL) NOT VALID;

-- The destination of the row's latest failed attempt: where a dead letter
-- died. Null for rows that never reached one (no_route, invalid_message).
ALTER TABLE {{.Schema}}.outbox ADD COLUMN destination text;

-- Every operator action on dead letters: who, when, what, why and on which
-- rows. Bulk actions write one record per batch, in the batch's own
-- transaction, so the trail matches what changed.
CREATE TABLE {{.Schema}}.outbox_audit (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,
    -- cli or api
    source  text        NOT NULL,
    action  text        NOT NULL,
    reason  text,
    row_ids bigint[]    NOT NULL,
    -- The selection a bulk action ran with, and for edits the row as it
    -- was before and the fields that replaced it.
    details jsonb       NOT NULL DEFAULT '{}',
    CONSTRAINT outbox_audit_action_check
        CHECK (action IN ('replay', 'edit', 'discard', 'release')),
    CONSTRAINT outbox_audit_actor_check CHECK (actor <> '')
);
CREATE INDEX outbox_audit_at_idx ON {{.Schema}}.outbox_audit (at, id);

-- The operators' view of dead letters: every dead-lettered and discarded
-- row, without the payload bytes (ask for the row itself when needed).
CREATE VIEW {{.Schema}}.outbox_dead_letters AS
SELECT id, event_id, topic, key, destination, status,
       dead_letter_reason AS reason, dead_lettered_at,
       key_parked AS parks_key,
       retry_count AS attempts, last_error, last_attempt_at, created_at,
       octet_length(payload) AS payload_bytes, headers, error_history
FROM {{.Schema}}.outbox
WHERE status IN ('dead_lettered', 'discarded');

-- +goose Down
DROP VIEW {{.Schema}}.outbox_dead_letters;
-- Never drop the audit trail while it holds records.
LOCK TABLE {{.Schema}}.outbox_audit IN ACCESS EXCLUSIVE MODE;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{.Schema}}.outbox_audit) THEN
        RAISE EXCEPTION 'refusing to drop {{.SchemaText}}.outbox_audit: it still holds records'
            USING HINT = 'Export the audit records and delete them first; migrate down never drops data.';
    END IF;
END
$$;
-- +goose StatementEnd
DROP TABLE {{.Schema}}.outbox_audit;
ALTER TABLE {{.Schema}}.outbox DROP CONSTRAINT outbox_dead_lettered_at_check;
ALTER TABLE {{.Schema}}.outbox DROP COLUMN destination;
