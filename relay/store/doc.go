// Package store is the relay's claim engine on the outbox table: it claims
// due rows in id order within the partitions this process leases, keeps each
// key's rows in order (and, with strict order, waits for transactions that
// may still commit below what it claimed), writes every outcome back in the
// claim's transaction, and runs retention.
//
// Applications do not import it: they write messages with package outbox.
// The relay's engine (package relay) drives a Store; its statements are in
// internal/db/outboxdb.
package store
