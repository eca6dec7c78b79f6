package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/syncbuf"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// syncBuffer is a buffer safe for a process's output and the test.
type syncBuffer = syncbuf.Buffer

// relayProcess is "outbox-relay run" as a subprocess.
type relayProcess struct {
	cmd    *exec.Cmd
	output *syncBuffer
	done   chan struct{}
	err    error
}

// spawnRelay starts the relay; the test kills it at the latest when it
// ends. Safe to call from any goroutine.
func spawnRelay(t *testing.T, env []string) (*relayProcess, error) {
	p := &relayProcess{output: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(binary, "run")
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p, nil
}

func startRelay(t *testing.T, env []string) *relayProcess {
	t.Helper()
	p, err := spawnRelay(t, env)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *relayProcess) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("relay did not exit within %s; output:\n%s", timeout, p.output)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *relayProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// migrated returns a fresh database with the outbox in public, and a pool.
func migrated(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	if r := runBinary(t, []string{"OUTBOX_DATABASE_URL=" + dsn}, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: %s", r.stderr)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return dsn, pool
}

func relayEnv(dsn string, c *kfake.Cluster, extra ...string) []string {
	return append([]string{
		"OUTBOX_DATABASE_URL=" + dsn,
		"OUTBOX_KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ","),
		"OUTBOX_RELAY_POLL_INTERVAL=50ms",
		"OUTBOX_ADMIN_LISTEN=127.0.0.1:0",
		"OUTBOX_LOG_LEVEL=info",
	}, extra...)
}

func TestRunDeliversAndStopsCleanlyOnSIGTERM(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	c := kafkatest.NewCluster(t, []string{"orders"})
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
		SELECT 'orders', 'k' || (g % 50), g::text::bytea FROM generate_series(1, 2000) g`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, relayEnv(dsn, c))
	testwait.Within(t, 60*time.Second, "the backlog to drain", func() bool { return countRows(t, pool, "true") == 0 })

	// New rows arrive while it runs, and are woken up for.
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('orders', 'k1', 'late')`); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, 30*time.Second, "the late row", func() bool { return countRows(t, pool, "true") == 0 })

	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0; output:\n%s", code, p.output)
	}
	if out := p.output.String(); !strings.Contains(out, "relay stopped") {
		t.Fatalf("no clean stop in the log:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got := kafkatest.ConsumeAll(ctx, t, c, "orders"); len(got) != 2001 {
		t.Fatalf("%d messages in Kafka, want 2001", len(got))
	}
}

