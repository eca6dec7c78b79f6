package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/fleet"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka/kafkatest"
	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// Outages are run long, with time compressed: retry delays of 50 to
// 200 ms and cool-downs of 50 to 200 ms make a minute's outage hundreds
// of cool-downs, as an afternoon's is at the defaults. The breaker's
// failing_for is compressed as the base delay is (1s to 50ms, so 2s to
// 100ms); max_attempts (25) and max_age are the defaults.
const (
	outageFor     = 60 * time.Second
	outageRate    = 50 // rows a second, one a transaction
	outageKeys    = 20
	outageCool    = 50 * time.Millisecond
	outageCoolMax = 200 * time.Millisecond
)

var outagePolicy = retry.PolicyConfig{BaseDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond}

// outageRun is one destination taken down and healed while keyed traffic
// flows into it.
type outageRun struct {
	name string // the destination's name and its rows' topic
	// topic, when set, is where the route sends the rows instead.
	topic string
	// dest is replica i's destination.
	dest func(t *testing.T, name string, i int) relay.Destination
	// down takes the destination down or heals it.
	down func(bool)
	// reached counts what reached the destination so far, in unit.
	reached func() int
	unit    string
	// bound is the most of unit a second that may reach the destination
	// while it is down: its probes.
	bound float64
	// delivered returns the rows the destination received, as "key:n"
	// payloads in the order it received them, once every row is sent.
	delivered func(t *testing.T) []string
}

// checkOutages runs replicas relays with one destination for each run,
// offers each keyed traffic for a few seconds, takes them all down for
// outageFor, heals them, and checks, destination by destination, that the
// outage cost no row its delivery or more than three attempts, that every
// row went in order per key, and that the probes during the outage
// stayed light. The destinations fail apart, with keys of their own: each
// is a failure scope of its own, so that one run stands for one outage.
func checkOutages(t *testing.T, replicas int, runs ...outageRun) {
	// Connections enough for the relays' claims and the producer.
	s := pgtest.NewSchema(t).WithConns(t, 30)
	var store *fleet.Store
	if replicas > 1 {
		var err error
		if store, err = fleet.New(s.Pool, s.Name); err != nil {
			t.Fatal(err)
		}
	}
	var hs []*harness
	for i := range replicas {
		var cfg relay.Config
		for _, o := range runs {
			d := o.dest(t, o.name, i)
			d.Breaker.FailingFor = 100 * time.Millisecond
			cfg.Destinations = append(cfg.Destinations, d)
			cfg.Routes = append(cfg.Routes, relay.Route{Topics: []string{o.name}, Destination: o.name})
		}
		cfg.Pause = relay.PauseConfig{Base: outageCool, Max: outageCoolMax}
		opts := options{keepSent: true, policy: outagePolicy, listener: true, cfg: cfg}
		if store != nil {
			// Replicas share the destinations' breakers and lease the
			// outbox's partitions, as they do when run.
			name := fmt.Sprintf("r%d", i)
			opts.cfg.Fleet = &relay.FleetConfig{Fleet: store, Replica: name, Interval: 20 * time.Millisecond, Lease: 2 * time.Second}
			opts.claimer = name
		}
		hs = append(hs, start(t, s, nil, opts))
	}

	var n atomic.Int64
	traffic := func(d time.Duration) { offer(t, s, runs, outageKeys, &n, d) }
	traffic(3 * time.Second)
	before := make([]int, len(runs))
	for j, o := range runs {
		o.down(true)
		before[j] = o.reached()
	}
	began := time.Now()
	traffic(outageFor)
	during := make([]int, len(runs))
	for j, o := range runs {
		during[j] = o.reached() - before[j]
	}
	lasted := time.Since(began)
	for _, o := range runs {
		o.down(false)
	}
	traffic(3 * time.Second)
	if ok, _ := testwait.Poll(time.Minute, func() (bool, string) { return count(t, s.Pool, "status <> 'sent'") == 0, "" }); !ok {
		rows, err := s.Pool.Query(context.Background(), `SELECT topic, status, count(*), max(retry_count), min(next_attempt_at - now())
			FROM outbox WHERE status <> 'sent' GROUP BY 1, 2`)
		if err == nil {
			for rows.Next() {
				var topic, status string
				var n, most int
				var due time.Duration
				_ = rows.Scan(&topic, &status, &n, &most, &due)
				t.Logf("%s: %d rows %s, at most %d attempts, the first due in %s", topic, n, status, most, due)
			}
			rows.Close()
		}
		for _, h := range hs {
			t.Logf("stats %+v", h.relay.Stats())
		}
		t.Fatal("timed out waiting for every row delivered after the heal")
	}
	for _, h := range hs {
		h.stop()
	}

	for j, o := range runs {
		rate := float64(during[j]) / lasted.Seconds()
		t.Logf("%s: %d rows; during the %s outage %d %s reached it (%.1f a second, %d rows a second offered)",
			o.name, n.Load(), lasted.Round(time.Second), during[j], o.unit, rate, outageRate)
		if rate > o.bound {
			t.Errorf("%s: %.1f %s a second reached the destination while it was down, want at most %.0f: probes must stay light",
				o.name, rate, o.unit, o.bound)
		}
		if d := count(t, s.Pool, "topic = $1 AND status = 'dead_lettered'", o.name); d != 0 {
			t.Errorf("%s: %d rows dead-lettered by the outage", o.name, d)
		}
		var most, over int
		if err := s.Pool.QueryRow(context.Background(), `SELECT coalesce(max(retry_count), 0), count(*) FILTER (WHERE retry_count > 3)
			FROM outbox WHERE topic = $1`, o.name).Scan(&most, &over); err != nil {
			t.Fatal(err)
		}
		if over > 0 {
			t.Errorf("%s: %d rows counted more than 3 attempts (at most %d): an outage's probes are not the rows' attempts", o.name, over, most)
		}
		checkPayloadOrder(t, o.name, o.delivered(t), int(n.Load()))
	}
}

