// Package redistest runs a real redis-server (Debian's package, installed
// by scripts/ensure-redis) on a free port with a throwaway directory, for
// the Redis sink's tests: start, stop and start again on the same port
// and data, and read back what the streams hold.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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
	tb   testing.TB
	dir  string
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
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REDIS") != "" {
			tb.Fatal("redistest: redis-server is not installed: run scripts/ensure-redis")
		}
		tb.Skip("redistest: redis-server is not installed (scripts/ensure-redis installs it; make test does)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	s := &Server{tb: tb, dir: tb.TempDir(), Addr: fmt.Sprintf("127.0.0.1:%d", port)}
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
		var b []byte
		for _, l := range o.ACL {
			b = append(b, l+"\n"...)
		}
		if err := os.WriteFile(acl, b, 0o600); err != nil {
			tb.Fatal(err)
		}
		s.args = append(s.args, "--aclfile", acl)
	}
	s.start(bin)
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) start(bin string) {
	s.tb.Helper()
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Dir = s.dir
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	testwait.Within(s.tb, 30*time.Second, "redis-server to listen", func() bool {
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.tb.Fatalf("redistest: redis-server exited:\n%s", log)
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
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

// Restart starts the server again, on the same port with the same data.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start(s.cmd.Path)
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
