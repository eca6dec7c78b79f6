package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/user"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/deadletter"
)

// envActor names who runs dead-letter commands, for the audit trail, when
// --actor is not given.
const envActor = "OUTBOX_ACTOR"

// dlq carries what the dead-letter commands share.
type dlq struct {
	*app
	actor string
	json  bool
	store *deadletter.Store
}

func (a *app) dlqCmd() *cobra.Command {
	d := &dlq{app: a}
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, fix, replay and discard dead letters",
		Long: `Inspect, fix, replay and discard dead letters.

Every change is recorded in the audit table with who made it (--actor, else
$OUTBOX_ACTOR, else the operating-system user), when, why and on which rows.
Exit codes: 0 done, 1 failed or bad input (nothing changed), 2 bad usage.`,
		// Without a known subcommand: a usage error, not help and exit 0,
		// so a typo in a script does not pass for success.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %s", args[0], cmd.CommandPath())}
			}
			var names []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() && c.Name() != "help" {
					names = append(names, c.Name())
				}
			}
			return usageError{fmt.Errorf("%s needs a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))}
		},
		RunE: func(*cobra.Command, []string) error { return nil },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return d.open(cmd.Context())
		},
	}
	cmd.PersistentFlags().StringVar(&d.actor, "actor", "", "who is acting, for the audit trail (env "+envActor+", default the OS user)")
	cmd.PersistentFlags().BoolVar(&d.json, "json", false, "print JSON instead of text")
	cmd.PersistentFlags().StringVar(&d.outbox, "outbox", "", "the outbox to act on, by its name in outboxes (needed when there are several)")
	cmd.AddCommand(d.listCmd(), d.showCmd(), d.editCmd(), d.keysCmd(), d.releaseCmd(), d.auditCmd(), d.statsCmd(), d.groupsCmd())
	for _, a := range deadletter.SelectionActions() {
		cmd.AddCommand(d.selectionCmd(a))
	}
	return cmd
}

func (d *dlq) open(ctx context.Context) error {
	if err := d.load(config.NeedDatabase); err != nil {
		return err
	}
	o, err := d.cfg.Outbox(d.outbox)
	if err != nil {
		return err
	}
	pool, err := d.connect(ctx, o.Database)
	if err != nil {
		return err
	}
	if err := checkSchema(ctx, pool, o.Database.Schema, d.log); err != nil {
		pool.Close()
		return err
	}
	st, err := deadletter.NewStore(pool, deadLetters(d.cfg, o.Database.Schema, o.OrderScope))
	if err != nil {
		pool.Close()
		return err
	}
	d.store = st
	d.atExit = append(d.atExit, pool.Close)
	return nil
}

// who is the actor recorded in the audit trail.
func (d *dlq) who() deadletter.Actor {
	name := d.actor
	if name == "" {
		name = lookupEnv(d.env, envActor)
	}
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	if name == "" {
		name = lookupEnv(d.env, "USER")
	}
	return deadletter.Actor{Name: name, Source: "cli"}
}

