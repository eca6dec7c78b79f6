{{/*
What the relay reads from the server rather than from its tables: the
checks strict order needs, the transaction ids and sequence the safe id
and the watermark are made of, who holds strict order or the xmin
horizon, the pending indexes' statistics; and the small statements the
claims and listeners send beside their own. The claim engine (package
outbox) queues several of them in one batch, so they are rendered here
and run there.
*/}}

{{/*
Strict order needs the xid trigger enabled, the id sequence of the outbox
readable and without a per-session cache. $1 is the outbox, $2 the
trigger's name.
*/}}
{{define "strict_check"}}
SELECT
    coalesce((SELECT tgenabled::text FROM pg_trigger WHERE tgrelid = $1::text::regclass AND tgname = $2), ''),
    pg_get_serial_sequence($1::text, 'id'),
    (SELECT seqcache FROM pg_sequence WHERE seqrelid = pg_get_serial_sequence($1::text, 'id')::regclass),
    has_sequence_privilege(pg_get_serial_sequence($1::text, 'id'), 'SELECT,USAGE')
{{end}}

{{/*
The observation reads the sequence, then the transaction ids in a
statement of its own, after the sequence was read: the snapshot's xmin,
and the next transaction id, which no function returns without taking it.
age(xid) is the next transaction id minus xid, for a transaction without
one (read at its first call), so xmin plus its age is the next
transaction id with its epoch.
*/}}
{{define "observe_last"}}
SELECT coalesce(pg_sequence_last_value($1::regclass), 0)
{{end}}

{{define "observe_xids"}}
SELECT x, x + age((x % 4294967296)::text::xid)
FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS x) s
{{end}}

{{/*
The oldest transaction by its transaction id, among backends and prepared
transactions. backend_xid is shown for every backend; its start time only
to roles allowed to see it.
*/}}
{{define "order_holder"}}
SELECT coalesce(pid, 0), coalesce(gid, ''), coalesce(extract(epoch FROM now() - started), 0)::float8,
       coalesce(datname, ''), coalesce(usename, ''), coalesce(application_name, ''), coalesce(state, '')
FROM (
    SELECT pid, NULL::text AS gid, backend_xid AS xid, xact_start AS started,
           datname::text, usename::text, application_name, state
    FROM pg_stat_activity WHERE backend_xid IS NOT NULL
    UNION ALL
    SELECT NULL, gid, transaction, prepared, database::text, owner::text, NULL, 'prepared'
    FROM pg_prepared_xacts
) t
ORDER BY age(xid) DESC
LIMIT 1
{{end}}

{{/*
The oldest transaction, as a 64-bit id, among those that hold the
outbox's ($1) insert lock and the database's prepared transactions; the
next transaction id when there is none. It reads the snapshot's oldest
and the next id as observe_xids does.
*/}}
{{define "lock_holders"}}
WITH n AS (
    SELECT x + age((x % 4294967296)::text::xid) AS next
    FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS x) s)
SELECT least(
    (SELECT min(n.next - age(a.backend_xid)) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'relation' AND l.relation = $1::regclass AND l.mode = 'RowExclusiveLock'
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()),
    (SELECT min(n.next - age(p.transaction)) FROM pg_prepared_xacts p WHERE p.database = current_database()),
    n.next)
FROM n
{{end}}

{{/* Tells one start of the database server from another. */}}
{{define "server_start"}}
SELECT pg_postmaster_start_time()
{{end}}

{{/*
The horizon's holders, the oldest first, at most $1. A session's horizon
is its snapshot's xmin or, without a snapshot, its own transaction id;
vacuum's own sessions are left out, as they hold back no one, and so are
walsenders, which are reported as standbys. A role without
pg_read_all_stats sees other users' sessions without their type, start
or state: sessions of no user (vacuum's) are left out then.
*/}}
{{define "horizon_holders"}}
SELECT kind, pid, name, usr, app, state, client, x::text, age(x),
       coalesce(extract(epoch FROM now() - since), 0)::float8
FROM (
    SELECT 'session' AS kind, pid, ''::text AS name, coalesce(usename::text, '') AS usr,
           coalesce(application_name, '') AS app, coalesce(state, '') AS state, ''::text AS client,
           coalesce(backend_xmin, backend_xid) AS x, xact_start AS since
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND usename IS NOT NULL AND coalesce(backend_type, '') NOT IN ('autovacuum worker', 'walsender')
      AND coalesce(backend_xmin, backend_xid) IS NOT NULL
    UNION ALL
    SELECT 'prepared', 0, gid, owner::text, '', 'prepared', '', transaction, prepared
    FROM pg_prepared_xacts WHERE database = current_database()
    UNION ALL
    SELECT 'slot', coalesce(active_pid, 0), slot_name::text, '', '',
           CASE WHEN active THEN 'active' ELSE 'inactive' END, slot_type, xmin, NULL
    FROM pg_replication_slots WHERE xmin IS NOT NULL
    UNION ALL
    SELECT 'standby', pid, coalesce(application_name, ''), coalesce(usename::text, ''), coalesce(application_name, ''),
           coalesce(state, ''), coalesce(host(client_addr), ''), backend_xmin, NULL
    FROM pg_stat_replication WHERE backend_xmin IS NOT NULL
) h
ORDER BY age(x) DESC
LIMIT $1
{{end}}

{{/*
The statistics of the outbox's ($1) indexes of pending rows (those whose
predicate names the pending status) summed, and whether the role sees
other sessions' details.
*/}}
{{define "pending_index_stats"}}
SELECT coalesce(sum(s.idx_scan), 0)::bigint, coalesce(sum(s.idx_tup_read), 0)::bigint,
       coalesce(sum(s.idx_tup_fetch), 0)::bigint, pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
FROM pg_stat_user_indexes s JOIN pg_index i ON i.indexrelid = s.indexrelid
WHERE s.relid = $1::regclass AND pg_get_expr(i.indpred, i.indrelid) LIKE '%''pending''%'
{{end}}

{{/* The database's clock, for a claim that read no row, or an operator's cutoff. */}}
{{define "now"}}
SELECT now()
{{end}}

{{/* A notification on channel $1 with payload $2: wake-ups, partitions shared anew. */}}
{{define "notify"}}
SELECT pg_notify($1, $2)
{{end}}

{{/* The listener's subscription; the channel is an identifier. */}}
{{define "listen"}}
LISTEN {{.Channel}}
{{end}}

{{/* The free rows' look takes their locks in a savepoint and gives them back. */}}
{{define "free_rows_savepoint"}}
SAVEPOINT outbox_free_rows
{{end}}

{{define "free_rows_rollback"}}
ROLLBACK TO SAVEPOINT outbox_free_rows
{{end}}

{{/* For the transaction only: commit without waiting for the WAL flush. */}}
{{define "async_commit"}}
SELECT set_config('synchronous_commit', 'off', true)
{{end}}
