{{/*
The console's sessions signed in through an identity provider
({{.Sessions}}), by the SHA-256 of their id.
*/}}

{{/* A new session; the expired ones go with it. */}}
{{define "session_create"}}
WITH trimmed AS (DELETE FROM {{.Sessions}} WHERE expires_at <= now())
INSERT INTO {{.Sessions}} (id_sha256, name, source, credential, groups, expires_at)
VALUES ($1, $2, $3, $4, $5, $6)
{{end}}

{{/* A session that has not expired. */}}
{{define "session_get"}}
SELECT name, source, credential, groups, expires_at FROM {{.Sessions}}
WHERE id_sha256 = $1 AND expires_at > now()
{{end}}

{{define "session_delete"}}
DELETE FROM {{.Sessions}} WHERE id_sha256 = $1
{{end}}
