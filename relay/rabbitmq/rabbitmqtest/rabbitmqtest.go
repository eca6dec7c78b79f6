// Package rabbitmqtest runs a real RabbitMQ node (Debian's
// rabbitmq-server, installed by scripts/ensure-rabbitmq) for the RabbitMQ
// sink's tests: its own node name, ports (AMQP, distribution, epmd) and
// throwaway directory, started, stopped and started again with the same
// data.
package rabbitmqtest

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/internal/dev/freeport"
	"github.com/outbox-relay/outbox-relay/internal/dev/memdir"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// Server is the broker's binary, as Debian installs it.
const Server = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// Options change the node a test starts.
type Options struct {
	// Users and their passwords, each with every permission on "/";
	// guest/guest is always there.
	Users map[string]string
	// TLSCert, TLSKey and TLSCA, when set, make the node speak AMQPS only.
	TLSCert, TLSKey, TLSCA string
	// Conf are further lines of rabbitmq.conf (max_message_size = 4096).
	Conf []string
}

// Node is a running RabbitMQ node.
type Node struct {
	tb       testing.TB // nil outside a test
	dir      string
	env      []string
	epmdPort int
	cmd      *exec.Cmd
	done     chan struct{}
	tls      *tls.Config // trusting the node's certificate, with TLS
	name     string      // the node's name
	// Addr is the AMQP listener's host:port; URL is amqp://guest@Addr/
	// (amqps:// with TLS), the password guest apart.
	Addr, URL string
}

// Start starts a node, stopped when the test ends. Without
// rabbitmq-server the test is skipped, unless OUTBOX_TEST_RABBITMQ is
// set, as make test sets it: then it fails.
func Start(tb testing.TB, o Options) *Node {
	tb.Helper()
	// A node takes seconds of CPU to boot: the inner loop leaves the
	// tests that start one to make test.
	testwait.SkipShort(tb)
	if _, err := os.Stat(Server); err != nil {
		if os.Getenv("OUTBOX_TEST_RABBITMQ") != "" {
			tb.Fatal("rabbitmqtest: rabbitmq-server is not installed: run scripts/ensure-rabbitmq")
		}
		tb.Skip("rabbitmqtest: rabbitmq-server is not installed (scripts/ensure-rabbitmq installs it; make test does)")
	}
	n, err := Launch(memdir.Temp(tb), o)
	if err != nil {
		tb.Fatal(err)
	}
	n.tb = tb
	tb.Cleanup(n.Stop)
	return n
}

// Launch starts a node with its data in dir, outside a test (the local
// stack); the caller stops it.
func Launch(dir string, o Options) (*Node, error) {
	if _, err := os.Stat(Server); err != nil {
		return nil, errors.New("rabbitmqtest: rabbitmq-server is not installed: run scripts/ensure-rabbitmq")
	}
	ports, err := freeport.Ports(3)
	if err != nil {
		return nil, err
	}
	n := &Node{dir: dir, epmdPort: ports[2], Addr: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	conf := []string{"loopback_users = none", "log.console = true", "log.file = false", "log.console.level = warning"}
	if o.TLSCert != "" {
		conf = append(conf, "listeners.tcp = none", fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d", ports[0]),
			"ssl_options.cacertfile = "+o.TLSCA, "ssl_options.certfile = "+o.TLSCert, "ssl_options.keyfile = "+o.TLSKey,
			"ssl_options.verify = verify_none", "ssl_options.fail_if_no_peer_cert = false")
		n.URL = "amqps://guest@" + n.Addr + "/"
		ca, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		n.tls = &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	} else {
		conf = append(conf, fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d", ports[0]))
		n.URL = "amqp://guest@" + n.Addr + "/"
	}
	conf = append(conf, o.Conf...)
	users := map[string]string{"guest": "guest"}
	for u, pw := range o.Users {
		users[u] = pw
	}
	defs, err := definitions(users)
	if err != nil {
		return nil, err
	}
	conf = append(conf, "definitions.import_backend = local_filesystem", "definitions.local.path = "+filepath.Join(dir, "definitions.json"))
	for name, text := range map[string]string{"definitions.json": string(defs), "rabbitmq.conf": strings.Join(conf, "\n") + "\n", "enabled_plugins": "[].\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	name := "outbox-test-" + strings.ToLower(rand.Text()[:10])
	n.name = name + "@localhost"
	n.env = append(os.Environ(),
		"HOME="+dir,
		"RABBITMQ_NODENAME="+name+"@localhost",
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", ports[1]),
		fmt.Sprintf("ERL_EPMD_PORT=%d", ports[2]),
		// One scheduler, which sleeps when idle rather than spinning:
		// tests run several nodes on small machines.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=+S 1:1 +A 4 +sbwt none +sbwtdcpu none +sbwtdio none",
	)
	return n, n.start()
}

func (n *Node) start() error {
	n.cmd = exec.Command(Server)
	n.cmd.Env, n.cmd.Dir = n.env, n.dir
	out, err := os.Create(filepath.Join(n.dir, "node.log"))
	if err != nil {
		return err
	}
	n.cmd.Stdout, n.cmd.Stderr = out, out
	// Its own process group: the script, the Erlang VM and its helpers
	// stop together.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("rabbitmqtest: %w", err)
	}
	n.done = make(chan struct{})
	go func() { _ = n.cmd.Wait(); _ = out.Close(); close(n.done) }()
	exited := false
	ok, _ := testwait.Poll(2*time.Minute, func() (bool, string) {
		select {
		case <-n.done:
			exited = true
			return true, ""
		default:
		}
		c, err := net.DialTimeout("tcp", n.Addr, time.Second)
		if err != nil {
			return false, ""
		}
		_ = c.Close()
		// Listening comes before the node takes logins: try one.
		conn, err := amqp.DialConfig(strings.Replace(n.URL, "guest@", "guest:guest@", 1), amqp.Config{TLSClientConfig: n.tls, Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			return false, ""
		}
		_ = conn.Close()
		return true, ""
	})
	if exited || !ok {
		log, _ := os.ReadFile(filepath.Join(n.dir, "node.log"))
		n.Stop()
		return fmt.Errorf("rabbitmqtest: the node did not start:\n%s", log)
	}
	return nil
}

// Stop stops the node and its epmd; its data stays in its directory.
func (n *Node) Stop() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	pgid := n.cmd.Process.Pid
	select {
	case <-n.done:
	default:
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(30 * time.Second):
		}
	}
	// The VM may outlive the script that started it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-n.done
	_ = exec.Command("epmd", "-port", fmt.Sprint(n.epmdPort), "-kill").Run()
}

// Kill kills the node as a crash does: SIGKILL to the script, the Erlang VM
// and its helpers, with no time to flush or to close its clients'
// connections. What it confirmed is on disk in its directory.
func (n *Node) Kill() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	<-n.done
}

