package console

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pmezard/go-difflib/difflib"

	"github.com/outbox-relay/outbox-relay/deadletter"
)

// parsePages parses each page's template with the layout, and the live
// fragment alone.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"ago":   ago,
		"stamp": stamp,
		"key": func(k *string) string {
			if k == nil {
				return "(none)"
			}
			return *k
		},
		"bytes": func(n int64) string {
			const unit = 1024
			if n < unit {
				return fmt.Sprintf("%d B", n)
			}
			div, exp := int64(unit), 0
			for m := n / unit; m >= unit; m /= unit {
				div *= unit
				exp++
			}
			return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
		},
		"dash": func(s string) string {
			if s == "" {
				return "–"
			}
			return s
		},
		"clip": func(s string, n int) string {
			if len(s) <= n {
				return s
			}
			return strings.ToValidUTF8(s[:n], "") + "…"
		},
		"rate": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		// The actions on a selection of dead letters, whose buttons and
		// forms the pages build.
		"actions": deadletter.SelectionActions,
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"login", "error", "overview", "groups", "confirm", "result", "letters", "letter", "preview", "keys", "audit", "found", "message", "key", "destination"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/live.html", "templates/chart.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: page %s: %w", name, err)
		}
		pages[name] = t
	}
	t, err := template.New("live.html").Funcs(funcs).ParseFS(assets, "templates/live.html")
	if err != nil {
		return nil, fmt.Errorf("console: live fragment: %w", err)
	}
	pages["live"] = t
	return pages, nil
}

// page is what every page's layout needs.
type page struct {
	Title    string
	Nav      string
	Session  session
	Outbox   string
	Outboxes []string
	Data     any
}

