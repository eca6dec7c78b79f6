package fleet_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/fleet"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/relay"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.WaitingTests) }

func TestShare(t *testing.T) {
	// Every replica of three wants more: an even split.
	all := func(rank int) fleet.Demand { return fleet.Demand{Wants: true, Wanting: 2, WantingBefore: rank} }
	lends := fleet.Demand{Wanting: 1}
	for _, c := range []struct {
		limit, replicas, rank, others int
		d                             fleet.Demand
		want                          int
	}{
		{limit: 10, replicas: 1, d: fleet.Demand{Wants: true}, want: 10},
		{limit: 10, replicas: 3, rank: 0, d: all(0), want: 4},
		{limit: 10, replicas: 3, rank: 1, d: all(1), want: 3},
		{limit: 10, replicas: 3, rank: 2, d: all(2), want: 3},
		{limit: 10, replicas: 3, rank: 2, others: 8, d: all(2), want: 2}, // only the free slots
		{limit: 10, replicas: 2, rank: 1, others: 10, d: fleet.Demand{Wants: true, Wanting: 1, WantingBefore: 1}, want: 0},
		{limit: 10, replicas: 2, rank: 1, others: 12, d: fleet.Demand{Wants: true, Wanting: 1, WantingBefore: 1}, want: 0}, // over-held after a fallback
		{limit: 2, replicas: 3, rank: 2, d: all(2), want: 0},
		// No one wants: the even split, or what the replica used, of the
		// slots the others do not hold.
		{limit: 10, replicas: 3, rank: 1, want: 3},
		{limit: 10, replicas: 1, want: 10},
		{limit: 3, replicas: 3, rank: 1, others: 1, d: fleet.Demand{Used: 2}, want: 2},
		{limit: 3, replicas: 3, rank: 1, others: 2, d: fleet.Demand{Used: 2}, want: 1},
		// The only one that wants: all the others do not hold.
		{limit: 10, replicas: 3, rank: 2, others: 2, d: fleet.Demand{Wants: true, IdleHeld: 2}, want: 8},
		{limit: 10, replicas: 3, rank: 2, others: 8, d: fleet.Demand{Wants: true, IdleHeld: 8}, want: 2},
		// Two of three want, the third holds one slot: they split nine.
		{limit: 10, replicas: 3, rank: 1, others: 1, d: fleet.Demand{Wants: true, Wanting: 1, WantingBefore: 0, IdleHeld: 1}, want: 5},
		{limit: 10, replicas: 3, rank: 2, others: 1, d: fleet.Demand{Wants: true, Wanting: 1, WantingBefore: 1, IdleHeld: 1}, want: 4},
		// ... but only from the slots the others do not hold yet.
		{limit: 10, replicas: 3, rank: 1, others: 8, d: fleet.Demand{Wants: true, Wanting: 1, WantingBefore: 1, IdleHeld: 1}, want: 2},
		// Wants none while another does: what it used, at most the even
		// split; none when it used none.
		{limit: 10, replicas: 3, rank: 1, d: lends, want: 0},
		{limit: 3, replicas: 3, rank: 1, d: fleet.Demand{Used: 1, Wanting: 2}, want: 1},
		{limit: 3, replicas: 3, rank: 1, d: fleet.Demand{Wanting: 2}, want: 0},
		{limit: 10, replicas: 3, rank: 1, d: fleet.Demand{Used: 2, Wanting: 1}, want: 2},
		{limit: 10, replicas: 3, rank: 1, d: fleet.Demand{Used: 5, Wanting: 1}, want: 3},
		{limit: 10, replicas: 3, rank: 1, others: 10, d: lends, want: 0},
	} {
		if got := fleet.Share(c.limit, c.replicas, c.rank, c.others, c.d); got != c.want {
			t.Errorf("Share(%d, %d, %d, %d, %+v) = %d, want %d", c.limit, c.replicas, c.rank, c.others, c.d, got, c.want)
		}
	}
}

