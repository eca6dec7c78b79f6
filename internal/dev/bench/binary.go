package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// users measures what users run: the outbox-relay binary with its
// default configuration, against the raw claim+delete SQL on the same
// table in the same run (the table's physical limit, see rawCeiling).
//
// Each backlog size, key distribution and write-back mode is a series
// (see userSeries): the bare SQL on n connections and n processes drain
// in alternating pairs, on a fresh table each, so that a change in the
// machine's speed weighs on both sides alike; with 10k keys, n is one,
// two and four. A delete-on-send series ends with the order ceiling: the
// relay's own claim, with its per-key order check, and write-back through
// the library on one connection, without publishing, whose distance to
// the raw ceiling is the cost of order. Peak resident memory is the
// largest process's.
//
// The LargeRows backlog is drained once, by one process, with 10k keys:
// it is compared with the smallest backlog's drain, the same but for its
// size, rather than with a ceiling of its own, which would need a second
// fill as long as the drain.
func (r *runner) users(ctx context.Context) error {
	if len(r.cfg.UserRows) == 0 {
		return nil
	}
	bin, cleanup, err := r.binary(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	var smallest float64 // the first backlog's 10k-keys drain by one process
	for _, rows := range r.cfg.UserRows {
		for _, dist := range distributions {
			for _, keep := range []bool{false, true} {
				procs := []int{1}
				if dist.name == "10k keys" && !keep {
					procs = []int{1, 2, 4}
				}
				if keep && dist.name != "10k keys" {
					continue
				}
				got, err := r.userSeries(ctx, bin, rows, dist.expr, dist.name, keep, procs)
				if err != nil {
					return err
				}
				if smallest == 0 && dist.name == "10k keys" && !keep && len(got) > 0 {
					smallest = got[0]
				}
			}
		}
	}
	if r.cfg.LargeRows == 0 {
		return nil
	}
	name := fmt.Sprintf("%s rows, 10k keys, delete-on-send, 1 process", count(r.cfg.LargeRows))
	if !strings.Contains(name, r.cfg.Match) {
		return nil
	}
	d, err := r.binaryDrain(ctx, bin, r.cfg.LargeRows, distributions[0].expr, false, 1)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	detail := fmt.Sprintf("peak RSS %.0f MB; %s", float64(d.rss)/(1<<20), d.spent.perRow(int64(r.cfg.LargeRows)))
	if smallest > 0 {
		detail = fmt.Sprintf("%.0f%% of the %s-row drain; %s", 100*d.rate/smallest, count(r.cfg.UserRows[0]), detail)
	}
	r.add(Result{Group: "binary", Name: name, Value: d.rate, Unit: "rows/s", Detail: detail})
	return nil
}

// userSeries measures one series of users against the bare SQL, as
// DESIGN.md has it: for each n of procs, in rounds, a pair — the bare claim
// and delete (or mark) on n connections, then n processes of the binary,
// each on a backlog of its own — alternating, so that a noisy stretch
// falls on both. Each figure is the median over the rounds: rows/s, and
// per delivered row what all of PostgreSQL spent (CPU), and the buffers
// and statement time of the statements on the outbox. The relay's best
// rows/s is judged against the bare SQL's best over the connection
// counts, and its costs with n processes against the bare SQL's on n
// connections. Delete-on-send series then report the order ceiling, the
// relay's own claim on one connection: the cost of order. It returns the
// relay's median rows/s for each n.
func (r *runner) userSeries(ctx context.Context, bin string, rows int, keyExpr, keys string, keep bool, procs []int) ([]float64, error) {
	mode := "delete-on-send"
	if keep {
		mode = "mark-sent"
	}
	series := fmt.Sprintf("%s rows, %s, %s", count(rows), keys, mode)
	names := make([]string, len(procs))
	matched := false
	for i, n := range procs {
		names[i] = fmt.Sprintf("%s, %d process", series, n)
		if n > 1 {
			names[i] += "es"
		}
		matched = matched || strings.Contains(names[i], r.cfg.Match)
	}
	if !matched {
		return nil, nil
	}
	rounds := max(r.cfg.BinaryRounds, 1)
	bare := make([][]sample, len(procs))
	relays := make([][]sample, len(procs))
	for range rounds {
		for i, n := range procs {
			rate, sp, err := r.rawCeiling(ctx, rows, keyExpr, keep, n)
			if err != nil {
				return nil, fmt.Errorf("%s: bare SQL on %s: %w", series, connections(n), err)
			}
			bare[i] = append(bare[i], sample{rate: rate, spent: sp, rows: rows})
			d, err := r.binaryDrain(ctx, bin, rows, keyExpr, keep, n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", names[i], err)
			}
			relays[i] = append(relays[i], sample{rate: d.rate, spent: d.spent, rows: rows, rss: d.rss})
		}
	}
	bareAt := make([]samples, len(procs))
	relayAt := make([]samples, len(procs))
	best, bestAt := 0.0, 0
	for i, n := range procs {
		bareAt[i], relayAt[i] = medians(bare[i]), medians(relays[i])
		if bareAt[i].rate > best {
			best, bestAt = bareAt[i].rate, n
		}
		r.add(Result{Group: "raw ceiling", Name: fmt.Sprintf("%s, %s", series, connections(n)), Value: bareAt[i].rate, Unit: "rows/s",
			Detail: fmt.Sprintf("median of %s; %s", list(bareAt[i].rates), bareAt[i].perRow())})
	}
	rates := make([]float64, len(procs))
	for i, n := range procs {
		got := relayAt[i]
		rates[i] = got.rate
		detail := fmt.Sprintf("median of %s; %.0f%% of the bare SQL's best (%.1fk rows/s on %s)", list(got.rates), 100*got.rate/best, best/1000, connections(bestAt))
		if i > 0 {
			detail += fmt.Sprintf(", %.2f× one process", got.rate/rates[0])
		}
		detail += fmt.Sprintf("; against the bare SQL on %s: %s; %s; peak RSS %.0f MB", connections(n), got.against(bareAt[i]), got.perRow(), float64(got.rss)/(1<<20))
		if note := got.typical.spent.statementsNote(int64(got.typical.rows), 6); note != "" {
			detail += "; in the median drain, " + note
		}
		r.add(Result{Group: "binary", Name: names[i], Value: got.rate, Unit: "rows/s", Detail: detail})
	}
	if keep {
		return rates, nil
	}
	order, err := r.orderCeiling(ctx, rows, keyExpr)
	if err != nil {
		return nil, fmt.Errorf("%s: order ceiling: %w", series, err)
	}
	r.add(Result{Group: "order ceiling", Name: series, Value: order, Unit: "rows/s",
		Detail: fmt.Sprintf("%.0f%% of the bare SQL on one connection: the relay's claim, key check and write-back, batch %d, one connection", 100*order/bareAt[0].rate, relay.DefaultBatchSize)})
	return rates, nil
}

// sample is one drain of rows: its rows/s and what the database spent.
type sample struct {
	rate  float64
	spent spent
	rows  int
	rss   int64
}

// samples are the medians of several drains: rows/s, and per row the
// CPU of all of PostgreSQL, buffers and statement time, in µs.
type samples struct {
	rates              []float64
	rate               float64
	cpu, buffers, stmt float64
	cpuOK, statements  bool
	rss                int64
	// typical is the drain whose rows/s is nearest the median: its statements
	// show where the database's time goes.
	typical sample
}

func medians(ss []sample) samples {
	var m samples
	var cpu, buffers, stmt []float64
	m.cpuOK, m.statements = true, true
	for _, s := range ss {
		m.rates = append(m.rates, s.rate)
		n := float64(max(s.rows, 1))
		cpu = append(cpu, us(s.spent.cluster)/n)
		buffers = append(buffers, float64(s.spent.buffers)/n)
		stmt = append(stmt, us(s.spent.time)/n)
		m.cpuOK = m.cpuOK && s.spent.cpu
		m.statements = m.statements && s.spent.statements
		m.rss = max(m.rss, s.rss)
	}
	m.rate, m.cpu, m.buffers, m.stmt = median(m.rates), median(cpu), median(buffers), median(stmt)
	for i, s := range ss {
		if i == 0 || math.Abs(s.rate-m.rate) < math.Abs(m.typical.rate-m.rate) {
			m.typical = s
		}
	}
	return m
}

// perRow says what the database spent per delivered row.
func (m samples) perRow() string {
	var parts []string
	if m.cpuOK {
		parts = append(parts, fmt.Sprintf("%.1f µs CPU in all of PostgreSQL", m.cpu))
	}
	if m.statements {
		parts = append(parts, fmt.Sprintf("%.1f buffers, %.1f µs of statements", m.buffers, m.stmt))
	} else {
		parts = append(parts, "no pg_stat_statements")
	}
	return "per row: " + strings.Join(parts, ", ")
}

// against compares m's costs per row with base's.
func (m samples) against(base samples) string {
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f×", a/b)
	}
	var parts []string
	if m.cpuOK && base.cpuOK {
		parts = append(parts, "server CPU "+ratio(m.cpu, base.cpu))
	}
	if m.statements && base.statements {
		parts = append(parts, "buffers "+ratio(m.buffers, base.buffers), "statement time "+ratio(m.stmt, base.stmt))
	}
	if len(parts) == 0 {
		return "no costs to compare"
	}
	return strings.Join(parts, ", ")
}

