package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"

	"github.com/outbox-relay/outbox-relay/internal/dev/containertest"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relaycontainer"
)

// The end-to-end scenarios run the relay against a database and a
// Kafka-protocol cluster. TestScenariosLocal runs them on the local harness
// (the binary as a process, a local PostgreSQL and the in-process kfake
// cluster); TestScenariosContainers runs the same scenarios with everything
// in containers built without a registry: the relay's image started through
// the relaycontainer module, PostgreSQL from the distribution's binaries,
// and the broker. `make test` starts a Docker engine for it.

// The delivery headers of the contract, spelled out as a consumer sees them.
const (
	headerEventID = "outbox-event-id"
	headerRowID   = "outbox-id"
)

// stack is where one scenario runs.
type stack struct {
	// dsn connects to a fresh, empty database of the scenario's own.
	dsn string
	// brokers bootstrap a cluster on which the scenario's topics exist.
	brokers []string
	// start runs "outbox-relay run" with env.
	start func(t *testing.T, env []string) relayRun
}

// relayRun is one running relay: a process, or a container.
type relayRun interface {
	// output is what it has logged so far.
	output() string
	// stop sends SIGTERM and fails t unless it drains and exits 0.
	stop(t *testing.T)
	// kill sends SIGKILL and waits for the end.
	kill(t *testing.T)
	// restart runs it again, as it was started, after it ended.
	restart(t *testing.T)
}

// newStack gives a scenario its stack, with the topics it names created.
// Scenarios name unique topics, so that they may share one cluster.
type newStack func(t *testing.T, topics ...string) stack

var scenarios = []struct {
	name string
	run  func(t *testing.T, newStack newStack)
}{
	{"DeliversCommittedRowsOnceInKeyOrder", scenarioDelivery},
	{"DeadLettersUnroutedAndOversizedRows", scenarioDeadLetters},
	{"DrainsOnSIGTERMAndResumes", scenarioRestart},
	{"SurvivesSIGKILLLosingNothing", scenarioKill},
}

func runScenarios(t *testing.T, ns newStack) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t, ns)
		})
	}
}

func TestScenariosLocal(t *testing.T) {
	t.Parallel()
	runScenarios(t, func(t *testing.T, topics ...string) stack {
		// Topics are created as on a real broker, so the local run covers
		// the container run's set-up too.
		c := kafkatest.NewCluster(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := kafkatest.CreateTopics(ctx, c.ListenAddrs(), 3, topics...); err != nil {
			t.Fatal(err)
		}
		return stack{dsn: pgtest.NewDatabase(t), brokers: c.ListenAddrs(), start: startProcess}
	})
}

func TestScenariosContainers(t *testing.T) {
	t.Parallel()
	containertest.Require(t)
	images := containertest.Build(t)
	serverURL := containertest.Postgres(t, images.Postgres)
	brokers := containertest.Kafka(t, images.Kafka)
	t.Logf("the relay (%s), PostgreSQL (%s) and the broker (%s, %s) in containers",
		images.Relay, images.Postgres, images.Kafka, strings.Join(brokers, ","))

	runScenarios(t, func(t *testing.T, topics ...string) stack {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		name := pgtest.UniqueName("scenario")
		dsn, err := pgtest.CreateDatabase(ctx, serverURL, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := pgtest.DropDatabase(context.Background(), serverURL, name); err != nil {
				t.Errorf("drop database %s: %v", name, err)
			}
		})
		if err := kafkatest.CreateTopics(ctx, brokers, 3, topics...); err != nil {
			t.Fatal(err)
		}
		start := func(t *testing.T, env []string) relayRun { return startContainer(t, images.Relay, env) }
		return stack{dsn: dsn, brokers: brokers, start: start}
	})
}

// process is a relay run as a process of the binary under test.
type process struct {
	p   *relayProcess
	env []string
}

func startProcess(t *testing.T, env []string) relayRun {
	return &process{p: startRelay(t, env), env: env}
}

func (p *process) output() string    { return p.p.output.String() }
func (p *process) stop(t *testing.T) { stopRelay(t, p.p) }

func (p *process) kill(t *testing.T) {
	t.Helper()
	p.p.signal(t, syscall.SIGKILL)
	p.p.wait(t, time.Minute)
}

func (p *process) restart(t *testing.T) { p.p = startRelay(t, p.env) }

// box is a relay run as a container of the relay's image, on the host's
// network, through the relaycontainer module.
type box struct {
	c      *relaycontainer.Container
	docker *testcontainers.DockerProvider // to kill it at once
}