func lookupEnv(env []string, key string) string {
	for _, kv := range slices.Backward(env) {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// filterFlags are the flags that select dead letters, one per filter
// field, by field name.
type filterFlags map[string]*string

func (f *filterFlags) bind(fs *pflag.FlagSet) {
	*f = filterFlags{}
	for _, ff := range deadletter.FilterFields {
		(*f)[ff.Name] = fs.String(ff.FlagName(), "", ff.Usage)
	}
}

func (f filterFlags) filter() (deadletter.Filter, error) {
	return deadletter.ParseFilter(func(name string) string { return *f[name] })
}

func (d *dlq) listCmd() *cobra.Command {
	var f filterFlags
	var status, cursor string
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, newest first",
		Long: `List dead letters, newest first, a page at a time.

Pass the printed --cursor to get the next page. A walk through the pages sees
every row that was dead-lettered when it began exactly once.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter()
			if err != nil {
				return err
			}
			page, err := d.store.List(cmd.Context(), deadletter.ListParams{Filter: filter, Status: status, Limit: limit, Cursor: cursor})
			if err != nil {
				return err
			}
			if d.json {
				return d.printJSON(page)
			}
			tw := d.table("ID", "DEAD-LETTERED", "TOPIC", "KEY", "DESTINATION", "REASON", "ATTEMPTS", "LAST ERROR")
			for _, l := range page.Letters {
				reason := l.Reason
				if l.Status == deadletter.StatusDiscarded {
					reason += " (discarded)"
				}
				if l.ParksKey {
					reason += " (parks key)"
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", l.ID, stamp(l.DeadLetteredAt), cell(l.Topic), keyText(l.Key),
					dash(l.Destination), reason, l.Attempts, clip(l.LastError, 60))
			}
			tw.Flush()
			if len(page.Letters) == 0 {
				fmt.Fprintln(d.stdout, "no dead letters match")
			}
			if page.Next != "" {
				fmt.Fprintf(d.stdout, "more: add --cursor %s\n", page.Next)
			}
			return nil
		},
	}
	f.bind(cmd.Flags())
	cmd.Flags().StringVar(&status, "status", deadletter.StatusDeadLettered, "dead_lettered, discarded or all")
	cmd.Flags().IntVar(&limit, "limit", deadletter.DefaultListLimit, fmt.Sprintf("rows per page, at most %d", deadletter.MaxListLimit))
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue after a previous page")
	return cmd
}

func (d *dlq) showCmd() *cobra.Command {
	var raw bool
	cmd := &cobra.Command{
		Use:   "show ID|EVENT_ID",
		Short: "Show a row with its payload, headers and error history",
		Example: `  outbox-relay dlq show 1042
  outbox-relay dlq show 1042 --raw-payload > payload.json   # the bytes, to edit`,
		Args: exactArgs(1, "a row id or event id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if raw && d.json {
				return usageError{errors.New("--raw-payload and --json do not go together")}
			}
			ref, err := deadletter.ParseRef(args[0])
			if err != nil {
				return err
			}
			row, err := d.store.Get(cmd.Context(), ref)
			if err != nil {
				return err
			}
			switch {
			case raw:
				_, err = d.stdout.Write(row.Payload)
				return err
			case d.json:
				return d.printJSON(row)
			}
			d.printDetail(row)
			return nil
		},
	}
	cmd.Flags().BoolVar(&raw, "raw-payload", false, "write only the payload's bytes, as they are")
	return cmd
}

func (d *dlq) printDetail(r *deadletter.Detail) {
	w := d.stdout
	status := r.Status
	if r.Reason != "" {
		status += " (" + r.Reason + ")"
	}
	if r.ParksKey {
		status += ", parks its key"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"row", strconv.FormatInt(r.ID, 10)},
		{"event id", r.EventID.String()},
		{"status", status},
		{"topic", cell(r.Topic)},
		{"key", keyText(r.Key)},
		{"destination", dash(r.Destination)},
		{"attempts", strconv.Itoa(r.Attempts)},
		{"created", stamp(&r.CreatedAt)},
		{"last attempt", stamp(r.LastAttemptAt)},
		{"dead-lettered", stamp(r.DeadLetteredAt)},
		{"next attempt", stamp(&r.NextAttemptAt)},
		{"last error", dash(r.LastError)},
		{"version", r.Version},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
	}
	tw.Flush()

	fmt.Fprintln(w, "\nheaders:")
	var headers map[string]any
	if err := json.Unmarshal(r.Headers, &headers); err != nil || len(headers) == 0 {
		fmt.Fprintf(w, "  %s\n", r.Headers)
	} else {
		names := make([]string, 0, len(headers))
		for k := range headers {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			v, _ := json.Marshal(headers[k])
			fmt.Fprintf(w, "  %s: %s\n", cell(k), v)
		}
	}

	enc := deadletter.PayloadEncoding(r.Payload)
	fmt.Fprintf(w, "\npayload (%d bytes, %s):\n", len(r.Payload), map[string]string{
		deadletter.EncodingJSON: "JSON", deadletter.EncodingText: "text", deadletter.EncodingBase64: "binary, hex dump"}[enc])
	switch enc {
	case deadletter.EncodingJSON:
		var b bytes.Buffer
		_ = json.Indent(&b, r.Payload, "  ", "  ")
		fmt.Fprintf(w, "  %s\n", b.String())
	case deadletter.EncodingText:
		fmt.Fprintln(w, indent(string(r.Payload)))
	default:
		fmt.Fprint(w, indent(hex.Dump(r.Payload)))
	}

	fmt.Fprintf(w, "\nerror history (%d, oldest first):\n", len(r.ErrorHistory))
	for _, h := range r.ErrorHistory {
		fmt.Fprintf(w, "  %s  attempt %d  %s  %s\n", stamp(&h.At), h.Attempt, cell(h.Class), cell(h.Error))
	}
}

