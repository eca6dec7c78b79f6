package sink_test

import (
	"reflect"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func TestKeyRuns(t *testing.T) {
	t.Parallel()
	recs := []sink.Record{{Key: "a", HasKey: true}, {}, {Key: "b", HasKey: true}, {Key: "a", HasKey: true}, {}, {Key: "", HasKey: true}}
	want := [][]int{{0, 3}, {1}, {2}, {4}, {5}}
	if got := sink.KeyRuns(recs); !reflect.DeepEqual(got, want) {
		t.Errorf("KeyRuns = %v, want %v", got, want)
	}
}
