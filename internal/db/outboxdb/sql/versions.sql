{{/*
A schema's migration state, read before goose runs (the binary refuses a
schema it cannot run on) and the lock under which migrations run.
{{.Versions}} is goose's table, {{.Compatibility}} the oldest relay
version the schema works with.
*/}}

{{/* Whether the two tables exist: $1 and $2 are their quoted names, as text. */}}
{{define "versions_tables"}}
SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL
{{end}}

{{/* The newest applied migration, as goose reads it. */}}
{{define "versions_found"}}
SELECT coalesce(max(version_id), 0) FROM {{.Versions}}
{{end}}

{{define "versions_compatible_from"}}
SELECT compatible_from FROM {{.Compatibility}}
{{end}}

{{/* One migrating process at a time per schema: $1 is its lock id. */}}
{{define "versions_lock"}}
SELECT pg_try_advisory_xact_lock($1)
{{end}}

{{define "versions_create_schema"}}
CREATE SCHEMA IF NOT EXISTS {{.Schema}}
{{end}}