func (c *console) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	t := c.pages[name]
	p := page{Session: sessionOf(r), Data: data, Nav: name}
	for _, o := range c.cfg.Outboxes {
		p.Outboxes = append(p.Outboxes, o.Name)
	}
	if o, err := c.outbox(r); err == nil {
		p.Outbox = o.Name
	}
	var b bytes.Buffer
	exec := "layout.html"
	if name == "live" {
		exec = "live.html"
	}
	if err := t.ExecuteTemplate(&b, exec, p); err != nil {
		c.cfg.Logger.Error("console page failed", "page", name, "error", err)
		http.Error(w, "the page could not be drawn; see the relay's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail shows what went wrong; nothing was changed.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, msg string, problems ...string) {
	c.render(w, r, status, "error", map[string]any{"Status": status, "Message": msg, "Problems": problems})
}

// failErr shows err: input problems as a 400 with each problem, a missing
// row as a 404, the rest as a 500 whose cause is in the log.
func (c *console) failErr(w http.ResponseWriter, r *http.Request, err error) {
	var ie *deadletter.InputError
	switch {
	case errors.As(err, &ie):
		c.fail(w, r, http.StatusBadRequest, "Nothing was changed: the input is not valid.", ie.Problems...)
	case errors.Is(err, deadletter.ErrNotFound), errors.Is(err, deadletter.ErrNotParked):
		c.fail(w, r, http.StatusNotFound, "Not found: "+err.Error())
	case errors.Is(err, deadletter.ErrNotDeadLettered), errors.Is(err, deadletter.ErrChanged):
		c.fail(w, r, http.StatusConflict, "Nothing was changed: "+err.Error())
	case r.Context().Err() != nil:
	default:
		c.cfg.Logger.Error("console request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		c.fail(w, r, http.StatusInternalServerError, "The request failed; see the relay's log.")
	}
}

// store is the dead-letter store of the request's outbox, or a 404.
func (c *console) store(w http.ResponseWriter, r *http.Request) (*deadletter.Store, bool) {
	o, err := c.outbox(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return nil, false
	}
	return o.Dead, true
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	o, err := c.outbox(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return
	}
	rng := cmp.Or(r.FormValue("range"), "hour")
	span, ok := trendRanges[rng]
	if !ok {
		c.fail(w, r, http.StatusBadRequest, "No such range: "+rng+". The trends cover the last hour (range=hour) or the last day (range=day).")
		return
	}
	v := c.liveData(r)
	if o.History != nil {
		tr, err := o.History.Read(r.Context(), span.window, span.step, c.cfg.HistoryInterval < time.Minute)
		if err != nil {
			c.cfg.Logger.Error("console trends failed", "outbox", o.Name, "error", err)
			v.Trends = &trendsView{Range: rng, Label: span.label, Error: "The history could not be read: " + c.cfg.Redact(err.Error())}
		} else {
			tv := trendsOf(tr, rng, span.label)
			v.Trends = &tv
		}
	}
	c.render(w, r, http.StatusOK, "overview", v)
}

// live is the overview's changing part, which the page fetches again
// every few seconds.
func (c *console) live(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "live", c.liveData(r))
}

type liveView struct {
	Shown    bool
	Outboxes []liveOutbox
	// Capture says an outbox is captured from the log.
	Capture bool
	Dests   []DestinationStatus
	At      time.Time
	// Trends are the outbox's history, on the overview only.
	Trends *trendsView
}

type liveOutbox struct {
	OutboxStatus
	DeliveredPerSec, FailedPerSec float64
	DeadLettered, Parked          int
	StatsError                    string
}

func (c *console) liveData(r *http.Request) liveView {
	v := liveView{At: c.cfg.now()}
	var st Status
	if c.cfg.Status != nil {
		st, v.Shown = c.cfg.Status(r.Context()), true
	}
	per := c.rates.per(v.At, st.Outboxes)
	byName := map[string]OutboxStatus{}
	for _, o := range st.Outboxes {
		byName[o.Name] = o
	}
	for _, o := range c.cfg.Outboxes {
		lo := liveOutbox{OutboxStatus: byName[o.Name]}
		lo.Name = o.Name
		lo.DeliveredPerSec, lo.FailedPerSec = per[o.Name][0], per[o.Name][1]
		if ds, err := c.deadStats(r.Context(), o); err != nil {
			lo.StatsError = "dead letters unknown: " + c.cfg.Redact(err.Error())
		} else {
			lo.DeadLettered, lo.Parked = ds.DeadLettered, ds.ParkedKeys
		}
		v.Outboxes = append(v.Outboxes, lo)
		v.Capture = v.Capture || lo.Capture != nil
	}
	v.Dests = st.Destinations
	return v
}

// filtered is the store of the request's outbox and the filter its query
// gives, or a page that says what is wrong with them.
func (c *console) filtered(w http.ResponseWriter, r *http.Request) (*deadletter.Store, deadletter.Filter, bool) {
	st, ok := c.store(w, r)
	if !ok {
		return nil, deadletter.Filter{}, false
	}
	f, err := deadletter.ParseFilter(r.FormValue)
	if err != nil {
		c.failErr(w, r, err)
		return nil, deadletter.Filter{}, false
	}
	return st, f, true
}

func (c *console) groups(w http.ResponseWriter, r *http.Request) {
	st, f, ok := c.filtered(w, r)
	if !ok {
		return
	}
	page, err := st.Groups(r.Context(), deadletter.GroupParams{Filter: f, Limit: 200})
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	suffix := ""
	if fields := filterFields(r); len(fields) > 0 {
		suffix = "&" + fields.Encode()
	}
	c.render(w, r, http.StatusOK, "groups", map[string]any{"Page": page, "Q": r.URL.Query(), "Reasons": deadletter.Reasons,
		"Filter": template.URL(suffix)}) //nolint:gosec // url.Values.Encode escapes every value
}

// selectionAction returns the action on a selection the request's path
// names.
func selectionAction(r *http.Request) (deadletter.ActionInfo, bool) {
	a, ok := deadletter.LookupAction(r.PathValue("action"))
	return a, ok && a.Apply != nil
}

// inputs reads the action's inputs from the form.
func inputs(r *http.Request, a deadletter.ActionInfo) deadletter.Inputs {
	in := deadletter.Inputs{}
	for _, i := range a.Inputs {
		if v := strings.TrimSpace(r.FormValue(i.Name)); v != "" {
			in[i.Name] = v
		}
	}
	return in
}

// groupRequest reads an action on a failure group: the store, the action,
// and the selection: the group's rows that the groups page's filter, which
// the confirm page carries on, matches.
func (c *console) groupRequest(w http.ResponseWriter, r *http.Request) (*deadletter.Store, deadletter.ActionInfo, deadletter.Filter, bool) {
	a, ok := selectionAction(r)
	if !ok {
		c.fail(w, r, http.StatusNotFound, "No such action: "+r.PathValue("action"))
		return nil, a, deadletter.Filter{}, false
	}
	st, f, ok := c.filtered(w, r)
	if !ok {
		return nil, a, f, false
	}
	f.Group = r.PathValue("group")
	if err := f.Validate(); err != nil {
		c.failErr(w, r, err)
		return nil, a, f, false
	}
	return st, a, f, true
}

// confirmGroup shows what an action on a group would change, by a dry
// run, and asks to go on.
func (c *console) confirmGroup(w http.ResponseWriter, r *http.Request) {
	st, a, f, ok := c.groupRequest(w, r)
	if !ok {
		return
	}
	g, err := c.findGroup(r, st, f)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	dry, err := c.bulk(r, st, a, f, true, "")
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "confirm", map[string]any{"Action": a, "Group": g, "Count": dry.Count, "Filter": filterFields(r)})
}

