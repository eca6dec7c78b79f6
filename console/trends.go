package console

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/history"
)

// The trends' ranges: the last hour by minute, the last day by quarter
// hour.
var trendRanges = map[string]struct {
	window, step time.Duration
	label        string
}{
	"hour": {time.Hour, time.Minute, "last hour, by minute"},
	"day":  {24 * time.Hour, 15 * time.Minute, "last day, by 15 minutes"},
}

// trendsView is the overview's trends of one outbox.
type trendsView struct {
	Range, Label string
	Outbox       []chart
	Destinations []destTrends
	Error        string
}

type destTrends struct {
	Name   string
	Charts []chart
}

// chart is one SVG line chart, drawn on the server: a viewBox of
// chartW×chartH, lines as polylines, and a hover target per step whose
// title gives its numbers.
type chart struct {
	Title   string
	Summary string
	Lines   []chartLine
	Top     string // the value at the top of the y axis
	Ticks   []chartTick
	Steps   []chartStep
	Empty   bool
}

type chartLine struct {
	Name, Class, Points string
	// Dots are the points with no neighbour to draw a line to.
	Dots []chartDot
}

type chartDot struct{ X, Y float64 }

type chartTick struct {
	X     float64
	Label string
}

// chartStep is a step's hover target; Count is the first line's count in
// the step (rows, or milliseconds for a lag), for tests and scrapers.
type chartStep struct {
	X, W  float64
	Title string
	Count int64
}

const (
	chartW, chartH      = 600.0, 150.0
	plotL, plotR        = 46.0, 594.0
	plotTop, plotBottom = 8.0, 128.0
)

// series is one line's values, per step; NaN where unknown.
type series struct {
	name, class string
	values      []float64
	counts      []int64
}

// buildChart draws lines over points' steps; format renders a value.
func buildChart(title string, pts []history.Point, step time.Duration, format func(float64) string, summary string, lines ...series) chart {
	c := chart{Title: title, Summary: summary}
	top := 0.0
	for _, l := range lines {
		for _, v := range l.values {
			if !math.IsNaN(v) {
				top = max(top, v)
			}
		}
	}
	c.Empty = top == 0
	top = niceCeil(top)
	c.Top = format(top)
	n := len(pts)
	dx := (plotR - plotL) / float64(max(n, 1))
	x := func(i int) float64 { return plotL + dx*(float64(i)+0.5) }
	y := func(v float64) float64 { return plotBottom - (plotBottom-plotTop)*v/top }
	known := func(vs []float64, i int) bool { return i >= 0 && i < len(vs) && !math.IsNaN(vs[i]) }
	for _, l := range lines {
		var b strings.Builder
		cl := chartLine{Name: l.name, Class: l.class}
		for i, v := range l.values {
			if math.IsNaN(v) {
				continue
			}
			fmt.Fprintf(&b, "%.1f,%.1f ", x(i), y(v))
			if !known(l.values, i-1) && !known(l.values, i+1) {
				cl.Dots = append(cl.Dots, chartDot{X: x(i), Y: y(v)})
			}
		}
		cl.Points = strings.TrimSpace(b.String())
		c.Lines = append(c.Lines, cl)
	}
	for i, p := range pts {
		parts := []string{p.At.UTC().Format("15:04") + "–" + p.At.Add(step).UTC().Format("15:04") + " UTC"}
		for _, l := range lines {
			v := "no data"
			if !math.IsNaN(l.values[i]) {
				v = format(l.values[i])
				if l.counts != nil {
					v += " (" + strconv.FormatInt(l.counts[i], 10) + ")"
				}
			}
			parts = append(parts, l.name+": "+v)
		}
		st := chartStep{X: plotL + dx*float64(i), W: dx, Title: strings.Join(parts, "; ")}
		if len(lines) > 0 && lines[0].counts != nil {
			st.Count = lines[0].counts[i]
		}
		c.Steps = append(c.Steps, st)
	}
	for i := 0; i < n; i += max(n/4, 1) {
		c.Ticks = append(c.Ticks, chartTick{X: x(i), Label: pts[i].At.UTC().Format("15:04")})
	}
	return c
}

// niceCeil is the smallest of 1, 2, 2.5 or 5 times a power of ten that
// is at least v; 1 for nothing.
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// perSecond formats a rate.
func perSecond(v float64) string {
	switch {
	case v == 0:
		return "0/s"
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64) + "/s"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + "/s"
}