// startContainer starts image with env, whose OUTBOX_CONFIG, a file of the
// host, goes into the container.
func startContainer(t *testing.T, image string, env []string) relayRun {
	t.Helper()
	vars := map[string]string{}
	opts := []testcontainers.ContainerCustomizer{relaycontainer.WithHostNetwork()}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "OUTBOX_CONFIG" {
			b, err := os.ReadFile(v)
			if err != nil {
				t.Fatal(err)
			}
			opts = append(opts, relaycontainer.WithConfig(string(b)))
			continue
		}
		vars[k] = v
	}
	opts = append(opts, testcontainers.WithEnv(vars))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := relaycontainer.Run(ctx, image, opts...)
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatal(err)
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &box{c: c, docker: p}
}

func (b *box) output() string {
	out, err := b.c.Output(context.Background())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return out
}

func (b *box) stop(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	timeout := time.Minute
	if err := b.c.Stop(ctx, &timeout); err != nil {
		t.Fatal(err)
	}
	st, err := b.c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.ExitCode != 0 || st.OOMKilled {
		t.Fatalf("exit code %d after SIGTERM, want 0; output:\n%s", st.ExitCode, b.output())
	}
	if out := b.output(); !strings.Contains(out, "relay stopped") {
		t.Fatalf("no clean stop in the log:\n%s", out)
	}
}

func (b *box) kill(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := b.docker.Client().ContainerKill(ctx, b.c.GetContainerID(), "KILL"); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, time.Minute, "the killed container to end", func() bool {
		st, err := b.c.State(ctx)
		return err == nil && !st.Running
	})
}

func (b *box) restart(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.c.Start(ctx); err != nil {
		t.Fatalf("restart the relay's container: %v\n%s", err, b.output())
	}
}

