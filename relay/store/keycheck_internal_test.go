package store

import (
	"fmt"
	"testing"
)

func TestKeyCheckFormChoice(t *testing.T) {
	distinct := make([]string, 1000) // a claim of 1000 rows of 1000 keys
	for i := range distinct {
		distinct[i] = fmt.Sprint("k", i)
	}
	hot := make([]string, 1000) // 1000 rows of one key
	for i := range hot {
		hot[i] = "hot"
	}
	cases := []struct {
		name string
		form keyCheckForm
		span int64
		keys []string
		want bool
	}{
		{"nothing passed over", keyCheckAuto, 1000, hot, true},
		{"another batch passed over, distinct keys", keyCheckAuto, 3000, distinct, true},
		{"at the limit, 4 rows passed a key", keyCheckAuto, 5000, distinct, true},
		{"past the limit", keyCheckAuto, 5001, distinct, false},
		{"a hot key behind another batch", keyCheckAuto, 2000, hot, false},
		{"a hot key, 4 rows passed", keyCheckAuto, 1004, hot, true},
		{"a hot key, 5 rows passed", keyCheckAuto, 1005, hot, false},
		{"forced by span", keyCheckBySpan, 1 << 40, hot, true},
		{"forced by key", keyCheckByKey, 1, distinct, false},
	}
	for _, c := range cases {
		if got := c.form.bySpan(c.span, c.keys); got != c.want {
			t.Errorf("%s: bySpan(%d, %d keys) = %v, want %v", c.name, c.span, len(c.keys), got, c.want)
		}
	}
}
