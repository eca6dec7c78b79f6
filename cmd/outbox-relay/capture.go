package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/logsource"
)

func (a *app) captureCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capture",
		Short: "Set up and check capture from the write-ahead log (capture: log)",
		Args:  noArgs,
	}
	var outbox string
	var check, recreate bool
	setup := &cobra.Command{
		Use:   "setup",
		Short: "Check what capture from the log needs, and make the publication and the slot",
		Long: `Check, for each outbox captured from the log (or the one --outbox names), what
capture needs: wal_level = logical, a role with the replication privilege, the
outbox_emit function ('migrate up'), the publication and the replication slot;
make the publication and the slot where they are missing (not with --check).
Each check is printed; the command fails if one still fails, naming what to do.

A lost slot (the server removed write-ahead log it had not confirmed: the
messages in it are gone) is made again only with --recreate, once the loss is
accounted for: see docs/capture.md.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(config.NeedDatabase); err != nil {
				return err
			}
			var outboxes []config.OutboxSettings
			if outbox != "" || len(a.cfg.OutboxList) == 0 {
				o, err := a.cfg.Outbox(outbox)
				if err != nil {
					return err
				}
				outboxes = []config.OutboxSettings{o}
			} else {
				for _, o := range a.cfg.Outboxes() {
					if o.Capture == relay.CaptureLog {
						outboxes = append(outboxes, o)
					}
				}
				if len(outboxes) == 0 {
					return usageError{errors.New("no outbox is captured from the log (capture: log): name one with --outbox")}
				}
			}
			failed := false
			for _, o := range outboxes {
				fmt.Fprintf(a.stdout, "outbox %s (schema %s):\n", o.Name, o.Database.Schema)
				pool, err := a.connect(cmd.Context(), o.Database)
				if err != nil {
					return err
				}
				checks, err := logsource.Setup(cmd.Context(), pool, o.Database.Schema, logsource.SetupOptions{Create: !check, Recreate: recreate})
				pool.Close()
				w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				for _, c := range checks {
					state := "ok"
					if !c.OK {
						state = "MISSING"
					}
					fmt.Fprintf(w, "  %s\t%s\t%s\n", c.What, state, c.Found)
				}
				if err := w.Flush(); err != nil {
					return err
				}
				if err != nil {
					return fmt.Errorf("outbox %s: %w", o.Name, err)
				}
				if m := logsource.Missing(checks); m != "" {
					fmt.Fprintf(a.stdout, "  to do:\n%s\n", indent(indent(m)))
					failed = true
				}
			}
			if failed {
				return errors.New("capture from the log is not set up: see above")
			}
			return nil
		},
	}
	setup.Flags().StringVar(&outbox, "outbox", "", "the outbox, by its name in outboxes (default every one with capture: log)")
	setup.Flags().BoolVar(&check, "check", false, "only check; make nothing")
	setup.Flags().BoolVar(&recreate, "recreate", false, "drop a lost slot and make a new one (its unread messages are gone)")
	cmd.AddCommand(setup)
	return cmd
}
