// Package relaycontainer starts outbox-relay in a container from an
// application's integration tests, with testcontainers-go: the relay
// delivers the rows the application's transactions write, to the brokers or
// webhooks the test runs, as it does in production.
//
//	if err := relaycontainer.MigrateUp(ctx, image, relaycontainer.WithDatabaseURL(dsn),
//		relaycontainer.WithHostNetwork()); err != nil { ... }
//	relay, err := relaycontainer.Run(ctx, image, relaycontainer.WithDatabaseURL(dsn),
//		relaycontainer.WithKafkaBrokers(brokers...), relaycontainer.WithHostNetwork())
//	defer testcontainers.TerminateContainer(relay)
//
// Run returns once the relay answers /readyz. With WithHostNetwork the relay
// shares the host's network (Linux engines), so the URLs and addresses the
// test itself uses (a database or broker container's published port on
// localhost, an httptest server) reach it unchanged. Without it the relay
// runs on Docker's default network: give it addresses it can reach there
// (a network the containers share, with aliases: testcontainers-go's
// network package).
//
// Any other setting goes in through testcontainers.WithEnv, with the
// variables of docs/configuration.md, or WithConfig.
package relaycontainer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// AdminPort is the container port of the admin listener (probes, metrics,
// and with a token the dead-letter API and the console) on Docker's
// default network.
const AdminPort = "9780/tcp"

// apiPrefix is where the dead-letter API is served on the admin listener.
const apiPrefix = "/api/v1/"

// configPath is where WithConfig puts the configuration file.
const configPath = "/etc/outbox-relay/config.yaml"

// StartupTimeout bounds Run's wait for /readyz and MigrateUp's for the
// migrations.
const StartupTimeout = 2 * time.Minute

// Container is a running relay.
type Container struct {
	testcontainers.Container
	// hostPort is the admin listener's port on the host's network, or 0
	// on Docker's default network.
	hostPort int
}

// Run starts the relay (`outbox-relay run`) from image and waits until it
// is ready: connected to the database, its schema migrated (see
// MigrateUp). On failure it returns the relay's last log lines in the error,
// and the container, if one was created, for the caller to terminate.
func Run(ctx context.Context, image string, opts ...testcontainers.ContainerCustomizer) (*Container, error) {
	req, hostPort, err := request(image, opts)
	if err != nil {
		return nil, err
	}
	port := nat.Port(AdminPort)
	if hostPort != 0 {
		port = nat.Port(strconv.Itoa(hostPort) + "/tcp")
	}
	req.WaitingFor = wait.ForHTTP("/readyz").WithPort(port).WithStartupTimeout(StartupTimeout).
		WithPollInterval(100 * time.Millisecond)
	c, err := testcontainers.GenericContainer(ctx, req)
	var relay *Container
	if c != nil {
		relay = &Container{Container: c, hostPort: hostPort}
	}
	if err != nil {
		return relay, fmt.Errorf("start the relay from %s: %w%s", image, err, logTail(c))
	}
	return relay, nil
}

// MigrateUp runs `outbox-relay migrate up` from image in a container of its
// own, with the same options as Run, and returns when it is done: the
// outbox table and the relay's tables exist (idempotent, and safe beside
// running relays). On failure the error holds its output.
func MigrateUp(ctx context.Context, image string, opts ...testcontainers.ContainerCustomizer) (err error) {
	req, _, err := request(image, opts)
	if err != nil {
		return err
	}
	req.Cmd = []string{"migrate", "up"}
	req.ExposedPorts = nil
	req.WaitingFor = wait.ForExit().WithExitTimeout(StartupTimeout)
	c, err := testcontainers.GenericContainer(ctx, req)
	defer func() {
		if c != nil {
			err = errors.Join(err, testcontainers.TerminateContainer(c))
		}
	}()
	if err != nil {
		return fmt.Errorf("migrate up from %s: %w%s", image, err, logTail(c))
	}
	st, err := c.State(ctx)
	if err != nil {
		return fmt.Errorf("migrate up from %s: %w", image, err)
	}
	if st.ExitCode != 0 {
		return fmt.Errorf("migrate up from %s: exit code %d%s", image, st.ExitCode, logTail(c))
	}
	return nil
}

