package deadletter

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Operator actions, by the name the audit trail records.
const (
	ActionReplay  = "replay"
	ActionEdit    = "edit"
	ActionDiscard = "discard"
	ActionRelease = "release"
	ActionReroute = "reroute"
)

// ActionInfo describes an operator action on dead letters.
//
// Actions on a selection (Apply is set) are whole here: the API's
// endpoint, the command line's command and the console's buttons and
// confirmation are built from their entry, so adding one takes its entry,
// its Store method (through bulk, which brings batches, pacing, parked
// keys and the audit), its statement, and a migration that widens the
// audit table's outbox_audit_action_check (a test compares the two).
// Edit and release take inputs of their own shape and have their own
// handlers, commands and pages.
type ActionInfo struct {
	// Name is what the audit trail records (its CHECK constraint allows
	// exactly these names), the API's and the CLI's name for it.
	Name string
	// Verb names it on a button; Past says what was done, as results
	// report it.
	Verb, Past string
	// Route is the API endpoint, under the api package's Prefix.
	Route string

	// Short is a line of help; Long says what happens to the rows;
	// Example gives command lines.
	Short, Long, Example string
	// Inputs are the action's own fields beyond the selection: the API's
	// JSON fields, the command's flags, the console's form fields.
	Inputs []Input
	// NeedsReason refuses the action without a reason for the audit trail.
	NeedsReason bool
	// Destructive: the rows will not be delivered; the console marks it.
	Destructive bool
	// Apply runs the action on a selection, its inputs as given (see
	// Input); nil for edit and release.
	Apply func(ctx context.Context, s *Store, p BulkParams, in Inputs) (*Result, error)
}

// Input is one of an action's own fields. Its value is text: the command
// line's flag, the form's field, the JSON string; Apply parses it.
type Input struct {
	Name     string
	Usage    string
	Required bool
}

// Inputs are an action's input values by name; an input not given is
// absent or empty.
type Inputs map[string]string

// Actions are every operator action.
var Actions = []ActionInfo{
	{Name: ActionReplay, Verb: "Replay", Past: "replayed", Route: "POST /dead-letters/replay",
		Short: "Deliver dead letters again",
		Long: `Make dead letters pending again: retry_count 0, ready now (or at a given
time), error history kept. They are delivered again, in order per key.`,
		Example: `  outbox-relay dlq replay 1042 1043
  outbox-relay dlq replay --topic 'orders.*' --reason-code retries_exhausted --since 6h --dry-run
  outbox-relay dlq replay --destination hooks --rate 200 --reason "endpoint fixed"`,
		Inputs: []Input{{Name: "at", Usage: "make the rows ready at this RFC 3339 time instead of now"}},
		Apply: func(ctx context.Context, s *Store, p BulkParams, in Inputs) (*Result, error) {
			at, err := inputTime(in, "at")
			if err != nil {
				return nil, err
			}
			return s.Replay(ctx, ReplayParams{BulkParams: p, At: at})
		}},
	{Name: ActionEdit, Verb: "Edit", Past: "edited and replayed", Route: "POST /dead-letters/{ref}/edit"},
	{Name: ActionDiscard, Verb: "Discard", Past: "discarded", Route: "POST /dead-letters/discard",
		Short: "Give up on dead letters; they stay, discarded, until retention",
		Long: `Mark dead letters discarded: they will not be delivered and stay in the table,
with status discarded, until relay.dead_letter_retention deletes them.
Discarding the row that parks a key releases the key. A reason is required.`,
		Example: `  outbox-relay dlq discard 1042 --reason "duplicate of order 77"
  outbox-relay dlq discard --topic 'test.*' --reason "test traffic"`,
		NeedsReason: true, Destructive: true,
		Apply: func(ctx context.Context, s *Store, p BulkParams, _ Inputs) (*Result, error) {
			return s.Discard(ctx, p)
		}},
	{Name: ActionRelease, Verb: "Release", Past: "released", Route: "POST /parked-keys/release"},
	{Name: ActionReroute, Verb: "Reroute", Past: "rerouted", Route: "POST /dead-letters/reroute",
		Short: "Deliver dead letters again under another topic",
		Long: `Give dead letters another topic and make them pending again, as replay does:
the routes send them where the new topic goes. For rows of a topic that had
no route, or whose destination moved to a new topic. The audit trail keeps
the topics they had.`,
		Example: `  outbox-relay dlq reroute --reason-code no_route --topic 'ordres.*' --to orders --reason "typo in the producer"
  outbox-relay dlq reroute 1042 --to orders.v2 --dry-run`,
		Inputs: []Input{
			{Name: "to", Usage: "the topic the rows get (required)", Required: true},
			{Name: "at", Usage: "make the rows ready at this RFC 3339 time instead of now"},
		},
		Apply: func(ctx context.Context, s *Store, p BulkParams, in Inputs) (*Result, error) {
			at, err := inputTime(in, "at")
			if err != nil {
				return nil, err
			}
			return s.Reroute(ctx, RerouteParams{BulkParams: p, Topic: in["to"], At: at})
		}},
}

