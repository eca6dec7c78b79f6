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
// Run returns once the relay answers /readyz, reached where testcontainers
// reaches the engine's containers (localhost, or the engine's address, or
// TESTCONTAINERS_HOST_OVERRIDE). It fails sooner when the relay cannot
// start: at once when the relay exits (bad configuration, refused
// credentials, a schema to migrate), and after DatabaseWait when the relay
// is still waiting for a database it cannot reach; with the relay's own
// words in the error. StartupTimeout bounds the rest (WithStartupTimeout).
//
// With WithHostNetwork the relay shares the host's network (Linux
// engines), so the URLs and addresses the test itself uses (a database or
// broker container's published port on localhost, an httptest server)
// reach it unchanged. Without it the relay runs on Docker's default
// network: give it addresses it can reach there (a network the containers
// share, with aliases: testcontainers-go's network package).
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
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

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
// migrations, unless WithStartupTimeout says otherwise.
const StartupTimeout = 2 * time.Minute

// DatabaseWait is how long Run lets a relay wait for a database it cannot
// reach (it logs "waiting for the database") before it gives up, with the
// relay's reason, unless WithDatabaseWait says otherwise. A relay in
// production waits for its database as long as it takes; a test's
// database is either there or misconfigured.
const DatabaseWait = 15 * time.Second

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
	req, set, err := request(image, opts)
	if err != nil {
		return nil, err
	}
	req.WaitingFor = ready{hostPort: set.hostPort, timeout: set.startup, database: set.database}
	c, err := testcontainers.GenericContainer(ctx, req)
	var relay *Container
	if c != nil {
		relay = &Container{Container: c, hostPort: set.hostPort}
	}
	if err != nil {
		return relay, fmt.Errorf("start the relay from %s: %w%s", image, err, logTail(c))
	}
	return relay, nil
}

// ready waits for the relay's /readyz, and gives up as Run says.
type ready struct {
	hostPort int // the admin listener's port on the host's network; 0 on Docker's
	timeout  time.Duration
	database time.Duration // how long the relay may wait for its database
}

// Timeout is the wait's bound, for testcontainers.
func (r ready) Timeout() *time.Duration { return &r.timeout }

