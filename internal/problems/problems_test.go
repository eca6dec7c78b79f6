package problems_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/problems"
)

func TestUnder(t *testing.T) {
	t.Parallel()
	if got := problems.Under("x.", nil); got != nil {
		t.Errorf("nil error: %q", got)
	}
	err := errors.Join(errors.New("failures must be ≥ 1"), errors.New("successes must be ≥ 1\n"))
	want := []string{"breaker.failures must be ≥ 1", "breaker.successes must be ≥ 1"}
	if got := problems.Under("breaker.", err); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
