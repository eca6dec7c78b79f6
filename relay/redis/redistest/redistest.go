// Package redistest runs a real redis-server (Debian's package, installed
// by scripts/ensure-redis) on a free port with a throwaway directory, for
// the Redis sink's tests: start, stop and start again on the same port
// and data, and read back what the streams hold.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/internal/dev/freeport"
	"github.com/outbox-relay/outbox-relay/internal/dev/memdir"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// Options change the server a test starts.
type Options struct {
	// Password, when set, is required of every client (requirepass).
	Password string
	// ACL lines, as a users file holds them (user name on >pw ~* +@all).
	ACL []string
	// TLSCert, TLSKey and TLSCA, when set, make the server speak TLS only.
	TLSCert, TLSKey, TLSCA string
}

// Server is a redis-server process.
type Server struct {
	tb   testing.TB // nil outside a test
	dir  string
	bin  string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	// Addr is the server's host:port, the same across restarts.
	Addr string
}

// Start starts a server, stopped when the test ends. Without
// redis-server the test is skipped, unless OUTBOX_TEST_REDIS is set, as
// make test sets it: then it fails.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("OUTBOX_TEST_REDIS") != "" {
			tb.Fatal("redistest: redis-server is not installed: run scripts/ensure-redis")
		}
		tb.Skip("redistest: redis-server is not installed (scripts/ensure-redis installs it; make test does)")
	}
	s, err := Launch(memdir.Temp(tb), o)
	if err != nil {
		tb.Fatal(err)
	}
	s.tb = tb
	tb.Cleanup(s.Stop)
	return s
}

// Launch starts a server with its data in dir, outside a test (the local
// stack); the caller stops it.
func Launch(dir string, o Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redistest: redis-server is not installed: run scripts/ensure-redis")
	}
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin, Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	s.args = []string{"--bind", "127.0.0.1", "--dir", s.dir, "--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--daemonize", "no", "--protected-mode", "no", "--logfile", filepath.Join(s.dir, "redis.log")}
	if o.TLSCert != "" {
		s.args = append(s.args, "--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cert-file", o.TLSCert,
			"--tls-key-file", o.TLSKey, "--tls-ca-cert-file", o.TLSCA, "--tls-auth-clients", "no")
	} else {
		s.args = append(s.args, "--port", strconv.Itoa(port))
	}
	if o.Password != "" {
		s.args = append(s.args, "--requirepass", o.Password)
	}
	if len(o.ACL) > 0 {
		acl := filepath.Join(s.dir, "users.acl")
		if err := os.WriteFile(acl, []byte(strings.Join(o.ACL, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
		s.args = append(s.args, "--aclfile", acl)
	}
	return s, s.start()
}

func (s *Server) start() error {
	logFile := filepath.Join(s.dir, "redis.log")
	before, _ := os.ReadFile(logFile)
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Dir = s.dir
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	exited := false
	// Ready when this start's log says so: a successful dial alone is not
	// proof, as the port may answer for another process (one that took it
	// after it was chosen, or the dial connecting to itself).
	ok, _ := testwait.Poll(30*time.Second, func() (bool, string) {
		select {
		case <-s.done:
			exited = true
			return true, ""
		default:
		}
		log, _ := os.ReadFile(logFile)
		return len(log) > len(before) && bytes.Contains(log[len(before):], []byte("Ready to accept connections")), ""
	})
	if exited || !ok {
		log, _ := os.ReadFile(logFile)
		s.Stop()
		return fmt.Errorf("redistest: redis-server did not start:\n%s", log)
	}
	return nil
}

// Stop stops the server; its data stays in its directory.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Kill kills the server as a crash does (SIGKILL): what it acknowledged is
// in its append-only file, written before each reply.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Crash kills the server and starts it again on the same port with the same
// data, and fails the test if it cannot.
func (s *Server) Crash() {
	s.tb.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.tb.Fatal(err)
	}
}

// Restart starts the server again, on the same port with the same data,
// and fails the test if it cannot.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.Relaunch(); err != nil {
		s.tb.Fatal(err)
	}
}

// Relaunch stops the server and starts it again, on the same port with the
// same data.
func (s *Server) Relaunch() error {
	s.Stop()
	return s.start()
}

// Client returns a client of the server with opts' credentials and TLS
// added, closed when the test ends.
func (s *Server) Client(opts *goredis.Options) *goredis.Client {
	s.tb.Helper()
	if opts == nil {
		opts = &goredis.Options{}
	}
	opts.Addr = s.Addr
	c := goredis.NewClient(opts)
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Entries returns the entries of stream, oldest first, each as its
// fields.
func Entries(tb testing.TB, c *goredis.Client, stream string) []map[string]any {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := c.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		tb.Fatalf("redistest: XRANGE %s: %v", stream, err)
	}
	out := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		out[i] = m.Values
	}
	return out
}
