package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
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

// healKeys is how many keys each destination's traffic spreads over in
// the heal tests, as a producer's traffic over customers or orders does.
const healKeys = 300

// A ten-second outage at the default cool-downs (1s, doubling up to 30s)
// and retry delays, keyed traffic flowing throughout: once the destination
// answers again, every row committed before it did is delivered within
// healWithin: the rows its failed probes held, and those of their keys
// behind them, included. An endpoint answering 503, and one answering
// nothing. Not parallel, as the heal tests: timed to the second, they run
// before the package's parallel fault tests, whose load would time the
// machine rather than the relay.
func TestShortOutageHealsWithinSeconds(t *testing.T) {
	testwait.SkipShort(t)
	checkHeals(t, newReceiver(t, http.StatusServiceUnavailable).run("http-503"), newReceiver(t, 0).run("http-timeout"))
}

// checkHeals runs one relay with a destination for each run at the
// default cool-downs and retry delays, offers keyed traffic throughout,
// takes every destination down for ten seconds, brings them back at once,
// and checks that every row committed before one came back is delivered
// within healWithin of its return, in order per key, none dead-lettered.
func checkHeals(t *testing.T, runs ...outageRun) {
	s := pgtest.NewSchema(t).WithConns(t, 20)
	var cfg relay.Config
	for _, o := range runs {
		cfg.Destinations = append(cfg.Destinations, o.dest(t, o.name, 0))
		cfg.Routes = append(cfg.Routes, relay.Route{Topics: []string{o.name}, Destination: o.name, Topic: o.topic})
	}
	cfg.Pause = relay.PauseConfig{Base: time.Second, Max: 30 * time.Second}
	h := start(t, s, nil, options{keepSent: true, listener: true, cfg: cfg,
		policy: retry.PolicyConfig{BaseDelay: time.Second, MaxDelay: time.Minute}})
	defer h.stop()

	var n atomic.Int64
	traffic := func(d time.Duration) { offer(t, s, runs, healKeys, &n, d) }
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
	for i, o := range runs {
		if err := s.Pool.QueryRow(context.Background(), `SELECT max(id) FROM outbox WHERE topic = $1`, o.name).Scan(&last[i]); err != nil {
			t.Fatal(err)
		}
	}
	// The servers come back at once, each outage as long as the others;
	// one that takes seconds to start (a RabbitMQ node) is back once it
	// answers.
	healed := make([]time.Time, len(runs))
	var heals sync.WaitGroup
	for i, o := range runs {
		heals.Add(1)
		go func() {
			defer heals.Done()
			o.down(false)
			healed[i] = time.Now()
		}()
	}
	heals.Wait()
	// Each destination is timed from its own return to when the last of
	// its rows committed before then was sent.
	said := make([]bool, len(runs))
	ok, saw := testwait.Poll(testwait.DefaultTimeout, func() (bool, string) {
		var waiting []string
		for i, o := range runs {
			left := count(t, s.Pool, "topic = $1 AND id <= $2 AND status <> 'sent'", o.name, last[i])
			if left == 0 {
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
		var sent time.Time
		if err := s.Pool.QueryRow(context.Background(), `SELECT max(sent_at) FROM outbox WHERE topic = $1 AND id <= $2`,
			o.name, last[i]).Scan(&sent); err != nil {
			t.Fatal(err)
		}
		took := max(sent.Sub(healed[i]), 0).Round(10 * time.Millisecond)
		t.Logf("%s: every row committed before the heal delivered %s after it", o.name, took)
		if took > healWithin {
			t.Errorf("%s: the rows committed before the heal took %s to go, want at most %s", o.name, took, healWithin)
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
