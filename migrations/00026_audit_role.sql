-- The role an audited action was taken with (viewer, reader or
-- operator), beside the actor and the credential: what they were allowed
-- to do when they did it. Null for the command line, which acts with the
-- database role's own rights. Additive: older relays ignore the column.

-- +goose Up
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox_audit ADD COLUMN role text;

-- +goose Down
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox_audit DROP COLUMN role;