// The relay and the dlq commands start only on a schema they can run on:
// not an older one, not a newer one that says it no longer works with them,
// and a newer compatible one (a rolling upgrade migrates first) is fine.
func TestRunChecksTheSchemaVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	need := migrations.Version
	c := kafkatest.NewCluster(t, []string{"upgrade"})

	t.Run("none", func(t *testing.T) {
		t.Parallel()
		dsn := pgtest.NewDatabase(t)
		for _, args := range [][]string{{"run"}, {"dlq", "list"}} {
			r := runBinary(t, relayEnv(dsn, c), args...)
			want := fmt.Sprintf("schema public has no outbox-relay migrations (found version 0, need %d): run 'outbox-relay migrate up'", need)
			if r.code != 2 || !strings.Contains(r.stderr, want) {
				t.Fatalf("%v: code %d, stderr: %s", args, r.code, r.stderr)
			}
			onlyTheGate(t, r)
		}
		// Nothing was created or written: no table at all.
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var tables int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil || tables != 0 {
			t.Fatalf("%d tables in the empty database after run (%v), want none", tables, err)
		}
	})
	t.Run("older", func(t *testing.T) {
		t.Parallel()
		dsn, pool := migrated(t)
		if _, err := pool.Exec(ctx, `DELETE FROM outbox_relay_migrations WHERE version_id = $1`, need); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"run"}, {"dlq", "list"}} {
			r := runBinary(t, relayEnv(dsn, c), args...)
			want := fmt.Sprintf("schema public is at version %d, need %d: run 'outbox-relay migrate up'", need-1, need)
			if r.code != 2 || !strings.Contains(r.stderr, want) {
				t.Fatalf("%v: code %d, stderr: %s", args, r.code, r.stderr)
			}
		}
	})
	t.Run("newer", func(t *testing.T) {
		t.Parallel()
		dsn, pool := migrated(t)
		// A later migration that only adds: this relay goes on.
		if _, err := pool.Exec(ctx, `INSERT INTO outbox_relay_migrations (version_id, is_applied) VALUES ($1, true)`, need+1); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (topic, payload) VALUES ('upgrade', 'x')`); err != nil {
			t.Fatal(err)
		}
		p := startRelay(t, relayEnv(dsn, c))
		testwait.Within(t, 30*time.Second, "the row delivered", func() bool { return countRows(t, pool, "true") == 0 })
		p.signal(t, syscall.SIGTERM)
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("exit code %d, output:\n%s", code, p.output)
		}
		if !strings.Contains(p.output.String(), "the schema is newer than this relay and compatible with it") {
			t.Fatalf("no compatibility line in the log:\n%s", p.output)
		}
		if r := runBinary(t, relayEnv(dsn, c), "dlq", "list"); r.code != 0 {
			t.Fatalf("dlq list: code %d, stderr: %s", r.code, r.stderr)
		}

		// A later migration that changes what this relay uses.
		if _, err := pool.Exec(ctx, `UPDATE outbox_relay_schema SET compatible_from = $1`, need+1); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `DELETE FROM outbox_fleet_replicas; DELETE FROM outbox_claimers;
			UPDATE outbox_claim_partitions SET owner = NULL, expires_at = NULL`); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"run"}, {"dlq", "list"}} {
			r := runBinary(t, relayEnv(dsn, c), args...)
			want := fmt.Sprintf("schema public is at version %d, which needs a relay of version %d or later; this relay is version %d: upgrade the relay", need+1, need+1, need)
			if r.code != 2 || !strings.Contains(r.stderr, want) {
				t.Fatalf("%v: code %d, stderr: %s", args, r.code, r.stderr)
			}
			onlyTheGate(t, r)
		}
		// The tables a newer schema may have changed were not touched:
		// the relay that ran before left them as they are now.
		var written int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_fleet_replicas) + (SELECT count(*) FROM outbox_claimers)
			+ (SELECT count(*) FROM outbox_claim_partitions WHERE owner IS NOT NULL)`).Scan(&written); err != nil || written != 0 {
			t.Fatalf("%d rows in the fleet's and the claimers' tables after the refused run (%v), want none", written, err)
		}
	})
}

// onlyTheGate checks that a run refused by the schema gate said nothing
// but why: it listened, joined and logged nothing first.
func onlyTheGate(t *testing.T, r result) {
	t.Helper()
	if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 {
		t.Errorf("the schema gate's line is not the only output:\n%s", r.stderr)
	}
}

func TestRunStrictOrderChecksTheTable(t *testing.T) {
	t.Parallel()
	dsn, pool := migrated(t)
	if _, err := pool.Exec(context.Background(), `DROP TRIGGER outbox_xid_first ON outbox`); err != nil {
		t.Fatal(err)
	}
	c := kafkatest.NewCluster(t, nil)
	r := runBinary(t, relayEnv(dsn, c, "OUTBOX_RELAY_STRICT_ORDER=true"), "run")
	if r.code != 1 || !strings.Contains(r.stderr, "strict order cannot work on public.outbox: trigger outbox_xid_first is missing") ||
		!strings.Contains(r.stderr, "run 'outbox-relay migrate up'") {
		t.Fatalf("code %d, stderr: %s", r.code, r.stderr)
	}
}

func TestRunReportsEveryConfigurationProblem(t *testing.T) {
	t.Parallel()
	r := runBinary(t, []string{
		"OUTBOX_DATABASE_URL=postgres://localhost/db",
		"OUTBOX_RELAY_WORKERS=0",
		"OUTBOX_RELAY_ON_DEAD_LETTER=ignore",
		"OUTBOX_RETRY_STRATEGY=random",
		"OUTBOX_KAFKA_SASL_MECHANISM=kerberos",
	}, "run")
	if r.code != 2 {
		t.Fatalf("exit code %d, want 2; stderr: %s", r.code, r.stderr)
	}
	for _, want := range []string{"kafka.brokers is required", "relay.workers", "relay.on_dead_letter", "retry.strategy", "kafka.sasl.mechanism", "kafka.sasl needs username and password"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not mention %q:\n%s", want, r.stderr)
		}
	}
}

