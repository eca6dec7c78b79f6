package deadletter_test

import (
	"errors"
	"net/url"
	"strconv"
	"testing"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

// The operators' text, parsed: a search (find), a filter with its time
// window, row references and cursors. Anything is either read or refused
// with the problems listed (an InputError, which the API answers 400 and
// the console shows); nothing panics or fails otherwise.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"q=4f1c7a58-5d7b-4d53-9e8b-8a1f2b9c0d11&kind=event",
		"q=1042&kind=row&limit=5", "q=customer-7&kind=key&limit=0", "q=%00&kind=auto", "q=&kind=nope",
		"topic=orders&destination=hooks&reason=permanent&key=k&since=2h&until=2026-11-30T10:00:00Z&error=HTTP%25&group=3f9c2a1b7d4e&status=dead_lettered",
		"since=-5m&until=1y", "since=2026-13-40&status=pending", "refs=1&refs=x&refs=00000000-0000-0000-0000-000000000000&refs=-1&refs=99999999999999999999&ref=1042&cursor=2026-11-30T10:00:00Z.12.x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		check := func(what string, err error) {
			var ie *deadletter.InputError
			if err != nil && !errors.As(err, &ie) {
				t.Fatalf("%s of %q: %v is not an input error", what, raw, err)
			}
			if ie != nil && len(ie.Problems) == 0 {
				t.Fatalf("%s of %q: an input error without a problem", what, raw)
			}
		}
		limit, _ := strconv.Atoi(q.Get("limit"))
		_, _, _, err = deadletter.ParseFind(deadletter.FindParams{Query: q.Get("q"), Kind: q.Get("kind"), Limit: limit})
		check("find", err)
		_, err = deadletter.ParseFilter(q.Get)
		check("filter", err)
		_, _, err = deadletter.ParseWindow(q.Get("since"), q.Get("until"))
		check("window", err)
		_, err = deadletter.ParseRefs(q["refs"])
		check("refs", err)
		_, err = deadletter.ParseRef(q.Get("ref"))
		check("ref", err)
		if c := q.Get("cursor"); c != "" {
			if _, _, _, err := deadletter.ParseCursor(c); err == nil && c == "" {
				t.Fatal("an empty cursor parsed")
			}
		}
	})
}
