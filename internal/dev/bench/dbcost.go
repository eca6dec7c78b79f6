package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// What the database spends for the relay, read from pg_stat_statements and
// from the server's processes in /proc. Both need the benchmark to run on
// the database's machine (the throwaway cluster does) and, for the
// statements, the extension: without them the figures are left out and the
// notes say so.

// dbCost is what the database had spent at one moment.
type dbCost struct {
	// statements: ok when pg_stat_statements answered.
	statements bool
	// The claim statements (those that lock with SKIP LOCKED), and every
	// statement naming the schema: what the relay runs on its tables.
	claimCalls, claimBuffers int64
	claimTime                time.Duration
	calls, buffers           int64
	time                     time.Duration
	// byQuery is each of those statements' calls and buffers, by queryid.
	byQuery map[int64]statement
	// cpu: ok when /proc showed the server's processes.
	cpu bool
	// relayBackends is the CPU time of each server process serving a
	// relay (application_name outbox-relay), by pid; cluster the CPU time
	// of the whole server, exited processes included.
	relayBackends map[int]time.Duration
	// senders are those of relayBackends that stream the log.
	senders map[int]bool
	cluster time.Duration
	// vacuum: ok when the outbox table's statistics answered; the times
	// autovacuum has run on it, and its size with its indexes.
	vacuum      bool
	autovacuums int64
	tableBytes  int64
}

// statementsReady creates pg_stat_statements where the server loads it;
// it reports whether the statements can be read.
func statementsReady(ctx context.Context, pool *pgxpool.Pool) bool {
	_, _ = pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	var n int64
	return pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n) == nil
}

// readCost reads what the database has spent on the relay's statements on
// schema, and its processes' CPU time.
func readCost(ctx context.Context, pool *pgxpool.Pool, schema string) dbCost {
	var c dbCost
	var claimMS, allMS float64
	err := pool.QueryRow(ctx, `SELECT
    coalesce(sum(calls) FILTER (WHERE query LIKE '%SKIP LOCKED%'), 0)::bigint,
    coalesce(sum(shared_blks_hit + shared_blks_read) FILTER (WHERE query LIKE '%SKIP LOCKED%'), 0)::bigint,
    coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '%SKIP LOCKED%'), 0)::float8,
    coalesce(sum(calls), 0)::bigint, coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint,
    coalesce(sum(total_exec_time), 0)::float8
FROM pg_stat_statements WHERE query LIKE '%"' || $1 || '".%'`, schema).Scan(
		&c.claimCalls, &c.claimBuffers, &claimMS, &c.calls, &c.buffers, &allMS)
	if err == nil {
		c.statements = true
		c.claimTime = time.Duration(claimMS * float64(time.Millisecond))
		c.time = time.Duration(allMS * float64(time.Millisecond))
		c.byQuery = readStatements(ctx, pool, schema)
	}
	c.vacuum = pool.QueryRow(ctx, `SELECT autovacuum_count, pg_total_relation_size(relid) FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname = 'outbox'`, schema).Scan(&c.autovacuums, &c.tableBytes) == nil
	var self int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&self); err != nil {
		return c
	}
	postmaster, ok := parentOf(self)
	if !ok {
		return c
	}
	// The relay's connections, its stream from a replication slot too.
	rows, err := pool.Query(ctx, `SELECT pid, backend_type = 'walsender' FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay%'`)
	if err != nil {
		return c
	}
	c.relayBackends, c.senders = map[int]time.Duration{}, map[int]bool{}
	for rows.Next() {
		var pid int
		var sender bool
		if rows.Scan(&pid, &sender) == nil {
			if t, ok := processCPU(pid); ok {
				c.relayBackends[pid] = t
				c.senders[pid] = sender
			}
		}
	}
	rows.Close()
	c.cluster, c.cpu = clusterCPU(postmaster)
	return c
}

// statement is what pg_stat_statements counts of one statement.
type statement struct {
	query          string
	calls, buffers int64
	time           time.Duration
}

// readStatements reads the calls and buffers of each statement naming
// schema, nil when they cannot be read.
func readStatements(ctx context.Context, pool *pgxpool.Pool, schema string) map[int64]statement {
	rows, err := pool.Query(ctx, `SELECT queryid, query, calls, shared_blks_hit + shared_blks_read, total_exec_time
FROM pg_stat_statements WHERE query LIKE '%"' || $1 || '".%' AND queryid IS NOT NULL`, schema)
	if err != nil {
		return nil
	}
	defer rows.Close()
	out := map[int64]statement{}
	for rows.Next() {
		var id int64
		var st statement
		var ms float64
		if rows.Scan(&id, &st.query, &st.calls, &st.buffers, &ms) == nil {
			st.query = label(st.query, schema)
			st.time = time.Duration(ms * float64(time.Millisecond))
			// One text can have several ids (one per user or database).
			prev := out[id]
			st.calls += prev.calls
			st.buffers += prev.buffers
			st.time += prev.time
			out[id] = st
		}
	}
	return out
}

// label shortens a statement's text to a name a reader can place: its
// first words, whitespace collapsed, without the schema.
func label(query, schema string) string {
	q := strings.Join(strings.Fields(strings.ReplaceAll(query, `"`+schema+`".`, "")), " ")
	if r := []rune(q); len(r) > 60 {
		q = string(r[:60]) + "…"
	}
	return q
}

