package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
)

// orderScopeFault is a failure of the Kafka destination, or of a part of
// it, while every key also has rows for a healthy webhook.
type orderScopeFault struct {
	name string
	// lasts is how long the fault lasts, traffic flowing throughout.
	lasts time.Duration
	// orders is the orders topic's max.message.bytes ("" for the
	// default).
	maxBytes string
	// poison makes one orders row one the broker refuses, for good.
	poison bool
}

// Keys shared by a Kafka destination (topics orders and payments) and a
// webhook (topic notifications): each transaction writes one row of a key
// to each. With order kept per destination, a fault of Kafka (its broker
// down, a topic paused, a key parked by a dead letter) holds back none of
// the webhook's rows, and Kafka's rows go in per-key order once it is
// healed; with order kept per topic, not even the other topic of the
// failing destination is held back by a paused one; with global order,
// the webhook's rows of the keys wait for Kafka's, as they always did.
func TestOrderScopeKeepsOtherDestinationsFlowing(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	brokerDown := orderScopeFault{name: "broker down", lasts: 30 * time.Second}
	pausedTopic := orderScopeFault{name: "paused topic", lasts: 10 * time.Second}
	parkedKey := orderScopeFault{name: "parked key", lasts: 5 * time.Second, maxBytes: "2000", poison: true}
	// Two runs at a time: each offers traffic throughout and measures the
	// webhook's latency, which the others' load must not decide.
	runs := make(chan struct{}, 2)
	for _, f := range []orderScopeFault{brokerDown, pausedTopic, parkedKey} {
		scopes := []string{relay.OrderScopeDestination, relay.OrderScopeGlobal}
		if f.name == "paused topic" {
			scopes = append(scopes, relay.OrderScopeTopic)
		}
		for _, scope := range scopes {
			t.Run(f.name+", "+scope, func(t *testing.T) {
				t.Parallel()
				runs <- struct{}{}
				defer func() { <-runs }()
				orderScopeRun(t, f, scope)
			})
		}
	}
}