// offer commits one transaction a tick, outageRate a second, for d, with a
// row for each run over keys keys, its payload "key:n" with n counted in
// n. Each run has
// keys of its own: a key's rows are delivered in order across
// destinations, and one destination's outage would hold back another's
// rows of the same key. It may run off the test's goroutine.
func offer(t *testing.T, s *pgtest.Schema, runs []outageRun, keys int, n *atomic.Int64, d time.Duration) {
	tick := time.NewTicker(time.Second / outageRate)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); {
		<-tick.C
		i := n.Add(1)
		var q strings.Builder
		q.WriteString("INSERT INTO outbox (topic, key, payload) VALUES ")
		for j, o := range runs {
			if j > 0 {
				q.WriteString(", ")
			}
			key := fmt.Sprintf("%s-k%d", o.name, i%int64(keys))
			fmt.Fprintf(&q, "('%s', '%s', '%s:%d')", o.name, key, key, i)
		}
		if _, err := s.Pool.Exec(context.Background(), q.String()); err != nil {
			t.Error(err)
			return
		}
	}
}

// checkPayloadOrder checks that every row, "key:n", was delivered, each
// key's first deliveries in order of n.
func checkPayloadOrder(t *testing.T, dest string, got []string, rows int) {
	t.Helper()
	last := map[string]int{}
	seen := map[int]bool{}
	for _, p := range got {
		key, num, ok := strings.Cut(p, ":")
		i, err := strconv.Atoi(num)
		if !ok || err != nil {
			t.Fatalf("%s: delivered payload %q", dest, p)
		}
		if seen[i] {
			continue // a redelivery
		}
		seen[i] = true
		if i < last[key] {
			t.Fatalf("%s: key %s: row %d delivered first after row %d", dest, key, i, last[key])
		}
		last[key] = i
	}
	if len(seen) != rows {
		t.Errorf("%s received %d distinct rows, want %d", dest, len(seen), rows)
	}
}

// receiver is an HTTP endpoint that answers 204 while up, and while down
// answers with status, or never (status 0) until the client gives up.
type receiver struct {
	srv      *httptest.Server
	status   int
	down     atomic.Bool
	requests atomic.Int64
	mu       sync.Mutex
	got      []string
}

