package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

func (d *dlq) groupsCmd() *cobra.Command {
	var f filterFlags
	var limit int
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "Group dead letters by destination, reason and error, largest first",
		Long: `Group dead letters by destination, reason and error, largest first.

Errors are compared with what varies from row to row masked: quoted values
as <q>, UUIDs and hexadecimal ids as <id>, numbers as <n>. Act on a whole
group with --group ID, as in:

  outbox-relay dlq replay --group 3f9c2a1b7d4e --dry-run
  outbox-relay dlq replay --group 3f9c2a1b7d4e --reason "hook fixed"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter()
			if err != nil {
				return err
			}
			page, err := d.store.Groups(cmd.Context(), deadletter.GroupParams{Filter: filter, Limit: limit})
			if err != nil {
				return err
			}
			if d.json {
				return d.printJSON(page)
			}
			tw := d.table("GROUP", "ROWS", "FIRST", "LAST", "DESTINATION", "REASON", "ERROR")
			for _, g := range page.Groups {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", g.ID, g.Count, stamp(&g.FirstSeen), stamp(&g.LastSeen),
					dash(g.Destination), g.Reason, clip(g.Fingerprint, 80))
			}
			tw.Flush()
			switch {
			case len(page.Groups) == 0:
				fmt.Fprintln(d.stdout, "no dead letters match")
			case page.Total > len(page.Groups):
				fmt.Fprintf(d.stdout, "%d of %d groups; raise --limit for more\n", len(page.Groups), page.Total)
			}
			return nil
		},
	}
	f.bind(cmd.Flags())
	cmd.Flags().IntVar(&limit, "limit", deadletter.DefaultListLimit, fmt.Sprintf("groups listed, at most %d", deadletter.MaxListLimit))
	return cmd
}
