-- The audit trail accepts reroute: the operators' action that gives dead
-- letters another topic and delivers them again. Only the audit table is
-- locked, while its records are checked; the outbox table is not touched.
-- Additive: older relays never write the new action.

-- +goose Up
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox_audit DROP CONSTRAINT outbox_audit_action_check,
    ADD CONSTRAINT outbox_audit_action_check
        CHECK (action IN ('replay', 'edit', 'discard', 'release', 'reroute'));

-- +goose Down
-- Records of reroutes stay: the narrower CHECK holds for new records only.
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox_audit DROP CONSTRAINT outbox_audit_action_check,
    ADD CONSTRAINT outbox_audit_action_check
        CHECK (action IN ('replay', 'edit', 'discard', 'release')) NOT VALID;
