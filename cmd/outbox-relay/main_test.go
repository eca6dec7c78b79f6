package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/dev/containertest"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

var binary string // the outbox-relay binary under test

// EnvBinary names the variable that points the tests at an outbox-relay
// binary built from this tree (make test builds it once for the packages
// that run it); without it, they build their own.
const EnvBinary = "OUTBOX_TEST_RELAY_BINARY"

func TestMain(m *testing.M) {
	flag.Parse()
	// The images take minutes to build: the tests that need no engine run
	// meanwhile.
	containertest.Prebuild()
	pgtest.Main(m, pgtest.ProcessTests, func(string) (func(), error) {
		if binary = os.Getenv(EnvBinary); binary != "" {
			return nil, nil
		}
		dir, err := os.MkdirTemp("", "outbox-relay-bin-")
		if err != nil {
			return nil, err
		}
		cleanup := func() { os.RemoveAll(dir) }
		binary = filepath.Join(dir, "outbox-relay")
		// Named as make names it: the commit and its time.
		var ldflags string
		if head, err := exec.Command("git", "log", "-1", "--format=%H %cI").Output(); err == nil {
			if rev, date, ok := strings.Cut(strings.TrimSpace(string(head)), " "); ok {
				ldflags = "-X main.revision=" + rev + " -X main.buildDate=" + date
			}
		}
		out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", binary, ".").CombinedOutput()
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("build outbox-relay: %v: %s", err, out)
		}
		return cleanup, nil
	})
}

type result struct {
	code           int
	stdout, stderr string
}

// runBinary runs the built binary with only the given environment.
func runBinary(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return result{code, stdout.String(), stderr.String()}
}

