package pgtest

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
)

func TestMain(m *testing.M) { Main(m) }

var applied = regexp.MustCompile(`'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?'`)

// A test's schema, copied from a dump, is the schema the migrations make:
// the same objects, settings, comments and migration record.
func TestCopiedSchemaIsTheMigratedOne(t *testing.T) {
	ctx := context.Background()
	bin, err := pgserver.FindBinaries()
	if err != nil {
		t.Skip("no pg_dump here: schemas are migrated one by one")
	}
	if _, _, err := dumpFor(ctx, URL(t)); err != nil {
		t.Fatal(err)
	}
	copied := NewSchema(t)
	pool, err := pgxpool.New(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	name := "t_" + randomSuffix()
	if err := migrate(ctx, pool, name); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA "+name+" CASCADE") }()
	dump := func(schema string) string {
		out, err := exec.Command(filepath.Join(bin, "pg_dump"), "--schema="+schema, "--no-owner", "--inserts", "--dbname="+URL(t)).Output()
		if err != nil {
			t.Fatal(err)
		}
		// The migration record says when the migrations ran: the
		// copy's, when its original's did.
		return applied.ReplaceAllString(strings.ReplaceAll(statements(string(out)), schema, "outbox_schema"), "'(when)'")
	}
	want, got := dump(name), dump(copied.Name)
	if got != want {
		t.Fatalf("the copied schema differs from the migrated one:\n--- migrated\n%s\n--- copied\n%s", want, got)
	}
	if !strings.Contains(want, "CREATE TABLE outbox_schema.outbox") {
		t.Fatalf("the dump holds no outbox table:\n%s", want)
	}
}
