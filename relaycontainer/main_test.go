package relaycontainer_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/dev/containertest"
)

// images are the ones built for this run.
var images containertest.Images

// TestMain builds the images without a registry and has the example use
// them. Without a Docker engine the package's tests are skipped, or fail
// with OUTBOX_TEST_CONTAINERS=1 (as `make test` sets).
func TestMain(m *testing.M) {
	if err := containertest.Available(); err != nil {
		if os.Getenv(containertest.EnvRequire) == "1" {
			fmt.Fprintf(os.Stderr, "%s=1 and no Docker engine answers: %v\n", containertest.EnvRequire, err)
			os.Exit(1)
		}
		fmt.Println("no Docker engine answers: the container tests are skipped:", err)
		os.Exit(0)
	}
	var err error
	if images, err = containertest.BuildImages(); err != nil {
		fmt.Fprintln(os.Stderr, "build the test images:", err)
		os.Exit(1)
	}
	for name, image := range map[string]string{"OUTBOX_RELAY_IMAGE": images.Relay, "POSTGRES_IMAGE": images.Postgres} {
		if os.Getenv(name) == "" {
			os.Setenv(name, image)
		}
	}
	os.Exit(m.Run())
}
