package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// drains measures backlog drain throughput of the relay and of its SQL
// alone, for each write-back mode, key distribution and worker count. The
// SQL ceiling is measured before and after each drain, and the relay's
// share is of their mean, so a change in the machine's speed during the
// scenario weighs on both sides alike. The 10k-keys scenarios with 2
// workers repeat the drain cfg.Pairs times (ceiling, drain, ceiling,
// drain, ceiling) and report the means.
func (r *runner) drains(ctx context.Context) error {
	for _, keep := range []bool{false, true} {
		mode := "delete-on-send"
		if keep {
			mode = "mark-sent"
		}
		for _, dist := range distributions {
			for _, workers := range []int{1, 2} {
				pairs := 1
				if dist.name == "10k keys" && workers == 2 {
					pairs = max(r.cfg.Pairs, 1)
				}
				name := fmt.Sprintf("%s, %s, %d worker(s)", mode, dist.name, workers)
				if !strings.Contains(name, r.cfg.Match) {
					continue
				}
				ceilings, drained := make([]float64, 0, pairs+1), make([]float64, 0, pairs)
				var drainUse, ceilingUse usage
				for i := 0; i <= pairs; i++ {
					if i > 0 {
						got, use, err := r.drain(ctx, keep, dist.expr, workers)
						if err != nil {
							return fmt.Errorf("%s: %w", name, err)
						}
						drainUse = drainUse.add(use)
						drained = append(drained, got)
					}
					c, use, err := r.sqlCeiling(ctx, keep, dist.expr, workers)
					if err != nil {
						return fmt.Errorf("%s: SQL ceiling: %w", name, err)
					}
					ceilingUse = ceilingUse.add(use)
					ceilings = append(ceilings, c)
				}
				// The ceiling of each drain is the mean of the two beside
				// it; the figures are the means over the drains.
				var ceiling, got float64
				for i, d := range drained {
					ceiling += (ceilings[i] + ceilings[i+1]) / 2 / float64(pairs)
					got += d / float64(pairs)
				}
				ceilingNote := fmt.Sprintf("mean of %.0f before and %.0f after the drain", ceilings[0], ceilings[1])
				drainNote := fmt.Sprintf("%.0f%% of the SQL ceiling; %s",
					100*got/ceiling, drainUse.against(ceilingUse, pairs*r.cfg.Rows, (pairs+1)*r.cfg.Rows))
				if pairs > 1 {
					ceilingNote = fmt.Sprintf("%s before, between and after %d drains; the mean, over the drains, of the two beside each",
						list(ceilings), pairs)
					drainNote = fmt.Sprintf("mean of %s; %s", list(drained), drainNote)
				}
				r.add(Result{Group: "ceiling", Name: name, Value: ceiling, Unit: "rows/s", Detail: ceilingNote})
				r.add(Result{Group: "drain", Name: name, Value: got, Unit: "rows/s", Detail: drainNote})
			}
		}
	}
	return nil
}

// usage is the CPU time spent over the timed part of drains or ceilings
// (not their backlog fills): this process's (relay, Kafka client and
// in-process broker, or the SQL ceiling's loop), in user and system mode,
// and, where the kernel reports them (Linux), the whole machine's busy
// and idle time, summed over its CPUs. What the machine spent beside this
// process is every other process's, mostly PostgreSQL's on a quiet
// machine, and the kernel's for work it does outside any process's time,
// such as delivering loopback traffic.
type usage struct {
	process, busy, idle time.Duration
}

// usageNow reads the CPU time used so far.
func usageNow() usage {
	var u usage
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	u.busy, u.idle = machineCPU()
	return u
}

// machineCPU reads the busy and idle time of every CPU since boot from
// the kernel's /proc/stat; zero where there is none. Time spent waiting
// for I/O counts as idle (with fsync on, PostgreSQL's WAL flushes among
// it); time stolen by a hypervisor counts as neither. The kernel counts
// in ticks of a hundredth of a second, so over a short stretch these
// figures are coarse beside the process's own.
func machineCPU() (busy, idle time.Duration) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0
	}
	st, err := fs.Stat()
	if err != nil {
		return 0, 0
	}
	t := st.CPUTotal
	seconds := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	return seconds(t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ), seconds(t.Idle + t.Iowait)
}

func (u usage) add(v usage) usage {
	return usage{process: u.process + v.process, busy: u.busy + v.busy, idle: u.idle + v.idle}
}

func (u usage) since(start usage) usage {
	return usage{process: u.process - start.process, busy: u.busy - start.busy, idle: u.idle - start.idle}
}

// against describes u, over n rows drained, beside the ceilings' c, over
// m rows: CPU a row, this process's and the rest of the machine's, and
// the machine's idle share.
func (u usage) against(c usage, n, m int) string {
	s := fmt.Sprintf("this process's CPU %.1f µs a row against the ceiling's %.1f", perRow(u.process, n), perRow(c.process, m))
	if u.busy > 0 && c.busy > 0 {
		s += fmt.Sprintf(", the rest of the machine's %.1f against %.1f, the machine idle %.0f%% of the time against %.0f%%",
			perRow(max(u.busy-u.process, 0), n), perRow(max(c.busy-c.process, 0), m),
			100*float64(u.idle)/float64(u.busy+u.idle), 100*float64(c.idle)/float64(c.busy+c.idle))
	}
	return s
}