func rows(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

// seconds formats a duration given in seconds.
func seconds(v float64) string {
	d := time.Duration(v * float64(time.Second))
	switch {
	case d == 0:
		return "0"
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// rateSeries is a count per step as a rate per second, over the part of
// the step its data covers; NaN where it covers none.
func rateSeries(name, class string, pts []history.Point, count func(history.Point) int64) series {
	s := series{name: name, class: class, values: make([]float64, len(pts)), counts: make([]int64, len(pts))}
	for i, p := range pts {
		s.counts[i] = count(p)
		s.values[i] = math.NaN()
		if p.Span >= time.Second {
			s.values[i] = float64(s.counts[i]) / p.Span.Seconds()
		}
	}
	return s
}

// lagSeries is a quantile of the delivery lag per step, in seconds; NaN
// where nothing was delivered.
func lagSeries(name, class string, pts []history.Point, q float64) series {
	s := series{name: name, class: class, values: make([]float64, len(pts))}
	for i, p := range pts {
		s.values[i] = math.NaN()
		if d, ok := p.Quantile(q); ok {
			s.values[i] = d.Seconds()
		}
	}
	return s
}

func total(pts []history.Point, count func(history.Point) int64) int64 {
	var n int64
	for _, p := range pts {
		n += count(p)
	}
	return n
}

func delivered(p history.Point) int64 { return p.Delivered }
func failed(p history.Point) int64    { return p.Failed() }

// flowCharts are the charts of a destination's rows, or the outbox's:
// delivered and failed per second, and the delivery lag.
func flowCharts(pts []history.Point, step time.Duration, label string) []chart {
	d, f := total(pts, delivered), total(pts, failed)
	flow := buildChart("Delivered and failed per second", pts, step, perSecond,
		fmt.Sprintf("%d delivered, %d failed (retried or dead-lettered) in the %s", d, f, label),
		rateSeries("delivered", "ok", pts, delivered), rateSeries("failed", "bad", pts, failed))
	var all []int64
	for _, p := range pts {
		all = history.AddLag(all, p.Lag)
	}
	summary := "nothing delivered"
	if p50, ok := history.Quantile(all, 0.5); ok {
		p99, _ := history.Quantile(all, 0.99)
		summary = fmt.Sprintf("p50 %s, p99 %s over the %s", seconds(p50.Seconds()), seconds(p99.Seconds()), label)
	}
	lag := buildChart("Commit to acknowledgement (p50, p99)", pts, step, seconds, summary,
		lagSeries("p50", "ok", pts, 0.5), lagSeries("p99", "warn", pts, 0.99))
	return []chart{flow, lag}
}

// backlogCharts are the outbox's pending rows and the age of its oldest.
func backlogCharts(pts []history.Point, step time.Duration) []chart {
	pending := series{name: "pending", class: "ok", values: make([]float64, len(pts)), counts: make([]int64, len(pts))}
	oldest := series{name: "oldest pending", class: "warn", values: make([]float64, len(pts))}
	last := -1
	for i, p := range pts {
		pending.values[i], oldest.values[i] = math.NaN(), math.NaN()
		if p.HasBacklog {
			pending.values[i], pending.counts[i] = float64(p.Backlog.Pending), p.Backlog.Pending
			oldest.values[i] = p.Backlog.OldestPending.Seconds()
			last = i
		}
	}
	summary := "not recorded yet"
	if last >= 0 {
		summary = fmt.Sprintf("%d pending, oldest %s, at %s UTC (the highest of each step)", pts[last].Backlog.Pending,
			seconds(pts[last].Backlog.OldestPending.Seconds()), pts[last].At.UTC().Format("15:04"))
	}
	return []chart{
		buildChart("Pending rows", pts, step, rows, summary, pending),
		buildChart("Oldest pending row's age", pts, step, seconds, "", oldest),
	}
}

// trendsOf builds the trends view of tr.
func trendsOf(tr *history.Trends, rng, label string) trendsView {
	v := trendsView{Range: rng, Label: label}
	v.Outbox = append(flowCharts(tr.Outbox.Points, tr.Step, label), backlogCharts(tr.Outbox.Points, tr.Step)...)
	for _, d := range tr.Destinations {
		v.Destinations = append(v.Destinations, destTrends{Name: d.Destination, Charts: flowCharts(d.Points, tr.Step, label)})
	}
	return v
}
