{{/*
The table's side of an outbox captured from the write-ahead log: messages
read from the log that must wait (a retry, a dead letter, a key with rows
in the table) are written into the outbox table, where the table's claims,
backoff, dead letters and operator tools own them.
*/}}

{{define "log_reserve_ids"}}
-- Ids for messages read from the log, from the table's own identity: a
-- message written into the table later keeps the id it was delivered
-- under, and its key's later messages get higher ones. The sequence is
-- named here, not looked up on every call: capture_check checks it is
-- the id column's.
SELECT nextval('{{.IDs}}'::regclass) FROM generate_series(1, $1)
{{end}}

{{define "log_keys_in_table"}}
-- Of the keys $1, those with a row in the table that goes first: pending
-- (waiting, ready or in flight), or a dead letter that parks its key. One
-- probe a key on each index.
SELECT c.key FROM unnest($1::text[]) AS c(key)
WHERE EXISTS (SELECT FROM {{.Outbox}} AS p WHERE p.status = 'pending' AND p.key IS NOT NULL AND p.key = c.key)
   OR EXISTS (SELECT FROM {{.Outbox}} AS p WHERE p.key_parked AND p.key = c.key)
{{end}}

{{define "log_adopt"}}
-- Messages read from the log written into the table as pending rows under
-- the ids they were delivered with, ready now: next_attempt_at apart from
-- created_at puts them among the rows that waited, which claims find at
-- any id, and behind which the key check holds their keys' later rows.
-- A message already in the table (read again after a restart) keeps its
-- row. The outcomes are written over them in the same transaction.
INSERT INTO {{.Outbox}} AS o (id, event_id, topic, key, payload, headers, created_at, next_attempt_at)
OVERRIDING SYSTEM VALUE
SELECT m.id, m.event_id, m.topic, m.key, m.payload, m.headers::jsonb, m.created_at,
       greatest(statement_timestamp(), m.created_at + interval '1 microsecond')
FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::timestamptz[])
     AS m(id, event_id, topic, key, payload, headers, created_at)
ON CONFLICT (event_id) DO NOTHING
{{end}}

{{/*
Capture from the log: the outbox's slot (named by the schema's
outbox_capture_slot(), unique in the cluster) and publication
({{.Publication}}), read and set up. The stream's connection is a
replication connection, which takes no parameters: the names are written
in.
*/}}

{{define "capture_slot"}}
-- The slot's name, and where its stream starts; no position: the slot
-- does not exist.
SELECT n.name, coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.wal_status, '')
FROM (SELECT {{.Schema}}.outbox_capture_slot() AS name) AS n
LEFT JOIN pg_replication_slots AS s ON s.slot_name = n.name AND s.database = current_database()
{{end}}

{{define "capture_check"}}
-- What capture from the log needs: one row each, (what, ok, what is found).
SELECT 'wal_level', current_setting('wal_level') = 'logical', 'wal_level is ' || current_setting('wal_level')
UNION ALL
SELECT 'replication', r.rolreplication OR r.rolsuper, 'role ' || r.rolname
FROM pg_roles AS r WHERE r.rolname = current_user
UNION ALL
SELECT 'function', to_regprocedure('{{.Emit}}(text, text, bytea, jsonb, uuid)') IS NOT NULL
    AND to_regprocedure('{{.Schema}}.outbox_capture_slot()') IS NOT NULL, 'outbox_emit'
UNION ALL
SELECT 'publication', EXISTS (SELECT FROM pg_publication WHERE pubname = '{{.Publication}}'), 'publication {{.Publication}}'
UNION ALL
SELECT 'identity', coalesce(pg_get_serial_sequence('{{.Outbox}}', 'id')::regclass = to_regclass('{{.IDs}}'), false),
    'the outbox''s id column takes its values from ' || coalesce(pg_get_serial_sequence('{{.Outbox}}', 'id'), 'no sequence')
{{end}}

{{define "capture_slot_check"}}
-- Once the function exists: the slot, there and not lost.
SELECT 'slot', EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = {{.Schema}}.outbox_capture_slot()
    AND database = current_database() AND coalesce(wal_status, '') <> 'lost'), 'slot ' || {{.Schema}}.outbox_capture_slot()
{{end}}

{{define "capture_create_publication"}}
-- No tables: pgoutput sends the messages, and with PostgreSQL 15 and
-- later skips the transactions without one.
CREATE PUBLICATION {{.PublicationIdent}}
{{end}}

{{define "capture_create_slot"}}
SELECT lsn::text FROM pg_create_logical_replication_slot({{.Schema}}.outbox_capture_slot(), 'pgoutput')
{{end}}

{{define "capture_drop_slot"}}
SELECT pg_drop_replication_slot({{.Schema}}.outbox_capture_slot())
{{end}}

{{define "capture_slot_state"}}
-- The slot as the server sees it: how far its confirmed position is
-- behind the end of the log, in bytes, and whether the log it needs is
-- still there (wal_status). No row: the slot does not exist.
SELECT active, coalesce(wal_status, ''), coalesce(confirmed_flush_lsn::text, ''),
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
FROM pg_replication_slots WHERE slot_name = {{.Schema}}.outbox_capture_slot() AND database = current_database()
{{end}}
