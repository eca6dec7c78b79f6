package deadletter_test

import (
	"context"
	"testing"

	dlt "github.com/outbox-relay/outbox-relay/internal/dev/deadlettertest"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.WaitingTests) }

// The fixtures, shared with the HTTP API's tests.
type (
	dead        = dlt.Dead
	parked      = dlt.Parked
	auditRecord = dlt.AuditRecord
	state       = dlt.State
)

var (
	base           = dlt.Base
	actor          = dlt.Actor
	newStore       = dlt.NewStore
	newStoreWith   = dlt.NewStoreWith
	query          = dlt.Query
	count          = dlt.Count
	dbNow          = dlt.DBNow
	addDead        = dlt.AddDead
	failAgain      = dlt.FailAgain
	addPending     = dlt.AddPending
	nullable       = dlt.Nullable
	addParked      = dlt.AddParked
	parkBehind     = dlt.ParkBehind
	checkReleased  = dlt.CheckReleased
	checkParked    = dlt.CheckParked
	str            = dlt.Str
	snapshot       = dlt.Snapshot
	checkUnchanged = dlt.CheckUnchanged
	auditRecords   = dlt.AuditRecords
	rowState       = dlt.RowState
	checkReplayed  = dlt.CheckReplayed
	statuses       = dlt.Statuses
	sorted         = dlt.Sorted
	idsOf          = dlt.IDsOf
)

// fakeLimiter records the rows it is asked to wait for, and fails the call
// numbered failAt (1-based) if set.
type fakeLimiter struct {
	calls  []int
	failAt int
	err    error
}

func (f *fakeLimiter) WaitN(_ context.Context, n int) error {
	f.calls = append(f.calls, n)
	if len(f.calls) == f.failAt {
		return f.err
	}
	return nil
}
