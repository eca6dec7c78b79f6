-- The oldest relay a schema still works with. A relay refuses to start on
-- a schema newer than the migrations it ships unless that relay is at
-- least compatible_from: a migration that changes or removes anything an
-- older relay uses raises it to its own version, so relays built before
-- it stop at start-up with a clear line instead of failing on a query.
-- Migrations that only add (a table, a nullable column, an index) leave it
-- as it is, and older relays keep running during a rolling upgrade.
--
-- 8 because relays of version 7 and older write the parked-key note into
-- last_error, which this schema keeps in parked_behind (they predate this
-- check, so it is a record rather than a gate for them).

-- +goose Up
CREATE TABLE {{.Schema}}.outbox_relay_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    compatible_from integer NOT NULL CHECK (compatible_from > 0)
);
COMMENT ON TABLE {{.Schema}}.outbox_relay_schema IS
    'outbox-relay: relays whose own schema version is below compatible_from refuse to run on this schema';
INSERT INTO {{.Schema}}.outbox_relay_schema (compatible_from) VALUES (8);

-- +goose Down
DROP TABLE {{.Schema}}.outbox_relay_schema;