func newReceiver(t *testing.T, status int) *receiver {
	r := &receiver{status: status}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		body := make([]byte, 64)
		n, _ := req.Body.Read(body)
		if r.down.Load() {
			if r.status == 0 {
				<-req.Context().Done()
				return
			}
			http.Error(w, `{"error":"unavailable"}`, r.status)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, string(body[:n]))
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) run(name string) outageRun {
	return outageRun{
		name:    name,
		dest:    func(t *testing.T, name string, _ int) relay.Destination { return hookDestination(t, name, r.srv.URL) },
		down:    r.down.Store,
		reached: func() int { return int(r.requests.Load()) },
		unit:    "requests",
		// One probe of at most eight rows a cool-down, fleet-wide.
		bound: 8 / outageCoolMax.Seconds(),
		delivered: func(*testing.T) []string {
			r.mu.Lock()
			defer r.mu.Unlock()
			return append([]string(nil), r.got...)
		},
	}
}

// Every outage of the table in docs/failures.md, each of its own
// destination, at once: an endpoint answering 503 or 500 to everything or
// never answering, a Kafka cluster answering every produce with
// REQUEST_TIMED_OUT or NOT_LEADER_OR_FOLLOWER, or closing every
// connection.
func TestOutagesCostNoRow(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	checkOutages(t, 1,
		newReceiver(t, http.StatusServiceUnavailable).run("http-503"),
		newReceiver(t, http.StatusInternalServerError).run("http-500"),
		newReceiver(t, 0).run("http-timeout"),
		kafkaRun(t, "kafka-timeout", produceFault(kerr.RequestTimedOut)),
		kafkaRun(t, "kafka-no-leader", produceFault(kerr.NotLeaderForPartition)),
		kafkaRun(t, "kafka-down", droppedConnections),
	)
}

// The same for two replicas sharing the destination's breaker.
func TestOutageCostsNoRowOfAFleet(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	checkOutages(t, 2, newReceiver(t, http.StatusServiceUnavailable).run("http-503"))
}

// kafkaRun is an outage of a cluster of one topic with three partitions,
// made by fault, which counts the produce requests it fails.
func kafkaRun(t *testing.T, name string, fault func(c *kfake.Cluster, topic string) (start func(), stop func(), hits func() int)) outageRun {
	c := kafkatest.NewCluster(t, []string{name})
	startFault, stopFault, hits := fault(c, name)
	return outageRun{
		name: name,
		dest: func(t *testing.T, name string, _ int) relay.Destination {
			return relay.Destination{Name: name, Publisher: newKafka(t, c)}
		},
		down: func(down bool) {
			if down {
				startFault()
			} else {
				stopFault()
			}
		},
		reached: hits,
		unit:    "produce requests",
		// A probe of the destination, or one of each paused partition,
		// a cool-down.
		bound: 3 / outageCoolMax.Seconds(),
		delivered: func(t *testing.T) []string {
			var got []string
			for _, r := range kafkatest.ConsumeAll(context.Background(), t, c, name) {
				got = append(got, string(r.Value))
			}
			return got
		},
	}
}

// produceFault fails every produce request's partitions with err.
func produceFault(err *kerr.Error) func(c *kfake.Cluster, topic string) (func(), func(), func() int) {
	return func(c *kfake.Cluster, topic string) (func(), func(), func() int) {
		var h atomic.Pointer[kfake.FaultHandle]
		var before atomic.Int64
		return func() {
				h.Store(c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: err, Count: -1}))
			}, func() {
				f := h.Swap(nil)
				before.Add(int64(f.Hits()))
				f.Remove()
			}, func() int {
				if f := h.Load(); f != nil {
					return int(before.Load()) + f.Hits()
				}
				return int(before.Load())
			}
	}
}

// droppedConnections is a broker that closes every connection the moment
// a request arrives on it.
func droppedConnections(c *kfake.Cluster, _ string) (func(), func(), func() int) {
	o := kafkatest.NewOutage(c)
	return o.Down, o.Up, o.Produces
}