// spent is what the database spent from c to later.
type spent struct {
	statements             bool
	claims, claimBuffers   int64
	claimTime              time.Duration
	calls, buffers         int64
	time                   time.Duration
	byQuery                []statement // by buffers, the most first
	cpu                    bool
	relayBackends, cluster time.Duration
	// senders is what the relay's backends that stream the log (WAL
	// senders, which decode it) spent of relayBackends.
	senders time.Duration
	// vacuum: autovacuum's runs on the outbox table meanwhile, and the
	// table's size with its indexes at the end.
	vacuum      bool
	autovacuums int64
	tableBytes  int64
}

func (c dbCost) until(later dbCost) spent {
	s := spent{statements: c.statements && later.statements, cpu: c.cpu && later.cpu, vacuum: c.vacuum && later.vacuum}
	if s.vacuum {
		s.autovacuums, s.tableBytes = later.autovacuums-c.autovacuums, later.tableBytes
	}
	if s.statements {
		s.claims, s.claimBuffers = later.claimCalls-c.claimCalls, later.claimBuffers-c.claimBuffers
		s.claimTime = later.claimTime - c.claimTime
		s.calls, s.buffers, s.time = later.calls-c.calls, later.buffers-c.buffers, later.time-c.time
		for id, st := range later.byQuery {
			st.calls -= c.byQuery[id].calls
			st.buffers -= c.byQuery[id].buffers
			st.time -= c.byQuery[id].time
			if st.calls > 0 {
				s.byQuery = append(s.byQuery, st)
			}
		}
		slices.SortFunc(s.byQuery, func(a, b statement) int { return cmp.Compare(b.buffers, a.buffers) })
	}
	if s.cpu {
		for pid, t := range later.relayBackends {
			// A backend that started since counts whole.
			s.relayBackends += t - c.relayBackends[pid]
			if later.senders[pid] {
				s.senders += t - c.relayBackends[pid]
			}
		}
		s.cluster = later.cluster - c.cluster
	}
	return s
}

// perRow describes s per delivered row.
func (s spent) perRow(rows int64) string {
	if rows <= 0 {
		return "no rows"
	}
	var parts []string
	if s.statements {
		parts = append(parts, fmt.Sprintf("database per row: %.1f buffers, %.1f µs of statements", float64(s.buffers)/float64(rows), us(s.time)/float64(rows)))
	} else {
		parts = append(parts, "no pg_stat_statements")
	}
	if s.cpu {
		parts = append(parts, fmt.Sprintf("%.1f µs CPU in the relay's backends, %.1f µs in all of PostgreSQL", us(s.relayBackends)/float64(rows), us(s.cluster)/float64(rows)))
		if s.senders > 0 {
			parts = append(parts, fmt.Sprintf("of the relay's backends, the log's sender %.1f µs", us(s.senders)/float64(rows)))
		}
	}
	if s.vacuum {
		parts = append(parts, fmt.Sprintf("the outbox autovacuumed %d times, %.0f MB with its indexes", s.autovacuums, float64(s.tableBytes)/(1<<20)))
	}
	return strings.Join(parts, "; ")
}

// statementsNote names the n statements that read the most buffers in s,
// with their buffers per delivered row (when rows were) and per call.
func (s spent) statementsNote(rows int64, n int) string {
	if !s.statements || len(s.byQuery) == 0 {
		return ""
	}
	var parts []string
	for _, st := range s.byQuery[:min(n, len(s.byQuery))] {
		perCall := fmt.Sprintf("%.0f a call (%d calls, %.1f ms): %s", float64(st.buffers)/float64(st.calls), st.calls, ms(st.time), st.query)
		if rows > 0 {
			perCall = fmt.Sprintf("%.2f a row, %s", float64(st.buffers)/float64(rows), perCall)
		}
		parts = append(parts, perCall)
	}
	return "buffers by statement: " + strings.Join(parts, " | ")
}

// claimsNote describes the claims in s.
func (s spent) claimsNote() string {
	if !s.statements {
		return "no pg_stat_statements"
	}
	if s.claims == 0 {
		return "no claims"
	}
	return fmt.Sprintf("%d claims, %.0f buffers and %.2f ms each", s.claims, float64(s.claimBuffers)/float64(s.claims), ms(s.claimTime)/float64(s.claims))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// clockTicks is the unit of CPU times in /proc (USER_HZ, 100 on Linux).
const clockTicks = 100

// statFields returns the fields of /proc/<pid>/stat after the command
// name: the process's state first.
func statFields(pid int) ([]string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	f := strings.Fields(s[i+1:])
	return f, len(f) > 14
}

func ticks(f []string, i int) time.Duration {
	n, _ := strconv.ParseInt(f[i], 10, 64)
	return time.Duration(n) * time.Second / clockTicks
}

// processCPU is a process's CPU time, user and system.
func processCPU(pid int) (time.Duration, bool) {
	f, ok := statFields(pid)
	if !ok {
		return 0, false
	}
	return ticks(f, 11) + ticks(f, 12), true
}

func parentOf(pid int) (int, bool) {
	f, ok := statFields(pid)
	if !ok {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// clusterCPU is the CPU time of a server: its postmaster's, its exited
// processes' (counted by the postmaster as children waited for) and its
// running processes'.
func clusterCPU(postmaster int) (time.Duration, bool) {
	f, ok := statFields(postmaster)
	if !ok {
		return 0, false
	}
	total := ticks(f, 11) + ticks(f, 12) + ticks(f, 13) + ticks(f, 14)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := statFields(pid); ok && f[1] == strconv.Itoa(postmaster) {
			total += ticks(f, 11) + ticks(f, 12)
		}
	}
	return total, true
}
