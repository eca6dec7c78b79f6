-- The console's sessions signed in through the identity provider: a
-- digest of each session's random id (the browser holds the id, in an
-- HttpOnly cookie), who signed in, how, the groups the provider named
-- (mapped to a role on every request, so a changed mapping applies at
-- once), and until when. Signing out deletes the row, which ends the
-- session on every replica. Expired rows are deleted at the next sign-in.
-- Additive: older relays ignore it.

-- +goose Up
CREATE TABLE {{.Schema}}.outbox_console_sessions (
    id_sha256  bytea       PRIMARY KEY,
    name       text        NOT NULL,
    source     text        NOT NULL,
    credential text        NOT NULL,
    groups     text[]      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX outbox_console_sessions_expires_idx ON {{.Schema}}.outbox_console_sessions (expires_at);

-- +goose Down
DROP TABLE {{.Schema}}.outbox_console_sessions;
