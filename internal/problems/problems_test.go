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

func TestErrors(t *testing.T) {
	t.Parallel()
	errs := problems.Errors("rate_limit.", errors.New("per_second must be > 0\nburst must be ≥ 1"))
	if len(errs) != 2 || errs[0].Error() != "rate_limit.per_second must be > 0" || errs[1].Error() != "rate_limit.burst must be ≥ 1" {
		t.Errorf("got %v", errs)
	}
}
