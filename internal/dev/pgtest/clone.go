package pgtest

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// A test's schema is a copy of one migrated once per database and test
// process: the schema as pg_dump prints it (objects, the migrations'
// record, sequences), run under the new schema's name in one statement
// batch. The migrations one by one cost a test a third of a second of
// the server's and its own time, most of it round trips; the copy a
// tenth of that. Where pg_dump is missing or fails (a server in a
// container), each schema is migrated.

// migrated is one database's migrated schema, dumped.
type migrated struct {
	once sync.Once
	name string // the schema's name in dump
	dump string
	err  error
}

var dumps struct {
	mu sync.Mutex
	by map[string]*migrated
}

// dumpFor returns the migrated schema of the database dbURL names, as SQL
// that creates it under the name it returns, or an error if it cannot be
// dumped.
func dumpFor(ctx context.Context, dbURL string) (name, dump string, err error) {
	dumps.mu.Lock()
	if dumps.by == nil {
		dumps.by = map[string]*migrated{}
	}
	m := dumps.by[dbURL]
	if m == nil {
		m = &migrated{}
		dumps.by[dbURL] = m
	}
	dumps.mu.Unlock()
	m.once.Do(func() { m.name, m.dump, m.err = migrateAndDump(ctx, dbURL) })
	return m.name, m.dump, m.err
}

// migrateAndDump migrates a schema in dbURL's database, dumps it and drops
// it.
func migrateAndDump(ctx context.Context, dbURL string) (name, dump string, err error) {
	bin, err := pgserver.FindBinaries()
	if err != nil {
		return "", "", err
	}
	name = "t_" + randomSuffix()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return "", "", err
	}
	defer pool.Close()
	if err := migrate(ctx, pool, name); err != nil {
		return "", "", err
	}
	defer func() {
		if _, derr := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); derr != nil && err == nil {
			err = fmt.Errorf("drop schema %s: %w", name, derr)
		}
	}()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "pg_dump"), "--schema="+name, "--no-owner", "--inserts", "--dbname="+dbURL).Output()
	if err != nil {
		return "", "", fmt.Errorf("pg_dump: %w", err)
	}
	return name, statements(string(out)), nil
}

// statements leaves out of a dump what only psql understands: its
// meta-commands, which newer dumps begin and end with.
func statements(dump string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(dump))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		if line := sc.Text(); !strings.HasPrefix(line, `\`) {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// migrate applies the outbox migrations to schema name.
func migrate(ctx context.Context, pool *pgxpool.Pool, name string) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	m, err := migrations.New(db, name)
	if err != nil {
		return err
	}
	_, err = m.Up(ctx)
	return err
}

// CreateSchema creates the migrated schema name in dbURL's database, on
// pool, as test schemas are made: a copy of one migrated once per
// database and process where it can be dumped, else by migrating it. For
// tools that make many schemas, such as the benchmark.
func CreateSchema(ctx context.Context, pool *pgxpool.Pool, dbURL, name string) error {
	return createSchema(ctx, pool, dbURL, name)
}

// createSchema creates the migrated schema name in dbURL's database: a
// copy of the dumped one where there is one, else by migrating it.
func createSchema(ctx context.Context, pool *pgxpool.Pool, dbURL, name string) error {
	from, dump, err := dumpFor(ctx, dbURL)
	if err != nil {
		return migrate(ctx, pool, name)
	}
	// A connection of its own: the dump sets the session's search_path.
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// No arguments: the simple protocol, every statement in one
	// implicit transaction.
	if _, err := conn.Exec(ctx, strings.ReplaceAll(dump, from, name)); err != nil {
		return fmt.Errorf("copy the migrated schema: %w", err)
	}
	return nil
}
