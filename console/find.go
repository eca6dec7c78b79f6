package console

import (
	"fmt"
	"net/http"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

// find answers the header's search: a row's page, a key's page, or what
// it means that no row matched.
func (c *console) find(w http.ResponseWriter, r *http.Request) {
	c.showFound(w, r, deadletter.FindParams{Query: r.FormValue("q"), Kind: r.FormValue("kind")})
}

// message is a row's page, by row id or event id.
func (c *console) message(w http.ResponseWriter, r *http.Request) {
	ref, err := deadletter.ParseRef(r.PathValue("ref"))
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	p := deadletter.FindParams{Query: ref.String(), Kind: deadletter.FindRow}
	if ref.ID == 0 {
		p.Kind = deadletter.FindEvent
	}
	c.showFound(w, r, p)
}

// key is a key's page.
func (c *console) key(w http.ResponseWriter, r *http.Request) {
	c.showFound(w, r, deadletter.FindParams{Query: r.FormValue("key"), Kind: deadletter.FindKey})
}

func (c *console) showFound(w http.ResponseWriter, r *http.Request, p deadletter.FindParams) {
	st, ok := c.store(w, r)
	if !ok {
		return
	}
	f, err := st.Find(r.Context(), p)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	switch {
	case f.Kind == deadletter.FindKey:
		v := map[string]any{"Found": f, "Key": f.Query}
		for i, row := range f.Rows {
			if row.State == "pending" || row.State == "leased" || row.ParksKey {
				head := row
				head.Holds = append(head.Holds, c.liveHolds(r, row)...)
				v["Head"] = head
				f.Rows[i] = head
				break
			}
		}
		c.render(w, r, http.StatusOK, "key", v)
	case len(f.Rows) == 0:
		c.render(w, r, http.StatusOK, "found", map[string]any{"Found": f, "Kind": p.Kind,
			"Kinds": []string{deadletter.FindEvent, deadletter.FindRow, deadletter.FindKey}})
	default:
		row := f.Rows[0]
		v := map[string]any{"Row": row, "Holds": append(row.Holds, c.liveHolds(r, row)...)}
		if c.cfg.Route != nil {
			if dest, topic, ok := c.cfg.Route(row.Topic); ok {
				v["Route"] = dest + " (as " + topic + ")"
			}
		}
		c.render(w, r, http.StatusOK, "message", v)
	}
}

// liveHolds are what of the relay's live state holds a pending row: its
// destination's open breaker, its topic or a partition of it paused, or no
// route for its topic.
func (c *console) liveHolds(r *http.Request, row deadletter.FoundRow) []deadletter.Hold {
	if row.State != "pending" || c.cfg.Route == nil {
		return nil
	}
	dest, topic, ok := c.cfg.Route(row.Topic)
	if !ok {
		return []deadletter.Hold{{Kind: deadletter.HoldNoRoute, Detail: fmt.Sprintf("no route takes topic %s: it is dead-lettered (no_route) when it is claimed", row.Topic)}}
	}
	if c.cfg.Status == nil {
		return nil
	}
	var holds []deadletter.Hold
	for _, d := range c.cfg.Status(r.Context()).Destinations {
		if d.Name != dest {
			continue
		}
		switch d.Breaker {
		case "open":
			until := d.OpenUntil
			holds = append(holds, deadletter.Hold{Kind: deadletter.HoldBreaker, Until: &until,
				Detail: fmt.Sprintf("destination %s's breaker is open: its rows wait without counting attempts until a probe at %s (%s)", dest, until.UTC().Format(time.RFC3339), d.LastError)})
		case "half_open":
			holds = append(holds, deadletter.Hold{Kind: deadletter.HoldBreaker,
				Detail: fmt.Sprintf("destination %s's breaker is half-open: a probe decides whether its rows go (%s)", dest, d.LastError)})
		}
		for _, p := range d.Pauses {
			if p.Topic != topic {
				continue
			}
			what := "topic " + topic
			if p.Partition >= 0 {
				what = fmt.Sprintf("partition %d of topic %s (it holds the row if its key falls there)", p.Partition, topic)
			}
			h := deadletter.Hold{Kind: deadletter.HoldPaused, Detail: fmt.Sprintf("%s is paused at %s (%s): %s", what, dest, p.State, p.LastError)}
			if !p.OpenUntil.IsZero() {
				until := p.OpenUntil
				h.Until = &until
			}
			holds = append(holds, h)
		}
	}
	return holds
}
