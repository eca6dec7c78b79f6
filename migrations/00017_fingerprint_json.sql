-- Failure groups mask the values inside JSON bodies. A receiver's answer
-- is quoted into last_error Go-style ("{\"error\":\"...\"}"), and the first
-- fingerprint paired its escaped quotes wrongly: the values inside were not
-- masked, so answers differing only in a value fell into groups of their
-- own. The fingerprint now masks each escaped string that is a value (not
-- a key, which is followed by a colon) first, then plain quoted values
-- without escapes; numbers and ids inside the body are masked as anywhere.
--
-- Every dead letter is regrouped: a group's id is made from its
-- fingerprint, so a group whose fingerprint changes gets a new id (links to
-- the old one find nothing), and groups that differed only by a value
-- inside a body become one. Outside a transaction, in batches along the
-- dead letters' index, each committed, so that producers are never blocked;
-- interrupted, 'migrate up' runs it again and redoes only what differs.
-- Relays of version 14 and later use the new function at once: it is the
-- database's.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{.Schema}}.outbox_error_fingerprint(err text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT left(btrim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(err,
        -- inside a quoted body: its keys (escaped strings before a colon)
        -- set aside, between chr(1) and chr(2)
        '\\"((?:[^"\\]|\\\\\\"|\\\\)*)\\"(?=\s*:)', chr(1) || '\1' || chr(2), 'g'),
        -- its other escaped strings, values, masked, escaped quotes inside
        -- them (nested JSON) included
        '\\"(?:[^"\\]|\\\\\\"|\\\\)*\\"', '<q>', 'g'),
        -- quoted values without escapes (nor keys set aside: not a
        -- body)
        '"[^"\\\x01\x02]*"|''[^''\\]*''|`[^`]*`', '<q>', 'g'),
        -- the keys put back
        '[\x01\x02]', '\\"', 'g'),
        -- UUIDs
        '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
        -- hexadecimal ids: eight digits or more, both letters and decimals
        '\m(0x)?(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\M', '<id>', 'g'),
        -- numbers, dotted (addresses) or with a unit (12ms, 3.5s), but not
        -- the digits of a word or a version (utf8, v1.2)
        '(?<![[:alnum:]_.])[0-9]+(\.[0-9]+)*([a-zA-Z]{1,2})?\M', '<n>', 'g'),
    '\s+', ' ', 'g')), 500)
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    at timestamptz := '-infinity';
    last bigint := 0;
    upto_at timestamptz;
    upto bigint;
BEGIN
    LOOP
        SELECT b.dead_lettered_at, b.id INTO upto_at, upto
        FROM (SELECT dead_lettered_at, id FROM {{.Schema}}.outbox
              WHERE status IN ('dead_lettered', 'discarded') AND (dead_lettered_at, id) > (at, last)
              ORDER BY dead_lettered_at, id LIMIT 5000) AS b
        ORDER BY b.dead_lettered_at DESC, b.id DESC LIMIT 1;
        EXIT WHEN upto IS NULL;
        UPDATE {{.Schema}}.outbox
        SET error_group = {{.Schema}}.outbox_error_group(destination, dead_letter_reason, last_error)
        WHERE status IN ('dead_lettered', 'discarded')
          AND error_group IS DISTINCT FROM {{.Schema}}.outbox_error_group(destination, dead_letter_reason, last_error)
          AND (dead_lettered_at, id) > (at, last) AND (dead_lettered_at, id) <= (upto_at, upto);
        COMMIT;
        at := upto_at;
        last := upto;
    END LOOP;
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{.Schema}}.outbox_error_fingerprint(err text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT left(btrim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(err,
        '"[^"]*"|''[^'']*''|`[^`]*`', '<q>', 'g'),
        '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
        '\m(0x)?(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\M', '<id>', 'g'),
        '(?<![[:alnum:]_.])[0-9]+(\.[0-9]+)*([a-zA-Z]{1,2})?\M', '<n>', 'g'),
    '\s+', ' ', 'g')), 500)
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    at timestamptz := '-infinity';
    last bigint := 0;
    upto_at timestamptz;
    upto bigint;
BEGIN
    LOOP
        SELECT b.dead_lettered_at, b.id INTO upto_at, upto
        FROM (SELECT dead_lettered_at, id FROM {{.Schema}}.outbox
              WHERE status IN ('dead_lettered', 'discarded') AND (dead_lettered_at, id) > (at, last)
              ORDER BY dead_lettered_at, id LIMIT 5000) AS b
        ORDER BY b.dead_lettered_at DESC, b.id DESC LIMIT 1;
        EXIT WHEN upto IS NULL;
        UPDATE {{.Schema}}.outbox
        SET error_group = {{.Schema}}.outbox_error_group(destination, dead_letter_reason, last_error)
        WHERE status IN ('dead_lettered', 'discarded')
          AND error_group IS DISTINCT FROM {{.Schema}}.outbox_error_group(destination, dead_letter_reason, last_error)
          AND (dead_lettered_at, id) > (at, last) AND (dead_lettered_at, id) <= (upto_at, upto);
        COMMIT;
        at := upto_at;
        last := upto;
    END LOOP;
END $$;
-- +goose StatementEnd
