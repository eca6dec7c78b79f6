// Command pgcontainer is the entrypoint of the PostgreSQL image the
// container tests build from the distribution's server binaries (see
// scripts/build-test-images): no registry is needed for it. It follows the
// interface of the official postgres image, which testcontainers-go's
// postgres module expects: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB
// and POSTGRES_HOST_AUTH_METHOD; on first start it initialises PGDATA, runs
// a server on the Unix socket alone to create the database, stops it, and
// then runs the server for real (each logs that it is ready), with the
// arguments given after "postgres".
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The postgres user of the image (its /etc/passwd says the same).
const (
	uid       = 999
	gid       = 999
	socketDir = "/var/run/postgresql"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "pgcontainer:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "postgres" {
		args = args[1:]
	}
	data := cmp.Or(os.Getenv("PGDATA"), "/var/lib/postgresql/data")
	if os.Getuid() == 0 {
		// As the official image does: prepare the directories as root,
		// then run as postgres, which the server insists on.
		for _, dir := range []string{data, socketDir} {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			if err := os.Chown(dir, uid, gid); err != nil {
				return err
			}
		}
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("drop groups: %w", err)
		}
		if err := syscall.Setgid(gid); err != nil {
			return fmt.Errorf("become postgres: %w", err)
		}
		if err := syscall.Setuid(uid); err != nil {
			return fmt.Errorf("become postgres: %w", err)
		}
	}
	postgres, err := exec.LookPath("postgres")
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := initialise(data, postgres); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	return syscall.Exec(postgres, append([]string{"postgres", "-D", data}, args...), os.Environ())
}

// initialise creates the cluster, its user and database, and lets every
// host in with a password (or without, if POSTGRES_HOST_AUTH_METHOD is
// trust).
func initialise(data, postgres string) error {
	user := cmp.Or(os.Getenv("POSTGRES_USER"), "postgres")
	password := os.Getenv("POSTGRES_PASSWORD")
	db := cmp.Or(os.Getenv("POSTGRES_DB"), user)
	auth := os.Getenv("POSTGRES_HOST_AUTH_METHOD")
	if auth == "" {
		auth = "scram-sha-256"
		if password == "" {
			return errors.New("POSTGRES_PASSWORD is empty: set it, or POSTGRES_HOST_AUTH_METHOD=trust to let anyone in")
		}
	}
	pwfile, err := os.CreateTemp("", "pwfile")
	if err != nil {
		return err
	}
	defer os.Remove(pwfile.Name())
	if _, err := pwfile.WriteString(password + "\n"); err != nil {
		return err
	}
	if err := pwfile.Close(); err != nil {
		return err
	}
	initdb := exec.Command(filepath.Join(filepath.Dir(postgres), "initdb"), "-D", data, "--username="+user,
		"--pwfile="+pwfile.Name(), "--encoding=UTF8", "--locale=C", "--auth-local=trust", "--auth-host="+auth)
	initdb.Stdout, initdb.Stderr = os.Stdout, os.Stderr
	if err := initdb.Run(); err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	if err := appendTo(filepath.Join(data, "pg_hba.conf"), "host all all all "+auth+"\n"); err != nil {
		return err
	}
	if err := appendTo(filepath.Join(data, "postgresql.conf"), "listen_addresses = '*'\n"); err != nil {
		return err
	}

	// The database, created on a server that only the socket reaches; it
	// runs whatever the database, as the official image's does, and says
	// it is ready, which its users wait for.
	srv := exec.Command(postgres, "-D", data, "-c", "listen_addresses=", "-p", "5432")
	srv.Stdout, srv.Stderr = os.Stdout, os.Stderr
	if err := srv.Start(); err != nil {
		return fmt.Errorf("start the setup server: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = createDatabase(ctx, user, db)
	if stopErr := srv.Process.Signal(os.Interrupt); stopErr != nil && err == nil {
		err = stopErr
	}
	if waitErr := srv.Wait(); waitErr != nil && err == nil {
		err = fmt.Errorf("setup server: %w", waitErr)
	}
	return err
}

func createDatabase(ctx context.Context, user, db string) error {
	cfg, err := pgx.ParseConfig("host=" + socketDir + " port=5432 dbname=postgres user=" + user)
	if err != nil {
		return err
	}
	var conn *pgx.Conn
	for {
		if conn, err = pgx.ConnectConfig(ctx, cfg); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the setup server did not answer: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	defer conn.Close(context.Background())
	if db == "postgres" {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	return err
}

func appendTo(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