// selectionCmd is the command of an action on a selection of dead
// letters, built from its entry in deadletter.Actions.
func (d *dlq) selectionCmd(a deadletter.ActionInfo) *cobra.Command {
	var b bulkFlags
	inputs := make([]string, len(a.Inputs))
	use := a.Name + " [ID|EVENT_ID ...]"
	for _, i := range a.Inputs {
		if i.Required {
			use += " --" + i.Name + " " + strings.ToUpper(i.Name)
		}
	}
	if a.NeedsReason {
		use += " --reason TEXT"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: a.Short,
		Long: a.Long + `

Select rows by id or event id, by filter flags, or with --all. Bulk actions
run in batches of --batch-size rows, each in its own transaction with its own
audit record, optionally paced by --rate. A filter applies to rows
dead-lettered before the action began. A named row that is no longer
dead-lettered is left as it is and reported. An unknown id changes nothing.`,
		Example: a.Example,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := b.params(d, args)
			if err != nil {
				return err
			}
			in := deadletter.Inputs{}
			for n, i := range a.Inputs {
				in[i.Name] = inputs[n]
			}
			// What the action lacks is a usage error, named by its flag.
			if missing, noReason := a.Missing(p, in); noReason {
				return usageError{fmt.Errorf("%s needs --reason: say why, for the audit trail", a.Name)}
			} else if len(missing) > 0 {
				return usageError{fmt.Errorf("%s needs --%s: %s", a.Name, missing[0].Name, missing[0].Usage)}
			}
			res, err := a.Run(cmd.Context(), d.store, p, in)
			d.printResult(res, a.Name)
			return err
		},
	}
	b.bind(cmd.Flags(), "be "+a.Past)
	why := "why, for the audit trail"
	if a.NeedsReason {
		why = "why (required), for the audit trail"
	}
	cmd.Flags().StringVar(&b.reason, "reason", "", why)
	for n, i := range a.Inputs {
		cmd.Flags().StringVar(&inputs[n], i.Name, "", i.Usage)
	}
	return cmd
}

// bulkFlags are the flags of the actions on a selection.
type bulkFlags struct {
	filterFlags
	all       bool
	dryRun    bool
	batchSize int
	rate      float64
	reason    string
}

func (b *bulkFlags) bind(fs *pflag.FlagSet, verb string) {
	b.filterFlags.bind(fs)
	fs.BoolVar(&b.all, "all", false, "select every dead letter")
	fs.BoolVar(&b.dryRun, "dry-run", false, "show what would "+verb+" and change nothing")
	fs.IntVar(&b.batchSize, "batch-size", deadletter.DefaultBatchSize, "rows changed per transaction")
	fs.Float64Var(&b.rate, "rate", 0, "at most this many rows per second (0: no limit)")
}

// params builds the bulk parameters from the arguments and flags.
func (b *bulkFlags) params(d *dlq, args []string) (deadletter.BulkParams, error) {
	p := deadletter.BulkParams{DryRun: b.dryRun, BatchSize: b.batchSize, Rate: b.rate, Actor: d.who(), Reason: b.reason}
	filter, ferr := b.filter()
	given := 0
	for _, g := range []bool{len(args) > 0, !filter.IsZero() || ferr != nil, b.all} {
		if g {
			given++
		}
	}
	if given != 1 {
		return p, usageError{errors.New("select rows by id arguments, by filter flags, or with --all: exactly one of them")}
	}
	if b.batchSize < 1 || b.batchSize > deadletter.MaxBatchSize {
		return p, usageError{fmt.Errorf("--batch-size %d: use 1 to %d", b.batchSize, deadletter.MaxBatchSize)}
	}
	if b.rate < 0 || math.IsNaN(b.rate) || math.IsInf(b.rate, 0) {
		return p, usageError{fmt.Errorf("--rate %v: use a positive number of rows per second, or 0 for no limit", b.rate)}
	}
	if ferr != nil {
		return p, ferr
	}
	refs, err := deadletter.ParseRefs(args)
	if err != nil {
		return p, err
	}
	p.Refs, p.Filter, p.All = refs, filter, b.all
	return p, nil
}

