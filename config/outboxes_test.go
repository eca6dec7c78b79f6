package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/config"
)

// Outboxes take what they leave unset from the database and relay
// sections; without a list the database section is the one outbox.
func TestOutboxes(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(secret, []byte("postgres://u:s3cret@shard2/app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, `
database:
  max_conns: 8
outboxes:
  - name: tenant-a
    schema: tenant_a
  - name: shard-2
    url_file: `+secret+`
    max_conns: 12
    workers: 4
    batch_size: 200
`)
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "OUTBOX_DATABASE_URL=postgres://db/app"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Outboxes()
	if len(got) != 2 {
		t.Fatalf("%d outboxes, want 2", len(got))
	}
	a, b := got[0], got[1]
	if a.Name != "tenant-a" || a.Database.URL != "postgres://db/app" || a.Database.Schema != "tenant_a" || a.Database.MaxConns != 8 || a.Workers != 0 {
		t.Errorf("tenant-a = %+v", a)
	}
	if b.Name != "shard-2" || b.Database.URL != "postgres://u:s3cret@shard2/app" || b.Database.Schema != "public" ||
		b.Database.MaxConns != 12 || b.Workers != 4 || b.BatchSize != 200 || b.Database.QueryTimeout != config.DefaultQueryTimeout {
		t.Errorf("shard-2 = %+v", b)
	}
	if o, err := cfg.Outbox("shard-2"); err != nil || o.Name != "shard-2" {
		t.Errorf("Outbox(shard-2) = %+v, %v", o, err)
	}
	if _, err := cfg.Outbox(""); err == nil || !strings.Contains(err.Error(), "several outboxes: choose one with --outbox (tenant-a, shard-2)") {
		t.Errorf("Outbox(\"\") = %v", err)
	}
	if got := cfg.RedactURLs("dial postgres://u:s3cret@shard2/app failed"); strings.Contains(got, "s3cret") {
		t.Errorf("RedactURLs left the password: %s", got)
	}

	single, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := single.Outbox(""); err != nil || o.Name != "default" || o.Database != single.Database {
		t.Errorf("the single outbox = %+v, %v", o, err)
	}
}

func TestOutboxProblems(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
relay:
  workers: 6
outboxes:
  - schema: nameless
  - name: "bad name"
    schema: s1
  - name: a
    schema: s2
  - name: a
    schema: s3
  - name: same-table
    schema: s2
  - name: bad-schema
    schema: "Bad-Schema"
  - name: negative
    schema: s4
    workers: -1
  - name: few-conns
    schema: s5
    max_conns: 4
  - name: big-batch
    schema: s6
    batch_size: 20000
`)
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_DATABASE_MAX_CONNS=10"}, config.NeedDatabase)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *config.Error", err)
	}
	for _, want := range []string{
		"outboxes[0]: name is required",
		`outboxes[1] (bad name): name "bad name": use letters, digits, '_' and '-'`,
		"outboxes[3] (a): the name a is used twice",
		"outboxes[4] (same-table): schema s2 of the same database as outbox a: one table, one outbox",
		"outboxes[5] (bad-schema): schema:",
		"outboxes[6] (negative): workers is -1; it must not be negative",
		"outboxes[7] (few-conns): max_conns 4 is below its workers + 2 (8)",
		"outboxes[8] (big-batch): batch_size is 20000",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the problems do not include %q:\n%s", want, err)
		}
	}
	// Outboxes that all name their database need no database.url.
	path = writeFile(t, "outboxes:\n  - name: a\n    url: postgres://db/a\n  - name: b\n")
	_, err = config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDatabase)
	if err == nil || !strings.Contains(err.Error(), "outboxes[1] (b): url is required") || strings.Contains(err.Error(), "database.url is required") {
		t.Errorf("err = %v, want only outbox b's missing url", err)
	}
}

func TestCoordination(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
outboxes:
  - {name: tenant-a, schema: tenant_a}
  - {name: tenant-b, schema: tenant_b}
`)
	env := []string{"OUTBOX_CONFIG=" + path, "OUTBOX_DATABASE_URL=postgres://db/app"}
	c, err := config.Load(nil, env, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Coordination.Enabled || c.Coordination.Interval != 200*time.Millisecond || c.Coordination.Lease != 5*time.Second {
		t.Errorf("defaults: %+v, want enabled, 200ms and 5s", c.Coordination)
	}
	if o, err := c.CoordinationOutbox(); err != nil || o.Name != "tenant-a" || o.Database.Schema != "tenant_a" {
		t.Errorf("the coordination outbox is %+v (%v), want the first", o, err)
	}
	c, err = config.Load(nil, append(env, "OUTBOX_COORDINATION_OUTBOX=tenant-b"), config.NeedDatabase)
	if o, _ := c.CoordinationOutbox(); err != nil || o.Name != "tenant-b" {
		t.Errorf("the coordination outbox is %s (%v), want tenant-b", o.Name, err)
	}

	_, err = config.Load(nil, append(env, "OUTBOX_COORDINATION_OUTBOX=tenant-c", "OUTBOX_COORDINATION_INTERVAL=2s"), config.NeedDatabase)
	for _, want := range []string{
		`coordination.outbox is "tenant-c"; it must name an outbox: tenant-a, tenant-b`,
		"coordination.lease is 5s; it must be at least three intervals (6s)",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if _, err := config.Load(nil, append(env, "OUTBOX_COORDINATION_ENABLED=false", "OUTBOX_COORDINATION_OUTBOX=tenant-c"), config.NeedDatabase); err != nil {
		t.Errorf("with coordination off, its settings are not checked: %v", err)
	}
}
