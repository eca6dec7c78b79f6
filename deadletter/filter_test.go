package deadletter_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

func TestParseTimeBound(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want deadletter.TimeBound
		bad  bool
	}{
		{in: ""},
		{in: "2026-11-20T08:00:00Z", want: deadletter.TimeBound{At: time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)}},
		{in: "2026-11-20T10:00:00.5+02:00", want: deadletter.TimeBound{At: time.Date(2026, 11, 20, 8, 0, 0, 5e8, time.UTC)}},
		{in: "2026-11-20", want: deadletter.TimeBound{At: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)}},
		{in: " 2026-11-20 ", want: deadletter.TimeBound{At: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)}},
		{in: "90m", want: deadletter.TimeBound{Ago: 90 * time.Minute}},
		{in: "1h30m", want: deadletter.TimeBound{Ago: 90 * time.Minute}},
		{in: "45s", want: deadletter.TimeBound{Ago: 45 * time.Second}},
		{in: "7d", want: deadletter.TimeBound{Ago: 7 * 24 * time.Hour}},
		{in: "36500d", want: deadletter.TimeBound{Ago: 36500 * 24 * time.Hour}},
		{in: "0d", bad: true},
		{in: "0s", bad: true},
		{in: "0", bad: true},
		{in: "-5m", bad: true},
		{in: "-1d", bad: true},
		{in: "36501d", bad: true},
		{in: "99999999999999999999d", bad: true},
		{in: "1.5d", bad: true},
		{in: "7 days", bad: true},
		{in: "yesterday", bad: true},
		{in: "2026-13-01", bad: true},
		{in: "2026-11-20 08:00", bad: true},
	} {
		t.Run(c.in, func(t *testing.T) {
			t.Parallel()
			got, err := deadletter.ParseTimeBound(c.in)
			if c.bad {
				if err == nil {
					t.Fatalf("ParseTimeBound(%q) = %+v, want an error", c.in, got)
				}
				if !deadletter.IsInput(err) {
					t.Errorf("ParseTimeBound(%q) error %v is not an input error", c.in, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTimeBound(%q): %v", c.in, err)
			}
			if !got.At.Equal(c.want.At) || got.Ago != c.want.Ago {
				t.Errorf("ParseTimeBound(%q) = %+v, want %+v", c.in, got, c.want)
			}
			if got.IsZero() != (c.in == "") {
				t.Errorf("ParseTimeBound(%q).IsZero() = %v", c.in, got.IsZero())
			}
		})
	}
}

func TestTimeBoundText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, text string
	}{
		{"7d", "7d"},
		{"48h", "2d"},
		{"90m", "1h30m0s"},
		{"2026-11-20T08:00:00Z", "2026-11-20T08:00:00Z"},
		{"2026-11-20", "2026-11-20T00:00:00Z"},
	} {
		var b deadletter.TimeBound
		if err := b.UnmarshalText([]byte(c.in)); err != nil {
			t.Fatalf("UnmarshalText(%q): %v", c.in, err)
		}
		text, err := b.MarshalText()
		if err != nil || string(text) != c.text {
			t.Errorf("MarshalText of %q = %q, %v; want %q", c.in, text, err, c.text)
		}
		var again deadletter.TimeBound
		if err := again.UnmarshalText(text); err != nil || again != b {
			t.Errorf("%q does not read back: %+v, %v; want %+v", text, again, err, b)
		}
	}
	var b deadletter.TimeBound
	if err := b.UnmarshalText([]byte("soon")); err == nil {
		t.Error(`UnmarshalText("soon") succeeded`)
	}

	// A filter in JSON leaves unset bounds out and writes set ones as text.
	out, err := json.Marshal(deadletter.Filter{Topic: "orders", Since: deadletter.TimeBound{Ago: 7 * 24 * time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"topic":"orders","since":"7d"}` {
		t.Errorf("filter JSON = %s", out)
	}
}

func TestParseRef(t *testing.T) {
	t.Parallel()
	ev := uuid.MustParse("0192f3a4-5b6c-7d8e-9f01-23456789abcd")
	for _, c := range []struct {
		in   string
		want deadletter.Ref
		bad  bool
	}{
		{in: "1", want: deadletter.Ref{ID: 1}},
		{in: " 42 ", want: deadletter.Ref{ID: 42}},
		{in: "9223372036854775807", want: deadletter.Ref{ID: 9223372036854775807}},
		{in: ev.String(), want: deadletter.Ref{EventID: ev}},
		{in: "0192F3A4-5B6C-7D8E-9F01-23456789ABCD", want: deadletter.Ref{EventID: ev}},
		{in: "0", bad: true},
		{in: "-3", bad: true},
		{in: "9223372036854775808", bad: true},
		{in: "", bad: true},
		{in: "abc", bad: true},
		{in: "1.5", bad: true},
		{in: "0192f3a4-5b6c-7d8e-9f01-23456789abc", bad: true},
	} {
		got, err := deadletter.ParseRef(c.in)
		if c.bad {
			if err == nil || !deadletter.IsInput(err) {
				t.Errorf("ParseRef(%q) = %+v, %v; want an input error", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if got.String() != c.want.String() {
			t.Errorf("Ref %+v prints as %q", got, got.String())
		}
	}
}

func TestParseRefs(t *testing.T) {
	t.Parallel()
	ev := uuid.New()
	refs, err := deadletter.ParseRefs([]string{"7", ev.String(), "8"})
	if err != nil {
		t.Fatal(err)
	}
	want := []deadletter.Ref{{ID: 7}, {EventID: ev}, {ID: 8}}
	if len(refs) != len(want) {
		t.Fatalf("ParseRefs = %+v, want %+v", refs, want)
	}
	for i := range want {
		if refs[i] != want[i] {
			t.Errorf("ref %d = %+v, want %+v", i, refs[i], want[i])
		}
	}

	refs, err = deadletter.ParseRefs([]string{"7", "x", "8", "-1"})
	var ie *deadletter.InputError
	if !errors.As(err, &ie) || refs != nil {
		t.Fatalf("ParseRefs with bad refs = %+v, %v; want an input error", refs, err)
	}
	if len(ie.Problems) != 2 {
		t.Errorf("problems = %q, want one for each of the 2 bad refs", ie.Problems)
	}
}

func TestFilterValidate(t *testing.T) {
	t.Parallel()
	at := func(h int) deadletter.TimeBound {
		return deadletter.TimeBound{At: base.Add(time.Duration(h) * time.Hour)}
	}
	ago := func(h int) deadletter.TimeBound { return deadletter.TimeBound{Ago: time.Duration(h) * time.Hour} }
	for _, c := range []struct {
		name     string
		f        deadletter.Filter
		problems int
	}{
		{"zero", deadletter.Filter{}, 0},
		{"every reason", deadletter.Filter{Reason: "too_large"}, 0},
		{"bad reason", deadletter.Filter{Reason: "timeout"}, 1},
		{"since before until", deadletter.Filter{Since: at(1), Until: at(2)}, 0},
		{"since equals until", deadletter.Filter{Since: at(1), Until: at(1)}, 1},
		{"since after until", deadletter.Filter{Since: at(2), Until: at(1)}, 1},
		{"since longer ago", deadletter.Filter{Since: ago(2), Until: ago(1)}, 0},
		{"since as long ago", deadletter.Filter{Since: ago(2), Until: ago(2)}, 1},
		{"since more recent", deadletter.Filter{Since: ago(1), Until: ago(2)}, 1},
		{"every problem", deadletter.Filter{Reason: "x", Since: at(2), Until: at(1)}, 2},
	} {
		err := c.f.Validate()
		var ie *deadletter.InputError
		switch {
		case c.problems == 0 && err != nil:
			t.Errorf("%s: Validate() = %v", c.name, err)
		case c.problems > 0 && !errors.As(err, &ie):
			t.Errorf("%s: Validate() = %v, want an input error", c.name, err)
		case c.problems > 0 && len(ie.Problems) != c.problems:
			t.Errorf("%s: problems %q, want %d", c.name, ie.Problems, c.problems)
		}
	}
}

func TestPayloadEncoding(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want string
	}{
		{`{"a":1}`, deadletter.EncodingJSON},
		{` [1, 2] `, deadletter.EncodingJSON},
		{`"text"`, deadletter.EncodingJSON},
		{`12`, deadletter.EncodingJSON},
		{``, deadletter.EncodingText},
		{`hello`, deadletter.EncodingText},
		{"line\r\nnext\ttab", deadletter.EncodingText},
		{"héllo ✓", deadletter.EncodingText},
		{`{"a":`, deadletter.EncodingText},
		{"nul\x00", deadletter.EncodingBase64},
		{"bell\x07", deadletter.EncodingBase64},
		{"del\x7f", deadletter.EncodingBase64},
		{"\xff\xfe", deadletter.EncodingBase64},
		{"\"\xff\"", deadletter.EncodingBase64},
		{`{"a":"` + "\xc3\x28" + `"}`, deadletter.EncodingBase64},
	} {
		if got := deadletter.PayloadEncoding([]byte(c.in)); got != c.want {
			t.Errorf("PayloadEncoding(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestInputErrorListsEveryProblem(t *testing.T) {
	t.Parallel()
	one := &deadletter.InputError{Problems: []string{"a is wrong"}}
	if one.Error() != "a is wrong" {
		t.Errorf("one problem: %q", one.Error())
	}
	two := &deadletter.InputError{Problems: []string{"a is wrong", "b is wrong"}}
	if two.Error() != "invalid input:\n  - a is wrong\n  - b is wrong" {
		t.Errorf("two problems: %q", two.Error())
	}
	if !deadletter.IsInput(errors.Join(errors.New("x"), two)) || deadletter.IsInput(errors.New("x")) {
		t.Error("IsInput does not find input errors in chains")
	}
}

// Every front end reads a filter from text through ParseFilter: each
// field of Filter has its entry, read by name, and every problem of the
// text is reported at once.
func TestParseFilter(t *testing.T) {
	t.Parallel()
	text := map[string]string{"topic": "orders.*", "destination": "hooks", "reason": "too_large", "key": "k1",
		"since": "2026-11-20", "until": "2026-11-21T08:00:00Z", "error": "refused", "group": "0123456789ab"}
	if got, want := len(deadletter.FilterFields), reflect.TypeFor[deadletter.Filter]().NumField(); got != want {
		t.Fatalf("%d filter fields described, Filter has %d", got, want)
	}
	for _, ff := range deadletter.FilterFields {
		if _, ok := text[ff.Name]; !ok || ff.Usage == "" {
			t.Errorf("filter field %q: not in this test, or without a usage", ff.Name)
		}
	}
	f, err := deadletter.ParseFilter(func(name string) string { return text[name] })
	if err != nil {
		t.Fatal(err)
	}
	want := deadletter.Filter{Topic: "orders.*", Destination: "hooks", Reason: "too_large", Key: "k1",
		Since: deadletter.TimeBound{At: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)},
		Until: deadletter.TimeBound{At: time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC)}, ErrorContains: "refused", Group: "0123456789ab"}
	if f != want {
		t.Errorf("ParseFilter = %+v\nwant          %+v", f, want)
	}
	bad := map[string]string{"reason": "late", "since": "yesterday", "group": "g1"}
	_, err = deadletter.ParseFilter(func(name string) string { return bad[name] })
	for _, problem := range []string{`since: time "yesterday"`, `reason "late"`, `group "g1"`} {
		if err == nil || !strings.Contains(err.Error(), problem) {
			t.Errorf("err = %v; want it to say %s", err, problem)
		}
	}
}
