package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// serverOutage is an outage of a sink's server, as rideOutOutage drives
// it.
type serverOutage struct {
	dest, topic string // the relay's destination and the rows' topic
	stop, start func() // take the server down, and bring it back
}

// outageProbes is how many failed probes of the breaker an outage lasts:
// at cool-downs of at most 200ms, a long outage compressed.
const outageProbes = 60

// rideOutOutage starts a relay with env (its configuration routing o.topic
// to o.dest, pauses of 50 to 200ms) and delivers 200 rows of keys k0 to
// k19, numbered from 1; then the server is down for outageProbes failed
// probes while rows keep arriving, then back. Every row must end sent,
// with no attempt counted and nothing retried or dead-lettered. It returns
// the number of rows written.
func rideOutOutage(t *testing.T, pool *pgxpool.Pool, env []string, o serverOutage) int {
	t.Helper()
	p := startRelay(t, append(env, "OUTBOX_RELAY_SENT_RETENTION=1h"))
	addr := adminAddr(t, p)
	var mu sync.Mutex
	rows := 0
	insert := func(n int) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
SELECT $1, 'k' || (g % 20), g::text::bytea FROM generate_series($2::int, $3::int) g`, o.topic, rows+1, rows+n); err != nil {
			t.Error(err)
			return
		}
		rows += n
	}
	insert(200)
	testwait.Within(t, 60*time.Second, "the first rows delivered", func() bool { return countRows(t, pool, "status = 'sent'") == 200 })

	o.stop()
	// Rows keep arriving through the outage, ten every 100ms.
	arriving, stopArriving := context.WithCancel(context.Background())
	arrived := make(chan struct{})
	go func() {
		defer close(arrived)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-arriving.Done():
				return
			case <-tick.C:
				insert(10)
			}
		}
	}()
	testwait.State(t, 2*time.Minute, func() (bool, string) {
		opened := strings.Count(p.output.String(), "circuit opened")
		return opened >= outageProbes, fmt.Sprintf("timed out waiting for %d failed probes; %d so far; output:\n%s", outageProbes, opened, p.output)
	})
	stopArriving()
	<-arrived
	if s := scrapeMetrics(t, addr); s.sum("outbox_retried_total", "destination", o.dest) != 0 || s.sum("outbox_dead_lettered_total") != 0 {
		t.Fatalf("rows retried or dead-lettered while the server was down; output:\n%s", p.output)
	}
	if n := countRows(t, pool, "status = 'sent'"); n != 200 {
		t.Fatalf("%d rows sent while the server was down", n)
	}
	o.start()
	testwait.Within(t, 2*time.Minute, "every row delivered after the outage", func() bool { return countRows(t, pool, "status = 'sent'") == rows })
	if n := countRows(t, pool, "retry_count > 0 OR status <> 'sent'"); n != 0 {
		t.Fatalf("%d rows counted an attempt or did not end sent; the outage must cost none:\n%s\noutput:\n%s", n, rowErrors(t, pool), p.output)
	}
	return rows
}

// sum adds up the counters of family name whose labels include labels.
func (s scrape) sum(name string, labels ...string) float64 {
	var total float64
	fam := s[name]
	if fam == nil {
		return 0
	}
next:
	for _, m := range fam.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
			}
			if !found {
				continue next
			}
		}
		total += m.GetCounter().GetValue()
	}
	return total
}

// checkerEnv is the environment of the kill-and-restart checker's relays
// against a sink's server: small batches, short backoffs and pauses.
func checkerEnv(dsn, cfg string, extra ...string) []string {
	return natsEnv(dsn, cfg, append(slices.Clone(checkerSettings), extra...)...)
}

// rowErrors lists, for a failure message, the attempts, status and last
// error of the rows that counted an attempt or did not end sent.
func rowErrors(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, retry_count, status, coalesce(last_error, '')
		FROM outbox WHERE retry_count > 0 OR status <> 'sent' ORDER BY id LIMIT 20`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id int64
		var attempts int
		var status, lastErr string
		if err := rows.Scan(&id, &attempts, &status, &lastErr); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  row %d: %s after %d attempts: %s\n", id, status, attempts, lastErr)
	}
	return b.String()
}
