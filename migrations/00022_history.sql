-- A short history of what the relay's replicas did, minute by minute, for
-- the console's trends: each replica adds its own counts (delivered,
-- retried, dead-lettered, and the delivery lag as histogram buckets) per
-- destination, and one replica a minute records the outbox's backlog
-- (destination and replica ''). The replicas' counts add up to the
-- fleet's; restarts lose nothing but the minute a process was killed in.
-- Rows older than the history's retention are deleted by the replicas
-- that write it: at most one row a minute per destination and replica,
-- and one for the backlog. Beside it, the breakers' changes. Additive:
-- older relays ignore them.

-- +goose Up
CREATE TABLE {{.Schema}}.outbox_history (
    minute            timestamptz NOT NULL,
    destination       text        NOT NULL,
    replica           text        NOT NULL,
    delivered         bigint      NOT NULL DEFAULT 0,
    retried           bigint      NOT NULL DEFAULT 0,
    dead_lettered     bigint      NOT NULL DEFAULT 0,
    -- Rows delivered per bucket of delivery lag (the relay's histogram
    -- buckets, the last one unbounded), not cumulative.
    lag_counts        bigint[],
    -- The backlog row's: rows pending, and the age of the oldest.
    pending           bigint,
    oldest_pending_ms bigint,
    PRIMARY KEY (minute, destination, replica),
    CONSTRAINT outbox_history_minute_check CHECK (date_trunc('minute', minute) = minute)
);

-- Each replica's own changes of its destinations' breakers (openings,
-- probes, closings; not those it adopted from the fleet), for the
-- console's destination pages.
CREATE TABLE {{.Schema}}.outbox_breaker_changes (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    destination text        NOT NULL,
    replica     text        NOT NULL,
    from_state  text        NOT NULL,
    to_state    text        NOT NULL,
    cooldown_ms bigint,
    last_error  text
);
CREATE INDEX outbox_breaker_changes_destination_idx ON {{.Schema}}.outbox_breaker_changes (destination, at);
CREATE INDEX outbox_breaker_changes_at_idx ON {{.Schema}}.outbox_breaker_changes (at);

-- +goose StatementBegin
CREATE FUNCTION {{.Schema}}.outbox_history_add(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE
    WHEN a IS NULL THEN b
    WHEN b IS NULL THEN a
    ELSE ARRAY(SELECT coalesce(x, 0) + coalesce(y, 0) FROM unnest(a, b) WITH ORDINALITY AS t(x, y, i) ORDER BY i)
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION {{.Schema}}.outbox_history_add(bigint[], bigint[]);
DROP TABLE {{.Schema}}.outbox_breaker_changes;
DROP TABLE {{.Schema}}.outbox_history;