// replica syncs one destination, d, as one replica.
type replica struct {
	t     *testing.T
	store *fleet.Store
	name  string
	lease time.Duration
}

func (r replica) sync(d relay.FleetDestination) relay.FleetBreaker {
	r.t.Helper()
	v, err := r.store.Sync(context.Background(), r.request(d))
	if err != nil {
		r.t.Fatal(err)
	}
	return v.Destinations[0]
}

func (r replica) request(d relay.FleetDestination) relay.FleetSync {
	if d.Name == "" {
		d.Name = "d"
	}
	lease := r.lease
	if lease == 0 {
		lease = time.Minute
	}
	return relay.FleetSync{Replica: r.name, Lease: lease, Destinations: []relay.FleetDestination{d}}
}

func newStore(t *testing.T) (*fleet.Store, *pgtest.Schema) {
	s := pgtest.NewSchema(t)
	store, err := fleet.New(s.Pool, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	return store, s
}

func TestBreakerAcrossReplicas(t *testing.T) {
	store, _ := newStore(t)
	a, b, c := replica{t: t, store: store, name: "a"}, replica{t: t, store: store, name: "b"}, replica{t: t, store: store, name: "c"}

	if v := a.sync(relay.FleetDestination{}); v.Open || v.Generation != 0 {
		t.Fatalf("a new destination is %+v, want closed", v)
	}
	// a opens it for a minute; b's own opening later changes nothing.
	v := a.sync(relay.FleetDestination{Event: relay.FleetOpened, Cooldown: time.Minute, Streak: 1, LastError: "refused"})
	if !v.Open || v.Generation != 1 || v.LastError != "refused" || v.Streak != 1 {
		t.Fatalf("after a opened it: %+v", v)
	}
	w := b.sync(relay.FleetDestination{Event: relay.FleetOpened, Cooldown: time.Second, Streak: 1, LastError: "reset"})
	if !w.OpenUntil.Equal(v.OpenUntil) || w.Generation != 1 || w.LastError != "refused" {
		t.Fatalf("b's opening of an open breaker changed it: %+v, was %+v", w, v)
	}
	// No probe before the cool-down ends; nobody closes it without one.
	if w := b.sync(relay.FleetDestination{Probe: true}); w.Probe {
		t.Fatal("b got the probe during the cool-down")
	}
	if w := c.sync(relay.FleetDestination{Event: relay.FleetClosed}); !w.Open {
		t.Fatal("c closed a breaker it did not probe")
	}

	// Opened with no cool-down: one probe at a time.
	d := replica{t: t, store: store, name: "d"}
	a.sync(relay.FleetDestination{Name: "e", Event: relay.FleetOpened, Streak: 1})
	if w := b.sync(relay.FleetDestination{Name: "e", Probe: true}); !w.Probe {
		t.Fatalf("b did not get the probe after the cool-down: %+v", w)
	}
	if w := c.sync(relay.FleetDestination{Name: "e", Probe: true}); w.Probe {
		t.Fatal("c got the probe b holds")
	}
	if w := b.sync(relay.FleetDestination{Name: "e", Probe: true}); !w.Probe {
		t.Fatal("b lost the probe it renewed")
	}
	// b's probe failed: it reopens, doubled, and the probe is free.
	w = b.sync(relay.FleetDestination{Name: "e", Event: relay.FleetOpened, Cooldown: time.Minute, Streak: 2})
	if !w.Open || w.Probe || w.Streak != 2 || w.Generation != 2 {
		t.Fatalf("after b's probe failed: %+v", w)
	}
	if w := d.sync(relay.FleetDestination{Name: "e", Probe: true}); w.Probe {
		t.Fatal("d got a probe during the new cool-down")
	}

	// A probe held by a replica that stops syncing ends with its lease.
	a.sync(relay.FleetDestination{Name: "f", Event: relay.FleetOpened, Streak: 1})
	short := replica{t: t, store: store, name: "short", lease: time.Microsecond}
	if w := short.sync(relay.FleetDestination{Name: "f", Probe: true}); !w.Probe {
		t.Fatal("short did not get the probe")
	}
	if w := c.sync(relay.FleetDestination{Name: "f", Probe: true}); !w.Probe {
		t.Fatal("the probe of a replica whose lease ended was not freed")
	}
	// c's probes succeed: closed for everyone.
	if w := c.sync(relay.FleetDestination{Name: "f", Event: relay.FleetClosed}); w.Open || w.Probe || w.Streak != 0 {
		t.Fatalf("after c's probes succeeded: %+v", w)
	}
	if w := a.sync(relay.FleetDestination{Name: "f"}); w.Open || w.Generation != 2 {
		t.Fatalf("a sees %+v, want closed at generation 2", w)
	}
}

func TestSharesNeverExceedTheLimit(t *testing.T) {
	store, s := newStore(t)
	const limit = 7
	// Each replica uses its whole share until told a smaller one, as a
	// busy replica does, and syncs at random with the others.
	type state struct{ slots, inUse int }
	states := map[string]*state{}
	var mu sync.Mutex
	check := func() {
		var sum int
		if err := s.Pool.QueryRow(context.Background(), "SELECT coalesce(sum(slots), 0) FROM outbox_fleet_shares WHERE destination = 'd'").Scan(&sum); err != nil {
			t.Fatal(err)
		}
		var using int
		mu.Lock()
		for _, st := range states {
			using += st.inUse
		}
		mu.Unlock()
		if sum > limit || using > limit {
			t.Errorf("recorded %d, in use %d, limit %d", sum, using, limit)
		}
	}
	syncOne := func(name string) int {
		mu.Lock()
		st := states[name]
		floor := max(st.slots, st.inUse)
		mu.Unlock()
		r := replica{t: t, store: store, name: name}
		// Every replica uses all its slots, and wants more.
		v := r.sync(relay.FleetDestination{MaxInFlight: limit, Floor: floor, Wants: true, Used: floor})
		mu.Lock()
		st.slots = v.Slots
		st.inUse = min(st.inUse, v.Slots) // rows finish; no new ones past the share
		mu.Unlock()
		return v.Slots
	}
	for i := range 3 {
		states[fmt.Sprintf("r%d", i)] = &state{}
	}
	var wg sync.WaitGroup
	for i := range 3 {
		name := fmt.Sprintf("r%d", i)
		wg.Go(func() {
			for range 40 {
				slots := syncOne(name)
				mu.Lock()
				states[name].inUse = slots
				mu.Unlock()
				check()
			}
		})
	}
	wg.Wait()
	// Settled: an even split, the remainder to the first by name. A share
	// shrinks in two syncs (first its replica stops taking more, then the
	// fleet records it), and r0 grows into what r1 and r2 gave up at its
	// sync after theirs: three rounds in order.
	for range 3 {
		for _, name := range []string{"r0", "r1", "r2"} {
			syncOne(name)
		}
	}
	got := []int{states["r0"].slots, states["r1"].slots, states["r2"].slots}
	if got[0] != 3 || got[1] != 2 || got[2] != 2 {
		t.Errorf("settled shares %v, want [3 2 2]", got)
	}

	// A share that did not change is not written again.
	version := func() string {
		var xmin string
		if err := s.Pool.QueryRow(context.Background(), "SELECT xmin::text FROM outbox_fleet_shares WHERE replica = 'r0'").Scan(&xmin); err != nil {
			t.Fatal(err)
		}
		return xmin
	}
	before := version()
	syncOne("r0")
	if after := version(); after != before {
		t.Errorf("r0's unchanged share was written again (row version %s, then %s)", before, after)
	}

	// A replica whose lease ends is forgotten, with its share.
	short := replica{t: t, store: store, name: "r3", lease: time.Microsecond}
	short.sync(relay.FleetDestination{MaxInFlight: limit})
	v, err := store.Sync(context.Background(), replica{name: "r0"}.request(relay.FleetDestination{MaxInFlight: limit, Floor: 3}))
	if err != nil {
		t.Fatal(err)
	}
	if v.Replicas != 3 {
		t.Errorf("after r3's lease ended the fleet has %d replicas, want 3", v.Replicas)
	}
	var left int
	if err := s.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_fleet_shares WHERE replica = 'r3'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("r3 left %d shares behind", left)
	}
}

