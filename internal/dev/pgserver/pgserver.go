// Package pgserver starts a throwaway PostgreSQL cluster from the local
// PostgreSQL binaries, for tests and the local demo stack.
//
// The cluster lives in a fresh temporary directory, listens on 127.0.0.1 on a
// free port (and on a Unix socket inside its directory), trusts local
// connections, and is removed by Stop. PostgreSQL refuses to run as root, so
// when the current user is root the server runs as the "postgres" user.
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/freeport"
)

// Server is a running throwaway cluster.
type Server struct {
	dir  string
	bin  string
	port int
	cred *syscall.Credential
}

// Options tune the cluster.
type Options struct {
	// Durable keeps fsync on. Throwaway clusters turn it off by default,
	// which is safe for everything except a crash of the host itself.
	// Commits stay synchronous either way: with synchronous_commit off, a
	// server stopped as a crash would (Halt) loses its last acknowledged
	// commits, sequence values among them, and ids come back.
	Durable bool
	// Settings are extra server settings (name → value).
	Settings map[string]string
}

// ErrNoBinaries reports that no PostgreSQL server binaries were found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin; install them, e.g. apt-get install -y postgresql")

// FindBinaries returns the directory holding initdb and pg_ctl.
func FindBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			p = resolved
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	// Prefer the newest major version.
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(initdbPath string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdbPath))))
	return v
}

// Start creates and starts a cluster. Call Stop to shut it down and remove it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, err
		}
		s.cred = cred
	}
	reapOrphans(ctx, s)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	s.dir = dir
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		s.remove()
		return nil, fmt.Errorf("record the cluster's owner: %w", err)
	}
	if s.cred != nil {
		// The temporary directory's parent must let the postgres user in.
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			s.remove()
			return nil, fmt.Errorf("hand cluster directory to postgres: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := s.command(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		s.remove()
		return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(out, 5))
	}

	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": dir,
		"max_connections":         "300",
		"shared_buffers":          "128MB",
		"log_min_messages":        "warning",
	}
	if !opts.Durable {
		settings["fsync"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	// Another process may take the free port between probe and bind; retry
	// with a new one.
	var lastErr error
	for range 5 {
		port, err := freeport.Port()
		if err != nil {
			s.remove()
			return nil, err
		}
		settings["port"] = strconv.Itoa(port)
		if err := writeSettings(filepath.Join(data, "postgresql.auto.conf"), settings, s.cred); err != nil {
			s.remove()
			return nil, err
		}
		out, err := s.command(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", data,
			"-l", filepath.Join(dir, "server.log")).CombinedOutput()
		if err == nil {
			s.port = port
			return s, nil
		}
		logTail, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		lastErr = fmt.Errorf("pg_ctl start: %w: %s %s", err, lastLines(out, 3), lastLines(logTail, 5))
	}
	s.remove()
	return nil, lastErr
}

// Port is the TCP port the server listens on at 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Dir is the cluster's directory (data and server log).
func (s *Server) Dir() string { return s.dir }

// DSN returns a connection string for database as the postgres superuser.
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, database)
}

// Stop shuts the server down and removes its directory.
func (s *Server) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := s.command(ctx, "pg_ctl", "stop", "-w", "-m", "immediate", "-D", filepath.Join(s.dir, "data")).CombinedOutput()
	s.remove()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, lastLines(out, 3))
	}
	return nil
}

// Restart stops the server the way a crash would and starts it again on the
// same port, for tests of database restarts.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Halt(ctx); err != nil {
		return err
	}
	return s.Resume(ctx)
}

// Halt stops the server the way a crash would, keeping its data; Resume
// starts it again on the same port. Between them the database is down.
func (s *Server) Halt(ctx context.Context) error {
	data := filepath.Join(s.dir, "data")
	if out, err := s.command(ctx, "pg_ctl", "stop", "-w", "-m", "immediate", "-D", data).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, lastLines(out, 3))
	}
	return nil
}

// Resume starts a halted server again.
func (s *Server) Resume(ctx context.Context) error {
	data := filepath.Join(s.dir, "data")
	if out, err := s.command(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", data,
		"-l", filepath.Join(s.dir, "server.log")).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s", err, lastLines(out, 3))
	}
	return nil
}

func (s *Server) remove() { _ = os.RemoveAll(s.dir) }

const (
	dirPrefix = "outbox-pg-"
	ownerFile = "owner.pid"
)

// reapOrphans stops and removes clusters whose owning process is gone: a
// test binary killed by a timeout or a signal cannot stop its cluster.
func reapOrphans(ctx context.Context, s *Server) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue // alive, or not ours to judge
		}
		orphan := &Server{dir: dir, bin: s.bin, cred: s.cred}
		_ = orphan.command(ctx, "pg_ctl", "stop", "-w", "-m", "immediate", "-D", filepath.Join(dir, "data")).Run()
		orphan.remove()
	}
}

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	// Locale variables of the caller can make initdb fail when the locale
	// is not installed; the cluster uses C.
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL must run as the postgres user, which does not exist: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user id %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres group id %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func writeSettings(path string, settings map[string]string, cred *syscall.Credential) error {
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write server settings: %w", err)
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("hand server settings to postgres: %w", err)
		}
	}
	return nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(bytes.ToValidUTF8(b, nil))), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
