package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/config"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadDefaultsAndEnv(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://u:p@db/app", "HOME=/root"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Database{URL: "postgres://u:p@db/app", Schema: "public", MaxConns: 10, ConnectTimeout: 10 * time.Second}
	if cfg.Database != want {
		t.Fatalf("database = %+v, want %+v", cfg.Database, want)
	}
	if cfg.Log.Level != "info" || cfg.Log.Format != "text" {
		t.Fatalf("log = %+v", cfg.Log)
	}
}

func TestLoadPrecedence(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
database:
  url: postgres://file@db/app
  schema: from_file
  max_conns: 4
  connect_timeout: 3s
log:
  level: warn
  format: json
`)
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	flags := config.Bind(fs)
	if err := fs.Parse([]string{"--config", path, "--schema", "from_flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(flags, []string{"OUTBOX_DATABASE_MAX_CONNS=7", "OUTBOX_DATABASE_SCHEMA=from_env", "OUTBOX_LOG_LEVEL=debug"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Database
	if got.URL != "postgres://file@db/app" || got.Schema != "from_flag" || got.MaxConns != 7 || got.ConnectTimeout != 3*time.Second {
		t.Fatalf("database = %+v: want url from file, schema from flag, max_conns from env, timeout from file", got)
	}
	if cfg.Log.Level != "debug" || cfg.Log.Format != "json" {
		t.Fatalf("log = %+v: want level from env, format from file", cfg.Log)
	}
}

func TestLoadConfigFileFromEnvAndURLFile(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(secret, []byte("postgres://u:s3cret@db/app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "database:\n  url_file: "+secret+"\n")
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database.URL != "postgres://u:s3cret@db/app" {
		t.Fatalf("url = %q, want the file's content", cfg.Database.URL)
	}
}

func TestLoadReportsEveryProblem(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
database:
  schema: "bad-schema"
  max_conns: lots
  connect_timeout: soon
  pasword: oops
log:
  level: loud
  format: xml
`)
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDatabase)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *config.Error", err)
	}
	msg := err.Error()
	for _, want := range []string{"database.url is required", "max_conns", "connect_timeout", "pasword", "log.level", "log.format"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	// Decode errors prevent a valid struct, but the schema problem is
	// still found when decoding succeeds.
	_, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_DATABASE_SCHEMA=bad-schema", "OUTBOX_LOG_FORMAT=xml"}, config.NeedDatabase)
	if err == nil || !strings.Contains(err.Error(), "database.schema") || !strings.Contains(err.Error(), "log.format") {
		t.Errorf("err = %v, want both the schema and the log format", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=/nonexistent/relay.yaml", "OUTBOX_DATABASE_URL=postgres://db/app"}, config.NeedDatabase)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/relay.yaml") {
		t.Fatalf("err = %v, want the missing file named", err)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, in string }{
		{"postgres://app:hunter2@db:5432/x", "cannot connect to postgres://app:hunter2@db:5432/x"},
		{"postgres://app:p%40ss@db/x", "failed: postgres://app:p%40ss@db/x and p@ss"},
		{"host=db user=app password=hunter2 dbname=x", "bad dsn host=db user=app password=hunter2"},
		{"postgres://app@db/x?password=hunter2", "dsn postgres://app@db/x?password=hunter2"},
		{"host=db user=app password='hunter2 with spaces' dbname=x", "bad dsn password='hunter2 with spaces'"},
	} {
		out := config.Redact(tc.in, tc.dsn)
		if strings.Contains(out, "hunter2") || strings.Contains(out, "p@ss") || strings.Contains(out, "p%40ss") {
			t.Errorf("Redact(%q) = %q still shows the password", tc.in, out)
		}
	}
	if got := config.RedactURL("postgres://app:hunter2@db/x"); got != "postgres://app:xxxxx@db/x" {
		t.Errorf("RedactURL = %q", got)
	}
}

func TestAdminSettings(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("from-a-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_ADMIN_TOKEN_FILE=" + tokenFile}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.Listen != ":9780" || cfg.Admin.Token != "from-a-file-0123456789" || cfg.Relay.DeadLetterRetention != 14*24*time.Hour {
		t.Fatalf("admin %+v, dead-letter retention %s", cfg.Admin, cfg.Relay.DeadLetterRetention)
	}

	_, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_ADMIN_LISTEN=9780",
		"OUTBOX_ADMIN_TOKEN=short-secret", "OUTBOX_RELAY_DEAD_LETTER_RETENTION=-1h"}, config.NeedDatabase)
	var ce *config.Error
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("err = %v, want three problems", err)
	}
	msg := err.Error()
	for _, want := range []string{`admin.listen: "9780" is not host:port`, "admin.token is 12 characters", "relay.dead_letter_retention is -1h0m0s"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "short-secret") {
		t.Errorf("the error shows the token:\n%s", msg)
	}
}
