// Package pgtest gives tests a real PostgreSQL: one server per test package,
// and a fresh schema or database per test that needs isolation.
//
// The server comes from, in order: OUTBOX_TEST_DATABASE_URL; a throwaway
// cluster started from the local PostgreSQL binaries; or, without them, a
// container started with testcontainers-go when a Docker engine answers.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
)

// EnvURL names the variable that points the tests at an existing server.
// The role needs CREATEDB for tests that create databases.
const EnvURL = "OUTBOX_TEST_DATABASE_URL"

// baseURL is the package's server, database "postgres" unless EnvURL says
// otherwise.
var baseURL string

// Setup prepares a test package once its server runs, and returns what to
// undo after the tests (or nil).
type Setup func(serverURL string) (cleanup func(), err error)

// Main starts the package's server, runs the setups with the server's URL,
// runs the tests, undoes the setups and stops the server. Call it from
// TestMain.
func Main(m *testing.M, setups ...Setup) {
	if !flag.Parsed() {
		flag.Parse()
	}
	stop, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	var cleanups []func()
	undo := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	for _, s := range setups {
		c, err := s(baseURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: setup:", err)
			undo()
			_ = stop()
			os.Exit(1)
		}
		if c != nil {
			cleanups = append(cleanups, c)
		}
	}
	code := m.Run()
	undo()
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest: stop:", err)
	}
	os.Exit(code)
}

// WaitingTests is a Setup for packages whose tests mostly wait (on the
// server, a backoff, a breaker's cool-down) and use little CPU: it runs 4 ×
// GOMAXPROCS of their parallel tests at once, where go test's default,
// GOMAXPROCS, leaves the machine idle, unless -parallel says otherwise.
// Not for packages of tests that start relay processes or servers.
func WaitingTests(string) (func(), error) { return nil, parallelTests(4) }

// ProcessTests is a Setup for packages whose tests mostly wait on what
// they run (relays, their processes and servers, faults held for seconds)
// but use the CPU in bursts meanwhile: it runs 2 × GOMAXPROCS of their
// parallel tests at once, unless -parallel says otherwise.
func ProcessTests(string) (func(), error) { return nil, parallelTests(2) }

// parallelTests runs factor × GOMAXPROCS parallel tests at once, unless
// -parallel says otherwise.
func parallelTests(factor int) error {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if set {
		return nil
	}
	return flag.Set("test.parallel", strconv.Itoa(factor*runtime.GOMAXPROCS(0)))
}

func start() (stop func() error, err error) {
	if u := os.Getenv(EnvURL); u != "" {
		baseURL = u
		return func() error { return nil }, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Local binaries first: a cluster of the package's own starts in a
	// second and allows what some tests need. A container only where
	// there are none.
	if _, err := pgserver.FindBinaries(); err != nil {
		if u, stop, ok := startContainer(ctx); ok {
			baseURL = u
			return stop, nil
		}
	}
	// Prepared transactions are allowed: tests of what holds the xmin
	// horizon prepare one. pg_stat_statements counts what each statement
	// reads, for tests of what a claim costs the database. Logical
	// decoding serves the outboxes captured from the write-ahead log.
	srv, err := pgserver.Start(ctx, pgserver.Options{Settings: map[string]string{
		"max_prepared_transactions": "10",
		"wal_level":                 "logical",
		"max_replication_slots":     "40",
		"max_wal_senders":           "40",
		"shared_preload_libraries":  "pg_stat_statements",
		"pg_stat_statements.max":    "10000",
	}})
	if err != nil {
		return nil, err
	}
	baseURL = srv.DSN("postgres")
	return srv.Stop, nil
}

// URL returns the connection string of the package's server.
func URL(tb testing.TB) string {
	tb.Helper()
	if baseURL == "" {
		tb.Fatal("pgtest: no server; call pgtest.Main from TestMain")
	}
	return baseURL
}

// NewDatabase creates an empty database and returns its connection string.
// The database is dropped when the test ends.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	ctx := context.Background()
	name := "t_" + randomSuffix()
	dsn, err := CreateDatabase(ctx, URL(tb), name)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := DropDatabase(ctx, URL(tb), name); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

// UniqueName returns prefix followed by a random suffix, for databases and
// schemas that must not collide with those of other test runs.
func UniqueName(prefix string) string { return prefix + "_" + randomSuffix() }

// DropDatabase drops database name, disconnecting its sessions.
func DropDatabase(ctx context.Context, serverURL, name string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// CreateDatabase creates database name on the server serverURL points at and
// returns a connection string for it. Use it from Main's setup functions,
// where there is no test to clean up after; NewDatabase otherwise.
func CreateDatabase(ctx context.Context, serverURL, name string) (string, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", fmt.Errorf("parse server URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// Schema is a fresh, migrated outbox schema.
type Schema struct {
	// Name is the schema's name.
	Name string
	// URL connects to the schema's database.
	URL string
	// Pool connects with search_path set to the schema, so test SQL can
	// name the outbox table unqualified.
	Pool *pgxpool.Pool
}

// Exec runs sql on the schema's pool and fails the test on error.
func (s *Schema) Exec(tb testing.TB, sql string, args ...any) {
	tb.Helper()
	if _, err := s.Pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// WithConns returns the schema with a pool of its own of up to conns
// connections, for tests that hold many at once; it closes when the test
// ends.
func (s *Schema) WithConns(tb testing.TB, conns int32) *Schema {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		tb.Fatalf("pgtest: parse URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = s.Name
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return &Schema{Name: s.Name, URL: s.URL, Pool: pool}
}

// NewSchema creates a schema in the package server's default database,
// migrated (see createSchema), and drops it when the test ends.
func NewSchema(tb testing.TB) *Schema {
	tb.Helper()
	return NewSchemaIn(tb, URL(tb))
}

// NewSchemaIn is NewSchema in the database that dbURL names.
func NewSchemaIn(tb testing.TB, dbURL string) *Schema {
	tb.Helper()
	ctx := context.Background()
	name := "t_" + randomSuffix()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatalf("pgtest: parse URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	if err := createSchema(ctx, pool, dbURL, name); err != nil {
		pool.Close()
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		pool.Close()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			tb.Errorf("pgtest: connect: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			tb.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return &Schema{Name: name, URL: dbURL, Pool: pool}
}

func randomSuffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// NewServer starts a throwaway PostgreSQL cluster of the test's own,
// beside the package's server, and stops it when the test ends: for tests
// that stop a database while another keeps running.
func NewServer(tb testing.TB) *pgserver.Server {
	tb.Helper()
	return NewServerWith(tb, nil)
}

// NewServerWith is NewServer with extra server settings.
func NewServerWith(tb testing.TB, settings map[string]string) *pgserver.Server {
	tb.Helper()
	srv, err := pgserver.Start(context.Background(), pgserver.Options{Settings: settings})
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() { _ = srv.Stop() })
	return srv
}
