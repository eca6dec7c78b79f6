package bench_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/bench"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A small run of every scenario, so the benchmark cannot rot.
func TestSmoke(t *testing.T) {
	testwait.SkipShort(t)
	results, err := bench.Run(context.Background(), bench.Config{
		URL: pgtest.URL(t), Rows: 2000, Pairs: 2, BatchSize: 200, PayloadBytes: 100,
		Rates: []int{500}, LatencyFor: time.Second, ProducersFor: 300 * time.Millisecond,
		NaiveRows: 200, NaiveFor: 5 * time.Second,
		// A backlog that takes about a second: in a tenth of one, under the
		// rest of the suite, the quiet outbox's first rows could still be
		// on their way when it drained.
		FairnessRows: 30000, FairnessRate: 500, ConsoleLetters: 500, FleetOutage: 2 * time.Second,
		UserRows: []int{2000}, LargeRows: 3000,
		SoakFor: 3 * time.Second, SoakMinute: time.Second, SoakIdle: time.Second, SoakRate: 500,
		CaptureFor: 2 * time.Second, CaptureRates: []int{300}, CaptureRounds: 1, CaptureBacklog: 3000,
		Only:   "binary,drain,latency,producer,baseline,claim,fleet,fairness,console,soak,capture",
		Binary: os.Getenv("OUTBOX_TEST_RELAY_BINARY"), // built by make test; else built here
		Logf:   t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]int{}
	for _, r := range results {
		groups[r.Group]++
		// An idle relay may spend no CPU tick at all in a soak's short
		// idle phase.
		if r.Value <= 0 && r.Group != "latency" && r.Group != "claim" && r.Unit != "%" && r.Unit != "% of a core" {
			t.Errorf("%s / %s = %v %s", r.Group, r.Name, r.Value, r.Unit)
		}
		if r.Group == "drain" && strings.Contains(r.Name, "10k keys, 2 worker(s)") != strings.HasPrefix(r.Detail, "mean of ") {
			t.Errorf("%s / %s: %q, want the mean of 2 drains for 10k keys with 2 workers, and one drain otherwise", r.Group, r.Name, r.Detail)
		}
		// Linux reports the machine's CPU time, which the notes compare.
		if r.Group == "drain" && runtime.GOOS == "linux" && !strings.Contains(r.Detail, "the rest of the machine's") {
			t.Errorf("%s / %s: %q, want the machine's CPU time a row beside this process's", r.Group, r.Name, r.Detail)
		}
	}
	retried := regexp.MustCompile(`, ([1-9][0-9]*) retried`)
	for _, r := range results {
		if strings.Contains(r.Name, "healthy rows") && (r.Value <= 0 || !retried.MatchString(r.Detail)) {
			t.Errorf("%s / %s = %v: %q, want a latency and the failing rows retried", r.Group, r.Name, r.Value, r.Detail)
		}
	}
	// The soak: three intervals and the idle cost, with a snapshot held
	// and without, and from the log with a snapshot held; the ratio of buffers a claim where pg_stat_statements
	// is loaded.
	for _, phase := range []string{"held snapshot", "no snapshot", "log, held snapshot"} {
		intervals, idle := 0, 0
		for _, r := range results {
			switch {
			case r.Group != "soak" || !strings.HasPrefix(r.Name, phase):
			case strings.Contains(r.Name, "p99 commit→ack"):
				intervals++
				if !strings.Contains(r.Detail, "µs CPU a row") {
					t.Errorf("%s: %q, want the relay's CPU a row", r.Name, r.Detail)
				}
				if strings.Contains(r.Detail, "database per row") && !strings.Contains(r.Detail, "buffers by statement: ") {
					t.Errorf("%s: %q, want the statements that read the most buffers", r.Name, r.Detail)
				}
			case strings.Contains(r.Name, "idle"):
				idle++
			}
		}
		if intervals != 3 || idle != 1 {
			t.Errorf("soak, %s: %d intervals and %d idle results, want 3 and 1", phase, intervals, idle)
		}
		delete(groups, "soak")
	}
	for g, want := range map[string]int{"drain": 12, "ceiling": 12, "latency": 7, "producer": 6, "baseline": 2, "claim": 2, "fleet": 6, "fairness": 3, "binary": 7, "raw ceiling": 6, "order ceiling": 3, "console": 15, "capture": 5} {
		if groups[g] != want {
			t.Errorf("%d %s results, want %d", groups[g], g, want)
		}
	}
	dir := t.TempDir()
	var table strings.Builder
	if err := bench.WriteTable(&table, results); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "| drain | delete-on-send, hot key, 2 worker(s) |") {
		t.Errorf("table:\n%s", table.String())
	}
	if err := bench.WriteJSON(filepath.Join(dir, "r.json"), results); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "chart.png")
	if err := bench.WriteChart(png, results); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(png); err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
		t.Fatalf("chart: %d bytes, err %v", len(b), err)
	}
}
