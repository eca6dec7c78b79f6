package store

import (
	"testing"
	"time"
)

func TestWatermarkAdvance(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var w watermark
	steps := []struct {
		name          string
		last, xmax    int64
		xmin          int64
		ms            int
		safe          int64
		heldSinceMs   int // -1: nothing held
		pendingLength int
	}{
		{"quiet database: safe at once", 10, 100, 100, 0, 10, -1, 0},
		{"a transaction runs: held", 12, 105, 101, 1, 10, 1, 1},
		{"no new id: the older observation stays", 12, 106, 101, 2, 10, 1, 1},
		{"new ids, still held", 15, 108, 101, 3, 10, 1, 2},
		{"the holder ends: first observation safe", 17, 110, 106, 4, 12, 3, 2},
		{"all end", 17, 111, 111, 5, 17, -1, 0},
		{"an old observation never lowers it", 5, 112, 111, 6, 17, -1, 0},
	}
	for _, s := range steps {
		safe, since := w.advance(observation{last: s.last, xmax: s.xmax, at: at(s.ms)}, s.xmin)
		wantSince := time.Time{}
		if s.heldSinceMs >= 0 {
			wantSince = at(s.heldSinceMs)
		}
		if safe != s.safe || !since.Equal(wantSince) || len(w.pending) != s.pendingLength {
			t.Fatalf("%s: safe %d, held since %v, %d pending; want %d, %v, %d",
				s.name, safe, since, len(w.pending), s.safe, wantSince, s.pendingLength)
		}
	}

	// A long holder: observations are bounded, the newest replaced, and
	// none is ever taken as safe before its transactions end.
	for i := range 3 * maxObservations {
		safe, _ := w.advance(observation{last: int64(100 + i), xmax: int64(200 + i), at: at(10 + i)}, 150)
		if safe != 17 {
			t.Fatalf("observation %d: safe %d while the holder runs, want 17", i, safe)
		}
	}
	if len(w.pending) != maxObservations {
		t.Fatalf("%d observations kept, want %d", len(w.pending), maxObservations)
	}
	newest := int64(100 + 3*maxObservations - 1)
	if safe, since := w.advance(observation{last: newest, xmax: 500, at: at(1000)}, 400); safe != newest || !since.IsZero() {
		t.Fatalf("after the holder: safe %d, held since %v; want %d, nothing held", safe, since, newest)
	}
}