func (r ready) WaitUntilReady(ctx context.Context, target wait.StrategyTarget) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	began := time.Now()
	client := &http.Client{Timeout: time.Second}
	var url string
	lastLog := time.Time{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if url == "" {
			url, _ = r.readyURL(ctx, target)
		}
		if url != "" {
			if res, err := client.Get(url); err == nil {
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		st, err := target.State(ctx)
		if err == nil && !st.Running {
			return fmt.Errorf("the relay exited (code %d) before it was ready", st.ExitCode)
		}
		// The log once a second, once the database has had its time.
		if since := time.Since(began); since >= r.database && time.Since(lastLog) >= time.Second {
			lastLog = time.Now()
			if line := waitingLine(ctx, target); line != "" {
				return fmt.Errorf("the relay has waited %s for its database: %s", since.Round(time.Second), line)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the relay was not ready within %s (WithStartupTimeout): %w", r.timeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// readyURL is /readyz where the test reaches the relay: on the host the
// engine's containers are reached at, through the port Docker maps, or
// the host's port itself on the host's network.
func (r ready) readyURL(ctx context.Context, target wait.StrategyTarget) (string, error) {
	host, err := target.Host(ctx)
	if err != nil {
		return "", err
	}
	port := strconv.Itoa(r.hostPort)
	if r.hostPort == 0 {
		p, err := target.MappedPort(ctx, AdminPort)
		if err != nil {
			return "", err
		}
		port = p.Port()
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}

// waitingLine is the relay's last log line saying it waits for its
// database, or nothing.
func waitingLine(ctx context.Context, target wait.StrategyTarget) string {
	r, err := target.Logs(ctx)
	if err != nil {
		return ""
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	var last string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "waiting for the database") {
			last = strings.TrimSpace(l)
		}
	}
	return last
}

// MigrateUp runs `outbox-relay migrate up` from image in a container of its
// own, with the same options as Run, and returns when it is done: the
// outbox table and the relay's tables exist (idempotent, and safe beside
// running relays). On failure the error holds its output.
func MigrateUp(ctx context.Context, image string, opts ...testcontainers.ContainerCustomizer) (err error) {
	req, set, err := request(image, opts)
	if err != nil {
		return err
	}
	req.Cmd = []string{"migrate", "up"}
	req.ExposedPorts = nil
	req.WaitingFor = wait.ForExit().WithExitTimeout(set.startup)
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

// settings are what request found in the options.
type settings struct {
	// hostPort is the admin listener's port on the host's network, or 0
	// on Docker's default network.
	hostPort int
	startup  time.Duration
	database time.Duration
}

// request builds the container request of image with opts.
func request(image string, opts []testcontainers.ContainerCustomizer) (testcontainers.GenericContainerRequest, settings, error) {
	req := testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        image,
			ExposedPorts: []string{AdminPort},
			Env:          map[string]string{"OUTBOX_ADMIN_LISTEN": ":9780"},
		},
		Started: true,
	}
	set := settings{startup: StartupTimeout, database: DatabaseWait}
	host := false
	for _, opt := range opts {
		if err := opt.Customize(&req); err != nil {
			return req, set, err
		}
		switch opt := opt.(type) {
		case hostNetwork:
			host = true
		case startupTimeout:
			set.startup = time.Duration(opt)
		case databaseWait:
			set.database = time.Duration(opt)
		}
	}
	if !host {
		return req, set, nil
	}
	hostNetworkMode(&req)
	req.ExposedPorts = nil
	port, err := freePort()
	if err != nil {
		return req, set, err
	}
	// Every interface: the test may reach the host at another address
	// than loopback (from a container of its own, the bridge's gateway).
	req.Env["OUTBOX_ADMIN_LISTEN"] = ":" + strconv.Itoa(port)
	set.hostPort = port
	return req, set, nil
}

// hostNetworkMode sets the container's network mode to host, after the
// host config modifiers of the other options.
//
// The modifier is made by reflection rather than written as a function:
// its parameter is Docker's HostConfig, which testcontainers-go took from
// github.com/docker/docker up to v0.40 and from github.com/moby/moby
// since. Naming either would tie an application's tests to that range of
// testcontainers-go versions; this compiles against both, and the field's
// name is the same in each.
func hostNetworkMode(req *testcontainers.GenericContainerRequest) {
	field := reflect.ValueOf(&req.HostConfigModifier).Elem()
	earlier := reflect.ValueOf(req.HostConfigModifier)
	field.Set(reflect.MakeFunc(field.Type(), func(args []reflect.Value) []reflect.Value {
		if !earlier.IsNil() {
			earlier.Call(args)
		}
		args[0].Elem().FieldByName("NetworkMode").SetString("host")
		return nil
	}))
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
// listener takes a free port of the host, on every interface.
func WithHostNetwork() testcontainers.ContainerCustomizer { return hostNetwork{} }

// hostNetwork is applied by request, after the other options.
type hostNetwork struct{}

func (hostNetwork) Customize(*testcontainers.GenericContainerRequest) error { return nil }

// WithStartupTimeout bounds how long Run waits for the relay to be ready,
// and MigrateUp for the migrations: StartupTimeout without it.
func WithStartupTimeout(d time.Duration) testcontainers.ContainerCustomizer { return startupTimeout(d) }

type startupTimeout time.Duration

func (startupTimeout) Customize(*testcontainers.GenericContainerRequest) error { return nil }

// WithDatabaseWait is how long Run lets the relay wait for a database it
// cannot reach: DatabaseWait without it. Raise it for a database that
// takes longer to start than the test waits for it.
func WithDatabaseWait(d time.Duration) testcontainers.ContainerCustomizer { return databaseWait(d) }

type databaseWait time.Duration

func (databaseWait) Customize(*testcontainers.GenericContainerRequest) error { return nil }

// AdminURL is the admin listener's base URL where the test reaches it,
// such as http://localhost:32768: /livez, /readyz, /metrics, the console.
func (c *Container) AdminURL(ctx context.Context) (string, error) {
	if c.hostPort != 0 {
		host, err := c.Host(ctx)
		if err != nil {
			return "", err
		}
		return "http://" + net.JoinHostPort(host, strconv.Itoa(c.hostPort)), nil
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