func (d *dlq) editCmd() *cobra.Command {
	var payloadFile, headersFile, topic, reason, at, ifVersion string
	var allowNonJSON bool
	cmd := &cobra.Command{
		Use:   "edit ID|EVENT_ID",
		Short: "Replace a dead letter's payload, headers or topic, and replay it",
		Long: `Replace a dead letter's payload, headers or topic, and replay it, in one
transaction. The row as it was is kept in the audit record.

--payload and --headers read a file, or standard input for "-". Headers are a
JSON object of strings. A JSON payload can only be replaced by JSON unless
--allow-non-json is given; a new topic must match a route when routes are
configured. Invalid input changes nothing. With --if-version (the version
dlq show prints), a row that another edit changed since is left as it is.`,
		Example: `  outbox-relay dlq show 1042 --raw-payload > fixed.json && vi fixed.json
  outbox-relay dlq edit 1042 --payload fixed.json --reason "currency code fixed"
  outbox-relay dlq edit 1043 --topic orders.created --reason "typo in topic"`,
		Args: exactArgs(1, "a row id or event id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if payloadFile == "-" && headersFile == "-" {
				return usageError{errors.New("--payload and --headers cannot both read standard input")}
			}
			ref, err := deadletter.ParseRef(args[0])
			if err != nil {
				return err
			}
			p := deadletter.EditParams{Ref: ref, Topic: topic, AllowNonJSON: allowNonJSON, Actor: d.who(), Reason: reason, Version: ifVersion}
			var problems []string
			if payloadFile != "" {
				if p.Payload, err = d.readInput(payloadFile); err != nil {
					problems = append(problems, "--payload: "+err.Error())
				} else if p.Payload == nil {
					p.Payload = []byte{}
				}
			}
			if headersFile != "" {
				if p.Headers, err = d.readInput(headersFile); err != nil {
					problems = append(problems, "--headers: "+err.Error())
				} else if p.Headers == nil {
					p.Headers = []byte{}
				}
			}
			if at != "" {
				if p.At, err = deadletter.ParseTime("--at", at); err != nil {
					problems = append(problems, err.Error())
				}
			}
			if len(problems) > 0 {
				return &deadletter.InputError{Problems: problems}
			}
			res, err := d.store.Edit(cmd.Context(), p)
			d.printResult(res, deadletter.ActionEdit)
			return err
		},
	}
	cmd.Flags().StringVar(&payloadFile, "payload", "", "file with the new payload, - for standard input")
	cmd.Flags().StringVar(&headersFile, "headers", "", "file with the new headers (a JSON object of strings), - for standard input")
	cmd.Flags().StringVar(&topic, "topic", "", "new topic")
	cmd.Flags().BoolVar(&allowNonJSON, "allow-non-json", false, "accept a payload that is not JSON in place of a JSON one")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit trail")
	cmd.Flags().StringVar(&at, "at", "", "make the row ready at this RFC 3339 time instead of now")
	cmd.Flags().StringVar(&ifVersion, "if-version", "", "change nothing unless the row's content is still this version (dlq show prints it)")
	return cmd
}

// readInput reads a file, or standard input for "-".
func (d *dlq) readInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(d.stdin)
	}
	return os.ReadFile(name)
}

func (d *dlq) keysCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keys",
		Short: "List keys parked by a dead letter (on_dead_letter: block)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keys, err := d.store.Keys(cmd.Context(), 0)
			if err != nil {
				return err
			}
			limited := len(keys) == deadletter.MaxListLimit
			if d.json {
				return d.printJSON(map[string]any{"parked_keys": keys, "limited": limited})
			}
			if len(keys) == 0 {
				fmt.Fprintln(d.stdout, "no parked keys")
				return nil
			}
			tw := d.table("KEY", "PARKED BY ROW", "TOPIC", "DESTINATION", "REASON", "DEAD-LETTERED", "WAITING", "LAST ERROR")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", cell(k.Key), k.Row.ID, cell(k.Row.Topic), dash(k.Row.Destination),
					k.Row.Reason, stamp(k.Row.DeadLetteredAt), k.Waiting, clip(k.Row.LastError, 60))
			}
			tw.Flush()
			if limited {
				fmt.Fprintf(d.stdout, "only the %d longest parked keys are listed; dlq stats counts them all\n", len(keys))
			}
			return nil
		},
	}
}

