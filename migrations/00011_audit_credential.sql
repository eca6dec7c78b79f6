-- Which credential an audited action was authenticated with: the name of
-- the admin API token, beside the actor the caller names itself. Null for
-- the command line, which acts with the database role's own rights.
-- Additive: older relays ignore the column.

-- +goose Up
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox_audit ADD COLUMN credential text;

-- +goose Down
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox_audit DROP COLUMN credential;
