package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/freeport"
)

// Bouncer is a running PgBouncer in front of a PostgreSQL server.
type Bouncer struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// ErrNoBouncer reports that the pgbouncer binary was not found.
var ErrNoBouncer = errors.New("pgbouncer not found on PATH or in /usr/sbin; install it, e.g. apt-get install -y pgbouncer")

// StartBouncer starts PgBouncer on a free port of 127.0.0.1 in poolMode
// (session or transaction), passing every database through to the server
// that serverURL (a postgres:// URL) names, as serverURL's user. Clients may
// log in as anyone. Stop shuts it down.
func StartBouncer(ctx context.Context, serverURL, poolMode string) (*Bouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, err := os.Stat(bin); err != nil {
			return nil, ErrNoBouncer
		}
	}
	target, err := bouncerTarget(serverURL)
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 { // PgBouncer refuses to run as root
		if cred, err = postgresCredential(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "outbox-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("create pgbouncer directory: %w", err)
	}
	var lastErr error
	for range 5 { // the free port may be taken before PgBouncer binds it
		port, err := freeport.Port()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		b, err := startBouncer(ctx, bin, dir, target, poolMode, port, cred)
		if err == nil {
			return b, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// bouncerTarget turns a server URL into PgBouncer's fallback database line.
func bouncerTarget(serverURL string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", fmt.Errorf("server URL: %w", err)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "5432"
	}
	user := u.User.Username()
	if user == "" {
		user = "postgres"
	}
	line := fmt.Sprintf("host=%s port=%s user=%s", host, port, user)
	if pw, ok := u.User.Password(); ok {
		line += " password=" + pw
	}
	return line, nil
}

func startBouncer(ctx context.Context, bin, dir, target, poolMode string, port int, cred *syscall.Credential) (*Bouncer, error) {
	ini := filepath.Join(dir, "pgbouncer.ini")
	conf := strings.Join([]string{
		"[databases]",
		"* = " + target,
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = any",
		"pool_mode = " + poolMode,
		"max_client_conn = 500",
		"default_pool_size = 40",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"",
	}, "\n")
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("write pgbouncer.ini: %w", err)
	}
	if cred != nil {
		for _, p := range []string{dir, ini} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("hand pgbouncer files to postgres: %w", err)
			}
		}
	}
	cmd := exec.Command(bin, ini)
	cmd.Dir = dir
	// The pooler must not outlive a test binary killed by a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	b := &Bouncer{dir: dir, port: port, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(b.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			_ = conn.Close()
			return b, nil
		}
		select {
		case <-b.done:
			logTail, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return nil, fmt.Errorf("pgbouncer exited: %s %s", lastLines([]byte(out.String()), 3), lastLines(logTail, 5))
		case <-ctx.Done():
			b.kill()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.kill()
			return nil, errors.New("pgbouncer did not listen within 30s")
		}
	}
}

// Port is the TCP port PgBouncer listens on at 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// DSN returns a connection string for database through PgBouncer.
func (b *Bouncer) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", b.port, database)
}

// Log is what PgBouncer has logged so far.
func (b *Bouncer) Log() string {
	s, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(s)
}

// Stop shuts PgBouncer down and removes its directory.
func (b *Bouncer) Stop() error {
	b.kill()
	return os.RemoveAll(b.dir)
}

func (b *Bouncer) kill() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}