func (d *dlq) releaseCmd() *cobra.Command {
	var discard bool
	var reason string
	cmd := &cobra.Command{
		Use:   "release KEY",
		Short: "Let a parked key's later rows go on, in order",
		Long: `Release a key parked by a dead letter: its later rows are delivered at once,
in order. The parking row stays dead-lettered (replay it later, out of order)
or, with --discard, is discarded; --discard needs --reason.`,
		Args: exactArgs(1, "a key"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if discard && strings.TrimSpace(reason) == "" {
				return usageError{errors.New("release --discard needs --reason: say why, for the audit trail")}
			}
			res, err := d.store.Release(cmd.Context(), deadletter.ReleaseParams{Key: args[0], Discard: discard, Actor: d.who(), Reason: reason})
			d.printResult(res, deadletter.ActionRelease)
			return err
		},
	}
	cmd.Flags().BoolVar(&discard, "discard", false, "discard the row that parks the key")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit trail (required with --discard)")
	return cmd
}

func (d *dlq) auditCmd() *cobra.Command {
	var action, actor, since, until, cursor string
	var row int64
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List operator actions on dead letters, newest first",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := deadletter.AuditParams{Action: action, Actor: actor, Row: row, Limit: limit, Cursor: cursor}
			var err error
			if p.Since, p.Until, err = deadletter.ParseWindow(since, until); err != nil {
				return err
			}
			page, err := d.store.Audit(cmd.Context(), p)
			if err != nil {
				return err
			}
			if d.json {
				return d.printJSON(page)
			}
			if len(page.Records) == 0 {
				fmt.Fprintln(d.stdout, "no audit records match")
				return nil
			}
			tw := d.table("ID", "AT", "ACTOR", "SOURCE", "ACTION", "ROWS", "REASON")
			for _, r := range page.Records {
				source := r.Source
				if r.Credential != "" {
					source += " (token " + r.Credential + ")"
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, stamp(&r.At), cell(r.Actor), cell(source), r.Action, idList(r.RowIDs, len(r.RowIDs)), clip(r.Reason, 60))
			}
			tw.Flush()
			if page.Next != "" {
				fmt.Fprintf(d.stdout, "more: add --cursor %s\n", page.Next)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&action, "action", "", strings.Join(deadletter.ActionNames(), ", "))
	fs.StringVar(&actor, "by", "", "actor, exactly")
	fs.Int64Var(&row, "row", 0, "records that touched this row id")
	fs.StringVar(&since, "since", "", "at or after: RFC 3339 time, date, or duration ago")
	fs.StringVar(&until, "until", "", "before: RFC 3339 time, date, or duration ago")
	fs.IntVar(&limit, "limit", deadletter.DefaultListLimit, "records per page")
	fs.StringVar(&cursor, "cursor", "", "continue after a previous page")
	return cmd
}

func (d *dlq) statsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Count dead letters by topic, destination and reason",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := d.store.Stats(cmd.Context())
			if err != nil {
				return err
			}
			if d.json {
				return d.printJSON(st)
			}
			w := d.stdout
			fmt.Fprintf(w, "dead-lettered %d, discarded %d, parked keys %d\n", st.DeadLettered, st.Discarded, st.ParkedKeys)
			if st.Oldest != nil {
				fmt.Fprintf(w, "oldest %s, newest %s\n", stamp(st.Oldest), stamp(st.Newest))
			}
			for _, g := range []struct {
				name   string
				counts map[string]int
			}{{"topic", st.ByTopic}, {"destination", st.ByDestination}, {"reason", st.ByReason}} {
				if len(g.counts) == 0 {
					continue
				}
				fmt.Fprintf(w, "\nby %s:\n", g.name)
				names := make([]string, 0, len(g.counts))
				for k := range g.counts {
					names = append(names, k)
				}
				sort.Slice(names, func(i, j int) bool {
					if g.counts[names[i]] != g.counts[names[j]] {
						return g.counts[names[i]] > g.counts[names[j]]
					}
					return names[i] < names[j]
				})
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				for _, k := range names {
					fmt.Fprintf(tw, "  %s\t%d\n", dash(k), g.counts[k])
				}
				tw.Flush()
			}
			return nil
		},
	}
}