// scenarioDelivery: while the relay runs, a producer commits 2,000 rows
// over 50 keys in transactions of 25 and rolls back every fifth
// transaction. Every committed row arrives exactly once (a clean run has no
// reason for duplicates), in id order per key, with the row's key, payload
// and headers plus the event id and row id; no rolled-back row arrives.
func scenarioDelivery(t *testing.T, newStack newStack) {
	const (
		txs     = 100
		perTx   = 25
		keys    = 50
		rolling = 5 // every rolling-th transaction rolls back
	)
	topic := pgtest.UniqueName("orders")
	st := newStack(t, topic)
	pool := st.migrate(t)
	p := st.start(t, st.relayEnv("OUTBOX_RELAY_BATCH_SIZE=200"))
	testwait.Within(t, time.Minute, "the relay to start", func() bool { return strings.Contains(p.output(), "relay started") })

	ctx := context.Background()
	want := map[string]outboxRow{}
	rolledBack := map[string]bool{}
	for i := range txs {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows := insertRows(t, tx, `INSERT INTO outbox (topic, key, payload, headers)
SELECT $1, 'key-' || (n % $3), n::text::bytea, jsonb_build_object('x-seq', n::text)
FROM generate_series($2::int * $4, $2::int * $4 + $4 - 1) n
RETURNING id, event_id::text, key, payload, headers->>'x-seq'`, topic, i, keys, perTx)
		if i%rolling == rolling-1 {
			for _, r := range rows {
				rolledBack[r.eventID] = true
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			want[r.eventID] = r
		}
	}
	if len(want) != 2000 || len(rolledBack) != 500 {
		t.Fatalf("committed %d rows and rolled back %d, want 2000 and 500", len(want), len(rolledBack))
	}

	testwait.Within(t, 90*time.Second, "the outbox to drain", func() bool { return countRows(t, pool, "true") == 0 })
	p.stop(t)
	recs := st.consume(t, topic)
	checkDelivered(t, recs, want, rolledBack, false)
}

// scenarioDeadLetters: with a route for one topic only and a 4 KiB payload
// cap, a row of another topic is dead-lettered no_route and an oversized
// row too_large, and dlq list shows both; the rows around them, their own
// keys' later rows included, are delivered.
func scenarioDeadLetters(t *testing.T, newStack newStack) {
	topic := pgtest.UniqueName("orders")
	unrouted := topic + ".unrouted"
	st := newStack(t, topic)
	pool := st.migrate(t)

	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte("routes:\n  - topics: [\""+topic+"\"]\n    destination: kafka\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	const insert = `INSERT INTO outbox (topic, key, payload, headers)
SELECT $1, 'k' || (n % 5), n::text::bytea, jsonb_build_object('x-seq', n::text)
FROM generate_series($2::int, $3::int) n
RETURNING id, event_id::text, key, payload, headers->>'x-seq'`
	want := map[string]outboxRow{}
	for _, r := range insertRows(t, pool, insert, topic, 1, 100) {
		want[r.eventID] = r
	}
	noRoute := insertRows(t, pool, `INSERT INTO outbox (topic, key, payload) VALUES ($1, 'k1', 'lost')
RETURNING id, event_id::text, key, payload, ''`, unrouted)[0]
	tooLarge := insertRows(t, pool, `INSERT INTO outbox (topic, key, payload) VALUES ($1, 'k2', convert_to(repeat('x', 5000), 'UTF8'))
RETURNING id, event_id::text, key, payload, ''`, topic)[0]
	for _, r := range insertRows(t, pool, insert, topic, 101, 200) {
		want[r.eventID] = r
	}

	p := st.start(t, st.relayEnv("OUTBOX_CONFIG="+cfgFile, "OUTBOX_RELAY_PAYLOAD_CAP=4096"))
	testwait.Within(t, 90*time.Second, "only the two dead letters to be left", func() bool {
		return countRows(t, pool, "true") == 2 && countRows(t, pool, "status = 'dead_lettered'") == 2
	})
	p.stop(t)

	for _, tc := range []struct {
		row    outboxRow
		reason string
	}{{noRoute, "no_route"}, {tooLarge, "too_large"}} {
		var reason string
		if err := pool.QueryRow(ctx, `SELECT dead_letter_reason FROM outbox WHERE id = $1 AND status = 'dead_lettered'`, tc.row.id).Scan(&reason); err != nil {
			t.Fatalf("row %d is not a dead letter: %v", tc.row.id, err)
		}
		if reason != tc.reason {
			t.Errorf("row %d dead-lettered %s, want %s", tc.row.id, reason, tc.reason)
		}
	}

	type listed struct {
		ID      int64  `json:"id"`
		EventID string `json:"event_id"`
		Topic   string `json:"topic"`
		Reason  string `json:"reason"`
		Bytes   int    `json:"payload_bytes"`
	}
	dlqList := func(args ...string) []listed {
		t.Helper()
		r := runBinary(t, []string{"OUTBOX_DATABASE_URL=" + st.dsn}, append([]string{"dlq", "list", "--json"}, args...)...)
		if r.code != 0 {
			t.Fatalf("dlq list %v: exit %d\n%s", args, r.code, r.stderr)
		}
		var out struct {
			DeadLetters []listed `json:"dead_letters"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatalf("dlq list %v: output is not JSON: %v\n%s", args, err, r.stdout)
		}
		return out.DeadLetters
	}
	got := dlqList()
	sort.Slice(got, func(i, j int) bool { return got[i].ID < got[j].ID })
	wantList := []listed{
		{noRoute.id, noRoute.eventID, unrouted, "no_route", 4},
		{tooLarge.id, tooLarge.eventID, topic, "too_large", 5000},
	}
	if !slices.Equal(got, wantList) {
		t.Errorf("dlq list shows %+v, want %+v", got, wantList)
	}
	if got := dlqList("--reason-code", "too_large"); len(got) != 1 || got[0].ID != tooLarge.id {
		t.Errorf("dlq list --reason-code too_large shows %+v, want row %d only", got, tooLarge.id)
	}

	recs := st.consume(t, topic)
	checkDelivered(t, recs, want, map[string]bool{noRoute.eventID: true, tooLarge.eventID: true}, false)
}

