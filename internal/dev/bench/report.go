package bench

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WriteTable writes results as a Markdown table.
func WriteTable(w io.Writer, results []Result) error {
	var b strings.Builder
	b.WriteString("| group | scenario | value | unit | note |\n|---|---|---:|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Group, r.Name, format(r.Value), r.Unit, r.Detail)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func format(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// WriteJSON writes results as JSON.
func WriteJSON(path string, results []Result) error {
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteChart draws the binary's drain throughput beside the bare SQL's on
// as many connections as it ran processes, and latency percentiles, into
// one PNG.
func WriteChart(path string, results []Result) error {
	ceilings := map[string]float64{}
	for _, r := range results {
		if r.Group == "raw ceiling" {
			ceilings[r.Name] = r.Value
		}
	}
	var names []string
	var relay, ceiling plotter.Values
	for _, r := range results {
		if r.Group != "binary" {
			continue
		}
		names = append(names, r.Name)
		relay = append(relay, r.Value)
		// None for a backlog drained without a series.
		c := ceilings[strings.NewReplacer(" processes", " connections", " process", " connection").Replace(r.Name)]
		ceiling = append(ceiling, c)
	}
	top := plot.New()
	top.Title.Text = "Backlog drain by outbox-relay run (rows/s)"
	top.Y.Label.Text = "rows/s"
	if len(relay) > 0 && len(ceiling) == len(relay) {
		w := vg.Points(7)
		c, err := plotter.NewBarChart(ceiling, w)
		if err != nil {
			return err
		}
		c.Color = color.RGBA{R: 180, G: 180, B: 180, A: 255}
		c.Offset = -w / 2
		r, err := plotter.NewBarChart(relay, w)
		if err != nil {
			return err
		}
		r.Color = color.RGBA{R: 40, G: 110, B: 200, A: 255}
		r.Offset = w / 2
		top.Add(c, r)
		top.Legend.Add("raw SQL ceiling", c)
		top.Legend.Add("outbox-relay", r)
		top.Legend.Top = true
		short := make([]string, len(names))
		for i, n := range names {
			short[i] = abbreviate(n)
		}
		top.NominalX(short...)
		top.X.Tick.Label.Rotation = 0.6
		top.X.Tick.Label.XAlign = draw.XRight
	}

	bottom := plot.New()
	bottom.Title.Text = "Commit → broker ack latency (ms)"
	bottom.Y.Label.Text = "ms"
	var latNames []string
	var lat plotter.Values
	for _, r := range results {
		if r.Group == "latency" {
			latNames = append(latNames, strings.TrimSuffix(strings.Replace(r.Name, " commit→ack at ", " @ ", 1), " offered"))
			lat = append(lat, r.Value)
		}
	}
	if len(lat) > 0 {
		b, err := plotter.NewBarChart(lat, vg.Points(14))
		if err != nil {
			return err
		}
		b.Color = color.RGBA{R: 220, G: 120, B: 40, A: 255}
		bottom.Add(b)
		bottom.NominalX(latNames...)
	}

	img := vgimg.New(vg.Points(900), vg.Points(900))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(8), PadBottom: vg.Points(8), PadX: vg.Points(8), PadY: vg.Points(16)}
	plots := [][]*plot.Plot{{top}, {bottom}}
	canvases := plot.Align(plots, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func abbreviate(name string) string {
	r := strings.NewReplacer("delete-on-send", "delete", "mark-sent", "mark", " worker(s)", "w",
		" processes", "p", " process", "p", " rows", "", ", ", " ")
	return r.Replace(name)
}