// A Jepsen-style check of the delivery contract: concurrent producers (some
// rolling back), three relays SIGKILLed and restarted at random moments, a
// broker failing produce requests now and then, rows of three topics on two
// destinations (events and changes on one, audit on the other).
// Afterwards every committed row was delivered, no rolled-back row was,
// the rows of each key reached the brokers first in id order within the
// order scope (the key's rows of a destination, of a topic, or all of
// them), and nothing is left pending.
//
// By default per-key order needs producers to serialise a key's writes,
// and they lock each key they write, as an application locking the
// aggregate it changes does.
func TestKillRestartChecker(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	checkKillRestart(t, false, "destination", 20_000)
}

// With strict order, producers write keys from concurrent transactions
// without locking them, and the check is the same.
func TestKillRestartCheckerStrictOrder(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	checkKillRestart(t, true, "destination", 20_000)
}

// Order per topic, and order across every destination: smaller runs, one
// after the other.
func TestKillRestartCheckerScopes(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	for _, c := range []struct {
		scope  string
		strict bool
	}{{"topic", false}, {"global", false}} {
		t.Run(fmt.Sprintf("%s, strict %v", c.scope, c.strict), func(t *testing.T) {
			checkKillRestart(t, c.strict, c.scope, 8_000)
		})
	}
}

// checkerTopics are the checker's topics, and the destination of each.
var checkerTopics = map[string]string{"events": "kafka", "changes": "kafka", "audit": "audit"}

// Capture from the write-ahead log: producers write with outbox_emit,
// one relay at a time streams from the slot and the others stand by,
// messages that fail wait in the table, and every relay is killed again
// and again. The order checked is the producers' commit order of each
// key (a sequence taken under the key's lock), since a message read
// again after a restart is delivered under a new id.
func TestKillRestartCheckerLog(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	checkKillRestartIn(t, false, "destination", 10_000, relay.CaptureLog)
}

// checkKillRestart runs the checker in an order scope until producers
// have committed rows rows.
func checkKillRestart(t *testing.T, strict bool, scope string, rows int64) {
	checkKillRestartIn(t, strict, scope, rows, relay.CaptureTable)
}

// checkKillRestartIn is checkKillRestart with the outbox's capture.
func checkKillRestartIn(t *testing.T, strict bool, scope string, rows int64, capture string) {
	const (
		relays   = 3
		minKills = 3
	)
	dsn, pool := migrated(t)
	emit := capture == relay.CaptureLog
	if emit {
		captureLog(t, dsn, pool)
		if _, err := pool.Exec(context.Background(), "CREATE SEQUENCE checker_order"); err != nil {
			t.Fatal(err)
		}
	}
	c := kafkatest.NewCluster(t, []string{"events", "changes", "audit"}, kfake.DefaultNumPartitions(6))
	var produceRequests atomic.Int64
	c.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: -1,
		When: func(kmsg.Request) bool { return produceRequests.Add(1)%13 == 0 },
	})
	// The order in which rows reach the brokers, across topics and
	// destinations: a row's first arrival is its first delivery.
	var arrivedMu sync.Mutex
	var arrived []arrival
	firstArrival := map[string]bool{}
	kafkatest.WatchProduce(c, func(topic string, _ int32, rec *kmsg.Record) {
		a := arrival{key: string(rec.Key), topic: topic, at: time.Now()}
		first := ""
		for _, h := range rec.Headers {
			switch {
			case h.Key == kafka.HeaderID && !emit:
				id, err := strconv.ParseInt(string(h.Value), 10, 64)
				if err != nil {
					return
				}
				a.id, first = id, string(h.Value)
			case h.Key == kafka.HeaderEventID && emit:
				// The producers' order: the key's sequence, then the
				// message's place in its transaction.
				seq, i, _ := strings.Cut(string(rec.Value), "/")
				n, err1 := strconv.ParseInt(seq, 10, 64)
				m, err2 := strconv.ParseInt(i, 10, 64)
				if err1 != nil || err2 != nil {
					return
				}
				a.id, first = n*100+m, string(h.Value)
			}
		}
		if first == "" {
			return
		}
		arrivedMu.Lock()
		if !firstArrival[first] {
			firstArrival[first] = true
			arrived = append(arrived, a)
		}
		arrivedMu.Unlock()
	})
	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