// Crash kills the node and starts it again on the same ports with the same
// data, and fails the test if it cannot.
func (n *Node) Crash() {
	n.tb.Helper()
	n.Kill()
	if err := n.start(); err != nil {
		n.tb.Fatal(err)
	}
}

// Ctl runs rabbitmqctl against the node and returns what it printed; it
// fails the test if the command fails.
func (n *Node) Ctl(args ...string) string {
	n.tb.Helper()
	cmd := exec.Command("/usr/lib/rabbitmq/bin/rabbitmqctl", append([]string{"-n", n.name}, args...)...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		n.tb.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// Restart starts the node again, on the same ports with the same data,
// and fails the test if it cannot.
func (n *Node) Restart() {
	n.tb.Helper()
	if err := n.Relaunch(); err != nil {
		n.tb.Fatal(err)
	}
}

// Relaunch stops the node and starts it again, on the same ports with the
// same data.
func (n *Node) Relaunch() error {
	n.Stop()
	return n.start()
}

// Dial connects as guest (with cfg's TLS, if any), closed when the test
// ends.
func (n *Node) Dial(cfg amqp.Config) *amqp.Connection {
	n.tb.Helper()
	u := strings.Replace(n.URL, "guest@", "guest:guest@", 1)
	c, err := amqp.DialConfig(u, cfg)
	if err != nil {
		n.tb.Fatalf("rabbitmqtest: dial: %v", err)
	}
	n.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// definitions are the node's users and their permissions, as RabbitMQ
// imports them at boot: salted SHA-256 password hashes.
func definitions(users map[string]string) ([]byte, error) {
	type user struct {
		Name      string   `json:"name"`
		Hash      string   `json:"password_hash"`
		Algorithm string   `json:"hashing_algorithm"`
		Tags      []string `json:"tags"`
	}
	var d struct {
		Users       []user              `json:"users"`
		Vhosts      []map[string]string `json:"vhosts"`
		Permissions []map[string]string `json:"permissions"`
	}
	d.Vhosts = []map[string]string{{"name": "/"}}
	for name, pw := range users {
		salt := make([]byte, 4)
		_, _ = rand.Read(salt)
		sum := sha256.Sum256(append(append([]byte{}, salt...), pw...))
		d.Users = append(d.Users, user{Name: name, Hash: base64.StdEncoding.EncodeToString(append(salt, sum[:]...)),
			Algorithm: "rabbit_password_hashing_sha256", Tags: []string{"administrator"}})
		d.Permissions = append(d.Permissions, map[string]string{"user": name, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"})
	}
	return json.Marshal(d)
}
