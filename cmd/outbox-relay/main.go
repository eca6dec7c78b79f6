// Command outbox-relay delivers the rows of a PostgreSQL outbox table to
// Kafka and HTTP destinations, and manages the table's schema.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/gctune"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2 // bad flags, arguments or configuration
)

func main() {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one gets the default behaviour:
	// exit at once.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Environ(), os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError marks errors in how the command was called.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// silentError ends a command with exit code 1 once it has printed why.
type silentError struct{ err error }

func (e silentError) Error() string { return e.err.Error() }
func (e silentError) Unwrap() error { return e.err }

// app carries what every command needs.
type app struct {
	flags  *config.Flags
	env    []string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	cfg    *config.Config // set by load
	log    *slog.Logger
	outbox string   // --outbox of migrate and dlq
	atExit []func() // run when the command is done, last first
}

func run(ctx context.Context, args, env []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{env: env, stdin: stdin, stdout: stdout, stderr: stderr}
	defer func() {
		for _, f := range slices.Backward(a.atExit) {
			f()
		}
	}()
	ver := currentBuild().Version
	root := &cobra.Command{
		Use:           "outbox-relay",
		Short:         "Deliver PostgreSQL outbox rows to Kafka and HTTP, at least once and in order per key",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       ver,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		var ne *pflag.NotExistError
		if errors.As(err, &ne) {
			if hint, ok := config.SecretFlag(ne.GetSpecifiedName()); ok {
				return usageError{fmt.Errorf("--%s: secrets are not taken from the command line, where every user of the machine can see them; %s", ne.GetSpecifiedName(), hint)}
			}
		}
		return usageError{err}
	})
	a.flags = config.Bind(root.PersistentFlags())
	root.AddCommand(a.migrateCmd(), a.runCmd(), a.dlqCmd(), a.findCmd(), a.captureCmd(), a.versionCmd())
	root.SetArgs(args)

	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	redact := func(s string) string { return s }
	if a.cfg != nil {
		redact = a.cfg.RedactURLs
	}
	var ce *config.Error
	switch {
	case errors.As(err, &ce):
		fmt.Fprintln(stderr, "outbox-relay:", err)
		return exitUsage
	case errors.As(err, new(*migrations.VersionError)):
		fmt.Fprintln(stderr, "outbox-relay:", err)
		return exitUsage
	case errors.As(err, new(silentError)):
		return exitFailed
	case deadletter.IsInput(err):
		// Input the operator gave: nothing secret, and clearer on
		// several lines.
		fmt.Fprintln(stderr, "outbox-relay:", err)
		return exitFailed
	case errors.As(err, new(usageError)) || strings.HasPrefix(err.Error(), "unknown command"):
		// A misplaced connection string may be echoed back: not its
		// password.
		msg := err.Error()
		for _, arg := range args {
			msg = config.Redact(msg, arg)
		}
		fmt.Fprintln(stderr, "outbox-relay:", msg)
		fmt.Fprintln(stderr, "Run 'outbox-relay --help' for usage.")
		return exitUsage
	default:
		fmt.Fprintln(stderr, "outbox-relay:", oneLine(redact(err.Error())))
		return exitFailed
	}
}

// load reads and validates the configuration for what the command needs,
// and sets up the logger.
func (a *app) load(need config.Need) error {
	cfg, err := config.Load(a.flags, a.env, need)
	if err != nil {
		return err
	}
	level, _ := config.ParseLevel(cfg.Log.Level) // validated by Load
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(a.stderr, opts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(a.stderr, opts)
	}
	a.cfg = cfg
	a.log = slog.New(h)
	return nil
}

// connect opens a pool to db and checks that the database answers.
func (a *app) connect(ctx context.Context, db config.Database) (*pgxpool.Pool, error) {
	pool, err := newPool(ctx, db)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// newPool opens a pool to db without connecting yet. It sends no
// startup parameter beyond application_name, which PgBouncer passes on:
// it refuses the others.
func newPool(ctx context.Context, db config.Database) (*pgxpool.Pool, error) {
	pc, err := db.PoolConfig()
	if err != nil {
		return nil, err
	}
	rp := pc.ConnConfig.RuntimeParams
	if rp["application_name"] == "" {
		rp["application_name"] = "outbox-relay"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// getenv looks variables up in the command's environment.
func (a *app) getenv() func(string) string {
	m := make(map[string]string, len(a.env))
	for _, kv := range a.env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(k string) string { return m[k] }
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
