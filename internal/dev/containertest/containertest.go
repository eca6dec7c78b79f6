// Package containertest runs the container tests: it checks for a Docker
// engine, builds the images they use without a registry (the relay's, as
// `make image` does, and PostgreSQL and a Kafka-protocol broker, by
// scripts/build-test-images), and starts PostgreSQL and the broker.
package containertest

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

// EnvRequire, set to 1 (as `make test` does), makes a missing Docker engine
// fail the container tests rather than skip them.
const EnvRequire = "OUTBOX_TEST_CONTAINERS"

func init() {
	// No registry serves the reaper's image here: the tests remove their
	// containers themselves, and a stopped engine removes the rest.
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
}

// Available says why no Docker engine can be used, or nil.
func Available() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pgtest.CheckDocker(ctx)
}

// Require skips t without a Docker engine, or fails it with EnvRequire=1.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("container test: skipped in -short runs; make test runs it")
	}
	if err := Available(); err != nil {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s=1 and no Docker engine answers: %v", EnvRequire, err)
		}
		t.Skipf("no Docker engine answers (%v): container test skipped; `make test` starts one", err)
	}
}

// Images are the tags of the images built for the tests.
type Images struct {
	Relay    string // the relay, as `make image` builds it
	Postgres string // PostgreSQL from the distribution's binaries
	Kafka    string // the Kafka-protocol broker
}

var (
	buildOnce sync.Once
	built     Images
	buildErr  error
)

// Build builds the images, once per test binary, and returns their tags.
func Build(t testing.TB) Images {
	t.Helper()
	images, err := BuildImages()
	if err != nil {
		t.Fatalf("build the test images: %v", err)
	}
	return images
}

// Prebuild starts building the images in the background where an engine
// answers, for the TestMain of a package run whole (no -run): its other
// tests run meanwhile, and Build waits for it. It builds nothing in -short
// runs, which skip the container tests.
func Prebuild() {
	if run := flag.Lookup("test.run"); run != nil && run.Value.String() != "" {
		return
	}
	if !testing.Short() && Available() == nil {
		go BuildImages() //nolint:errcheck // Build reports the error.
	}
}

// BuildImages is Build for a TestMain. Test binaries that build at the
// same time take turns.
func BuildImages() (Images, error) {
	buildOnce.Do(func() { built, buildErr = build() })
	return built, buildErr
}

func build() (Images, error) {
	root, err := moduleRoot()
	if err != nil {
		return Images{}, err
	}
	unlock, err := LockBuilds()
	if err != nil {
		return Images{}, err
	}
	defer unlock()

	relay, err := script(root, "scripts/build-image", "outbox-relay-test/relay:local")
	if err != nil {
		return Images{}, err
	}
	others, err := script(root, "scripts/build-test-images")
	if err != nil {
		return Images{}, err
	}
	if len(relay) != 1 || len(others) != 2 {
		return Images{}, fmt.Errorf("the build scripts printed %q and %q, want one tag and two", relay, others)
	}
	return Images{Relay: relay[0], Postgres: others[0], Kafka: others[1]}, nil
}

// LockBuilds waits until no other test process builds the static binary
// or the images, and holds that turn until unlock. A static build compiles
// every package anew (-trimpath, no cgo): two at once would each do it in
// full, where the second one's turn finds them in the build cache.
func LockBuilds() (unlock func(), err error) {
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "outbox-relay-test-images.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		lock.Close()
	}, nil
}

// script runs a script of the repository and returns the lines it printed.
func script(root, name string, args ...string) ([]string, error) {
	cmd := exec.Command(filepath.Join(root, name), args...)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", name, err, stderr.String())
	}
	return strings.Fields(string(out)), nil
}

// moduleRoot is the directory of the repository's go.mod, above the test's
// working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Postgres starts image through testcontainers-go's postgres module, as an
// application's tests would start the official image, and returns the
// server's URL (database postgres, on a port published on localhost). The
// container is removed when t ends.
func Postgres(t testing.TB, image string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, stop, err := pgtest.RunContainer(ctx, image)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("remove the PostgreSQL container: %v", err)
		}
	})
	return u
}

// Kafka starts the broker image on the host's network, on a free port of
// 127.0.0.1 (the address it advertises, which the host and containers on
// its network dial alike), and returns its address. The container is
// removed when t ends.
func Kafka(t testing.TB, image string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ready = "kafkabroker listening on "
	c, err := testcontainers.Run(ctx, image,
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
		testcontainers.WithWaitStrategy(wait.ForLog(ready).WithStartupTimeout(time.Minute)))
	t.Cleanup(func() {
		if err := testcontainers.TerminateContainer(c); err != nil {
			t.Errorf("remove the broker's container: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("start the broker from %s: %v", image, err)
	}
	r, err := c.Logs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if addrs, ok := strings.CutPrefix(sc.Text(), ready); ok {
			return strings.Split(addrs, ",")
		}
	}
	t.Fatalf("the broker's log has no line %q: %v", ready, sc.Err())
	return nil
}
