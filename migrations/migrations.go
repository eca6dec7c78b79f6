// Package migrations holds the outbox schema as goose SQL migrations embedded
// in the binary, and runs them against a configurable PostgreSQL schema.
//
// The SQL files name every object through the {{.Schema}} placeholder; they
// are rendered for the configured schema before goose reads them, so one
// database can hold several independent outboxes (one per schema) and every
// statement is schema-qualified whatever the session's search_path.
package migrations

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"testing/fstest"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/internal/db/schema"
)

//go:embed *.sql
var files embed.FS

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = schema.Default

// VersionTable is the table, inside the configured schema, that records the
// applied migrations. It is not goose's default name so that an application
// that manages its own schema with goose keeps its own history.
const VersionTable = "outbox_relay_migrations"

// ValidateSchema reports whether name can be used as the outbox schema: a
// plain identifier (letters, digits, underscores) of at most 56 bytes.
func ValidateSchema(name string) error { return schema.Validate(name) }

// Migrator applies and reverts the outbox migrations in one schema.
type Migrator struct {
	db       *sql.DB
	schema   string
	lockID   int64
	provider *goose.Provider
}

// Result describes one migration that was applied or reverted.
type Result = goose.MigrationResult

// Status describes one known migration and whether it is applied.
type Status = goose.MigrationStatus

// New returns a Migrator for schema on db. The caller keeps ownership of db.
func New(db *sql.DB, schema string) (*Migrator, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	rendered, err := render(schema)
	if err != nil {
		return nil, err
	}
	store, err := database.NewStore(database.DialectPostgres, schema+"."+VersionTable)
	if err != nil {
		return nil, fmt.Errorf("create migration store: %w", err)
	}
	lockID := LockID(schema)
	// Replicas starting together all run "migrate up": one applies, the
	// others wait on the advisory lock and then find nothing to do.
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(lockID),
		lock.WithLockTimeout(1, 600), // poll every second for up to 10 minutes
	)
	if err != nil {
		return nil, fmt.Errorf("create migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectCustom, db, rendered,
		goose.WithStore(store),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return &Migrator{db: db, schema: schema, lockID: lockID, provider: provider}, nil
}

// LockID is the advisory lock key that serialises migrations of schema.
// Each schema has its own, so independent outboxes migrate independently.
func LockID(name string) int64 { return schema.LockID(name) }

// Up applies every pending migration, creating the schema if needed.
func (m *Migrator) Up(ctx context.Context) ([]*Result, error) {
	if err := m.ensureSchema(ctx); err != nil {
		return nil, err
	}
	var all []*Result
	for attempt := 1; ; attempt++ {
		res, err := m.provider.Up(ctx)
		all = append(all, res...)
		if err == nil {
			return all, nil
		}
		if !lockTimedOut(err) || attempt == lockAttempts {
			return all, fmt.Errorf("migrate %s up: %w", m.schema, err)
		}
		// A migration that changes the table gave up waiting for
		// transactions writing to it rather than hold producers
		// queued behind it; the migrations before it are applied.
		select {
		case <-ctx.Done():
			return all, fmt.Errorf("migrate %s up: %w", m.schema, err)
		case <-time.After(lockRetryDelay):
		}
	}
}

// lockAttempts is how often Up tries a migration that gives up waiting for
// its lock (lock_timeout), lockRetryDelay apart.
const (
	lockAttempts   = 30
	lockRetryDelay = time.Second
)

// lockTimedOut reports whether err is a statement's lock_timeout.
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

// Down reverts the most recently applied migration. Reverting the table's
// creation is refused while the table still holds rows.
func (m *Migrator) Down(ctx context.Context) (*Result, error) {
	if err := m.ensureSchema(ctx); err != nil {
		return nil, err
	}
	res, err := m.provider.Down(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate %s down: %w", m.schema, err)
	}
	return res, nil
}

// Status lists every known migration with the time it was applied, if it was.
func (m *Migrator) Status(ctx context.Context) ([]*Status, error) {
	if err := m.ensureSchema(ctx); err != nil {
		return nil, err
	}
	st, err := m.provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status of %s: %w", m.schema, err)
	}
	return st, nil
}

// ensureSchema creates the schema under the migration lock, because two
// concurrent CREATE SCHEMA IF NOT EXISTS can still collide on the catalog's
// unique index. It polls for the lock rather than wait in a transaction:
// a replica migrating meanwhile may build an index concurrently, which
// waits for every transaction with a snapshot, and a transaction waiting
// for that replica's lock would deadlock with it.
func (m *Migrator) ensureSchema(ctx context.Context) error {
	for {
		created, err := m.tryCreateSchema(ctx)
		if err != nil {
			return fmt.Errorf("create schema %s: %w", m.schema, err)
		}
		if created {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create schema %s: waiting for another migration: %w", m.schema, ctx.Err())
		case <-time.After(schemaLockPoll):
		}
	}
}

// schemaLockPoll is how often ensureSchema tries the migration lock.
const schemaLockPoll = 100 * time.Millisecond

// tryCreateSchema creates the schema if the migration lock is free, and
// reports whether it was.
func (m *Migrator) tryCreateSchema(ctx context.Context) (bool, error) {
	v, err := outboxdb.NewVersions(m.schema, VersionTable, CompatibilityTable)
	if err != nil {
		return false, err
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var locked bool
	if err := tx.QueryRowContext(ctx, v.Lock, m.lockID).Scan(&locked); err != nil {
		return false, fmt.Errorf("lock: %w", err)
	}
	if !locked {
		return false, nil
	}
	if _, err := tx.ExecContext(ctx, v.Create); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// render returns the embedded migrations with the schema filled in.
func render(name string) (fs.FS, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	data := struct{ Schema, SchemaText, Publication, Prefix string }{
		Schema:      pgx.Identifier{name}.Sanitize(),
		SchemaText:  name,
		Publication: schema.Publication(name),
		Prefix:      schema.MessagePrefix(name),
	}
	out := fstest.MapFS{}
	for _, file := range names {
		src, err := files.ReadFile(file)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(file).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("parse migration %s: %w", file, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("render migration %s: %w", file, err)
		}
		out[file] = &fstest.MapFile{Data: buf.Bytes(), Mode: 0o444}
	}
	return out, nil
}
