package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

// printResult reports what an action did; res may be nil after an error.
func (d *dlq) printResult(res *deadletter.Result, verb string) {
	if res == nil {
		return
	}
	if d.json {
		_ = d.printJSON(res)
		return
	}
	w := d.stdout
	action, _ := deadletter.LookupAction(verb)
	for _, u := range res.Unchanged {
		if u.Status == deadletter.StatusGone {
			fmt.Fprintf(w, "row %d is gone (delivered or deleted since an earlier action): nothing to do\n", u.ID)
			continue
		}
		fmt.Fprintf(w, "row %d is %s, not dead-lettered: left as it is\n", u.ID, u.Status)
	}
	switch {
	case res.DryRun:
		fmt.Fprintf(w, "dry run: would %s %s: %s\n", verb, rowCount(res.Count), idList(res.Changed, res.Count))
	case verb == deadletter.ActionRelease:
		fmt.Fprintf(w, "released key %s (parked by row %s)\n", strings.Join(res.ReleasedKeys, ", "), idList(res.Changed, res.Count))
	default:
		fmt.Fprintf(w, "%s %s: %s\n", action.Past, rowCount(res.Count), idList(res.Changed, res.Count))
		if len(res.ReleasedKeys) > 0 {
			fmt.Fprintf(w, "released parked keys: %s\n", strings.Join(res.ReleasedKeys, ", "))
		}
	}
}

func (d *dlq) printJSON(v any) error {
	enc := json.NewEncoder(d.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (d *dlq) table(headers ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(d.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(headers, "\t"))
	return tw
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s, got %d arguments", cmd.CommandPath(), what, len(args))}
		}
		return nil
	}
}

func stamp(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func keyText(k *string) string {
	if k == nil {
		return "(none)"
	}
	return cell(*k)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return cell(s)
}

// cell makes text from a row or an operator safe for a terminal: text
// with control or unprintable characters is shown quoted, with escapes.
func cell(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

func clip(s string, n int) string {
	s = cell(oneLine(s))
	if s == "" {
		return "-"
	}
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

func rowCount(n int) string {
	if n == 1 {
		return "1 row"
	}
	return strconv.Itoa(n) + " rows"
}

// idList shows up to ten of ids, of total.
func idList(ids []int64, total int) string {
	if total == 0 {
		return "none"
	}
	parts := make([]string, 0, 11)
	for _, id := range ids[:min(len(ids), 10)] {
		parts = append(parts, strconv.FormatInt(id, 10))
	}
	if total > 10 {
		parts = append(parts, fmt.Sprintf("… (%d more)", total-10))
	}
	return strings.Join(parts, ", ")
}
