package natstest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-relay/outbox-relay/internal/dev/freeport"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// serveVar, set in a process's environment, makes Main serve NATS with the
// options it holds instead of running the tests.
const serveVar = "NATSTEST_SERVE"

// processOptions are what a server process is started with.
type processOptions struct {
	Port       int
	StoreDir   string
	MaxPayload int32
}

// Main runs the tests of a package that starts server processes
// (StartProcess): call it from TestMain. In a process StartProcess
// started, it serves NATS instead, until it is killed.
func Main(m *testing.M) {
	if v := os.Getenv(serveVar); v != "" {
		os.Exit(serve(v))
	}
	os.Exit(m.Run())
}

func serve(v string) int {
	var o processOptions
	if err := json.Unmarshal([]byte(v), &o); err != nil {
		fmt.Fprintln(os.Stderr, "natstest:", err)
		return 2
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: o.Port, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: o.StoreDir, MaxPayload: o.MaxPayload})
	if err != nil {
		fmt.Fprintln(os.Stderr, "natstest:", err)
		return 2
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "natstest: the server did not start")
		return 2
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	<-stop
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}

// Process is a NATS server with JetStream in a process of its own, which a
// test can kill as a crash does. Its package's TestMain must call Main.
type Process struct {
	tb   testing.TB
	opts processOptions
	cmd  *exec.Cmd
	done chan struct{}
	// URL is the server's client URL, the same across restarts.
	URL string
}

// StartProcess starts a server in a process of its own (the test binary,
// run again as a server: see Main) on a free port, its streams in a
// directory of the test's, stopped when the test ends. Users and TLS are
// not taken.
func StartProcess(tb testing.TB, o Options) *Process {
	tb.Helper()
	if o.Users != nil || o.Token != "" || o.TLS != nil {
		tb.Fatal("natstest: a server process takes no users, token or TLS")
	}
	port, err := freeport.Port()
	if err != nil {
		tb.Fatal(err)
	}
	p := &Process{tb: tb, opts: processOptions{Port: port, StoreDir: filepath.Join(tb.TempDir(), "jetstream"), MaxPayload: o.MaxPayload},
		URL: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	p.start()
	tb.Cleanup(p.Stop)
	return p
}

func (p *Process) start() {
	p.tb.Helper()
	opts, err := json.Marshal(p.opts)
	if err != nil {
		p.tb.Fatal(err)
	}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), serveVar+"="+string(opts))
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		p.tb.Fatalf("natstest: %v", err)
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	testwait.State(p.tb, 30*time.Second, func() (bool, string) {
		select {
		case <-p.done:
			p.tb.Fatalf("natstest: the server process exited: %v", p.cmd.ProcessState)
		default:
		}
		nc, err := natsgo.Connect(p.URL, natsgo.Timeout(time.Second))
		if err != nil {
			return false, fmt.Sprintf("natstest: the server process does not answer: %v", err)
		}
		nc.Close()
		return true, ""
	})
}

// Kill kills the server as a crash does (SIGKILL): no goodbye to its
// clients, nothing written beyond what it had written.
func (p *Process) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Crash kills the server and starts it again on the same port with the
// same streams.
func (p *Process) Crash() {
	p.tb.Helper()
	p.Kill()
	p.start()
}

// Stop stops the server; its streams stay on disk.
func (p *Process) Stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.Kill()
	}
}

// Connect returns a JetStream client of the server, closed when the test
// ends, that reconnects across restarts.
func (p *Process) Connect() jetstream.JetStream {
	p.tb.Helper()
	nc, err := natsgo.Connect(p.URL, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	if err != nil {
		p.tb.Fatalf("natstest: connect: %v", err)
	}
	p.tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		p.tb.Fatal(err)
	}
	return js
}