func (c *console) actOnGroup(w http.ResponseWriter, r *http.Request) {
	st, a, f, ok := c.groupRequest(w, r)
	if !ok {
		return
	}
	res, err := c.bulk(r, st, a, f, false, r.PostForm.Get("why"))
	c.done(w, r, res, err, a.Past, "groups")
}

// filterFields are the filter's fields the request gives, to carry on
// to a group's pages, whose path names the group.
func filterFields(r *http.Request) url.Values {
	out := url.Values{}
	for _, name := range deadletter.FilterFieldNames() {
		if v := r.FormValue(name); v != "" && name != "group" {
			out.Set(name, v)
		}
	}
	return out
}

func (c *console) bulk(r *http.Request, st *deadletter.Store, a deadletter.ActionInfo, f deadletter.Filter, dry bool, reason string) (*deadletter.Result, error) {
	p := deadletter.BulkParams{Selection: deadletter.Selection{Filter: f}, DryRun: dry, Actor: actor(r), Reason: reason}
	if dry {
		// Nothing is locked or changed: the largest batches, the fewest
		// round trips. The inputs are checked when the action is taken.
		p.BatchSize = deadletter.MaxBatchSize
		return st.Preview(r.Context(), a.Name, p)
	}
	return a.Run(r.Context(), st, p, inputs(r, a))
}

// done shows what an action changed, with a link back to the list it
// came from, or why it changed nothing.
func (c *console) done(w http.ResponseWriter, r *http.Request, res *deadletter.Result, err error, past, back string) {
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "result", map[string]any{"Result": res, "Past": past,
		"Back": Prefix + back + "?outbox=" + url.QueryEscape(r.FormValue("outbox"))})
}

// findGroup returns the failure group f selects, as far as f matches it.
func (c *console) findGroup(r *http.Request, st *deadletter.Store, f deadletter.Filter) (deadletter.Group, error) {
	page, err := st.Groups(r.Context(), deadletter.GroupParams{Filter: f, Limit: 1})
	if err != nil {
		return deadletter.Group{}, err
	}
	if len(page.Groups) == 0 {
		return deadletter.Group{}, fmt.Errorf("failure group %s: %w (its rows may have been replayed or discarded)", f.Group, deadletter.ErrNotFound)
	}
	return page.Groups[0], nil
}