destinations:
  audit:
    kafka:
      brokers: [%s]
routes:
  - {topics: [events, changes], destination: kafka}
  - {topics: [audit], destination: audit}
`, strings.Join(c.ListenAddrs(), ", "))), 0o600); err != nil {
		t.Fatal(err)
	}
	env := relayEnv(dsn, c, append(slices.Clone(checkerSettings),
		"OUTBOX_CONFIG="+cfgFile,
		"OUTBOX_RELAY_WORKERS=2",
		"OUTBOX_RELAY_STRICT_ORDER="+strconv.FormatBool(strict),
		"OUTBOX_RELAY_ORDER_SCOPE="+scope,
		"OUTBOX_RELAY_CAPTURE="+capture,
	)...)

	book := newLedger()
	book.emit = emit
	producing := produceChecked(t, pool, book, strict, rows, []string{"events", "changes", "audit"})

	// Chaos: each relay is SIGKILLed at a random moment and restarted,
	// until the producers are done and every relay died minKills times.
	kills := killAtRandom(t, env, relays, minKills, producing)
	if t.Failed() {
		return
	}

	if emit {
		// Everything written is in the log before this position: drained
		// once the slot has confirmed it and the table is empty.
		var end string
		if err := pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
			t.Fatal(err)
		}
		drainCalmlyUntil(t, env, relays, func() bool {
			var done bool
			err := pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = outbox_capture_slot()`,
				end).Scan(&done)
			if err != nil {
				t.Fatal(err)
			}
			return done && countRows(t, pool, "true") == 0
		})
	} else {
		drainCalmly(t, env, relays, pool)
	}

	// Check.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var recs []kafkatest.Record
	for topic := range checkerTopics {
		recs = append(recs, kafkatest.ConsumeAll(ctx, t, c, topic)...)
	}
	delivered := map[uuid.UUID]int{}
	for _, r := range recs {
		id, err := uuid.Parse(r.Headers[kafka.HeaderEventID])
		if err != nil {
			t.Fatalf("message without a valid event id: %v", r.Headers)
		}
		delivered[id]++
	}
	arrivedMu.Lock()
	checkScopeOrder(t, arrived, scope)
	arrivedMu.Unlock()
	book.check(t, delivered)
	duplicates := 0
	for _, n := range delivered {
		duplicates += n - 1
	}
	if n := countRows(t, pool, "true"); n != 0 {
		t.Errorf("%d rows left in the outbox", n)
	}
	t.Logf("%d committed rows, %d rolled back, %d messages, %d duplicates (%.2f%%), kills per relay %v, produce requests %d (every 13th failed)",
		len(book.committed), len(book.rolledBack), len(recs), duplicates, 100*float64(duplicates)/float64(len(book.committed)), kills, produceRequests.Load())
	if int64(len(book.committed)) < rows {
		t.Errorf("only %d committed rows, want at least %d", len(book.committed), rows)
	}
	for i, k := range kills {
		if k < minKills {
			t.Errorf("relay %d was killed %d times, want at least %d", i, k, minKills)
		}
	}
}

// produceChecked runs the checker's producers until they have committed
// rows rows over topics, and returns a channel closed when they are done.
// Producers write transactions of 1-20 rows over random keys, 10% rolled
// back; without strict order they lock their keys first.
func produceChecked(t *testing.T, pool *pgxpool.Pool, book *ledger, strict bool, rows int64, topics []string) <-chan struct{} {
	const (
		keys      = 200
		producers = 4
	)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		written atomic.Int64
		prodWG  sync.WaitGroup
	)
	for w := range producers {
		prodWG.Add(1)
		go func() {
			defer prodWG.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			ctx := context.Background()
			for written.Load() < rows {
				n := 1 + rng.IntN(20)
				msgs := make([]outbox.Message, n)
				keySet := map[string]bool{}
				for i := range msgs {
					k := "key-" + strconv.Itoa(rng.IntN(keys))
					keySet[k] = true
					msgs[i] = outbox.Message{Topic: topics[rng.IntN(len(topics))], Key: k, Payload: []byte(strconv.Itoa(i))}
				}
				sorted := make([]string, 0, len(keySet))
				for k := range keySet {
					sorted = append(sorted, k)
				}
				sort.Strings(sorted)
				rollback := rng.IntN(10) == 0
				err := book.write(ctx, pool, producer, msgs, rollback, func(tx pgx.Tx) error {
					for _, k := range sorted {
						if strict {
							break
						}
						if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", k); err != nil {
							return err
						}
					}
					if book.emit {
						// Under the keys' locks: the keys' commit order.
						var seq int64
						if err := tx.QueryRow(ctx, "SELECT nextval('checker_order')").Scan(&seq); err != nil {
							return err
						}
						for i := range msgs {
							msgs[i].Payload = []byte(fmt.Sprintf("%d/%d", seq, i))
						}
					}
					return nil
				})
				if err != nil {
					t.Errorf("producer: %v", err)
					return
				}
				if !rollback {
					written.Add(int64(n))
				}
			}
		}()
	}
	producing := make(chan struct{})
	go func() { prodWG.Wait(); close(producing) }()
	return producing
}

