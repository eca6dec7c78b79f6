package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/redis"
	"github.com/outbox-relay/outbox-relay/relay/redis/redistest"
)

// redisConfig routes activity.* to a Redis destination named streams,
// whose entries take up to 64 KiB.
func redisConfig(t *testing.T, addr string) string {
	return writeConfig(t, `
retry:
  pause_base: 50ms
  pause_max: 200ms
destinations:
  streams:
    redis:
      addresses: [`+addr+`]
      max_entry_bytes: 65536
routes:
  - topics: ["activity.*"]
    destination: streams
`)
}

// The binary routes topics to Redis streams from its configuration: 1,000
// rows appended, every key's in order, and a row larger than an entry may
// be dead-lettered too_large beside them.
func TestRunDeliversToRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	dsn, pool := migrated(t)
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload)
SELECT 'activity.click', 'k' || (g % 20), CASE WHEN g = 500 THEN repeat('x', 100000)::bytea ELSE g::text::bytea END
FROM generate_series(1, 1001) g`); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, natsEnv(dsn, redisConfig(t, srv.Addr)))
	testwait.Within(t, 90*time.Second, "every row settled", func() bool { return countRows(t, pool, "status = 'pending'") == 0 })
	if n := countRows(t, pool, "status = 'dead_lettered' AND dead_letter_reason = 'too_large' AND length(payload) = 100000"); n != 1 {
		t.Fatalf("%d rows dead-lettered too_large, want the one too large; output:\n%s", n, p.output)
	}
	if n := countRows(t, pool, "true"); n != 1 {
		t.Fatalf("%d rows left, want only the dead letter", n)
	}
	entries := redistest.Entries(t, srv.Client(nil), "activity.click")
	if len(entries) != 1000 {
		t.Fatalf("the stream holds %d entries, want 1000", len(entries))
	}
	byKey := map[string][]int{}
	for _, e := range entries {
		n, err := strconv.Atoi(e[redis.FieldPayload].(string))
		if err != nil || e[redis.FieldKey] != "k"+strconv.Itoa(n%20) {
			t.Fatalf("entry %v", e)
		}
		byKey[e[redis.FieldKey].(string)] = append(byKey[e[redis.FieldKey].(string)], n)
	}
	inOrder(t, "the stream", byKey)
}

// The server stops while rows arrive, for many failed probes of the
// breaker, then comes back: every row is appended, in order per key, none
// is dead-lettered, and no attempt is counted for the refused connections.
func TestRunRidesOutARedisOutage(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	dsn, pool := migrated(t)
	rows := rideOutOutage(t, pool, natsEnv(dsn, redisConfig(t, srv.Addr)),
		serverOutage{dest: "streams", topic: "activity.click", stop: srv.Stop, start: srv.Restart})
	entries := redistest.Entries(t, srv.Client(nil), "activity.click")
	if len(entries) != rows {
		t.Fatalf("the stream holds %d entries, want %d", len(entries), rows)
	}
	byKey := map[string][]int{}
	for _, e := range entries {
		n, _ := strconv.Atoi(e[redis.FieldPayload].(string))
		byKey[e[redis.FieldKey].(string)] = append(byKey[e[redis.FieldKey].(string)], n)
	}
	inOrder(t, "the stream", byKey)
}

// The kill-and-restart checker against a real redis-server, restarted
// twice meanwhile: every committed row is appended, no rolled-back one,
// each key's rows first in id order; duplicates come only from kills.
func TestKillRestartCheckerRedis(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	const (
		rows     = 8_000
		relays   = 3
		minKills = 3
	)
	srv := redistest.Start(t, redistest.Options{})
	dsn, pool := migrated(t)
	cfg := writeConfig(t, `
destinations:
  streams:
    redis: {addresses: [`+srv.Addr+`]}
routes:
  - {topics: [events, changes, audit], destination: streams}
`)
	env := checkerEnv(dsn, cfg)
	book := newLedger()
	producing := produceChecked(t, pool, book, false, rows, []string{"events", "changes", "audit"})
	restarts := make(chan func(), 2)
	go func() {
		defer close(restarts)
		for _, share := range []int{4, 2} {
			if ok, _ := testwait.Poll(time.Minute, func() (bool, string) { return book.committedCount() > rows/share, "" }); !ok {
				return
			}
			restarts <- srv.Restart
		}
	}()
	// The test's goroutine restarts the server when the producers are a
	// quarter and half way, while the relays are killed at random.
	killed := make(chan []int, 1)
	go func() { killed <- killAtRandom(t, env, relays, minKills, producing) }()
	restarted := 0
	for restart := range restarts {
		restart()
		restarted++
	}
	kills := <-killed
	if restarted != 2 {
		t.Errorf("the server was restarted %d times, want 2", restarted)
	}
	if t.Failed() {
		return
	}
	drainCalmly(t, env, relays, pool)
	// Each stream in its order: consumers read a stream at a time.
	c := srv.Client(nil)
	delivered := map[uuid.UUID]int{}
	var arrived []arrival
	entries := 0
	for _, stream := range []string{"events", "changes", "audit"} {
		for _, e := range redistest.Entries(t, c, stream) {
			entries++
			eid, err := uuid.Parse(e[redis.FieldEventID].(string))
			id, err2 := strconv.ParseInt(e[redis.FieldID].(string), 10, 64)
			if err != nil || err2 != nil {
				t.Fatalf("entry without valid ids: %v", e)
			}
			if delivered[eid] == 0 {
				arrived = append(arrived, arrival{id: id, key: e[redis.FieldKey].(string), topic: stream})
			}
			delivered[eid]++
		}
	}
	checkScopeOrder(t, arrived, "topic")
	book.check(t, delivered)
	t.Logf("%d committed rows, %d entries, %d duplicates from kills, kills per relay %v",
		book.committedCount(), entries, entries-len(delivered), kills)
	for i, k := range kills {
		if k < minKills {
			t.Errorf("relay %d was killed %d times, want at least %d", i, k, minKills)
		}
	}
}
