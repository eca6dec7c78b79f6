package filesink_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/internal/dev/filesink"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const conformanceLimit = 4 << 10

func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			dir := t.TempDir()
			return publishertest.Destination{
				Publisher: filesink.New(dir, conformanceLimit),
				Accepted: func(t *testing.T) []string {
					var out []string
					for _, topic := range []string{publishertest.TopicA, publishertest.TopicB} {
						lines, err := filesink.Read(dir, topic)
						if err != nil {
							t.Fatal(err)
						}
						for _, l := range lines {
							out = append(out, string(l.Payload))
						}
					}
					return out
				},
			}
		},
		Reject:   func(rec *sink.Record) { rec.Topic = "../" + rec.Topic },
		TooLarge: func(rec *sink.Record) { rec.Payload = []byte(strings.Repeat("x", conformanceLimit)) },
		Unreachable: func(t *testing.T) sink.Publisher {
			return filesink.New(filepath.Join(t.TempDir(), "missing"), 0)
		},
	})
}

// The sink is configured like any other, and its destination delivers in
// order per key beside a poison row, which alone is dead-lettered.
func TestRelayDeliversThroughConfiguration(t *testing.T) {
	t.Parallel()
	s := pgtest.NewSchema(t)
	dir := t.TempDir()
	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	yaml := fmt.Sprintf(`
destinations:
  audit:
    max_in_flight: 50
    file:
      dir: %s
routes:
  - topics: ["audit*"]
    destination: audit
`, dir)
	if err := os.WriteFile(cfgFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + cfgFile, "OUTBOX_DATABASE_SCHEMA=" + s.Name}, config.NeedDestinations)
	if err != nil {
		t.Fatal(err)
	}
	settings, routes := cfg.DestinationList()
	if len(settings) != 1 || settings[0].Sink.Kind != "file" || settings[0].Relay.MaxInFlight != 50 {
		t.Fatalf("destinations %+v", settings)
	}
	var dests []relay.Destination
	for _, d := range settings {
		p, err := d.Settings.Open(sink.Options{Name: d.Name})
		if err != nil {
			t.Fatal(err)
		}
		d.Relay.Publisher = p
		dests = append(dests, d.Relay)
	}
	st, err := store.New(s.Pool, store.Config{Schema: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	policy, err := retry.NewPolicy(retry.PolicyConfig{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Config{Store: st, Destinations: dests, Routes: routes, Policy: policy,
		Logger: slog.New(slog.DiscardHandler), PollInterval: 10 * time.Millisecond, BatchSize: 40})
	if err != nil {
		t.Fatal(err)
	}

	s.Exec(t, `INSERT INTO outbox (topic, key, payload)
SELECT CASE WHEN g = 150 THEN 'audit bad' ELSE 'audit.' || (g % 2) END, 'k' || (g % 7), g::text::bytea
FROM generate_series(1, 400) g`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testwait.Within(t, 60*time.Second, "every row delivered or dead-lettered", func() bool {
		var pending int
		if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE status = 'pending'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	var reason, lastError string
	if err := s.Pool.QueryRow(context.Background(),
		`SELECT dead_letter_reason, last_error FROM outbox WHERE status = 'dead_lettered'`).Scan(&reason, &lastError); err != nil {
		t.Fatalf("the poison row: %v", err)
	}
	if reason != sink.ReasonPermanent || !strings.Contains(lastError, `topic "audit bad" cannot name a file`) {
		t.Fatalf("the poison row was dead-lettered %s: %s", reason, lastError)
	}
	total := 0
	for _, topic := range []string{"audit.0", "audit.1"} {
		lines, err := filesink.Read(dir, topic)
		if err != nil {
			t.Fatal(err)
		}
		last := map[string]int64{}
		for _, l := range lines {
			if l.ID <= last[l.Key] {
				t.Fatalf("%s: key %s row %d after %d", topic, l.Key, l.ID, last[l.Key])
			}
			last[l.Key] = l.ID
		}
		total += len(lines)
	}
	if total != 399 {
		t.Fatalf("%d rows in the files, want 399", total)
	}
}
