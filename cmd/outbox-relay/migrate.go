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
		Long: `Create, upgrade or inspect the outbox schema in the configured database schema,
or in each outbox's of the outboxes list (one of them with --outbox).

Safe to run from several replicas at once: an advisory lock lets one apply the
migrations while the others wait and then find nothing to do.`,
		Args: noArgs,
	}
	cmd.PersistentFlags().StringVar(&a.outbox, "outbox", "", "the outbox to migrate, by its name in outboxes (default every one; down needs one)")
	cmd.AddCommand(
		&cobra.Command{
			Use:   "up",
			Short: "Apply every pending migration",
			Args:  noArgs,
			RunE: a.withMigrator(true, func(ctx context.Context, o config.OutboxSettings, m *migrations.Migrator) error {
				res, err := m.Up(ctx)
				for _, r := range res {
					fmt.Fprintf(a.stdout, "applied %s (%s)\n", r.Source.Path, r.Duration.Round(time.Millisecond))
				}
				if err != nil {
					return err
				}
				if len(res) == 0 {
					fmt.Fprintf(a.stdout, "schema %s is up to date\n", o.Database.Schema)
				}
				return nil
			}),
		},
		&cobra.Command{
			Use:   "down",
			Short: "Revert the most recent migration (never drops a table that holds rows)",
			Args:  noArgs,
			RunE: a.withMigrator(false, func(ctx context.Context, _ config.OutboxSettings, m *migrations.Migrator) error {
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
			RunE: a.withMigrator(true, func(ctx context.Context, _ config.OutboxSettings, m *migrations.Migrator) error {
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

// withMigrator runs fn on the migrator of the --outbox outbox, or, with
// every, of each outbox when none is named.
func (a *app) withMigrator(every bool, fn func(context.Context, config.OutboxSettings, *migrations.Migrator) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if err := a.load(config.NeedDatabase); err != nil {
			return err
		}
		outboxes := a.cfg.Outboxes()
		if a.outbox != "" || !every {
			o, err := a.cfg.Outbox(a.outbox)
			if err != nil {
				return err
			}
			outboxes = []config.OutboxSettings{o}
		}
		for _, o := range outboxes {
			if len(a.cfg.OutboxList) > 0 {
				fmt.Fprintf(a.stdout, "outbox %s (schema %s):\n", o.Name, o.Database.Schema)
			}
			if err := a.migrate(cmd.Context(), o, fn); err != nil {
				if len(a.cfg.OutboxList) > 0 {
					return fmt.Errorf("outbox %s: %w", o.Name, err)
				}
				return err
			}
		}
		return nil
	}
}

func (a *app) migrate(ctx context.Context, o config.OutboxSettings, fn func(context.Context, config.OutboxSettings, *migrations.Migrator) error) error {
	pool, err := a.connect(ctx, o.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	m, err := migrations.New(db, o.Database.Schema)
	if err != nil {
		return err
	}
	return fn(ctx, o, m)
}
