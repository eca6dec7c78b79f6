package console

import (
	"context"
	"net/http"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/history"
)

// FleetShare is a live replica's share of a destination's in-flight
// limit.
type FleetShare struct {
	Replica string
	Slots   int
	// Wants says rows of the replica waited for a slot lately.
	Wants bool
}

// destination is a destination's page: its breaker and the fleet's
// history of it, its pauses with their cool-downs, its limits and the
// replicas' shares of them, its failure groups and its trends.
func (c *console) destination(w http.ResponseWriter, r *http.Request) {
	o, err := c.outbox(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return
	}
	name := r.PathValue("name")
	var st Status
	if c.cfg.Status != nil {
		st = c.cfg.Status(r.Context())
	}
	var d *DestinationStatus
	for i := range st.Destinations {
		if st.Destinations[i].Name == name {
			d = &st.Destinations[i]
		}
	}
	if d == nil {
		c.fail(w, r, http.StatusNotFound, "No destination "+clipName(name)+" in this relay's configuration.")
		return
	}
	v := map[string]any{"D": d}
	var problems []string
	note := func(what string, err error) {
		if err != nil && r.Context().Err() == nil {
			c.cfg.Logger.Error("console destination page", "destination", name, "part", what, "error", err)
			problems = append(problems, what+" could not be read: "+c.cfg.Redact(err.Error()))
		}
	}
	if h := c.cfg.Outboxes[0].History; h != nil {
		changes, err := h.Changes(r.Context(), name, 30)
		note("The breaker's history", err)
		v["Changes"] = changes
	}
	if c.cfg.Shares != nil {
		shares, err := c.cfg.Shares(r.Context(), name)
		note("The fleet's shares", err)
		total := 0
		for _, s := range shares {
			total += s.Slots
		}
		v["Shares"], v["SharesTotal"] = shares, total
	}
	groups, err := o.Dead.Groups(r.Context(), deadletter.GroupParams{Filter: deadletter.Filter{Destination: name}, Limit: 10})
	note("The failure groups", err)
	if groups == nil {
		groups = &deadletter.GroupPage{}
	}
	v["Groups"] = groups
	if o.History != nil {
		v["Trends"] = c.destinationTrends(r.Context(), o.History, name, note)
	}
	v["Problems"] = problems
	c.render(w, r, http.StatusOK, "destination", v)
}

// destinationTrends are a destination's charts of the last hour.
func (c *console) destinationTrends(ctx context.Context, h *history.Store, name string, note func(string, error)) []chart {
	span := trendRanges["hour"]
	tr, err := h.Read(ctx, span.window, span.step, c.cfg.HistoryInterval < time.Minute)
	if err != nil {
		note("The trends", err)
		return nil
	}
	for _, d := range tr.Destinations {
		if d.Destination == name {
			return flowCharts(d.Points, tr.Step, span.label)
		}
	}
	empty := make([]history.Point, len(tr.Outbox.Points))
	for i, p := range tr.Outbox.Points {
		empty[i].At = p.At
	}
	return flowCharts(empty, tr.Step, span.label)
}

func clipName(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