// scenarioRestart: SIGTERM while a backlog drains makes the relay finish
// its in-flight batches and exit 0; rows inserted while it is down wait,
// and a restarted relay delivers them and the rest of the backlog. Nothing
// arrives twice: had the first relay abandoned a published batch instead
// of writing it back, the second would publish it again.
func scenarioRestart(t *testing.T, newStack newStack) {
	topic := pgtest.UniqueName("orders")
	st := newStack(t, topic)
	pool := st.migrate(t)
	env := st.relayEnv("OUTBOX_RELAY_BATCH_SIZE=50", "OUTBOX_RELAY_WORKERS=2")

	const insert = `INSERT INTO outbox (topic, key, payload, headers)
SELECT $1, 'key-' || (n % 30), n::text::bytea, jsonb_build_object('x-seq', n::text)
FROM generate_series($2::int, $3::int) n
RETURNING id, event_id::text, key, payload, headers->>'x-seq'`
	want := map[string]outboxRow{}
	for _, r := range insertRows(t, pool, insert, topic, 1, 1500) {
		want[r.eventID] = r
	}

	p := st.start(t, env)
	testwait.Within(t, time.Minute, "the first deliveries", func() bool { return countRows(t, pool, "true") < 1500 })
	p.stop(t)
	left := countRows(t, pool, "true")
	if n := countRows(t, pool, "status <> 'pending' OR retry_count > 0"); n != 0 {
		t.Fatalf("%d rows were failed, dead-lettered or left claimed by the stopped relay", n)
	}
	t.Logf("SIGTERM left %d of 1500 rows pending", left)

	// While the relay is down: more rows, and a transaction that rolls back.
	for _, r := range insertRows(t, pool, insert, topic, 1501, 2000) {
		want[r.eventID] = r
	}
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rolledBack := map[string]bool{}
	for _, r := range insertRows(t, tx, insert, topic, 2001, 2010) {
		rolledBack[r.eventID] = true
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, "true"); n != left+500 {
		t.Fatalf("%d rows pending while the relay is down, want %d", n, left+500)
	}

	p = st.start(t, env)
	testwait.Within(t, 90*time.Second, "the outbox to drain after the restart", func() bool { return countRows(t, pool, "true") == 0 })
	p.stop(t)
	recs := st.consume(t, topic)
	checkDelivered(t, recs, want, rolledBack, false)
}

// scenarioKill: SIGKILL while a backlog drains; the killed relay is
// restarted (the same container, in containers) while producers commit.
// Every committed row arrives, none rolled back does, each key's rows in id
// order; copies only of the batches in flight at the kill, which the relay
// had published but not yet written back.
func scenarioKill(t *testing.T, newStack newStack) {
	topic := pgtest.UniqueName("orders")
	st := newStack(t, topic)
	pool := st.migrate(t)
	const batch, workers = 50, 2

	const insert = `INSERT INTO outbox (topic, key, payload, headers)
SELECT $1, 'key-' || (n % 40), n::text::bytea, jsonb_build_object('x-seq', n::text)
FROM generate_series($2::int, $3::int) n
RETURNING id, event_id::text, key, payload, headers->>'x-seq'`
	want := map[string]outboxRow{}
	rolledBack := map[string]bool{}
	// produce commits transactions of size rows, rolling back every
	// fourth.
	next := 1
	produce := func(txs, size int) {
		for i := range txs {
			tx, err := pool.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			rows := insertRows(t, tx, insert, topic, next, next+size-1)
			next += size
			if i%4 == 3 {
				for _, r := range rows {
					rolledBack[r.eventID] = true
				}
				if err := tx.Rollback(context.Background()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := tx.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				want[r.eventID] = r
			}
		}
	}
	// A backlog of 15,000 rows: the relay is killed after its first
	// hundred, long before it could be done.
	produce(20, 1000)
	p := st.start(t, st.relayEnv(fmt.Sprintf("OUTBOX_RELAY_BATCH_SIZE=%d", batch), fmt.Sprintf("OUTBOX_RELAY_WORKERS=%d", workers)))
	testwait.Within(t, time.Minute, "the first deliveries", func() bool { return countRows(t, pool, "true") < 14900 })
	p.kill(t)
	left := countRows(t, pool, "true")
	t.Logf("SIGKILL left %d rows pending", left)
	if left == 0 {
		t.Fatal("the relay drained everything before the kill: the scenario proves nothing")
	}
	produce(20, 25) // while it is down

	p.restart(t)
	produce(20, 25) // while it runs again
	testwait.Within(t, 90*time.Second, "the outbox to drain after the restart", func() bool { return countRows(t, pool, "true") == 0 })
	p.stop(t)
	copies := checkDelivered(t, st.consume(t, topic), want, rolledBack, true)
	// A worker publishes one batch at a time (the one it claims ahead
	// waits for it).
	if most := workers * batch; copies > most {
		t.Errorf("%d copies after one kill, want at most the %d rows the workers publish at once", copies, most)
	}
	t.Logf("%d rows delivered, %d copies of rows in flight at the kill", len(want), copies)
}

// outboxRow is what a scenario wrote to the outbox.
type outboxRow struct {
	id      int64
	eventID string
	key     string
	payload []byte
	seq     string // the x-seq header, when the row has one
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// insertRows runs an INSERT ... RETURNING id, event_id, key, payload and
// seq header.
func insertRows(t *testing.T, q querier, sql string, args ...any) []outboxRow {
	t.Helper()
	rows, err := q.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
		var r outboxRow
		var seq *string
		err := row.Scan(&r.id, &r.eventID, &r.key, &r.payload, &seq)
		if seq != nil {
			r.seq = *seq
		}
		return r, err
	})
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return out
}