func orderScopeRun(t *testing.T, f orderScopeFault, scope string) {
	ctx := context.Background()
	s := pgtest.NewSchema(t).WithConns(t, 8)
	c := kafkatest.NewCluster(t, nil)
	orderCfg := map[string]string{}
	if f.maxBytes != "" {
		orderCfg["max.message.bytes"] = f.maxBytes
	}
	if err := c.CreateTopic("orders", 3, orderCfg); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic("payments", 3, nil); err != nil {
		t.Fatal(err)
	}
	hook := newReceiver(t, http.StatusServiceUnavailable)
	var startFault, stopFault func()
	switch f.name {
	case "broker down":
		startFault, stopFault, _ = droppedConnections(c, "")
	case "paused topic":
		startFault, stopFault, _ = produceFault(kerr.TopicAuthorizationFailed)(c, "orders")
	default:
		startFault, stopFault = func() {}, func() {}
	}
	obs := &settled{}
	dests, routes := kafkaAndHook(t, c, hook)
	h := start(t, s, nil, options{claimer: "relay", policy: outagePolicy, cfg: relay.Config{
		Destinations: dests,
		Routes:       routes,
		OrderScope:   scope,
		Observer:     obs,
		Pause:        relay.PauseConfig{Base: outageCool, Max: outageCoolMax},
	}})

	// Two seconds of health, the fault, and two seconds once healed. In
	// global scope a key whose rows alternate between the destinations
	// moves one row per batch (docs/ordering.md), so the keys are many
	// and their backlogs short: the drain after the fault takes a few
	// batches, not one per row a key wrote during it.
	const keys = 1000
	const poisoned = 300 // the transaction whose orders row is refused
	rows := 0
	began := time.Now()
	var faulty atomic.Bool
	var paymentsStuck int // payments rows pending as the paused topic heals
	healed := began.Add(2*time.Second + f.lasts)
	produce(t, s, f.lasts+4*time.Second, func(n int) string {
		k := fmt.Sprintf("k%d", n%keys)
		order := fmt.Sprintf("'%s:%d'", k, n)
		if f.poison && n == poisoned {
			order = "repeat('x', 5000)::bytea" // refused by the broker: dead-lettered, parking its key in Kafka's scope
		}
		rows++
		q := fmt.Sprintf(`INSERT INTO outbox (topic, key, payload) VALUES
    ('orders', '%[1]s', %[2]s), ('notifications', '%[1]s', '%[1]s:%[3]d')`, k, order, n)
		if f.name == "paused topic" {
			q += fmt.Sprintf(`, ('payments', '%[1]s', '%[1]s:%[2]d')`, k, n)
		}
		return q
	}, func() {
		switch since := time.Since(began); {
		case since > 2*time.Second && since < 2*time.Second+f.lasts && !faulty.Load():
			faulty.Store(true)
			startFault()
		case since >= 2*time.Second+f.lasts && faulty.Load():
			if f.name == "paused topic" {
				paymentsStuck = count(t, s.Pool, "topic = 'payments' AND status = 'pending' AND created_at < now() - interval '3 seconds'")
			}
			faulty.Store(false)
			stopFault()
			healed = time.Now()
		}
	})
	if faulty.Load() {
		stopFault()
	}
	parked := 0 // rows held back behind the parked key
	if f.poison {
		testwait.For(t, "the refused row dead-lettered", func() bool {
			return count(t, s.Pool, "status = 'dead_lettered' AND key_parked") == 1
		})
		testwait.For(t, "every row but those behind the parked key settled", func() bool {
			return count(t, s.Pool, "status = 'pending' AND parked_behind IS NULL") == 0
		})
		parked = count(t, s.Pool, "status = 'pending'")
	} else {
		testwait.State(t, testwait.DefaultTimeout, func() (bool, string) {
			if count(t, s.Pool, "status = 'pending'") == 0 {
				return true, ""
			}
			return false, "timed out waiting for every row delivered; pending: " + pendingRows(t, s)
		})
	}
	h.stop()

	// Through the fault: the rows committed until it ended. Once it ends,
	// the failing destination's backlog shares the next batches with the
	// webhook's rows.
	p99, delivered := obs.p99Between("hook", began, healed)
	all, _ := obs.p99("hook")
	t.Logf("%s, %s scope: webhook p99 commit to ack %s over %d rows until the fault ended, %s over all; %d rows parked; %d payments rows stuck as the fault ended",
		f.name, scope, p99, delivered, all, parked, paymentsStuck)
	hookParked := count(t, s.Pool, "topic = 'notifications' AND status = 'pending'")
	// Held back, the webhook's rows wait for the whole fault: their p99
	// is nearly its length. Not held back, they still slow down as the
	// failing destination's backlog grows: the rows held behind it are
	// claimed and deferred again at each cool-down (docs/ordering.md),
	// about a second by the end of a 10 s pause on two quiet cores, and
	// several on a loaded machine: well under half the fault either way.
	heldBack := f.lasts / 2
	switch scope {
	case relay.OrderScopeGlobal:
		// The webhook's rows wait behind Kafka's: the fault held them.
		if f.poison {
			if hookParked == 0 {
				t.Errorf("no webhook row of the parked key waits behind it: global order lets rows past their key's dead letter")
			}
		} else if p99 < heldBack {
			t.Errorf("webhook p99 %s under a Kafka fault of %s: global order must hold the webhook's rows of the shared keys", p99, f.lasts)
		}
	default:
		if p99 >= heldBack || hookParked != 0 {
			t.Errorf("webhook p99 %s, %d of its rows held back by the parked key: Kafka's fault must not hold back another destination", p99, hookParked)
		}
		checkPayloadOrder(t, "hook", hook.run("hook").delivered(t), rows)
	}
	switch {
	case f.name != "paused topic":
	case scope == relay.OrderScopeTopic && paymentsStuck > 0:
		t.Errorf("%d payments rows still pending as the orders topic's pause ended: order per topic must let them go", paymentsStuck)
	case scope == relay.OrderScopeDestination && paymentsStuck == 0:
		t.Errorf("no payments row waited for the paused orders topic: order per destination keeps the key's rows of both topics in order")
	}
	// Kafka's rows, each topic in per-key order; those of the parked key
	// after its dead letter, and nothing else, still wait.
	topics := []string{"orders"}
	if f.name == "paused topic" {
		topics = append(topics, "payments")
	}
	for _, topic := range topics {
		var got []string
		for _, r := range kafkatest.ConsumeAll(ctx, t, c, topic) {
			got = append(got, string(r.Value))
		}
		want := rows - count(t, s.Pool, "topic = $1 AND status <> 'sent'", topic)
		checkPayloadOrder(t, topic, got, want)
	}
	if f.poison {
		if n := count(t, s.Pool, "status = 'pending' AND key <> $1", fmt.Sprintf("k%d", poisoned%keys)); n != 0 {
			t.Errorf("%d rows of keys other than the parked one still pending", n)
		}
		if n := count(t, s.Pool, "status = 'pending' AND topic <> 'notifications' AND parked_behind IS NULL"); n != 0 {
			t.Errorf("%d Kafka rows pending but not parked", n)
		}
	}
}

