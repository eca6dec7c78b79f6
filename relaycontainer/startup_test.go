package relaycontainer_test

import (
	"context"
	"go/parser"
	"go/token"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"

	"github.com/outbox-relay/outbox-relay/relaycontainer"
)

// unreachable is a database URL whose port nothing listens on.
func unreachable(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "postgres://app:secret@" + addr + "/app"
}

// A database the relay cannot reach fails Run after the database wait
// (DatabaseWait, or WithDatabaseWait's), with the relay's own words,
// rather than at the caller's deadline.
func TestRunFailsSoonWithoutItsDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const wait = 3 * time.Second
	began := time.Now()
	relay, err := relaycontainer.Run(ctx, images.Relay, relaycontainer.WithDatabaseURL(unreachable(t)),
		relaycontainer.WithHostNetwork(), relaycontainer.WithKafkaBrokers("127.0.0.1:1"), relaycontainer.WithDatabaseWait(wait))
	testcontainers.CleanupContainer(t, relay)
	took := time.Since(began)
	if err == nil || !strings.Contains(err.Error(), "waited") || !strings.Contains(err.Error(), "waiting for the database") {
		t.Fatalf("Run without a database: %v, want the relay's wait for it", err)
	}
	if took < wait || took > wait+10*time.Second {
		t.Errorf("Run took %s to give up, want about %s", took.Round(time.Second), wait)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// WithStartupTimeout bounds Run's wait.
func TestRunWithStartupTimeout(t *testing.T) {
	t.Parallel()
	began := time.Now()
	relay, err := relaycontainer.Run(context.Background(), images.Relay, relaycontainer.WithDatabaseURL(unreachable(t)),
		relaycontainer.WithHostNetwork(), relaycontainer.WithKafkaBrokers("127.0.0.1:1"), relaycontainer.WithStartupTimeout(3*time.Second))
	testcontainers.CleanupContainer(t, relay)
	if err == nil || !strings.Contains(err.Error(), "not ready within 3s") {
		t.Fatalf("Run with a 3s timeout: %v", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("Run took %s with a 3s timeout", took.Round(time.Second))
	}
}

// The relay becomes ready, and its URL works, when testcontainers reaches
// the engine's containers at another address than loopback, as a test in
// a container of its own does (the bridge's gateway).
func TestRunReadyWhereverTheEngineIs(t *testing.T) {
	addr := nonLoopback(t)
	dsn := newDatabase(t)
	t.Setenv("TESTCONTAINERS_HOST_OVERRIDE", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	relay, err := relaycontainer.Run(ctx, images.Relay, relaycontainer.WithDatabaseURL(dsn),
		relaycontainer.WithHostNetwork(), relaycontainer.WithKafkaBrokers("127.0.0.1:1"), relaycontainer.WithStartupTimeout(30*time.Second))
	testcontainers.CleanupContainer(t, relay)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := relay.AdminURL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := url.Parse(admin); err != nil || u.Hostname() != addr {
		t.Fatalf("AdminURL %s, want the host %s", admin, addr)
	}
	if code := get(t, admin+"/livez", ""); code != http.StatusOK {
		t.Fatalf("GET %s/livez: %d", admin, code)
	}
}

// nonLoopback is an IPv4 address of this machine that is not loopback.
func nonLoopback(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
			return ip.IP.String()
		}
	}
	t.Skip("this machine has no address but loopback")
	return ""
}

// The module names no type of Docker's API: testcontainers-go moved them
// from github.com/docker/docker to github.com/moby/moby, and an
// application's go.mod may hold either side of that move.
func TestNoDockerAPITypes(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "relaycontainer.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		p := strings.Trim(imp.Path.Value, `"`)
		if strings.HasPrefix(p, "github.com/docker/") || strings.HasPrefix(p, "github.com/moby/") {
			t.Errorf("relaycontainer.go imports %s", p)
		}
	}
}