func (c *console) letters(w http.ResponseWriter, r *http.Request) {
	st, f, ok := c.filtered(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	page, err := st.List(r.Context(), deadletter.ListParams{Filter: f, Status: q.Get("status"), Cursor: q.Get("cursor")})
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	next := nextPage("dead-letters", q, page.Next)
	c.render(w, r, http.StatusOK, "letters", map[string]any{"Page": page, "Q": q, "Next": next, "Reasons": deadletter.Reasons})
}

// rowView is a row's page.
type rowView struct {
	Row      *deadletter.Detail
	Payload  string // shown as text
	Encoding string // json, text or hex
	Headers  string
	Audit    []deadletter.AuditRecord
}

func (c *console) rowView(r *http.Request, st *deadletter.Store, ref deadletter.Ref) (rowView, error) {
	d, err := st.Get(r.Context(), ref)
	if err != nil {
		return rowView{}, err
	}
	if !sessionOf(r).Payloads() {
		d.HidePayload()
	}
	v := rowView{Row: d, Headers: indentJSON(d.Headers)}
	switch deadletter.PayloadEncoding(d.Payload) {
	case deadletter.EncodingJSON:
		v.Payload, v.Encoding = indentJSON(d.Payload), "json"
	case deadletter.EncodingText:
		v.Payload, v.Encoding = string(d.Payload), "text"
	default:
		v.Payload, v.Encoding = hex.Dump(d.Payload), "hex"
	}
	audit, err := st.Audit(r.Context(), deadletter.AuditParams{Row: d.ID, Limit: 100})
	if err != nil {
		return rowView{}, err
	}
	v.Audit = audit.Records
	return v, nil
}

func indentJSON(b []byte) string {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}

func (c *console) letter(w http.ResponseWriter, r *http.Request) {
	if _, _, v, ok := c.row(w, r); ok {
		c.render(w, r, http.StatusOK, "letter", v)
	}
}

// row is the row the request's path names, in the request's outbox.
func (c *console) row(w http.ResponseWriter, r *http.Request) (*deadletter.Store, deadletter.Ref, rowView, bool) {
	st, ok := c.store(w, r)
	if !ok {
		return nil, deadletter.Ref{}, rowView{}, false
	}
	ref, err := deadletter.ParseRef(r.PathValue("ref"))
	if err != nil {
		c.failErr(w, r, err)
		return nil, deadletter.Ref{}, rowView{}, false
	}
	v, err := c.rowView(r, st, ref)
	if err != nil {
		c.failErr(w, r, err)
		return nil, deadletter.Ref{}, rowView{}, false
	}
	return st, ref, v, true
}

// editForm is an edit as the row's page submits it. A field the form does
// not carry is left as it is. Version is the row's when the page showed
// it: the preview and the save refuse a row changed since.
type editForm struct {
	Topic, Headers, Payload, Reason string
	HasHeaders, HasPayload          bool
	AllowNonJSON                    bool
	Version                         string
}

// readEdit reads an edit. Browsers send a text area's line breaks as CRLF
// whatever they were: they are made LF again, as the row's were shown.
func readEdit(r *http.Request) editForm {
	lf := strings.NewReplacer("\r\n", "\n")
	return editForm{Topic: strings.TrimSpace(r.PostForm.Get("topic")), Headers: lf.Replace(r.PostForm.Get("headers")),
		Payload: lf.Replace(r.PostForm.Get("payload")), Reason: r.PostForm.Get("why"), AllowNonJSON: r.PostForm.Get("allow_non_json") != "",
		HasHeaders: r.PostForm.Has("headers"), HasPayload: r.PostForm.Has("payload"), Version: r.PostForm.Get("version")}
}

// params are the edit's, keeping only what changed from v.
func (e editForm) params(v rowView, r *http.Request, c *console) deadletter.EditParams {
	p := deadletter.EditParams{AllowNonJSON: e.AllowNonJSON,
		Actor: actor(r), Reason: e.Reason, Version: e.Version}
	if e.Topic != "" && e.Topic != v.Row.Topic {
		p.Topic = e.Topic
	}
	if e.HasHeaders && strings.TrimSpace(e.Headers) != strings.TrimSpace(v.Headers) {
		p.Headers = json.RawMessage(e.Headers)
	}
	if e.HasPayload && e.Payload != v.Payload {
		p.Payload = []byte(e.Payload)
	}
	return p
}

// editable refuses the edit of a binary payload, which a form would
// garble.
func (c *console) editable(w http.ResponseWriter, r *http.Request, v rowView) bool {
	if v.Encoding == "hex" {
		c.fail(w, r, http.StatusBadRequest, "Nothing was changed: this payload is binary. Edit it with the command line (dlq edit --payload FILE).")
		return false
	}
	return true
}

// preview shows the edit as a diff against the row, to confirm.
func (c *console) preview(w http.ResponseWriter, r *http.Request) {
	_, _, v, ok := c.row(w, r)
	if !ok {
		return
	}
	if !c.editable(w, r, v) {
		return
	}
	e := readEdit(r)
	if !c.unchanged(w, r, e, v) {
		return
	}
	p := e.params(v, r, c)
	diff := func(name, a, b string) string {
		if a == b {
			return ""
		}
		s, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: difflib.SplitLines(a + "\n"), B: difflib.SplitLines(b + "\n"),
			FromFile: name + " (now)", ToFile: name + " (edited)", Context: 3})
		return s
	}
	diffs := []string{}
	if p.Topic != "" {
		diffs = append(diffs, diff("topic", v.Row.Topic, p.Topic))
	}
	if p.Headers != nil {
		diffs = append(diffs, diff("headers", v.Headers, e.Headers))
	}
	if p.Payload != nil {
		diffs = append(diffs, diff("payload", v.Payload, e.Payload))
	}
	c.render(w, r, http.StatusOK, "preview", map[string]any{"Row": v.Row, "Edit": e, "Diffs": diffs})
}

