-- The coordination tables through which the relay's replicas share each
-- destination's flow control: who is alive, each destination's breaker
-- (one probe at a time across the fleet), and each replica's share of a
-- destination's in-flight limit. A replica that stops renewing its row
-- leaves nothing behind: its row expires, its shares go with it, and a
-- probe it held ends with its own lease. Only the database named by
-- coordination.outbox uses them; the tables are small and are created in
-- every schema so that any outbox can be named. Additive: older relays
-- ignore them.

-- +goose Up
CREATE TABLE {{.Schema}}.outbox_fleet_replicas (
    replica    text        PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

CREATE TABLE {{.Schema}}.outbox_fleet_breakers (
    destination text        PRIMARY KEY,
    state       text        NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open')),
    open_until  timestamptz,
    streak      integer     NOT NULL DEFAULT 0,
    generation  bigint      NOT NULL DEFAULT 0,
    probe_by    text,
    probe_until timestamptz,
    last_error  text,
    changed_by  text,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{.Schema}}.outbox_fleet_shares (
    destination text    NOT NULL,
    replica     text    NOT NULL REFERENCES {{.Schema}}.outbox_fleet_replicas ON DELETE CASCADE,
    slots       integer NOT NULL CHECK (slots >= 0),
    PRIMARY KEY (destination, replica)
);

-- +goose Down
DROP TABLE {{.Schema}}.outbox_fleet_shares;
DROP TABLE {{.Schema}}.outbox_fleet_breakers;
DROP TABLE {{.Schema}}.outbox_fleet_replicas;
