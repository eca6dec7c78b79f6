package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// healWithin is how soon after a ten-second outage ends every row
// committed before it ended must be delivered.
const healWithin = 5 * time.Second

// A ten-second outage at the default cool-downs (1s, doubling up to 30s)
// and retry delays, keyed traffic flowing throughout: once the destination
// answers again, every row committed before it did is delivered within
// healWithin: the rows its failed probes held, and those of their keys
// behind them, included. An endpoint answering 503; one that answers
// nothing is not yet held to it (docs/failures.md, "Recovery is
// immediate").
func TestShortOutageHealsWithinSeconds(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	checkHeals(t, newReceiver(t, http.StatusServiceUnavailable).run("http-503"))
}

// checkHeals runs one relay with a destination for each run at the
// default cool-downs and retry delays, offers keyed traffic throughout,
// takes every destination down for ten seconds, brings each back in turn,
// and checks that every row committed before one came back is delivered
// within healWithin of its return, in order per key, none dead-lettered.
func checkHeals(t *testing.T, runs ...outageRun) {
	s := pgtest.NewSchema(t).WithConns(t, 20)
	var cfg relay.Config
	for _, o := range runs {
		cfg.Destinations = append(cfg.Destinations, o.dest(t, o.name, 0))
		cfg.Routes = append(cfg.Routes, relay.Route{Topics: []string{o.name}, Destination: o.name})
	}
	cfg.Pause = relay.PauseConfig{Base: time.Second, Max: 30 * time.Second}
	h := start(t, s, nil, options{keepSent: true, listener: true, cfg: cfg,
		policy: retry.PolicyConfig{BaseDelay: time.Second, MaxDelay: time.Minute}})
	defer h.stop()

	var n atomic.Int64
	traffic := func(d time.Duration) { offer(t, s, runs, &n, d) }
	traffic(2 * time.Second)
	for _, o := range runs {
		o.down(true)
	}
	traffic(10 * time.Second)
	// Traffic goes on while the destinations come back and their held
	// rows go.
	done := make(chan struct{})
	go func() {
		defer close(done)
		traffic(2 * time.Second)
	}()
	last := make([]int64, len(runs))
	healed := make([]time.Time, len(runs))
	for i, o := range runs {
		if err := s.Pool.QueryRow(context.Background(), `SELECT max(id) FROM outbox WHERE topic = $1`, o.name).Scan(&last[i]); err != nil {
			t.Fatal(err)
		}
		// A server that takes seconds to start is back once it answers.
		o.down(false)
		healed[i] = time.Now()
	}
	// Each destination's rows are watched at once: one slow to heal does
	// not hide how soon the others did.
	took := make([]time.Duration, len(runs))
	said := make([]bool, len(runs))
	ok, saw := testwait.Poll(testwait.DefaultTimeout, func() (bool, string) {
		var waiting []string
		for i, o := range runs {
			if took[i] != 0 {
				continue
			}
			left := count(t, s.Pool, "topic = $1 AND id <= $2 AND status <> 'sent'", o.name, last[i])
			if left == 0 {
				took[i] = time.Since(healed[i])
				continue
			}
			if !said[i] && time.Since(healed[i]) > healWithin {
				said[i] = true
				logWaiting(t, s, o.name, last[i])
			}
			waiting = append(waiting, fmt.Sprintf("%s: %d rows committed during the outage still undelivered", o.name, left))
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	})
	if !ok {
		t.Fatal(saw)
	}
	for i, o := range runs {
		t.Logf("%s: every row committed before the heal delivered %s after it", o.name, took[i].Round(10*time.Millisecond))
		if took[i] > healWithin {
			t.Errorf("%s: the rows committed before the heal took %s to go, want at most %s", o.name, took[i].Round(10*time.Millisecond), healWithin)
		}
	}
	<-done
	testwait.For(t, "every row delivered", func() bool { return count(t, s.Pool, "status <> 'sent'") == 0 })
	for _, o := range runs {
		if d := count(t, s.Pool, "topic = $1 AND status = 'dead_lettered'", o.name); d != 0 {
			t.Errorf("%s: %d rows dead-lettered by the outage", o.name, d)
		}
		checkPayloadOrder(t, o.name, o.delivered(t), int(n.Load()))
	}
}

// logWaiting says why the rows of topic up to id last still wait: their
// attempts, when they are due, and their last error.
func logWaiting(t *testing.T, s *pgtest.Schema, topic string, last int64) {
	rows, err := s.Pool.Query(context.Background(), `SELECT retry_count, round(extract(epoch FROM next_attempt_at - now())::numeric, 1),
		coalesce(last_error, ''), count(*)
		FROM outbox WHERE topic = $1 AND id <= $2 AND status <> 'sent' GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 5`, topic, last)
	if err != nil {
		t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var attempts, n int
		var due float64
		var lastErr string
		if err := rows.Scan(&attempts, &due, &lastErr, &n); err != nil {
			t.Log(err)
			return
		}
		t.Logf("%s: %d rows wait after %d attempts, due in %.1fs: %s", topic, n, attempts, due, lastErr)
	}
}