// unchanged refuses an edit made from a version of the row that it no
// longer holds (another edit came first): the edit's fields are compared
// with the row as it is now, which is not what the page showed. The store
// checks again under the row's lock.
func (c *console) unchanged(w http.ResponseWriter, r *http.Request, e editForm, v rowView) bool {
	if e.Version != "" && e.Version != v.Row.Version {
		c.failErr(w, r, fmt.Errorf("row %d has %w: open it again to edit what it holds now", v.Row.ID, deadletter.ErrChanged))
		return false
	}
	return true
}

// edit applies an edit that the preview showed, and replays the row.
func (c *console) edit(w http.ResponseWriter, r *http.Request) {
	st, ref, v, ok := c.row(w, r)
	if !ok || !c.editable(w, r, v) {
		return
	}
	e := readEdit(r)
	if !c.unchanged(w, r, e, v) {
		return
	}
	p := e.params(v, r, c)
	p.Ref = ref
	if p.Topic == "" && p.Headers == nil && p.Payload == nil {
		c.fail(w, r, http.StatusBadRequest, "Nothing was changed: the edit changes nothing. Use Replay to send the row as it is.")
		return
	}
	res, err := st.Edit(r.Context(), p)
	c.done(w, r, res, err, "edited and replayed", "dead-letters")
}

// actOnRow replays or discards one row.
func (c *console) actOnRow(w http.ResponseWriter, r *http.Request) {
	st, ok := c.store(w, r)
	if !ok {
		return
	}
	a, ok := selectionAction(r)
	if !ok {
		c.fail(w, r, http.StatusNotFound, "No such action: "+r.PathValue("action"))
		return
	}
	ref, err := deadletter.ParseRef(r.PathValue("ref"))
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	p := deadletter.BulkParams{Selection: deadletter.Selection{Refs: []deadletter.Ref{ref}}, Actor: actor(r), Reason: r.PostForm.Get("why")}
	res, err := a.Run(r.Context(), st, p, inputs(r, a))
	c.done(w, r, res, err, a.Past, "dead-letters")
}

func (c *console) keys(w http.ResponseWriter, r *http.Request) {
	st, ok := c.store(w, r)
	if !ok {
		return
	}
	keys, err := st.Keys(r.Context(), 0)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "keys", map[string]any{"Keys": keys, "Limited": len(keys) == deadletter.MaxListLimit})
}

func (c *console) release(w http.ResponseWriter, r *http.Request) {
	st, ok := c.store(w, r)
	if !ok {
		return
	}
	res, err := st.Release(r.Context(), deadletter.ReleaseParams{Key: r.PostForm.Get("key"), Discard: r.PostForm.Get("discard") != "",
		Reason: r.PostForm.Get("why"), Actor: actor(r)})
	c.done(w, r, res, err, "released", "parked-keys")
}

func (c *console) audit(w http.ResponseWriter, r *http.Request) {
	st, ok := c.store(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	p := deadletter.AuditParams{Action: q.Get("action"), Actor: q.Get("actor"), Cursor: q.Get("cursor")}
	if s := q.Get("row"); s != "" {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id < 1 {
			c.fail(w, r, http.StatusBadRequest, "Not a row id: "+s)
			return
		}
		p.Row = id
	}
	page, err := st.Audit(r.Context(), p)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	next := nextPage("audit", q, page.Next)
	c.render(w, r, http.StatusOK, "audit", map[string]any{"Page": page, "Q": q, "Next": next, "Actions": deadletter.ActionNames()})
}

// nextPage links to the page after this one: the same query with cursor;
// none without a cursor.
func nextPage(path string, q url.Values, cursor string) string {
	if cursor == "" {
		return ""
	}
	nq := url.Values{}
	for k, v := range q {
		nq[k] = v
	}
	nq.Set("cursor", cursor)
	return Prefix + path + "?" + nq.Encode()
}

// ago says how long ago t was, roughly.
func ago(t any) string {
	var at time.Time
	switch v := t.(type) {
	case time.Time:
		at = v
	case *time.Time:
		if v == nil {
			return "–"
		}
		at = *v
	default:
		return ""
	}
	d := time.Since(at)
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h ago"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d ago"
}

func stamp(t any) string {
	switch v := t.(type) {
	case time.Time:
		return v.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if v != nil {
			return v.UTC().Format("2006-01-02 15:04:05Z")
		}
	}
	return "–"
}
