-- Failure groups: dead letters grouped by destination, reason and a
-- fingerprint of their error, so that an operator sees "4,000 rows: HTTP
-- <n> from the billing hook" rather than 4,000 rows. The fingerprint is
-- the error with what varies from row to row masked: quoted values, UUIDs
-- and long hexadecimal ids, then numbers (with a unit such as ms). A
-- group's id is the start of an MD5 of the three, kept in error_group when
-- the relay dead-letters a row. Both are computed here, in SQL, for the
-- relay's write-back and for rows dead-lettered before this migration
-- alike.
--
-- Additive (functions and a nullable column; the lock is brief, and gives
-- up after two seconds): older relays keep running during a rolling
-- upgrade; the rows they dead-letter meanwhile get their group when groups
-- are next read.

-- +goose Up
SET LOCAL lock_timeout = '2s';

-- +goose StatementBegin
CREATE FUNCTION {{.Schema}}.outbox_error_fingerprint(err text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT left(btrim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(err,
        -- quoted values
        '"[^"]*"|''[^'']*''|`[^`]*`', '<q>', 'g'),
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
COMMENT ON FUNCTION {{.Schema}}.outbox_error_fingerprint(text) IS
    'outbox-relay: the error text with quoted values, ids and numbers masked, for failure groups';

-- +goose StatementBegin
CREATE FUNCTION {{.Schema}}.outbox_error_group(destination text, reason text, err text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT left(md5(coalesce(destination, '') || chr(31) || coalesce(reason, '') || chr(31)
    || coalesce({{.Schema}}.outbox_error_fingerprint(err), '')), 12)
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION {{.Schema}}.outbox_error_group(text, text, text) IS
    'outbox-relay: the failure group of a dead letter at destination for reason with error err';

ALTER TABLE {{.Schema}}.outbox ADD COLUMN error_group text;

-- +goose Down
SET LOCAL lock_timeout = '2s';
ALTER TABLE {{.Schema}}.outbox DROP COLUMN error_group;
DROP FUNCTION {{.Schema}}.outbox_error_group(text, text, text);
DROP FUNCTION {{.Schema}}.outbox_error_fingerprint(text);
