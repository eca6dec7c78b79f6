package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// DockerSocket is where a local Docker engine listens when DOCKER_HOST is
// unset.
const DockerSocket = "/var/run/docker.sock"

// CheckDocker returns nil when a Docker engine answers, and otherwise an
// error saying why none can be used, fit for a test's skip message. A
// client binary alone is not enough, and with no socket and no DOCKER_HOST
// there is nothing to ask.
func CheckDocker(ctx context.Context) error {
	if err := checkDocker(ctx); err != nil {
		// One line: the Docker client's errors span several.
		return errors.New(strings.Join(strings.Fields(err.Error()), " "))
	}
	return nil
}

func checkDocker(ctx context.Context) (err error) {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		if _, err := os.Stat(DockerSocket); err != nil {
			return fmt.Errorf("DOCKER_HOST unset and %s missing", DockerSocket)
		}
		host = "unix://" + DockerSocket
	}
	// testcontainers-go panics when it finds no engine after all.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("no Docker engine at %s: %v", host, r)
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return fmt.Errorf("no Docker engine at %s: %w", host, err)
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return fmt.Errorf("no answer from the Docker engine at %s: %w", host, err)
	}
	return nil
}

// RunContainer starts PostgreSQL from image (ContainerImage, or one of
// the same interface) through testcontainers-go's postgres module and
// returns the server's URL, database "postgres", and a function that
// removes the container. It needs a Docker engine: see CheckDocker.
func RunContainer(ctx context.Context, image string) (serverURL string, stop func() error, err error) {
	c, err := postgres.Run(ctx, image,
		postgres.WithDatabase("postgres"),
		postgres.WithUsername("postgres"),
		postgres.WithPassword("postgres"),
		postgres.BasicWaitStrategies(),
	)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return "", nil, fmt.Errorf("start PostgreSQL container %s: %w", image, err)
	}
	serverURL, err = c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return "", nil, fmt.Errorf("connection string of PostgreSQL container %s: %w", image, err)
	}
	return serverURL, func() error { return testcontainers.TerminateContainer(c) }, nil
}
