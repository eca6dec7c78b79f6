package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// receiver accepts order events over HTTP: 400 for a body marked bad, 422
// for one marked flaky while broken, 200 otherwise.
type receiver struct {
	broken atomic.Bool
	mu     sync.Mutex
	byKey  map[string][]int // per key, the accepted orders, in arrival order
	events map[string]int   // accepted deliveries per Idempotency-Key
	bodies map[int]string   // accepted body per order
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var msg struct {
		N     int  `json:"n"`
		Bad   bool `json:"bad"`
		Flaky bool `json:"flaky"`
	}
	if err := json.Unmarshal(body, &msg); err != nil || msg.Bad {
		http.Error(w, "order rejected: bad", http.StatusBadRequest)
		return
	}
	if msg.Flaky && rc.broken.Load() {
		http.Error(w, "validation service unavailable", http.StatusUnprocessableEntity)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	key := r.Header.Get("X-Key")
	rc.byKey[key] = append(rc.byKey[key], msg.N)
	rc.events[r.Header.Get("Idempotency-Key")]++
	rc.bodies[msg.N] = string(body)
}

func (rc *receiver) accepted(key string) []int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.byKey[key])
}

// The dead-letter workflow against a running relay: fix and replay, release
// a parked key, replay after an outage, and the admin API beside it.
func TestDLQWorkflowWithRelay(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	rc := &receiver{byKey: map[string][]int{}, events: map[string]int{}, bodies: map[int]string{}}
	rc.broken.Store(true)
	srv := httptest.NewServer(rc)
	defer srv.Close()

	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte(`
relay:
  poll_interval: 50ms
admin:
  listen: 127.0.0.1:0
destinations:
  hooks:
    on_dead_letter: block
    http:
      url: `+srv.URL+`/orders
      allow_private_networks: true
routes:
  - topics: ["orders"]
    destination: hooks
`), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "admin-token-0123456789"
	c.env = append(c.env, "OUTBOX_CONFIG="+cfgFile, "OUTBOX_ADMIN_TOKEN="+token, "OUTBOX_ADMIN_ROLES=admin=operator")

	// Key a: order 1 is rejected and parks the key; 2 and 3 wait behind it.
	// Key b: likewise 10, with 11 and 12 behind. Order 20 has no key and
	// fails while the receiver is broken.
	ids := map[int]int64{}
	for _, r := range []struct {
		n    int
		key  string
		body string
	}{
		{1, "a", `{"n":1,"bad":true}`}, {2, "a", `{"n":2}`}, {3, "a", `{"n":3}`},
		{10, "b", `{"n":10,"bad":true}`}, {11, "b", `{"n":11}`}, {12, "b", `{"n":12}`},
		{20, "", `{"n":20,"flaky":true}`},
	} {
		var key *string
		if r.key != "" {
			key = &r.key
		}
		var id int64
		if err := pool.QueryRow(context.Background(), `INSERT INTO outbox (topic, key, payload, headers)
VALUES ('orders', $1, $2, jsonb_build_object('X-Key', coalesce($1, '')))
RETURNING id`, key, []byte(r.body)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[r.n] = id
	}

	var logs syncBuffer
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"run"}, c.env, nil, io.Discard, &logs) }()
	defer func() {
		stop()
		if code := <-done; code != 0 {
			t.Errorf("relay exit %d\n%s", code, logs.String())
		}
	}()

	testwait.Within(t, 30*time.Second, "both keys parked and order 20 dead-lettered", func() bool {
		return countRows(t, pool, "key_parked") == 2 && countRows(t, pool, "status = 'dead_lettered' AND key IS NULL") == 1 &&
			countRows(t, pool, "status = 'pending' AND parked_behind IS NOT NULL") == 4
	})

	var keys struct {
		ParkedKeys []struct {
			Key string `json:"key"`
			Row struct {
				ID int64 `json:"id"`
			} `json:"row"`
			Waiting int `json:"waiting"`
		} `json:"parked_keys"`
	}
	c.json(&keys, "dlq", "keys")
	if len(keys.ParkedKeys) != 2 || keys.ParkedKeys[0].Row.ID != ids[1] || keys.ParkedKeys[0].Waiting != 2 || keys.ParkedKeys[1].Key != "b" {
		t.Fatalf("parked keys: %+v", keys)
	}

	// Fix order 1 and replay it: the key's rows follow it, in order. The
	// relay would otherwise look at them again only minutes later.
	fixed := filepath.Join(t.TempDir(), "fixed.json")
	if err := os.WriteFile(fixed, []byte(`{"n":1,"fixed":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c.ok("dlq", "edit", strconv.FormatInt(ids[1], 10), "--payload", fixed, "--reason", "order 1 corrected")
	testwait.Within(t, 30*time.Second, "key a delivered", func() bool { return len(rc.accepted("a")) == 3 })
	if got := rc.accepted("a"); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("key a arrived as %v, want [1 2 3]", got)
	}
	rc.mu.Lock()
	body := rc.bodies[1]
	rc.mu.Unlock()
	if body != `{"n":1,"fixed":true}` {
		t.Fatalf("order 1 delivered as %s, want the edited payload", body)
	}
	var before string
	if err := pool.QueryRow(context.Background(), `SELECT details->'before'->>'payload' FROM outbox_audit WHERE action = 'edit'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if orig, _ := base64.StdEncoding.DecodeString(before); string(orig) != `{"n":1,"bad":true}` {
		t.Fatalf("the audit record keeps %q, want the original payload", orig)
	}

	// Release key b: 11 and 12 go on, in order; 10 stays dead-lettered.
	c.ok("dlq", "release", "b", "--reason", "order 10 is handled by hand")
	testwait.Within(t, 30*time.Second, "key b's later rows delivered", func() bool { return len(rc.accepted("b")) == 2 })
	if got := rc.accepted("b"); !slices.Equal(got, []int{11, 12}) {
		t.Fatalf("key b arrived as %v, want [11 12]", got)
	}
	if countRows(t, pool, fmt.Sprintf("id = %d AND status = 'dead_lettered' AND NOT key_parked", ids[10])) != 1 {
		t.Fatal("the parking row of key b is no longer a dead letter")
	}

	// The receiver is mended: replay order 20, delivered exactly once and
	// deleted; replaying it again is a no-op.
	rc.broken.Store(false)
	id20 := strconv.FormatInt(ids[20], 10)
	var event string
	if err := pool.QueryRow(context.Background(), `SELECT event_id::text FROM outbox WHERE id = $1`, ids[20]).Scan(&event); err != nil {
		t.Fatal(err)
	}
	c.ok("dlq", "replay", id20)
	testwait.Within(t, 30*time.Second, "order 20 delivered", func() bool { return countRows(t, pool, "id = "+id20) == 0 })
	out := c.ok("dlq", "replay", id20)
	if !strings.Contains(out, "row "+id20+" is gone") || !strings.Contains(out, "replayed 0 rows") {
		t.Fatalf("second replay: %s", out)
	}
	rc.mu.Lock()
	n := rc.events[event]
	rc.mu.Unlock()
	if n != 1 {
		t.Fatalf("order 20 accepted %d times, want once", n)
	}

	// The admin API runs beside the relay, behind the token.
	m := regexp.MustCompile(`msg="admin listener started" address=(\S+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no admin listener in the log:\n%s", logs.String())
	}
	base := "http://" + m[1] + "/api/v1"
	get := func(path, tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/dead-letters", ""); code != http.StatusUnauthorized || strings.Contains(body, "orders") {
		t.Fatalf("without a token: %d %s", code, body)
	}
	if code, body := get("/dead-letters", "wrong-token-0123456789"); code != http.StatusUnauthorized || strings.Contains(body, "orders") {
		t.Fatalf("with a wrong token: %d %s", code, body)
	}
	code, body := get("/dead-letters", token)
	var page listOutput
	if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || !slices.Equal(page.ids(), []int64{ids[10]}) {
		t.Fatalf("list over the API: %d %s", code, body)
	}
}
