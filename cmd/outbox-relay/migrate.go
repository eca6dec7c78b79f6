package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/migrations"
)

func (a *app) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create, upgrade or inspect the outbox schema",
		Long: `Create, upgrade or inspect the outbox schema in the configured database schema.

Safe to run from several replicas at once: an advisory lock lets one apply the
migrations while the others wait and then find nothing to do.`,
		Args: noArgs,
	}
	cmd.AddCommand(
		&cobra.Command{
			Use:   "up",
			Short: "Apply every pending migration",
			Args:  noArgs,
			RunE: a.withMigrator(func(ctx context.Context, m *migrations.Migrator) error {
				res, err := m.Up(ctx)
				for _, r := range res {
					fmt.Fprintf(a.stdout, "applied %s (%s)\n", r.Source.Path, r.Duration.Round(time.Millisecond))
				}
				if err != nil {
					return err
				}
				if len(res) == 0 {
					fmt.Fprintf(a.stdout, "schema %s is up to date\n", a.cfg.Database.Schema)
				}
				return nil
			}),
		},
		&cobra.Command{
			Use:   "down",
			Short: "Revert the most recent migration (never drops a table that holds rows)",
			Args:  noArgs,
			RunE: a.withMigrator(func(ctx context.Context, m *migrations.Migrator) error {
				r, err := m.Down(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "reverted %s (%s)\n", r.Source.Path, r.Duration.Round(time.Millisecond))
				return nil
			}),
		},
		&cobra.Command{
			Use:   "status",
			Short: "List the migrations and whether each is applied",
			Args:  noArgs,
			RunE: a.withMigrator(func(ctx context.Context, m *migrations.Migrator) error {
				st, err := m.Status(ctx)
				if err != nil {
					return err
				}
				w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "VERSION\tMIGRATION\tSTATE\tAPPLIED AT")
				for _, s := range st {
					at := "-"
					if !s.AppliedAt.IsZero() {
						at = s.AppliedAt.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", s.Source.Version, s.Source.Path, s.State, at)
				}
				return w.Flush()
			}),
		},
	)
	return cmd
}

func (a *app) withMigrator(fn func(context.Context, *migrations.Migrator) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if err := a.load(config.NeedDatabase); err != nil {
			return err
		}
		ctx := cmd.Context()
		pool, err := a.connect(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		m, err := migrations.New(db, a.cfg.Database.Schema)
		if err != nil {
			return err
		}
		return fn(ctx, m)
	}
}
