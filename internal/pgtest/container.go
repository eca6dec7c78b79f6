package pgtest

import (
	"context"
	"fmt"
	"os"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// ContainerImage is the PostgreSQL image used when a Docker engine is there.
const ContainerImage = "postgres:15-alpine"

// startContainer starts PostgreSQL in a container when a Docker engine
// answers. ok is false when there is no engine or the container fails to
// start; the caller then falls back to a local cluster.
func startContainer(ctx context.Context) (dsn string, stop func() error, ok bool) {
	if !dockerReachable(ctx) {
		return "", nil, false
	}
	c, err := postgres.Run(ctx, ContainerImage,
		postgres.WithDatabase("postgres"),
		postgres.WithUsername("postgres"),
		postgres.WithPassword("postgres"),
		postgres.BasicWaitStrategies(),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest: Docker engine found but the PostgreSQL container did not start, using local binaries:", err)
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return "", nil, false
	}
	dsn, err = c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return "", nil, false
	}
	return dsn, func() error { return testcontainers.TerminateContainer(c) }, true
}

// dockerReachable reports whether a Docker engine answers. A client binary
// alone is not enough, and with no socket and no DOCKER_HOST there is
// nothing to ask.
func dockerReachable(ctx context.Context) bool {
	if os.Getenv("DOCKER_HOST") == "" {
		if _, err := os.Stat("/var/run/docker.sock"); err != nil {
			return false
		}
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	return p.Health(ctx) == nil
}
