package relaycontainer_test

import (
	"context"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/testcontainers/testcontainers-go"

	"github.com/outbox-relay/outbox-relay/internal/dev/containertest"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relaycontainer"
)

// newDatabase starts PostgreSQL and returns a migrated database's URL.
func newDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	server := containertest.Postgres(t, images.Postgres)
	dsn, err := pgtest.CreateDatabase(ctx, server, pgtest.UniqueName("relay"))
	if err != nil {
		t.Fatal(err)
	}
	if err := relaycontainer.MigrateUp(ctx, images.Relay, relaycontainer.WithDatabaseURL(dsn), relaycontainer.WithHostNetwork()); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// The image runs as its non-root user with a read-only root file system,
// and serves its probes and API.
func TestImageRunsReadOnlyAsNonRoot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := newDatabase(t)
	relay, err := relaycontainer.Run(ctx, images.Relay, relaycontainer.WithDatabaseURL(dsn),
		relaycontainer.WithHostNetwork(), relaycontainer.WithKafkaBrokers("127.0.0.1:1"),
		relaycontainer.WithAdminToken("a-token-of-sixteen-chars"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.ReadonlyRootfs = true }))
	testcontainers.CleanupContainer(t, relay)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := relay.AdminURL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/livez", "/readyz"} {
		if code := get(t, admin+path, ""); code != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, code)
		}
	}
	api, err := relay.APIURL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code := get(t, api+"dead-letters", "a-token-of-sixteen-chars"); code != http.StatusOK {
		t.Errorf("GET %sdead-letters: %d, want 200", api, code)
	}

	inspect, err := relay.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inspect.HostConfig.ReadonlyRootfs {
		t.Error("the root file system is writable")
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	top, err := p.Client().ContainerTop(ctx, relay.GetContainerID(), nil)
	if err != nil {
		t.Fatal(err)
	}
	uid := -1
	for i, title := range top.Titles {
		if title == "UID" {
			uid = i
		}
	}
	if uid < 0 || len(top.Processes) != 1 || top.Processes[0][uid] != "65532" {
		t.Errorf("the container's processes are %v %v, want one, of user 65532 (nonroot)", top.Titles, top.Processes)
	}
}

// The image built without a registry carries what deploy/Dockerfile.local
// says, which is what deploy/Dockerfile says (see
// containertest.TestDockerfilesDescribeTheSameRuntime).
func TestImageMatchesItsDockerfile(t *testing.T) {
	t.Parallel()
	rt, err := containertest.ReadRuntime(filepath.Join("..", "deploy", "Dockerfile.local"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	img, err := p.Client().ImageInspect(context.Background(), images.Relay)
	if err != nil {
		t.Fatal(err)
	}
	cfg := img.Config
	var exposed []string
	for port := range cfg.ExposedPorts {
		exposed = append(exposed, strings.TrimSuffix(port, "/tcp"))
	}
	if cfg.User != rt.User || !reflect.DeepEqual(cfg.Entrypoint, rt.Entrypoint) || !reflect.DeepEqual(cfg.Cmd, rt.Cmd) ||
		!reflect.DeepEqual(exposed, rt.Expose) {
		t.Errorf("the image runs user %q, %q %q, exposing %q; the Dockerfile says %q, %q %q, %q",
			cfg.User, cfg.Entrypoint, cfg.Cmd, exposed, rt.User, rt.Entrypoint, rt.Cmd, rt.Expose)
	}
	for key, v := range rt.Labels {
		got, ok := cfg.Labels[key]
		switch {
		case !ok:
			t.Errorf("the image lacks the label %s", key)
		case !strings.Contains(v, "${") && got != v:
			t.Errorf("label %s is %q, want %q", key, got, v)
		case got == "":
			t.Errorf("label %s is empty, want the build's %s", key, v)
		}
	}
}

// A relay that cannot start says why, in Run's error.
func TestRunReportsWhyTheRelayDidNotStart(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	relay, err := relaycontainer.Run(ctx, images.Relay, relaycontainer.WithDatabaseURL(dsn), relaycontainer.WithHostNetwork())
	testcontainers.CleanupContainer(t, relay)
	if err == nil || !strings.Contains(err.Error(), "kafka.brokers") {
		t.Errorf("Run without brokers: %v, want the relay's complaint about kafka.brokers", err)
	}
}

// MigrateUp's error holds the migration's output, the password redacted.
func TestMigrateUpReportsItsOutput(t *testing.T) {
	t.Parallel()
	server := containertest.Postgres(t, images.Postgres)
	wrong := strings.Replace(server, "postgres:postgres@", "postgres:not-the-password@", 1)
	if wrong == server {
		t.Fatalf("no password to replace in %s", server)
	}
	err := relaycontainer.MigrateUp(context.Background(), images.Relay, relaycontainer.WithDatabaseURL(wrong), relaycontainer.WithHostNetwork())
	if err == nil || !strings.Contains(err.Error(), "password authentication failed") {
		t.Errorf("MigrateUp with a wrong password: %v, want the server's refusal", err)
	}
	if err != nil && strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("MigrateUp's error shows the password: %v", err)
	}
}

func get(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
