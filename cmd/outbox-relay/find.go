package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

func (a *app) findCmd() *cobra.Command {
	d := &dlq{app: a}
	var kind string
	var limit int
	cmd := &cobra.Command{
		Use:   "find EVENT_ID|ROW_ID|KEY",
		Short: "Find a message wherever it is: pending, in flight, delivered and kept, dead-lettered or discarded",
		Long: `Find a message by event id, row id or key, and say where it is now, its
attempts, what holds it back (the row of its key ahead of it, a parked key,
its backoff, a lease) and what an operator can do. A UUID is taken for an
event id and a positive integer for a row id, else (or when no row has that
id) the text is a key; --kind says which. A key's rows are its pending,
dead-lettered and discarded ones, in order, its head first.

The relay's live state (open breakers, paused topics) is on the console's
message page. Exit codes: 0 found, 1 not found or failed, 2 bad usage.`,
		Example: `  outbox-relay find 0b7c6a9e-3f8e-4d7a-9a53-2c1f4f2f7a10
  outbox-relay find customer-42 --kind key --json`,
		Args: exactArgs(1, "an event id, row id or key"),
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return d.open(cmd.Context())
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := d.store.Find(cmd.Context(), deadletter.FindParams{Query: args[0], Kind: kind, Limit: limit})
			if err != nil {
				return err
			}
			if d.json {
				if err := d.printJSON(f); err != nil {
					return err
				}
			} else {
				printFound(d.stdout, f)
			}
			if len(f.Rows) == 0 {
				return errNotFound
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kind, "kind", "", "what the argument is: event, row or key (default: by its form)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many of a key's rows (default 100)")
	cmd.Flags().BoolVar(&d.json, "json", false, "print JSON instead of text")
	cmd.Flags().StringVar(&d.outbox, "outbox", "", "the outbox to look in, by its name in outboxes (needed when there are several)")
	return cmd
}

// errNotFound ends a search that found nothing with exit code 1, after
// what that means was printed.
var errNotFound = silentError{fmt.Errorf("not found")}

func printFound(w io.Writer, f *deadletter.Found) {
	if len(f.Rows) == 0 {
		fmt.Fprintln(w, f.Absent)
		printAudit(w, f.Audit)
		return
	}
	if f.Kind == deadletter.FindKey {
		fmt.Fprintf(w, "key %s: %d rows%s, in order\n\n", cell(f.Query), len(f.Rows), map[bool]string{true: " (more not shown)"}[f.More])
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ROW\tSTATE\tTOPIC\tATTEMPTS\tHELD BY")
		for _, r := range f.Rows {
			var held []string
			for _, h := range r.Holds {
				held = append(held, h.Kind)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\n", r.ID, r.State, cell(r.Topic), r.Attempts, dash(strings.Join(held, ", ")))
		}
		tw.Flush()
		return
	}
	r := f.Rows[0]
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"row", strconv.FormatInt(r.ID, 10)},
		{"event id", r.EventID.String()},
		{"topic", cell(r.Topic)},
		{"key", keyText(r.Key)},
		{"where", r.Where},
		{"created", stamp(&r.CreatedAt)},
		{"attempts", strconv.Itoa(r.Attempts)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
	}
	tw.Flush()
	if len(r.Holds) > 0 {
		fmt.Fprintln(w, "\nheld by:")
		for _, h := range r.Holds {
			fmt.Fprintf(w, "  %s: %s\n", h.Kind, cell(h.Detail))
		}
	}
	if len(r.ErrorHistory) > 0 {
		fmt.Fprintln(w, "\nattempts:")
		for _, e := range r.ErrorHistory {
			fmt.Fprintf(w, "  %s  #%d  %s  %s\n", stamp(&e.At), e.Attempt, e.Class, cell(e.Error))
		}
	}
	printAudit(w, r.Audit)
	if len(r.Do) > 0 {
		fmt.Fprintln(w, "\nwhat to do:")
		for _, d := range r.Do {
			fmt.Fprintf(w, "  %s\n", d)
		}
	}
}

func printAudit(w io.Writer, records []deadletter.AuditRecord) {
	if len(records) == 0 {
		return
	}
	fmt.Fprintln(w, "\naudit:")
	for _, a := range records {
		fmt.Fprintf(w, "  %s  %s by %s (%s)  %s\n", stamp(&a.At), a.Action, cell(a.Actor), a.Source, cell(a.Reason))
	}
}