// migrate runs "outbox-relay migrate up" and returns a pool on the
// database.
func (s stack) migrate(t *testing.T) *pgxpool.Pool {
	t.Helper()
	if r := runBinary(t, []string{"OUTBOX_DATABASE_URL=" + s.dsn}, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: exit %d\n%s", r.code, r.stderr)
	}
	pool, err := pgxpool.New(context.Background(), s.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// relayEnv is the environment of "outbox-relay run" on the stack.
func (s stack) relayEnv(extra ...string) []string {
	return append([]string{
		"OUTBOX_DATABASE_URL=" + s.dsn,
		"OUTBOX_KAFKA_BROKERS=" + strings.Join(s.brokers, ","),
		"OUTBOX_RELAY_POLL_INTERVAL=50ms",
		"OUTBOX_ADMIN_LISTEN=127.0.0.1:0",
		"OUTBOX_LOG_LEVEL=info",
	}, extra...)
}

// consume returns every record the topic holds, duplicates included.
func (s stack) consume(t *testing.T, topic string) []kafkatest.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return kafkatest.ConsumeTopic(ctx, t, s.brokers, topic)
}

// stopRelay sends SIGTERM and expects a clean stop: exit code 0 and the
// relay's last words in the log.
func stopRelay(t *testing.T, p *relayProcess) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, time.Minute); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0; output:\n%s", code, p.output)
	}
	if out := p.output.String(); !strings.Contains(out, "relay stopped") {
		t.Fatalf("no clean stop in the log:\n%s", out)
	}
}

// checkDelivered checks the records of one topic against the rows written:
// each row in want arrived exactly once (at least once with dups) with its
// key, payload, seq header, event id and row id; none in never did; and per
// key, the rows arrived on one partition in id order (with dups: each row's
// first copy). It returns how many copies arrived more than once.
func checkDelivered(t *testing.T, recs []kafkatest.Record, want map[string]outboxRow, never map[string]bool, dups bool) (copies int) {
	t.Helper()
	sort.SliceStable(recs, func(i, j int) bool {
		if recs[i].Partition != recs[j].Partition {
			return recs[i].Partition < recs[j].Partition
		}
		return recs[i].Offset < recs[j].Offset
	})
	seen := map[string]int{}
	lastID := map[string]int64{}
	partition := map[string]int32{}
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 10 {
			t.Errorf(format, args...)
		}
	}
	for _, r := range recs {
		ev := r.Headers[headerEventID]
		seen[ev]++
		w, ok := want[ev]
		switch {
		case never[ev]:
			report("record %d/%d: row %s must never be delivered", r.Partition, r.Offset, r.Headers[headerRowID])
			continue
		case !ok:
			report("record %d/%d: unknown event id %q (headers %v)", r.Partition, r.Offset, ev, r.Headers)
			continue
		case seen[ev] > 1 && dups:
			copies++
			continue
		case seen[ev] > 1:
			report("record %d/%d: row %d delivered %d times", r.Partition, r.Offset, w.id, seen[ev])
			continue
		}
		if id := r.Headers[headerRowID]; id != strconv.FormatInt(w.id, 10) {
			report("record %d/%d: %s %q, want %d", r.Partition, r.Offset, headerRowID, id, w.id)
		}
		if string(r.Key) != w.key || string(r.Value) != string(w.payload) || r.Headers["x-seq"] != w.seq {
			report("record %d/%d: key %q, value %q, x-seq %q; want row %d's %q, %q, %q",
				r.Partition, r.Offset, r.Key, r.Value, r.Headers["x-seq"], w.id, w.key, w.payload, w.seq)
		}
		if p, ok := partition[w.key]; ok && p != r.Partition {
			report("key %s on partitions %d and %d", w.key, p, r.Partition)
		}
		partition[w.key] = r.Partition
		if w.id < lastID[w.key] {
			report("key %s: row %d arrived after row %d", w.key, w.id, lastID[w.key])
		}
		lastID[w.key] = w.id
	}
	missing := 0
	for ev := range want {
		if seen[ev] == 0 {
			missing++
		}
	}
	if missing > 0 || bad > 0 {
		t.Errorf("%d records for %d rows: %d rows missing, %d problems", len(recs), len(want), missing, bad)
	}
	return copies
}