// connections names n connections.
func connections(n int) string {
	if n == 1 {
		return "1 connection"
	}
	return fmt.Sprintf("%d connections", n)
}

// orderCeiling drains a backlog of rows with the relay's own claim (with
// its per-key order check) and delete, through the library, on one
// connection, at the relay's default batch size: the raw ceiling plus
// what keeping order costs the database.
func (r *runner) orderCeiling(ctx context.Context, rows int, keyExpr string) (float64, error) {
	e, err := r.filled(ctx, rows, keyExpr, 2)
	if err != nil {
		return 0, err
	}
	defer e.close()
	st, err := claimingStore(ctx, e, store.Config{})
	if err != nil {
		return 0, err
	}
	var done atomic.Int64
	start := time.Now()
	for done.Load() < int64(rows) {
		if _, err := claimAndAck(ctx, st, relay.DefaultBatchSize, &done); err != nil {
			return 0, err
		}
	}
	return float64(rows) / time.Since(start).Seconds(), nil
}

// filled returns a fresh environment with a backlog of rows, and conns
// connections for the relay (at least two).
func (r *runner) filled(ctx context.Context, rows int, keyExpr string, conns int) (*env, error) {
	e, err := r.newEnv(ctx, int32(max(2, conns)))
	if err != nil {
		return nil, err
	}
	if err := r.fill(ctx, e, rows, keyExpr); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
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

// rawCeiling drains a backlog of rows with the bare claim and delete
// (or, keep, the mark as sent) on conns connections at once, each with
// synchronous_commit off as the relay's: select what a relay reads of a
// batch of 1000 ready rows in id order, locking them (skipping the rows
// another connection holds), then delete them by id, and commit. No key
// order, no publish. It returns rows/s and what the database spent.
func (r *runner) rawCeiling(ctx context.Context, rows int, keyExpr string, keep bool, conns int) (rate float64, sp spent, err error) {
	e, err := r.filled(ctx, rows, keyExpr, conns)
	if err != nil {
		return 0, spent{}, err
	}
	defer e.close()
	// The table by its schema, as the relay names it: what the
	// statements cost is read by the schema's name.
	table := pgx.Identifier{e.schema, "outbox"}.Sanitize()
	claim := `SELECT id, event_id, topic, key, payload, headers, created_at, retry_count
		FROM ` + table + ` WHERE status = 'pending' AND next_attempt_at <= now()
		ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED`
	write := "DELETE FROM " + table + " WHERE id = ANY($1)"
	if keep {
		write = "UPDATE " + table + " SET status = 'sent', sent_at = now() WHERE id = ANY($1)"
	}
	held := make([]*pgxpool.Conn, conns)
	for i := range held {
		if held[i], err = e.relayPool.Acquire(ctx); err != nil {
			return 0, spent{}, err
		}
		defer held[i].Release()
	}
	statementsReady(ctx, e.pool)
	before := readCost(ctx, e.pool, e.schema)
	var done atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	for _, conn := range held {
		g.Go(func() error {
			for done.Load() < int64(rows) {
				var ids []int64
				err := pgx.BeginFunc(gctx, conn, func(tx pgx.Tx) error {
					rs, err := tx.Query(gctx, claim)
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
					_, err = tx.Exec(gctx, write, ids)
					return err
				})
				if err != nil {
					return err
				}
				if len(ids) == 0 && conns == 1 {
					return fmt.Errorf("the claim found nothing after %d of %d rows", done.Load(), rows)
				}
				done.Add(int64(len(ids)))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, spent{}, err
	}
	rate = float64(rows) / time.Since(start).Seconds()
	return rate, before.until(readCost(ctx, e.pool, e.schema)), nil
}

// binaryDrain fills a backlog of rows and times procs outbox-relay run
// processes with the default configuration (but, keep, for a sent
// retention of an hour) delivering it, from the first
// process's start of delivery to an empty table. It returns rows/s and
// the largest peak resident memory of the processes.
func (r *runner) binaryDrain(ctx context.Context, bin string, rows int, keyExpr string, keep bool, procs int) (drained, error) {
	e, err := r.filled(ctx, rows, keyExpr, 2)
	if err != nil {
		return drained{}, err
	}
	defer e.close()
	statementsReady(ctx, e.pool)
	before := readCost(ctx, e.pool, e.schema)
	relays, err := startRelays(ctx, bin, r.relayEnv(e, keep), procs)
	if err != nil {
		return drained{}, err
	}
	defer relays.stop()
	start := relays.started
	// Looked at every 20ms, through the pending rows' index: often
	// enough for a drain of seconds, seldom enough to cost it nothing.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(30 * time.Minute)
	for {
		var left bool
		if err := e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox WHERE status = 'pending')").Scan(&left); err != nil {
			return drained{}, err
		}
		if !left {
			break
		}
		if time.Now().After(deadline) {
			return drained{}, errors.New("the backlog did not drain in 30 minutes")
		}
		select {
		case <-ctx.Done():
			return drained{}, ctx.Err()
		case <-tick.C:
		}
	}
	elapsed := time.Since(start)
	d := drained{rate: float64(rows) / elapsed.Seconds(), spent: before.until(readCost(ctx, e.pool, e.schema))}
	for _, c := range relays.cmds {
		d.rss = max(d.rss, peakRSS(c.Process.Pid))
	}
	if err := relays.stop(); err != nil {
		return drained{}, err
	}
	return d, nil
}

// drained is what a drain by the binary measured.
type drained struct {
	rate  float64 // rows/s
	rss   int64   // the largest process's peak resident memory
	spent spent   // the database's work for the relay (its backends: until the drain's end)
}

// relayEnv is the environment of outbox-relay run on e's outbox, with its
// default configuration (but, keep, a sent retention of an hour).
func (r *runner) relayEnv(e *env, keep bool) []string {
	env := append(os.Environ(),
		"OUTBOX_DATABASE_URL="+r.cfg.URL,
		"OUTBOX_DATABASE_SCHEMA="+e.schema,
		"OUTBOX_KAFKA_BROKERS="+strings.Join(e.cluster.ListenAddrs(), ","),
		"OUTBOX_ADMIN_LISTEN=127.0.0.1:0",
		"OUTBOX_LOG_LEVEL=info",
	)
	if keep {
		env = append(env, "OUTBOX_RELAY_SENT_RETENTION=1h")
	}
	return env
}

// relays are outbox-relay run processes.
type relays struct {
	cmds []*exec.Cmd
	// started is when the first of them logged that it started.
	started time.Time
	// warned counts the warnings and errors they logged, by message.
	mu     sync.Mutex
	warned map[string]int
	last   string // the last line a process logged, for errors
}

// warnings describes the warnings and errors the relays logged, the most
// frequent first; "" for none.
func (rs *relays) warnings() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	msgs := make([]string, 0, len(rs.warned))
	for m := range rs.warned {
		msgs = append(msgs, m)
	}
	sort.Slice(msgs, func(i, j int) bool { return rs.warned[msgs[i]] > rs.warned[msgs[j]] })
	var parts []string
	for _, m := range msgs[:min(len(msgs), 3)] {
		parts = append(parts, fmt.Sprintf("%d× %s", rs.warned[m], m))
	}
	return strings.Join(parts, "; ")
}

// logMessage is a log line's level and message, from the text format.
var logMessage = regexp.MustCompile(`level=(WARN|ERROR) msg="((?:[^"\\]|\\.)*)"`)

// startRelays starts procs outbox-relay run processes with env, and
// waits for the first to start delivering.
func startRelays(ctx context.Context, bin string, env []string, procs int) (*relays, error) {
	rs := &relays{warned: map[string]int{}}
	started := make(chan time.Time, procs)
	for range procs {
		c := exec.Command(bin, "run")
		c.Env = env
		stderr, err := c.StderrPipe()
		if err != nil {
			rs.kill()
			return nil, err
		}
		if err := c.Start(); err != nil {
			rs.kill()
			return nil, err
		}
		rs.cmds = append(rs.cmds, c)
		go func() {
			sc := bufio.NewScanner(stderr)
			sent := false
			for sc.Scan() {
				rs.mu.Lock()
				rs.last = sc.Text()
				rs.mu.Unlock()
				if !sent && strings.Contains(sc.Text(), `msg="relay started"`) {
					started <- time.Now()
					sent = true
				}
				if m := logMessage.FindStringSubmatch(sc.Text()); m != nil {
					rs.mu.Lock()
					rs.warned[m[1]+" "+m[2]]++
					rs.mu.Unlock()
				}
			}
		}()
	}
	select {
	case rs.started = <-started:
		return rs, nil
	case <-time.After(time.Minute):
		rs.kill()
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return nil, fmt.Errorf("the relay did not start within a minute; its last line: %s", rs.last)
	case <-ctx.Done():
		rs.kill()
		return nil, ctx.Err()
	}
}

// stop stops the processes with SIGTERM and waits for them; a second call
// does nothing.
func (rs *relays) stop() error {
	for _, c := range rs.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	var errs []error
	for _, c := range rs.cmds {
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("outbox-relay run: %w", err))
		}
	}
	rs.cmds = nil
	return errors.Join(errs...)
}

func (rs *relays) kill() {
	for _, c := range rs.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	rs.cmds = nil
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