// arrival is a row's first arrival at a broker.
type arrival struct {
	id         int64 // its row id; in capture from the log, its place in the producers' order
	key, topic string
	at         time.Time
}

// checkScopeOrder checks that the rows of each key reached the brokers
// first in id order within their order scope.
func checkScopeOrder(t *testing.T, arrived []arrival, scope string) {
	t.Helper()
	last := map[string]int64{}       // key in its scope → the id of its latest first arrival
	firsts := map[string][]arrival{} // the first arrivals of each key in its scope, to show around a violation
	for _, a := range arrived {
		k := a.key
		switch scope {
		case "destination":
			k += "/" + checkerTopics[a.topic]
		case "topic":
			k += "/" + a.topic
		}
		firsts[k] = append(firsts[k], a)
		if a.id < last[k] {
			f := firsts[k]
			var seen []string
			for _, b := range f[max(0, len(f)-8):] {
				seen = append(seen, fmt.Sprintf("%d@%s %s", b.id, b.topic, b.at.Format("15:04:05.000")))
			}
			t.Errorf("key %s: row %d first delivered after row %d; its first deliveries up to here (row@topic time): %v", k, a.id, last[k], seen)
		}
		last[k] = max(last[k], a.id)
	}
}

// checkerSettings are the kill-and-restart checker's relay settings:
// small batches, short backoffs and pauses, every row retried until
// delivered.
var checkerSettings = []string{
	"OUTBOX_RELAY_BATCH_SIZE=200",
	"OUTBOX_RELAY_PUBLISH_TIMEOUT=5s",
	"OUTBOX_RETRY_BASE_DELAY=5ms",
	"OUTBOX_RETRY_MAX_DELAY=100ms",
	"OUTBOX_RETRY_MAX_ATTEMPTS=10000",
	"OUTBOX_RETRY_PAUSE_BASE=20ms",
	"OUTBOX_RETRY_PAUSE_MAX=200ms",
	"OUTBOX_LOG_LEVEL=warn",
}

// drainCalmly is the checker's calm after the chaos: fresh relays with
// env drain what is left, then stop cleanly on SIGTERM.
func drainCalmly(t *testing.T, env []string, relays int, pool *pgxpool.Pool) {
	t.Helper()
	drainCalmlyUntil(t, env, relays, func() bool { return countRows(t, pool, "true") == 0 })
}

// drainCalmlyUntil is drainCalmly until drained says all is delivered.
func drainCalmlyUntil(t *testing.T, env []string, relays int, drained func() bool) {
	t.Helper()
	var final []*relayProcess
	for range relays {
		p := startRelay(t, append(env, "OUTBOX_LOG_LEVEL=info"))
		final = append(final, p)
		testwait.Within(t, time.Minute, "a relay to start", func() bool { return strings.Contains(p.output.String(), "relay started") })
	}
	// A key's rows alternating two topics of one destination move a row a
	// batch; on a loaded machine the drain takes minutes.
	testwait.Within(t, 4*time.Minute, "the outbox to drain", drained)
	for _, p := range final {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range final {
		if code := p.wait(t, time.Minute); code != 0 {
			t.Errorf("relay exit code %d after SIGTERM; output:\n%s", code, p.output)
		}
	}
}

// killAtRandom runs relays relay processes with env, SIGKILLs each at a
// random moment and starts it again, until producing is closed and each
// was killed at least minKills times. It returns the kills per relay.
func killAtRandom(t *testing.T, env []string, relays, minKills int, producing <-chan struct{}) []int {
	var wg sync.WaitGroup
	kills := make([]int, relays)
	for i := range relays {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for {
				p, err := spawnRelay(t, env)
				if err != nil {
					t.Errorf("start relay %d: %v", i, err)
					return
				}
				lifetime := time.Duration(150+rng.IntN(1000)) * time.Millisecond
				select {
				case <-p.done:
					t.Errorf("relay %d exited by itself: %v\n%s", i, p.err, p.output)
					return
				case <-time.After(lifetime):
				}
				if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Errorf("kill relay %d: %v", i, err)
					return
				}
				<-p.done
				kills[i]++
				select {
				case <-producing:
					if kills[i] >= minKills {
						return
					}
				default:
				}
			}
		})
	}
	wg.Wait()
	return kills
}