func TestLeave(t *testing.T) {
	store, s := newStore(t)
	a, b := replica{t: t, store: store, name: "a"}, replica{t: t, store: store, name: "b"}
	a.sync(relay.FleetDestination{Event: relay.FleetOpened, Streak: 1, MaxInFlight: 4})
	if v := a.sync(relay.FleetDestination{Probe: true, MaxInFlight: 4}); !v.Probe || v.Slots != 4 {
		t.Fatalf("a has %+v, want the probe and every slot", v)
	}
	if v := b.sync(relay.FleetDestination{Probe: true, MaxInFlight: 4}); v.Probe || v.Slots != 0 {
		t.Fatalf("b has %+v while a holds the probe and every slot", v)
	}
	if err := store.Leave(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if v := b.sync(relay.FleetDestination{Probe: true, MaxInFlight: 4}); !v.Probe || v.Slots != 4 {
		t.Errorf("after a left, b has %+v, want the probe and every slot", v)
	}
	var left int
	if err := s.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_fleet_replicas WHERE replica = 'a'").Scan(&left); err != nil || left != 0 {
		t.Errorf("a is still in the fleet: %d (%v)", left, err)
	}
}

// BenchmarkSync measures one replica's sync among ten, with twenty
// destinations that each have an in-flight limit: the coordination's cost
// per sync, on an idle database.
func BenchmarkSync(b *testing.B) {
	s := pgtest.NewSchema(b)
	store, err := fleet.New(s.Pool, s.Name)
	if err != nil {
		b.Fatal(err)
	}
	req := func(name string) relay.FleetSync {
		var ds []relay.FleetDestination
		for i := range 20 {
			ds = append(ds, relay.FleetDestination{Name: fmt.Sprintf("d%02d", i), MaxInFlight: 64, Floor: 6})
		}
		return relay.FleetSync{Replica: name, Lease: time.Minute, Destinations: ds}
	}
	ctx := context.Background()
	for i := range 10 {
		if _, err := store.Sync(ctx, req(fmt.Sprintf("r%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	r := req("r0")
	b.ResetTimer()
	for b.Loop() {
		if _, err := store.Sync(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}

// A replica that registers without the claims column (a relay older than
// migration 16, which claims without leasing partitions) is counted, so
// that the others check keys from the lowest pending row while it lives.
func TestCountsReplicasThatDoNotLeasePartitions(t *testing.T) {
	store, s := newStore(t)
	a := replica{t: t, store: store, name: "a"}
	view := func() relay.FleetView {
		t.Helper()
		v, err := store.Sync(context.Background(), a.request(relay.FleetDestination{}))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := view(); v.Replicas != 1 || v.Unleased != 0 {
		t.Fatalf("alone: %d replicas, %d without leases; want 1 and 0", v.Replicas, v.Unleased)
	}
	// As an older relay writes its heartbeat.
	s.Exec(t, `INSERT INTO outbox_fleet_replicas (replica, expires_at) VALUES ('old', now() + interval '1 minute')`)
	if v := view(); v.Replicas != 2 || v.Unleased != 1 {
		t.Fatalf("beside an older relay: %d replicas, %d without leases; want 2 and 1", v.Replicas, v.Unleased)
	}
	s.Exec(t, `DELETE FROM outbox_fleet_replicas WHERE replica = 'old'`)
	if v := view(); v.Unleased != 0 {
		t.Fatalf("after it left: %d without leases", v.Unleased)
	}
}

// Replicas whose rows want no slots lend theirs to those whose rows do,
// which split them, and get their even split back within two syncs of the
// borrowers' once their rows want them; the shares never add up to more
// than the limit.
func TestIdleReplicasLendTheirSlots(t *testing.T) {
	store, s := newStore(t)
	const limit = 9
	used := map[string]int{}
	wants := map[string]bool{}
	slots := map[string]int{}
	sync := func(name string) {
		r := replica{t: t, store: store, name: name}
		floor := max(slots[name], used[name])
		v := r.sync(relay.FleetDestination{MaxInFlight: limit, Floor: floor, Wants: wants[name], Used: used[name]})
		slots[name] = v.Slots
		if wants[name] {
			used[name] = v.Slots // its rows take every slot it has
		} else {
			used[name] = min(used[name], v.Slots)
		}
		var total int
		if err := s.Pool.QueryRow(context.Background(), "SELECT coalesce(sum(slots), 0) FROM outbox_fleet_shares").Scan(&total); err != nil {
			t.Fatal(err)
		}
		if total > limit {
			t.Fatalf("the fleet records %d slots of %d", total, limit)
		}
	}
	round := func() {
		for _, name := range []string{"r0", "r1", "r2"} {
			sync(name)
		}
	}
	// Each step: whose rows want slots, then the shares after three rounds
	// (the first: r0 joined alone, and shrinks in two syncs).
	for _, step := range []struct {
		wanting, want, why string
	}{
		{"", "3 3 3", "while no rows want slots"},
		{"r0", "9 0 0", "while only r0's rows want slots: r1 and r2, which use none, lend all"},
		{"r1", "5 4 0", "once r1's rows want slots too: r0 and r1 split what r2 lends"},
		{"r2", "3 3 3", "once every replica's rows want slots"},
	} {
		if step.wanting != "" {
			wants[step.wanting] = true
		}
		for range 3 {
			round()
		}
		if got := fmt.Sprint(slots["r0"], slots["r1"], slots["r2"]); got != step.want {
			t.Fatalf("shares %s = %s, want %s", step.why, got, step.want)
		}
	}
}

// A sync renews the replica's entry only once less than RenewBelow of it
// is left: each renewal leaves a row version that a snapshot held
// elsewhere keeps, and every sync reads them. The view says how long the
// entry lasts.
func TestSyncRenewsTheEntryOnlyWhenDue(t *testing.T) {
	store, s := newStore(t)
	ctx := context.Background()
	req := relay.FleetSync{Replica: "a", Lease: time.Minute, RenewBelow: 30 * time.Second,
		Destinations: []relay.FleetDestination{{Name: "d"}}}
	version := func() string {
		t.Helper()
		var xmin string
		if err := s.Pool.QueryRow(ctx, `SELECT xmin::text FROM outbox_fleet_replicas WHERE replica = 'a'`).Scan(&xmin); err != nil {
			t.Fatal(err)
		}
		return xmin
	}
	sync := func() relay.FleetView {
		t.Helper()
		v, err := store.Sync(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := sync()
	joined := version()
	if v.Left < 50*time.Second || v.Left > time.Minute {
		t.Fatalf("the entry lasts %s after joining, want about a minute", v.Left)
	}
	for range 5 {
		sync()
	}
	if got := version(); got != joined {
		t.Fatalf("syncs with most of the lease left wrote the entry again (xmin %s, then %s)", joined, got)
	}
	s.Exec(t, `UPDATE outbox_fleet_replicas SET expires_at = now() + interval '20 seconds' WHERE replica = 'a'`)
	short := version()
	if v := sync(); v.Left < 50*time.Second {
		t.Fatalf("the entry lasts %s after a sync with 20s left, want it renewed", v.Left)
	}
	if got := version(); got == short {
		t.Fatal("a sync with less than RenewBelow left did not renew the entry")
	}
}
