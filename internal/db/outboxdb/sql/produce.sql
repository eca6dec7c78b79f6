{{/*
The producer's write: messages as arrays, one element each. WITH
ORDINALITY and ORDER BY make ids follow the caller's order, which is the
delivery order of messages that share a key. A delay is counted from the
database's clock.
*/}}

{{define "produce"}}
INSERT INTO {{.Outbox}} (event_id, topic, key, payload, headers, next_attempt_at)
SELECT m.event_id, m.topic, m.key, m.payload, m.headers::jsonb, now() + m.delay_us * interval '1 microsecond'
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::bigint[])
     WITH ORDINALITY AS m(event_id, topic, key, payload, headers, delay_us, ord)
ORDER BY m.ord
{{end}}

{{/*
The producer's write into the write-ahead log (an outbox captured from
the log): outbox_emit once a message, in the caller's order, which the
sort keeps (a volatile function is computed after ORDER BY).
*/}}

{{define "emit"}}
SELECT {{.Emit}}(m.topic, m.key, m.payload, m.headers::jsonb, m.event_id)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[])
     WITH ORDINALITY AS m(event_id, topic, key, payload, headers, ord)
ORDER BY m.ord
{{end}}
