{{/*
The per-minute history of what the replicas did ({{.History}}), which
package history writes and the console's trends read. Durations are in
microseconds.
*/}}

{{/* A replica's counts for a minute: added to what it wrote for that minute already. */}}
{{define "history_add"}}
INSERT INTO {{.History}} AS h (minute, destination, replica, delivered, retried, dead_lettered, lag_counts)
VALUES (date_trunc('minute', $1::timestamptz), $2, $3, $4, $5, $6, $7)
ON CONFLICT (minute, destination, replica) DO UPDATE SET
    delivered = h.delivered + excluded.delivered,
    retried = h.retried + excluded.retried,
    dead_lettered = h.dead_lettered + excluded.dead_lettered,
    lag_counts = {{.HistoryAdd}}(h.lag_counts, excluded.lag_counts)
{{end}}

{{/* Whether the minute's backlog is still to be counted: one replica a minute counts it. */}}
{{define "history_backlog_due"}}
SELECT NOT EXISTS (SELECT 1 FROM {{.History}} WHERE minute = date_trunc('minute', $1::timestamptz) AND destination = '' AND replica = '')
{{end}}

{{define "history_backlog"}}
INSERT INTO {{.History}} (minute, destination, replica, pending, oldest_pending_ms)
VALUES (date_trunc('minute', $1::timestamptz), '', '', $2, $3)
ON CONFLICT (minute, destination, replica) DO NOTHING
{{end}}

{{/* Rows older than the retention ($1): a range of the primary key. */}}
{{define "history_trim"}}
DELETE FROM {{.History}} WHERE minute < date_trunc('minute', now() - $1 * interval '1 microsecond')
{{end}}

{{define "changes_trim"}}
DELETE FROM {{.Changes}} WHERE at < now() - $1 * interval '1 microsecond'
{{end}}

{{define "change_add"}}
INSERT INTO {{.Changes}} (at, destination, replica, from_state, to_state, cooldown_ms, last_error)
VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''))
{{end}}

{{/* A destination's ($1) latest changes, newest first, up to $2. */}}
{{define "changes"}}
SELECT at, replica, from_state, to_state, coalesce(cooldown_ms, 0), coalesce(last_error, '')
FROM {{.Changes}} WHERE destination = $1 ORDER BY at DESC, id DESC LIMIT $2
{{end}}

{{/*
The history from $1 to $2 in steps of $3, each step's counts summed over
the replicas (the backlog: its highest in the step), by destination; the
lag histogram's buckets (.Buckets, numbered from 1) each summed.
*/}}
{{define "history_series"}}
SELECT date_bin($3 * interval '1 microsecond', minute, $1::timestamptz), destination,
       sum(delivered)::bigint, sum(retried)::bigint, sum(dead_lettered)::bigint,
       max(pending), max(oldest_pending_ms)
       {{- range .Buckets}}, coalesce(sum(lag_counts[{{.}}]), 0)::bigint{{end}}
FROM {{.History}}
WHERE minute >= $1 AND minute < $2
GROUP BY 1, 2 ORDER BY 1, 2
{{end}}

{{define "history_now"}}SELECT now(){{end}}
