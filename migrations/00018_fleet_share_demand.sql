-- Replicas lend the in-flight slots they do not use. Each records, beside
-- its share of a destination's limit, whether rows of its waited for a
-- slot since its last sync (wants). While some want, a replica that
-- wants none keeps one slot, or what it used, and those that want split
-- the rest. Additive: older relays never write it, and keep their even
-- split.

-- +goose Up
ALTER TABLE {{.Schema}}.outbox_fleet_shares ADD COLUMN wants boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE {{.Schema}}.outbox_fleet_shares DROP COLUMN wants;
