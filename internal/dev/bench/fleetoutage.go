package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"
)

// fleetOutage measures how much of an HTTP endpoint's in-flight limit a
// fleet keeps busy after an outage, with the binary as users run it:
// three outbox-relay processes deliver two outboxes (two schemas, 100 keys
// each) to an endpoint that answers each request after 20 ms, under a
// max_in_flight of 3. Producers write while the endpoint answers 503 for
// FleetOutage (8 s); one process is SIGKILLed in the middle of the outage and started
// again. The figure is the requests in flight on average from the
// endpoint's first answer after the outage until fewer keys have a row
// ready than the limit, against the limit; the detail says how long that
// first answer took to come, the most requests ever in flight, and when
// the last row committed before the outage ended was delivered.
func (r *runner) fleetOutage(ctx context.Context) error {
	const (
		limit   = 3
		keys    = 100
		answer  = 20 * time.Millisecond
		perTick = 4 // rows an outbox's producer writes every 20 ms
	)
	outage := r.cfg.FleetOutage
	bin, cleanup, err := r.binary(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	var envs []*env
	for range 2 {
		e, err := r.newEnv(ctx, 4)
		if err != nil {
			return err
		}
		defer e.close()
		envs = append(envs, e)
	}
	ep := &slowEndpoint{answer: answer}
	var down atomic.Bool
	var firstAnswer atomic.Int64 // after the outage, unix nanoseconds
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		ep.move(1)
		time.Sleep(answer)
		ep.move(-1)
		firstAnswer.CompareAndSwap(0, time.Now().UnixNano())
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	dir, err := os.MkdirTemp("", "outbox-relay-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfgFile := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
outboxes:
  - {name: a, schema: %s}
  - {name: b, schema: %s}
destinations:
  hook:
    max_in_flight: %d
    http: {url: %q, allow_private_networks: true}
routes:
  - {topics: ["*"], destination: hook}
`, envs[0].schema, envs[1].schema, limit, srv.URL)), 0o600); err != nil {
		return err
	}
	env := append(os.Environ(), "OUTBOX_DATABASE_URL="+r.cfg.URL, "OUTBOX_CONFIG="+cfgFile,
		"OUTBOX_ADMIN_LISTEN=127.0.0.1:0", "OUTBOX_LOG_LEVEL=info")
	rs, err := startRelays(ctx, bin, env, 3)
	if err != nil {
		return err
	}
	defer rs.kill()
	settled := func() bool {
		for _, e := range envs {
			var owners, free int
			if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT owner), count(*) FILTER (WHERE owner IS NULL)
				FROM outbox_claim_partitions`).Scan(&owners, &free); err != nil || owners != 3 || free != 0 {
				return false
			}
		}
		return true
	}
	if err := waitUntil(ctx, time.Minute, settled); err != nil {
		return fmt.Errorf("fleet outage: the replicas to share the partitions: %w", err)
	}

	// The outage, with producers writing through it and one process
	// killed and started again half way.
	produce := func() error {
		for _, e := range envs {
			if _, err := e.pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload)
				SELECT 'bench', 'k' || (floor(random() * $2))::int, '{}'::bytea FROM generate_series(1, $1) g`, perTick, keys); err != nil {
				return fmt.Errorf("fleet outage: produce: %w", err)
			}
		}
		return nil
	}
	down.Store(true)
	began := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	killed := false
	for time.Since(began) < outage {
		if err := produce(); err != nil {
			return err
		}
		if !killed && time.Since(began) >= outage/2 {
			killed = true
			if err := rs.restartOne(ctx, bin, env); err != nil {
				return fmt.Errorf("fleet outage: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	down.Store(false)
	healedAt := time.Now()

	// The drain after it: from the first answer until fewer keys have a
	// row ready (due now) than slots, and until every row, all committed
	// before the outage ended, is delivered.
	keysLeft := func() (ready, pending int) {
		for _, e := range envs {
			var r, p int
			if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT key) FILTER (WHERE next_attempt_at <= now()), count(DISTINCT key)
				FROM outbox WHERE status = 'pending'`).Scan(&r, &p); err != nil {
				return keys, keys
			}
			ready, pending = ready+r, pending+p
		}
		return ready, pending
	}
	if err := waitUntil(ctx, 2*time.Minute, func() bool { return firstAnswer.Load() != 0 }); err != nil {
		return fmt.Errorf("fleet outage: no answer after the outage: %w", err)
	}
	from, fromAt := ep.areaNow()
	// The rows held for the outage are let go within a sync of the first
	// answer: only then does a short count of ready keys end the drain.
	settle := fromAt.Add(time.Second)
	if err := waitUntil(ctx, 10*time.Minute, func() bool {
		ready, _ := keysLeft()
		return ready < limit && time.Now().After(settle)
	}); err != nil {
		return fmt.Errorf("fleet outage: the backlog to drain: %w", err)
	}
	to, toAt := ep.areaNow()
	span := toAt.Sub(fromAt).Seconds()
	if span <= 0 {
		return errors.New("fleet outage: the backlog drained before the first answer")
	}
	mean := (to - from) / span
	if err := waitUntil(ctx, 10*time.Minute, func() bool { _, pending := keysLeft(); return pending == 0 }); err != nil {
		return fmt.Errorf("fleet outage: the last rows to be delivered: %w", err)
	}
	drained := time.Since(healedAt)
	ep.mu.Lock()
	most := ep.most
	ep.mu.Unlock()
	r.add(Result{Group: "fleet", Name: outageName(outage),
		Value: 100 * mean / limit, Unit: "%",
		Detail: fmt.Sprintf("%.2f requests in flight on average over the %.1f s from the first answer, %.2f s after the outage, until fewer than %d keys had a row ready; %d at most; the last row committed before the outage ended delivered %.1f s after it",
			mean, span, time.Unix(0, firstAnswer.Load()).Sub(healedAt).Seconds(), limit, most, drained.Seconds())})
	return rs.stop()
}

// outageName names the fleetOutage figure.
func outageName(outage time.Duration) string {
	return fmt.Sprintf("3 replicas after %s of outage, max_in_flight 3: slots busy", outage)
}

// restartOne SIGKILLs the first process and starts another in its place
// with env.
func (rs *relays) restartOne(ctx context.Context, bin string, env []string) error {
	old := rs.cmds[0]
	_ = old.Process.Kill()
	_ = old.Wait()
	c := exec.CommandContext(ctx, bin, "run")
	c.Env = env
	if err := c.Start(); err != nil {
		return fmt.Errorf("start outbox-relay run again: %w", err)
	}
	rs.cmds[0] = c
	return nil
}