// perRow is d a row over n rows, in microseconds.
func perRow(d time.Duration, n int) float64 {
	return float64(d) / float64(time.Microsecond) / float64(max(n, 1))
}

// list formats rates as "55.2k, 61.0k and 58.4k".
func list(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.1fk", x/1000)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func (r *runner) drain(ctx context.Context, keep bool, keyExpr string, workers int) (float64, usage, error) {
	return r.drainWith(ctx, keep, keyExpr, workers, nil, nil)
}

// drainWith is drain with the relay's configuration changed by tune, and
// after told of the relay once the backlog is drained.
func (r *runner) drainWith(ctx context.Context, keep bool, keyExpr string, workers int,
	tune func(*relay.Config, *env) error, after func(*relay.Relay)) (float64, usage, error) {
	e, err := r.newEnv(ctx, int32(workers+4))
	if err != nil {
		return 0, usage{}, err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.Rows, keyExpr); err != nil {
		return 0, usage{}, err
	}
	pub, err := r.publisher(e)
	if err != nil {
		return 0, usage{}, err
	}
	defer pub.Close()
	st, err := store.New(e.relayPool, store.Config{Schema: e.schema, KeepSent: keep, Claimer: "bench"})
	if err != nil {
		return 0, usage{}, err
	}
	cfg := relay.Config{
		Store: st, Publisher: pub, Workers: workers, BatchSize: r.cfg.BatchSize,
		MaxBatchBytes: r.cfg.BatchSize * (r.cfg.PayloadBytes + relay.RecordOverhead + 64), PayloadCap: r.cfg.PayloadBytes * 2,
		PollInterval: 5 * time.Millisecond,
	}
	if keep {
		cfg.SentRetention = time.Hour
	}
	if tune != nil {
		if err := tune(&cfg, e); err != nil {
			return 0, usage{}, err
		}
	}
	rel, err := relay.New(cfg)
	if err != nil {
		return 0, usage{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start, startUse := time.Now(), usageNow()
	go func() { done <- rel.Run(runCtx) }()
	err = waitUntil(ctx, 10*time.Minute, func() bool { return rel.Stats().Delivered >= int64(r.cfg.Rows) })
	elapsed, use := time.Since(start), usageNow().since(startUse)
	stop()
	if runErr := <-done; runErr != nil {
		return 0, usage{}, runErr
	}
	if err != nil {
		return 0, usage{}, fmt.Errorf("drain: %w (delivered %d of %d)", err, rel.Stats().Delivered, r.cfg.Rows)
	}
	if after != nil {
		after(rel)
	}
	return float64(r.cfg.Rows) / elapsed.Seconds(), use, nil
}

// sqlCeiling drains a backlog with the relay's own claim and write-back
// statements and nothing else: no publish.
func (r *runner) sqlCeiling(ctx context.Context, keep bool, keyExpr string, workers int) (float64, usage, error) {
	e, err := r.newEnv(ctx, int32(workers+2))
	if err != nil {
		return 0, usage{}, err
	}
	defer e.close()
	if err := r.fill(ctx, e, r.cfg.Rows, keyExpr); err != nil {
		return 0, usage{}, err
	}
	st, err := claimingStore(ctx, e, store.Config{KeepSent: keep})
	if err != nil {
		return 0, usage{}, err
	}
	var done atomic.Int64
	start, startUse := time.Now(), usageNow()
	err = parallel(workers, func(int) error {
		for done.Load() < int64(r.cfg.Rows) {
			if _, err := claimAndAck(ctx, st, r.cfg.BatchSize, &done); err != nil {
				return err
			}
		}
		return nil
	})
	return float64(r.cfg.Rows) / time.Since(start).Seconds(), usageNow().since(startUse), err
}

// claimingStore returns a store of e's outbox that leases every
// partition, as one relay process alone does, for claims made in a loop
// rather than by a relay (which renews the lease every second).
func claimingStore(ctx context.Context, e *env, cfg store.Config) (*store.Store, error) {
	cfg.Schema, cfg.Claimer, cfg.ClaimLease = e.schema, "bench", 24*time.Hour
	st, err := store.New(e.relayPool, cfg)
	if err != nil {
		return nil, err
	}
	return st, st.SyncPartitions(ctx)
}

func claimAndAck(ctx context.Context, st *store.Store, limit int, done *atomic.Int64) (time.Duration, error) {
	start := time.Now()
	c, err := st.Claim(ctx, store.ClaimParams{Limit: limit, PayloadCap: 1 << 20})
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	outcomes := make([]store.Outcome, len(c.Records))
	for i, rec := range c.Records {
		outcomes[i] = store.Outcome{ID: rec.ID, Kind: store.Sent}
	}
	if err := c.Complete(ctx, outcomes); err != nil {
		return 0, err
	}
	done.Add(int64(len(outcomes)))
	return took, nil
}
