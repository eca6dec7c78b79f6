// Command bench runs the end-to-end benchmark on a throwaway PostgreSQL
// cluster (durable: fsync on, as in production) and an in-process
// Kafka-protocol broker, prints a table and writes it, as Markdown and JSON,
// with a PNG chart, to a results directory.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/dev/bench"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgserver"
	"github.com/outbox-relay/outbox-relay/internal/gctune"
)

func main() {
	// The relay as it ships: its binary does the same.
	gctune.Apply()
	rows := flag.Int("rows", 200_000, "backlog rows of the in-process drains (groups drain and fleet)")
	batch := flag.Int("batch", 1000, "claim batch size of the in-process scenarios (the binary runs with its default)")
	payload := flag.Int("payload", 200, "payload bytes per message")
	out := flag.String("out", "bench-results", "directory for results.md, results.json and chart.png")
	only := flag.String("only", "", "run only these scenario groups: binary, drain (the relay in process; not run by default), latency, producer, baseline, claim, fleet, fairness, console, soak, capture (comma-separated)")
	match := flag.String("match", "", "run only the drain and fleet scenarios whose name contains this, such as \"1M rows, 10k keys, delete-on-send, 1 process\"")
	binary := flag.String("binary", "", "the outbox-relay binary the binary group runs (default: built from this module), to compare versions")
	quick := flag.Bool("quick", false, "drain 200k-row backlogs only (no 1M and 10M), for a run of a few minutes")
	soak := flag.Duration("soak", 5*time.Minute, "how long the soak offers 2,000 rows/s, with a snapshot held and again without (30m for the long run)")
	capture := flag.Duration("capture", 30*time.Second, "how long each round of the capture scenario offers each of -capture-rates messages/s, into the table and into the write-ahead log in turn")
	var captureRates []int
	flag.Func("capture-rates", "the capture scenario's rates, messages/s (comma-separated; default 1000,2000,20000)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return fmt.Errorf("%q is not a rate of messages a second", f)
			}
			captureRates = append(captureRates, n)
		}
		return nil
	})
	captureBacklog := flag.Int("capture-backlog", 1_000_000, "the backlog the capture scenario drains from the table and from the log (200k with -quick)")
	stores := flag.Bool("broker-stores", false, "have the in-process broker keep the records it acknowledges, on the cores the relay and PostgreSQL share (by default it checks and acknowledges each batch, then discards it)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	c := capturing{For: *capture, Rates: captureRates, Backlog: *captureBacklog}
	if *quick && !flagSet("capture-backlog") {
		c.Backlog = 200_000
	}
	if err := run(ctx, *rows, *batch, *payload, *only, *match, *stores, *quick, *soak, c, *binary, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// capturing is how the capture scenario runs.
type capturing struct {
	For     time.Duration
	Rates   []int
	Backlog int
}

// flagSet says the command line sets the flag named name.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func run(ctx context.Context, rows, batch, payload int, only, match string, stores, quick bool, soak time.Duration, capture capturing, binary, out string) error {
	url := os.Getenv("OUTBOX_BENCH_DATABASE_URL")
	if url == "" {
		srv, err := pgserver.Start(ctx, pgserver.Options{Durable: true, Settings: map[string]string{
			"autovacuum_naptime": "1s",
			"max_wal_size":       "2GB",
			// What the relay's statements cost the database, per row.
			"shared_preload_libraries": "pg_stat_statements",
			"pg_stat_statements.max":   "10000",
			// Capture from the write-ahead log, beside the table.
			"wal_level": "logical",
		}})
		if err != nil {
			return err
		}
		defer srv.Stop()
		url = srv.DSN("postgres")
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	var pgVersion string
	_ = conn.QueryRow(ctx, "SHOW server_version").Scan(&pgVersion)
	conn.Close(ctx)

	machine := fmt.Sprintf("%d CPUs (%s), %s, PostgreSQL %s (fsync on), Go %s, %s",
		runtime.NumCPU(), cpuModel(), memTotal(), pgVersion, strings.TrimPrefix(runtime.Version(), "go"), time.Now().UTC().Format("2006-01-02"))
	fmt.Println("machine:", machine)
	fmt.Printf("payload %d bytes; the binary with its default configuration; in process: backlog %d rows, batch %d\n\n", payload, rows, batch)

	userRows, largeRows, fairnessRows, consoleRows := []int{200_000, 1_000_000}, 10_000_000, 1_000_000, 1_000_000
	if quick {
		userRows, largeRows, fairnessRows, consoleRows = []int{200_000}, 0, 200_000, 200_000
	}
	start := time.Now()
	results, err := bench.Run(ctx, bench.Config{
		URL: url, Rows: rows, Pairs: 5, BinaryRounds: 3, BatchSize: batch, PayloadBytes: payload,
		Rates: []int{1000, 20000}, LatencyFor: 10 * time.Second,
		ProducersFor: 16 * time.Second,
		NaiveRows:    5000, NaiveFor: 15 * time.Second,
		FairnessRows: fairnessRows, FairnessRate: 2000, ConsoleLetters: 100_000, ConsoleRows: consoleRows,
		UserRows: userRows, LargeRows: largeRows, Binary: binary, SoakFor: soak,
		CaptureFor: capture.For, CaptureRates: capture.Rates, CaptureBacklog: capture.Backlog,
		Only: only, Match: match, BrokerStores: stores,
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	var table bytes.Buffer
	broker := "checks and acknowledges each batch, then discards its records"
	if stores {
		broker = "keeps the records it acknowledges, in memory"
	}
	fmt.Fprintf(&table, "Machine: %s. Payload %d bytes. The binary runs with its default configuration; the scenarios in process drain %d rows, batch %d. The in-process broker %s. Run took %s.\n\n",
		machine, payload, rows, batch, broker, time.Since(start).Round(time.Second))
	if err := bench.WriteTable(&table, results); err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(table.String())
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "results.md"), table.Bytes(), 0o644); err != nil {
		return err
	}
	if err := bench.WriteJSON(filepath.Join(out, "results.json"), results); err != nil {
		return err
	}
	if err := bench.WriteChart(filepath.Join(out, "chart.png"), results); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s/results.md, results.json and chart.png\n", out)
	return nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	out, err := exec.Command("free", "-h", "--si").Output()
	if err != nil {
		return "memory unknown"
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Mem:" {
			return f[1] + " memory"
		}
	}
	return "memory unknown"
}
