package deadletter

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Reasons are the dead-letter reasons a filter may name.
var Reasons = []string{
	sink.ReasonPermanent, sink.ReasonRetriesExhausted, sink.ReasonMaxAgeExceeded,
	sink.ReasonTooLarge, sink.ReasonNoRoute, sink.ReasonInvalidMessage,
}

// Statuses of rows the dead-letter operations see.
const (
	StatusDeadLettered = "dead_lettered"
	StatusDiscarded    = "discarded"
)

// Filter selects dead letters; zero fields match everything.
type Filter struct {
	// Topic is a topic name, or a glob where * matches any run of
	// characters and ? one character.
	Topic string `json:"topic,omitempty"`
	// Destination is the name of the destination the row failed at.
	Destination string `json:"destination,omitempty"`
	// Reason is a dead-letter reason (see Reasons).
	Reason string `json:"reason,omitempty"`
	// Key is an exact ordering key.
	Key string `json:"key,omitempty"`
	// Since and Until bound when rows were dead-lettered: Since
	// inclusive, Until exclusive.
	Since TimeBound `json:"since,omitzero"`
	Until TimeBound `json:"until,omitzero"`
	// ErrorContains is text in last_error, matched without regard to
	// case.
	ErrorContains string `json:"error_contains,omitempty"`
	// Group is a failure group's id (see Group): the dead letters of its
	// destination and reason whose errors have its fingerprint.
	Group string `json:"group,omitempty"`
}

// FilterField is a field of Filter as operators give it, as text: the
// same name in query strings and forms, a flag on the command line.
// Every front end reads a Filter through FilterFields and ParseFilter, so
// a new field is one entry here, its Filter field and its SQL.
type FilterField struct {
	// Input is its name (the query parameter and the form field) and
	// usage, described as the actions' inputs are.
	Input
	// Flag is the command line's flag, when it is not Name.
	Flag string
	// set gives f the field's text; since and until are read together
	// (see ParseFilter).
	set func(f *Filter, v string)
}

// FlagName is the field's command-line flag.
func (ff FilterField) FlagName() string { return cmp.Or(ff.Flag, ff.Name) }

// FilterFields are Filter's fields, in the order help texts list them.
var FilterFields = []FilterField{
	{Input: Input{Name: "topic", Usage: "topic, or a glob such as 'orders.*'"}, set: func(f *Filter, v string) { f.Topic = v }},
	{Input: Input{Name: "destination", Usage: "destination the rows failed at"}, set: func(f *Filter, v string) { f.Destination = v }},
	{Input: Input{Name: "reason", Usage: "dead-letter reason: " + strings.Join(Reasons, ", ")}, Flag: "reason-code",
		set: func(f *Filter, v string) { f.Reason = v }},
	{Input: Input{Name: "key", Usage: "ordering key"}, set: func(f *Filter, v string) { f.Key = v }},
	{Input: Input{Name: "since", Usage: "dead-lettered at or after: RFC 3339 time, date, or duration ago (90m, 6h, 7d)"}},
	{Input: Input{Name: "until", Usage: "dead-lettered before: RFC 3339 time, date, or duration ago"}},
	{Input: Input{Name: "error", Usage: "text in the last error, any case"}, set: func(f *Filter, v string) { f.ErrorContains = v }},
	{Input: Input{Name: "group", Usage: "failure group id, as 'dlq groups' lists them"}, set: func(f *Filter, v string) { f.Group = v }},
}

// FilterFieldNames are the names of FilterFields.
func FilterFieldNames() []string {
	names := make([]string, len(FilterFields))
	for i, ff := range FilterFields {
		names[i] = ff.Name
	}
	return names
}

// ParseFilter reads a Filter from text, value returning each field's text
// by name ("" when not given), and validates it: every problem is listed.
func ParseFilter(value func(name string) string) (Filter, error) {
	var f Filter
	for _, ff := range FilterFields {
		if ff.set != nil {
			ff.set(&f, value(ff.Name))
		}
	}
	var problems []string
	var err error
	f.Since, f.Until, err = ParseWindow(value("since"), value("until"))
	var ie *InputError
	if errors.As(err, &ie) {
		problems = append(problems, ie.Problems...)
	}
	if errors.As(f.Validate(), &ie) {
		problems = append(problems, ie.Problems...)
	}
	if len(problems) > 0 {
		return f, &InputError{Problems: problems}
	}
	return f, nil
}

// IsZero reports whether f matches every dead letter.
func (f Filter) IsZero() bool { return f == Filter{} }