// kafkaAndHook are the destinations of the order-scope tests: cluster c
// takes topics orders and payments (a dead letter parks its key there),
// and the webhook hook takes notifications.
func kafkaAndHook(t *testing.T, c *kfake.Cluster, hook *receiver) ([]relay.Destination, []relay.Route) {
	return []relay.Destination{
			{Name: "kafka", Publisher: newKafka(t, c), OnDeadLetter: relay.OnDeadLetterBlock},
			hookDestination(t, "hook", hook.srv.URL),
		}, []relay.Route{
			{Topics: []string{"orders", "payments"}, Destination: "kafka"},
			{Topics: []string{"notifications"}, Destination: "hook"},
		}
}

// pendingRows describes the pending rows, by topic.
func pendingRows(t *testing.T, s *pgtest.Schema) string {
	rows, err := s.Pool.Query(context.Background(), `SELECT topic || ': ' || count(*) || ' (' || count(*) FILTER (WHERE next_attempt_at <> created_at)
    || ' waited; the first due in ' || (min(next_attempt_at) - now()) || ')' FROM outbox WHERE status = 'pending' GROUP BY topic`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(got, "; ")
}

// A topic paused long enough for its keys' rows held behind it to
// outnumber a batch: those rows, deferred to each probe, come due together,
// and claims that took them first left no room for the rows that never
// waited, the probe's among them: the topic never recovered, and neither
// its rows nor the other destinations' new ones were claimed again. Claims
// leave rows that never waited a share, so once the topic heals
// everything drains.
func TestLongPauseLeavesRoomForItsProbes(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	s := pgtest.NewSchema(t).WithConns(t, 8)
	c := kafkatest.NewCluster(t, nil)
	for _, topic := range []string{"orders", "payments"} {
		if err := c.CreateTopic(topic, 3, nil); err != nil {
			t.Fatal(err)
		}
	}
	hook := newReceiver(t, http.StatusServiceUnavailable)
	startFault, stopFault, _ := produceFault(kerr.TopicAuthorizationFailed)(c, "orders")
	const batch = 100
	dests, routes := kafkaAndHook(t, c, hook)
	h := start(t, s, nil, options{claimer: "relay", policy: outagePolicy, cfg: relay.Config{
		Destinations: dests,
		Routes:       routes,
		BatchSize:    batch,
		Pause:        relay.PauseConfig{Base: outageCool, Max: outageCoolMax},
	}})
	startFault()
	// Eight seconds of traffic, and more while fewer than two batches of
	// rows are held behind the paused topic (a loaded machine commits
	// fewer transactions a second).
	offset := 0
	held := func() int {
		return count(t, s.Pool, "topic = 'payments' AND status = 'pending' AND next_attempt_at <> created_at")
	}
	for began := time.Now(); offset == 0 || (held() < 2*batch && time.Since(began) < time.Minute); {
		produce(t, s, 8*time.Second, func(n int) string {
			n += offset
			return fmt.Sprintf(`INSERT INTO outbox (topic, key, payload) VALUES
    ('orders', 'k%[1]d', 'o%[2]d'), ('notifications', 'k%[1]d', 'n%[2]d'), ('payments', 'k%[1]d', 'p%[2]d')`, n%50, n)
		}, nil)
		offset += 100_000
	}
	if n := held(); n < 2*batch {
		t.Fatalf("%d payments rows held behind the paused topic after a minute, fewer than two batches: the test proves nothing", n)
	}
	stopFault()
	testwait.State(t, time.Minute, func() (bool, string) {
		if count(t, s.Pool, "status = 'pending'") == 0 {
			return true, ""
		}
		return false, "rows still pending a minute after the topic healed: " + pendingRows(t, s)
	})
	h.stop()
}
