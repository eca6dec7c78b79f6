package pgtest

import (
	"context"
	"fmt"
	"os"
)

// ContainerImage is the PostgreSQL image used when a Docker engine is there.
const ContainerImage = "postgres:15-alpine"

// startContainer starts PostgreSQL in a container when a Docker engine
// answers. ok is false when there is no engine or the container fails to
// start; the caller then falls back to a local cluster.
func startContainer(ctx context.Context) (dsn string, stop func() error, ok bool) {
	if CheckDocker(ctx) != nil {
		return "", nil, false
	}
	dsn, stop, err := RunContainer(ctx, ContainerImage)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest: Docker engine found but the PostgreSQL container did not start, using local binaries:", err)
		return "", nil, false
	}
	return dsn, stop, true
}
