package pgserver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
)

func TestStartRestartStop(t *testing.T) {
	if _, err := pgserver.FindBinaries(); err != nil {
		t.Fatal(err) // make test installs them
	}
	ctx := context.Background()
	srv, err := pgserver.Start(ctx, pgserver.Options{Settings: map[string]string{"application_name": "pgserver_test"}})
	if err != nil {
		t.Fatal(err)
	}
	query := func() string {
		conn, err := pgx.Connect(ctx, srv.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var fsync string
		if err := conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
			t.Fatal(err)
		}
		return fsync
	}
	if got := query(); got != "off" {
		t.Errorf("fsync = %s, want off for a throwaway cluster", got)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	query() // answers again on the same port
	dir := srv.Dir()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still there after Stop (err %v)", dir, err)
	}
}

// A cluster whose owner died is stopped and removed by the next Start.
func TestStartReapsOrphans(t *testing.T) {
	ctx := context.Background()
	orphan, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer orphan.Stop()
	// Make its owner a process that has exited.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan.Dir(), "owner.pid"), []byte(strconv.Itoa(dead.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if _, err := os.Stat(orphan.Dir()); !os.IsNotExist(err) {
		t.Fatalf("orphaned cluster %s still there (err %v)", orphan.Dir(), err)
	}
	conn, err := pgx.Connect(ctx, orphan.DSN("postgres"))
	if err == nil {
		conn.Close(ctx)
		t.Fatal("the orphaned cluster still answers")
	}
}
