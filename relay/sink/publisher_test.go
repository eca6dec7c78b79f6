package sink_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

type plain struct{}

func (plain) Publish(_ context.Context, recs []sink.Record) []error { return make([]error, len(recs)) }

type partitioned struct{ plain }

func (partitioned) Partition(sink.Record) (int, bool) { return 3, true }

type pinging struct{ plain }

var errPing = errors.New("down")

func (pinging) Ping(context.Context) error { return errPing }

type both struct{ plain }

func (both) Partition(sink.Record) (int, bool) { return 3, true }
func (both) Ping(context.Context) error        { return errPing }

// A wrapper made with Decorate has the optional interfaces of what it
// wraps, and only those.
func TestDecorateKeepsTheOptionalInterfaces(t *testing.T) {
	for _, c := range []struct {
		name           string
		inner          sink.Publisher
		partition, pin bool
	}{
		{"plain", plain{}, false, false},
		{"partitioner", partitioned{}, true, false},
		{"pinger", pinging{}, false, true},
		{"both", both{}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			outer := sink.Decorate(c.inner, plain{})
			pt, isPart := outer.(sink.Partitioner)
			pg, isPing := outer.(sink.Pinger)
			if isPart != c.partition || isPing != c.pin {
				t.Fatalf("wrapper is a Partitioner: %v, a Pinger: %v; want %v, %v", isPart, isPing, c.partition, c.pin)
			}
			if isPart {
				if p, _ := pt.Partition(sink.Record{}); p != 3 {
					t.Errorf("wrapper's partition %d, want the inner's 3", p)
				}
			}
			if isPing && !errors.Is(pg.Ping(context.Background()), errPing) {
				t.Error("wrapper's ping is not the inner's")
			}
		})
	}
}
