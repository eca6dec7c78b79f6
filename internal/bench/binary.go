package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// users measures what users run: the outbox-relay binary with its
// default configuration, against the raw claim+delete SQL on the same
// table in the same run (the table's physical limit, see rawCeiling).
// Each backlog and key distribution is drained by one relay process
// between two raw ceilings, on a fresh table each; the 10k-keys backlogs
// are drained by two processes too. It reports the share of the mean of
// the two ceilings and the processes' peak resident memory.
func (r *runner) users(ctx context.Context) error {
	if len(r.cfg.UserRows) == 0 {
		return nil
	}
	bin, cleanup, err := r.binary(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	for _, rows := range r.cfg.UserRows {
		for _, dist := range distributions {
			procs := []int{1}
			if dist.name == "10k keys" {
				procs = append(procs, 2)
			}
			for _, n := range procs {
				name := fmt.Sprintf("%s rows, %s, %d process(es)", count(rows), dist.name, n)
				if !strings.Contains(name, r.cfg.Match) {
					continue
				}
				before, err := r.rawCeiling(ctx, rows, dist.expr)
				if err != nil {
					return fmt.Errorf("%s: raw ceiling: %w", name, err)
				}
				got, rss, err := r.binaryDrain(ctx, bin, rows, dist.expr, n)
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				after, err := r.rawCeiling(ctx, rows, dist.expr)
				if err != nil {
					return fmt.Errorf("%s: raw ceiling: %w", name, err)
				}
				ceiling := (before + after) / 2
				r.add(Result{Group: "raw ceiling", Name: name, Value: ceiling, Unit: "rows/s",
					Detail: fmt.Sprintf("mean of %.0f before and %.0f after the drain", before, after)})
				r.add(Result{Group: "binary", Name: name, Value: got, Unit: "rows/s",
					Detail: fmt.Sprintf("%.0f%% of the raw ceiling; peak RSS %.0f MB", 100*got/ceiling, float64(rss)/(1<<20))})
			}
		}
	}
	return nil
}

// count writes 200000 as 200k and 1000000 as 1M.
func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// binary builds outbox-relay, or returns Config.Binary.
func (r *runner) binary(ctx context.Context) (string, func(), error) {
	if r.cfg.Binary != "" {
		return r.cfg.Binary, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "outbox-relay-bench-")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "outbox-relay")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/outbox-relay/outbox-relay/cmd/outbox-relay").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build outbox-relay: %w: %s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// rawCeiling drains a backlog of rows with the bare claim and delete,
// on one connection with synchronous_commit off as the relay's: select
// what a relay reads of a batch of 1000 ready rows in id order, locking
// them, then delete them by id, and commit. No key order, no publish.
func (r *runner) rawCeiling(ctx context.Context, rows int, keyExpr string) (float64, error) {
	e, err := r.newEnv(ctx, 2)
	if err != nil {
		return 0, err
	}
	defer e.close()
	if err := r.fill(ctx, e, rows, keyExpr); err != nil {
		return 0, err
	}
	conn, err := e.relayPool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	const claim = `SELECT id, event_id, topic, key, payload, headers, created_at, retry_count
		FROM outbox WHERE status = 'pending' AND next_attempt_at <= now()
		ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED`
	start := time.Now()
	done := 0
	for done < rows {
		var ids []int64
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			rs, err := tx.Query(ctx, claim)
			if err != nil {
				return err
			}
			for rs.Next() {
				vals, err := rs.Values()
				if err != nil {
					return err
				}
				ids = append(ids, vals[0].(int64))
			}
			if err := rs.Err(); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "DELETE FROM outbox WHERE id = ANY($1)", ids)
			return err
		})
		if err != nil {
			return 0, err
		}
		if len(ids) == 0 {
			return 0, fmt.Errorf("the claim found nothing after %d of %d rows", done, rows)
		}
		done += len(ids)
	}
	return float64(rows) / time.Since(start).Seconds(), nil
}

// binaryDrain fills a backlog of rows and times procs outbox-relay run
// processes with the default configuration delivering it, from the first
// process's start of delivery to an empty table. It returns rows/s and
// the largest peak resident memory of the processes.
func (r *runner) binaryDrain(ctx context.Context, bin string, rows int, keyExpr string, procs int) (float64, int64, error) {
	e, err := r.newEnv(ctx, 2)
	if err != nil {
		return 0, 0, err
	}
	defer e.close()
	if err := r.fill(ctx, e, rows, keyExpr); err != nil {
		return 0, 0, err
	}
	env := append(os.Environ(),
		"OUTBOX_DATABASE_URL="+r.cfg.URL,
		"OUTBOX_DATABASE_SCHEMA="+e.schema,
		"OUTBOX_KAFKA_BROKERS="+strings.Join(e.cluster.ListenAddrs(), ","),
		"OUTBOX_ADMIN_LISTEN=127.0.0.1:0",
		"OUTBOX_LOG_LEVEL=info",
	)
	started := make(chan time.Time, procs)
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	for range procs {
		c := exec.Command(bin, "run")
		c.Env = env
		stderr, err := c.StderrPipe()
		if err != nil {
			return 0, 0, err
		}
		if err := c.Start(); err != nil {
			return 0, 0, err
		}
		cmds = append(cmds, c)
		go func() {
			sc := bufio.NewScanner(stderr)
			sent := false
			for sc.Scan() {
				if !sent && strings.Contains(sc.Text(), `msg="relay started"`) {
					started <- time.Now()
					sent = true
				}
			}
		}()
	}
	var start time.Time
	select {
	case start = <-started:
	case <-time.After(time.Minute):
		return 0, 0, errors.New("the relay did not start within a minute")
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	// Looked at every 20ms, through the pending rows' index: often
	// enough for a drain of seconds, seldom enough to cost it nothing.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(30 * time.Minute)
	for {
		var left bool
		if err := e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox WHERE status = 'pending')").Scan(&left); err != nil {
			return 0, 0, err
		}
		if !left {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, errors.New("the backlog did not drain in 30 minutes")
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-tick.C:
		}
	}
	elapsed := time.Since(start)
	var rss int64
	for _, c := range cmds {
		rss = max(rss, peakRSS(c.Process.Pid))
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			return 0, 0, fmt.Errorf("outbox-relay run: %w", err)
		}
	}
	cmds = nil
	return float64(rows) / elapsed.Seconds(), rss, nil
}

// peakRSS reads a process's peak resident memory (VmHWM) in bytes; 0
// where the kernel does not report it.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
