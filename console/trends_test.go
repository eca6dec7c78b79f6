package console_test

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/history"
)

var (
	chartFigure = regexp.MustCompile(`(?s)<figure class="chart">.*?</figure>`)
	stepCount   = regexp.MustCompile(`data-count="(\d+)"`)
	stepTitle   = regexp.MustCompile(`<title>([^<]*)</title>`)
)

// charts returns the page's charts by title: each step's count.
func charts(t *testing.T, page string) map[string][]int64 {
	t.Helper()
	out := map[string][]int64{}
	i := 0
	for _, fig := range chartFigure.FindAllString(page, -1) {
		title := regexp.MustCompile(`<strong>([^<]*)</strong>`).FindStringSubmatch(fig)[1]
		var counts []int64
		for _, m := range stepCount.FindAllStringSubmatch(fig, -1) {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			counts = append(counts, n)
		}
		out[strconv.Itoa(i)+" "+title] = counts
		i++
	}
	return out
}

func sum(ns []int64) int64 {
	var s int64
	for _, n := range ns {
		s += n
	}
	return s
}

// The overview charts what the history holds: the outbox's and each
// destination's steps carry the counts that were recorded.
func TestOverviewChartsTheHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var now time.Time
	if err := e.s.Pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	lag := make([]int64, len(history.LagBuckets)+1)
	lag[1] = 40
	for _, a := range []struct {
		at      time.Time
		replica string
		c       history.Counts
	}{
		{now, "a", history.Counts{Destination: "kafka", Delivered: 40, Lag: lag}},
		{now, "b", history.Counts{Destination: "hooks", Delivered: 3, Retried: 2, DeadLettered: 1}},
		{now.Add(-20 * time.Minute), "a", history.Counts{Destination: "kafka", Delivered: 17}},
		{now.Add(-3 * time.Hour), "a", history.Counts{Destination: "kafka", Delivered: 500}},
	} {
		if err := e.hist.Add(ctx, a.at, a.replica, []history.Counts{a.c}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.hist.RecordBacklog(ctx, now, func(context.Context) (history.Backlog, error) {
		return history.Backlog{Pending: 77, OldestPending: 2 * time.Second}, nil
	}); err != nil {
		t.Fatal(err)
	}
	b := e.browser()
	b.login(token)
	code, _, page := b.do("GET", "/console/", nil)
	if code != http.StatusOK {
		t.Fatalf("overview: %d\n%s", code, page)
	}
	got := charts(t, page)
	want := map[string]int64{
		"0 Delivered and failed per second": 60, // the outbox: 40 + 3 + 17
		"2 Pending rows":                    77,
		"4 Delivered and failed per second": 3,  // hooks
		"6 Delivered and failed per second": 57, // kafka
	}
	for title, n := range want {
		steps, ok := got[title]
		if !ok {
			t.Errorf("no chart %q among %d", title, len(got))
			continue
		}
		if len(steps) != 60 {
			t.Errorf("%s: %d steps, want 60 (an hour by minute)", title, len(steps))
		}
		if s := sum(steps); s != n {
			t.Errorf("%s: the steps add up to %d, want %d", title, s, n)
		}
	}
	for _, s := range []string{"60 delivered, 3 failed (retried or dead-lettered) in the last hour", "Destination hooks", "Destination kafka", "77 pending"} {
		if !strings.Contains(page, s) {
			t.Errorf("the overview does not say %q", s)
		}
	}
	titles := stepTitle.FindAllStringSubmatch(page, -1)
	if len(titles) < 60 || !strings.Contains(titles[59][1], "delivered: ") {
		t.Fatalf("a step's title does not give its numbers: %d titles", len(titles))
	}

	code, _, page = b.do("GET", "/console/?range=day", nil)
	if code != http.StatusOK {
		t.Fatalf("a day's overview: %d", code)
	}
	if steps := charts(t, page)["0 Delivered and failed per second"]; len(steps) != 96 || sum(steps) != 560 {
		t.Errorf("the day's outbox chart: %d steps adding up to %d, want 96 and 560", len(steps), sum(steps))
	}
	for _, bad := range []string{"week", "<script>", strings.Repeat("x", 5000)} {
		code, _, page = b.do("GET", "/console/?range="+bad, nil)
		if code != http.StatusBadRequest || !strings.Contains(page, "last hour (range=hour)") || strings.Contains(page, "<script>") {
			t.Errorf("range %.20q: %d, want a 400 that names the ranges", bad, code)
		}
	}
}