// request builds the container request of image with opts, and says on
// which port of the host's network the admin listener is (0: Docker's
// default network).
func request(image string, opts []testcontainers.ContainerCustomizer) (testcontainers.GenericContainerRequest, int, error) {
	req := testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        image,
			ExposedPorts: []string{AdminPort},
			Env:          map[string]string{"OUTBOX_ADMIN_LISTEN": ":9780"},
		},
		Started: true,
	}
	host := false
	for _, opt := range opts {
		if err := opt.Customize(&req); err != nil {
			return req, 0, err
		}
		if _, ok := opt.(hostNetwork); ok {
			host = true
		}
	}
	if !host {
		return req, 0, nil
	}
	// After every option: a later host config modifier replaces an earlier
	// one.
	modify := req.HostConfigModifier
	req.HostConfigModifier = func(hc *container.HostConfig) {
		if modify != nil {
			modify(hc)
		}
		hc.NetworkMode = "host"
	}
	req.ExposedPorts = nil
	port, err := freePort()
	if err != nil {
		return req, 0, err
	}
	req.Env["OUTBOX_ADMIN_LISTEN"] = "127.0.0.1:" + strconv.Itoa(port)
	return req, port, nil
}

// WithDatabaseURL is the PostgreSQL connection string the relay uses
// (OUTBOX_DATABASE_URL), as the relay's container reaches the database.
func WithDatabaseURL(url string) testcontainers.CustomizeRequestOption {
	return testcontainers.WithEnv(map[string]string{"OUTBOX_DATABASE_URL": url})
}

// WithKafkaBrokers are the bootstrap brokers (OUTBOX_KAFKA_BROKERS).
func WithKafkaBrokers(brokers ...string) testcontainers.CustomizeRequestOption {
	return testcontainers.WithEnv(map[string]string{"OUTBOX_KAFKA_BROKERS": strings.Join(brokers, ",")})
}

// WithAdminToken turns on the dead-letter API and the console, with token
// as their bearer token (at least 16 characters), named admin and granted
// the operator role.
func WithAdminToken(token string) testcontainers.CustomizeRequestOption {
	return testcontainers.WithEnv(map[string]string{"OUTBOX_ADMIN_TOKEN": token, "OUTBOX_ADMIN_ROLES": "admin=operator"})
}

// WithConfig gives the relay a YAML configuration file
// (docs/configuration.md): destinations, routes, several outboxes.
// Variables still override it.
func WithConfig(yaml string) testcontainers.CustomizeRequestOption {
	return func(req *testcontainers.GenericContainerRequest) error {
		req.Files = append(req.Files, testcontainers.ContainerFile{
			Reader: strings.NewReader(yaml), ContainerFilePath: configPath, FileMode: 0o444,
		})
		return testcontainers.WithEnv(map[string]string{"OUTBOX_CONFIG": configPath})(req)
	}
}

// WithHostNetwork runs the relay on the host's network (Linux engines):
// the addresses the test uses reach it as they are, and its admin
// listener takes a free port on 127.0.0.1.
func WithHostNetwork() testcontainers.ContainerCustomizer { return hostNetwork{} }

// hostNetwork is applied by request, after the other options.
type hostNetwork struct{}

func (hostNetwork) Customize(*testcontainers.GenericContainerRequest) error { return nil }

// AdminURL is the admin listener's base URL on the host, such as
// http://localhost:32768: /livez, /readyz, /metrics, the console.
func (c *Container) AdminURL(ctx context.Context) (string, error) {
	if c.hostPort != 0 {
		return "http://127.0.0.1:" + strconv.Itoa(c.hostPort), nil
	}
	return c.PortEndpoint(ctx, AdminPort, "http")
}

// APIURL is the dead-letter API's base URL on the host (see
// WithAdminToken), such as http://localhost:32768/api/v1/.
func (c *Container) APIURL(ctx context.Context) (string, error) {
	u, err := c.AdminURL(ctx)
	if err != nil {
		return "", err
	}
	return u + apiPrefix, nil
}

// Output returns what the relay has logged so far.
func (c *Container) Output(ctx context.Context) (string, error) {
	b, err := readLogs(ctx, c)
	return string(b), err
}

// readLogs reads c's log, stdout and stderr.
func readLogs(ctx context.Context, c testcontainers.Container) ([]byte, error) {
	r, err := c.Logs(ctx)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// logLines is how much of the relay's log an error carries.
const logLines = 40

// logTail is the end of c's log, for an error, or nothing.
func logTail(c testcontainers.Container) string {
	if c == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, _ := readLogs(ctx, c)
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > logLines {
		lines = lines[len(lines)-logLines:]
	}
	if len(lines) == 0 || len(lines[0]) == 0 {
		return ""
	}
	return "\nthe relay's last log lines:\n" + string(bytes.Join(lines, []byte("\n")))
}

// freePort asks the kernel for a free port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