// Validate reports every problem of f at once.
func (f Filter) Validate() error {
	var p []string
	if f.Group != "" && !groupIDPattern.MatchString(f.Group) {
		p = append(p, fmt.Sprintf("group %q is not a failure group's id (12 hexadecimal digits, as dlq groups lists them)", f.Group))
	}
	if f.Reason != "" && !slices.Contains(Reasons, f.Reason) {
		p = append(p, fmt.Sprintf("reason %q is not a dead-letter reason; use one of %s", f.Reason, strings.Join(Reasons, ", ")))
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && f.Since.Ago == 0 && f.Until.Ago == 0 && !f.Since.At.Before(f.Until.At) {
		p = append(p, fmt.Sprintf("since %s is not before until %s", f.Since, f.Until))
	}
	if f.Since.Ago > 0 && f.Until.Ago > 0 && f.Since.Ago <= f.Until.Ago {
		p = append(p, fmt.Sprintf("since %s is not before until %s", f.Since, f.Until))
	}
	if len(p) > 0 {
		return &InputError{Problems: p}
	}
	return nil
}

// TimeBound is a point in time, either absolute or a duration before the
// database's clock when the query runs.
type TimeBound struct {
	At  time.Time
	Ago time.Duration
}

// at returns b as an absolute time, taking now for the present.
func (b TimeBound) at(now time.Time) TimeBound {
	if b.Ago > 0 {
		return TimeBound{At: now.Add(-b.Ago)}
	}
	return b
}

// IsZero reports whether b is unset.
func (b TimeBound) IsZero() bool { return b.At.IsZero() && b.Ago == 0 }

func (b TimeBound) String() string {
	switch {
	case b.Ago > 0:
		return formatAgo(b.Ago)
	case !b.At.IsZero():
		return b.At.Format(time.RFC3339Nano)
	}
	return ""
}

// MarshalText writes b as ParseTimeBound reads it.
func (b TimeBound) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText reads b with ParseTimeBound.
func (b *TimeBound) UnmarshalText(text []byte) error {
	v, err := ParseTimeBound(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

var agoPattern = regexp.MustCompile(`^(\d+)(d|h|m|s)$`)

// ParseTimeBound reads an RFC 3339 time (2026-11-20T08:00:00Z), a date
// (2026-11-20, midnight UTC), or a duration before now: a Go duration
// such as 90m or 1h30m, or whole days such as 7d.
func ParseTimeBound(s string) (TimeBound, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return TimeBound{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return TimeBound{At: t}, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return TimeBound{At: t}, nil
	}
	if m := agoPattern.FindStringSubmatch(s); m != nil && m[2] == "d" {
		n, err := strconv.Atoi(m[1])
		if err == nil && n > 0 && n <= 36500 {
			return TimeBound{Ago: time.Duration(n) * 24 * time.Hour}, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return TimeBound{Ago: d}, nil
	}
	return TimeBound{}, &InputError{Problems: []string{fmt.Sprintf("time %q: use RFC 3339 (2026-11-20T08:00:00Z), a date (2026-11-20) or a duration before now (90m, 6h, 7d)", s)}}
}

// ParseWindow reads the since and until bounds of a time window with
// ParseTimeBound, reporting the problems of both at once.
func ParseWindow(since, until string) (TimeBound, TimeBound, error) {
	var p []string
	s, err := ParseTimeBound(since)
	if err != nil {
		p = append(p, "since: "+err.Error())
	}
	u, err := ParseTimeBound(until)
	if err != nil {
		p = append(p, "until: "+err.Error())
	}
	if len(p) > 0 {
		return s, u, &InputError{Problems: p}
	}
	return s, u, nil
}

func formatAgo(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

// rows is f as the outbox table's statements take it.
func (f Filter) rows() outboxdb.LetterFilter {
	return outboxdb.LetterFilter{Topic: f.Topic, Destination: f.Destination, Reason: f.Reason, Key: f.Key,
		Since: outboxdb.Bound(f.Since), Until: outboxdb.Bound(f.Until), ErrorContains: f.ErrorContains, Group: f.Group}
}

// InputError is input that cannot be used: a malformed filter, time,
// reference or edit. It lists every problem.
type InputError struct{ Problems []string }

func (e *InputError) Error() string {
	if len(e.Problems) == 1 {
		return e.Problems[0]
	}
	return "invalid input:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// IsInput reports whether err is an *InputError.
func IsInput(err error) bool {
	var ie *InputError
	return errors.As(err, &ie)
}