// inputTime parses the RFC 3339 time of input name; zero when not given.
func inputTime(in Inputs, name string) (time.Time, error) {
	v := strings.TrimSpace(in[name])
	if v == "" {
		return time.Time{}, nil
	}
	return ParseTime(name, v)
}

// ParseTime reads the RFC 3339 time an operator gave setting (at, --at).
func ParseTime(setting, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return t, &InputError{Problems: []string{fmt.Sprintf("%s %q: use an RFC 3339 time such as 2026-11-20T08:00:00Z", setting, v)}}
	}
	return t, nil
}

// SelectionActions are the actions on a selection of dead letters, those
// with Apply, in the table's order.
func SelectionActions() []ActionInfo {
	var out []ActionInfo
	for _, a := range Actions {
		if a.Apply != nil {
			out = append(out, a)
		}
	}
	return out
}

// Run applies a, an action on a selection, checking its inputs first:
// every problem is listed.
func (a ActionInfo) Run(ctx context.Context, s *Store, p BulkParams, in Inputs) (*Result, error) {
	if a.Apply == nil {
		return nil, fmt.Errorf("%s does not act on a selection of dead letters", a.Name)
	}
	var problems []string
	missing, noReason := a.Missing(p, in)
	for _, i := range missing {
		problems = append(problems, fmt.Sprintf("%s needs %s: %s", a.Name, i.Name, i.Usage))
	}
	for _, name := range slices.Sorted(maps.Keys(in)) {
		if !slices.ContainsFunc(a.Inputs, func(i Input) bool { return i.Name == name }) && in[name] != "" {
			problems = append(problems, fmt.Sprintf("%s takes no %s", a.Name, name))
		}
	}
	if noReason {
		problems = append(problems, fmt.Sprintf("%s needs a reason: say why, for the audit trail", a.Name))
	}
	for _, name := range slices.Sorted(maps.Keys(in)) {
		problems = append(problems, badText(name, in[name])...)
	}
	if len(problems) > 0 {
		return nil, &InputError{Problems: problems}
	}
	return a.Apply(ctx, s, p, in)
}

// Missing reports what a needs and p and in lack: its required inputs
// not given, and a reason when it needs one (but for a dry run).
func (a ActionInfo) Missing(p BulkParams, in Inputs) (inputs []Input, reason bool) {
	for _, i := range a.Inputs {
		if i.Required && strings.TrimSpace(in[i.Name]) == "" {
			inputs = append(inputs, i)
		}
	}
	return inputs, a.NeedsReason && !p.DryRun && strings.TrimSpace(p.Reason) == ""
}

// ActionNames lists the actions' names.
func ActionNames() []string {
	names := make([]string, len(Actions))
	for i, a := range Actions {
		names[i] = a.Name
	}
	return names
}

// LookupAction returns the action named name.
func LookupAction(name string) (ActionInfo, bool) {
	for _, a := range Actions {
		if a.Name == name {
			return a, true
		}
	}
	return ActionInfo{}, false
}