func TestMigrateUpStatusDown(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	env := []string{"OUTBOX_DATABASE_URL=" + dsn, "OUTBOX_DATABASE_SCHEMA=events"}

	r := runBinary(t, env, "migrate", "up")
	if r.code != 0 || !strings.Contains(r.stdout, "applied 00001_create_outbox.sql") {
		t.Fatalf("migrate up: code %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	r = runBinary(t, env, "migrate", "up")
	if r.code != 0 || !strings.Contains(r.stdout, "schema events is up to date") {
		t.Fatalf("second migrate up: code %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	r = runBinary(t, env, "migrate", "status")
	if r.code != 0 || strings.Count(r.stdout, " applied ") < 2 || strings.Contains(r.stdout, "pending") {
		t.Fatalf("migrate status: code %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	// The flag overrides the environment: schema "other" has nothing applied.
	r = runBinary(t, env, "migrate", "status", "--schema", "other")
	if r.code != 0 || !strings.Contains(r.stdout, "pending") {
		t.Fatalf("migrate status --schema other: code %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	r = runBinary(t, env, "migrate", "down")
	if r.code != 0 || strings.Count(r.stdout, "reverted ") != 1 {
		t.Fatalf("migrate down: code %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	// Only the latest is reverted.
	r = runBinary(t, env, "migrate", "status")
	if r.code != 0 || strings.Count(r.stdout, "pending") != 1 || strings.Contains(r.stdout, "00001_create_outbox.sql  pending") {
		t.Fatalf("migrate status after down: code %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

// Replicas that start together all run "migrate up".
func TestMigrateUpConcurrentProcesses(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	env := []string{"OUTBOX_DATABASE_URL=" + dsn}
	const n = 3
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runBinary(t, env, "migrate", "up")
		}()
	}
	wg.Wait()
	applied := 0
	for i, r := range results {
		if r.code != 0 {
			t.Errorf("process %d: code %d\nstdout: %s\nstderr: %s", i, r.code, r.stdout, r.stderr)
		}
		applied += strings.Count(r.stdout, "applied ")
	}
	r := runBinary(t, env, "migrate", "status")
	if strings.Count(r.stdout, " applied ") != applied || strings.Contains(r.stdout, "pending") {
		t.Fatalf("processes applied %d migrations in all; status:\n%s", applied, r.stdout)
	}
	// One correct schema: the table works and each trigger exists once.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var triggers string
	if err := conn.QueryRow(ctx, `SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_trigger
WHERE tgrelid = 'public.outbox'::regclass AND NOT tgisinternal`).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if triggers != "outbox_notify,outbox_xid_first" {
		t.Fatalf("triggers on public.outbox: %s, want outbox_notify,outbox_xid_first", triggers)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO public.outbox (topic, payload) VALUES ('t', 'x')`); err != nil {
		t.Fatal(err)
	}
}

func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

func TestMigrateBadDatabaseURL(t *testing.T) {
	t.Parallel()
	const password = "s3cr3t-Pa55"
	u, _ := strings.CutPrefix(pgtest.URL(t), "postgres://")
	hostAndRest := u[strings.Index(u, "@")+1:]
	host := hostAndRest[:strings.Index(hostAndRest, "/")]
	for _, tc := range []struct {
		name string
		dsn  string
		code int
	}{
		{"unreachable", fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/app?sslmode=disable", password, closedPort(t)), 1},
		{"no such database", fmt.Sprintf("postgres://postgres:%s@%s/no_such_db?sslmode=disable", password, host), 1},
		{"no such role", fmt.Sprintf("postgres://nobody:%s@%s/postgres?sslmode=disable", password, host), 1},
		{"unparsable", fmt.Sprintf("postgres://app:%s@127.0.0.1:notaport/app", password), 2},
		{"key-value form", fmt.Sprintf("host=127.0.0.1 port=%d user=app password=%s dbname=app sslmode=disable", closedPort(t), password), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runBinary(t, []string{"OUTBOX_DATABASE_URL=" + tc.dsn, "OUTBOX_DATABASE_CONNECT_TIMEOUT=5s"}, "migrate", "up")
			if r.code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", r.code, tc.code, r.stderr)
			}
			msg := strings.TrimSpace(r.stderr)
			if msg == "" || strings.Contains(msg, "\n") {
				t.Errorf("stderr is not one line: %q", r.stderr)
			}
			if strings.Contains(r.stderr+r.stdout, password) {
				t.Errorf("output shows the password: %q", r.stderr)
			}
		})
	}
}

func TestUsageAndConfigErrors(t *testing.T) {
	t.Parallel()
	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte("database:\n  schema: bad-name\nlog:\n  level: loud\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"unknown flag", nil, []string{"migrate", "up", "--nope"}, []string{"unknown flag: --nope"}},
		{"database URL on the command line is refused", nil, []string{"migrate", "up", "--database-url", "postgres://u:Secretpw@h/d"},
			[]string{"--database-url: secrets are not taken from the command line", "set OUTBOX_DATABASE_URL, or database.url_file"}},
		{"a token on the command line is refused", nil, []string{"run", "--admin-token=0123456789abcdefgh"},
			[]string{"--admin-token: secrets are not taken from the command line", "OUTBOX_ADMIN_TOKEN"}},
		{"any password flag is refused", nil, []string{"run", "--kafka-password", "x"},
			[]string{"--kafka-password: secrets are not taken from the command line"}},
		{"a connection string as an argument is not echoed", nil, []string{"migrate", "up", "postgres://u:Secretpw@h/d"},
			[]string{"takes no arguments", "postgres://u:xxxxx@h/d"}},
		{"a connection string as a command is not echoed", nil, []string{"postgres://u:Secretpw@h/d"}, []string{"unknown command"}},
		{"a connection string as a dlq command is not echoed", nil, []string{"dlq", "postgres://u:Secretpw@h/d"}, []string{"dlq"}},
		{"unknown command", nil, []string{"migrat"}, []string{"unknown command"}},
		{"stray argument", []string{"OUTBOX_DATABASE_URL=postgres://h/d"}, []string{"migrate", "up", "now"}, []string{"takes no arguments"}},
		{"every configuration problem", nil, []string{"migrate", "up", "--config", cfgFile},
			[]string{"database.url is required", "database.schema", "log.level"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runBinary(t, tc.env, tc.args...)
			if r.code != 2 {
				t.Errorf("exit code %d, want 2; stderr: %s", r.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not mention %q: %s", w, r.stderr)
				}
			}
			if strings.Contains(r.stderr, "Secretpw") {
				t.Errorf("stderr shows the password: %s", r.stderr)
			}
		})
	}
}