var errRollback = fmt.Errorf("rolled back on purpose")

// ledger records what producers wrote: the rows of transactions that
// committed, and of those rolled back on purpose (errRollback). A
// transaction that failed otherwise, such as a commit cut by a crash, has
// an unknown outcome: its rows are left out.
type ledger struct {
	mu                    sync.Mutex
	committed, rolledBack map[uuid.UUID]bool
	// emit writes into the write-ahead log (capture: log).
	emit bool
}

func newLedger() *ledger {
	return &ledger{committed: map[uuid.UUID]bool{}, rolledBack: map[uuid.UUID]bool{}}
}

// write writes msgs in one transaction, after first (if not nil), and
// commits it or rolls it back; it records the rows by how the transaction
// ended and returns its error, nil when it was rolled back on purpose.
func (l *ledger) write(ctx context.Context, pool *pgxpool.Pool, p *outbox.Producer, msgs []outbox.Message, rollback bool, first func(pgx.Tx) error) error {
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if first != nil {
			if err := first(tx); err != nil {
				return err
			}
		}
		var err error
		write := p.Write
		if l.emit {
			write = func(ctx context.Context, tx outbox.DB, msgs ...outbox.Message) ([]uuid.UUID, error) {
				return p.Emit(ctx, tx, msgs...)
			}
		}
		if ids, err = write(ctx, tx, msgs...); err != nil {
			return err
		}
		if rollback {
			return errRollback
		}
		return nil
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		switch {
		case err == nil:
			l.committed[id] = true
		case errors.Is(err, errRollback):
			l.rolledBack[id] = true
		}
	}
	if errors.Is(err, errRollback) {
		return nil
	}
	return err
}

// check fails the test for committed rows never delivered and for
// rolled-back rows delivered, given how often each event was delivered.
// committedCount is the number of rows committed so far.
func (l *ledger) committedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.committed)
}

func (l *ledger) check(t *testing.T, delivered map[uuid.UUID]int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	missing, phantom := 0, 0
	for id := range l.committed {
		if delivered[id] == 0 {
			missing++
		}
	}
	for id := range l.rolledBack {
		if delivered[id] > 0 {
			phantom++
		}
	}
	if missing > 0 || phantom > 0 {
		t.Errorf("%d committed rows never delivered, %d rolled-back rows delivered", missing, phantom)
	}
}

// captureLog sets the outbox of dsn up for capture from the log with the
// binary, as an operator would, and drops its slot when the test ends
// (a slot outlives the relays and holds the server's log).
func captureLog(t *testing.T, dsn string, pool *pgxpool.Pool) {
	t.Helper()
	var level string
	if err := pool.QueryRow(context.Background(), "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Skipf("the server runs with wal_level %s; capture from the log needs logical", level)
	}
	r := runBinary(t, []string{"OUTBOX_DATABASE_URL=" + dsn, "OUTBOX_RELAY_CAPTURE=log"}, "capture", "setup")
	if r.code != 0 {
		t.Fatalf("capture setup: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		testwait.For(t, "the slot to be free", func() bool {
			var active bool
			err := pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = outbox_capture_slot()").Scan(&active)
			return errors.Is(err, pgx.ErrNoRows) || (err == nil && !active)
		})
		if _, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = outbox_capture_slot()"); err != nil {
			t.Errorf("drop slot: %v", err)
		}
	})
}
