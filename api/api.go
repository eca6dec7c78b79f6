// Package api serves the dead-letter operations over HTTP: the same
// operations as the command line, as JSON, each request authenticated with
// a named bearer token (see package access).
package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/methods"
)

// MaxRequestBytes bounds an API request body.
const MaxRequestBytes = 16 << 20

// Prefix starts every path of the API.
const Prefix = "/api/v1/"

// HandlerConfig configures the dead-letter HTTP API.
type HandlerConfig struct {
	// Store is the outbox served at Prefix: the relay's only one.
	// Without it, only the paths of Outboxes are served.
	Store *deadletter.Store
	// Outboxes are the relay's outboxes by name, each served under
	// Prefix + "outboxes/{outbox}/".
	Outboxes map[string]*deadletter.Store
	// Tokens are the bearer tokens a request may carry, by name. Required:
	// the API is off without one.
	Tokens *access.Tokens
	// Throttle slows down guessing tokens, by client address; nil does
	// not.
	Throttle *access.Throttle
	Logger   *slog.Logger
}

// NewHandler returns the dead-letter API: the same operations as the
// command line, as JSON over HTTP, each request authenticated with the
// bearer token. Mount it at Prefix.
func NewHandler(cfg HandlerConfig) (http.Handler, error) {
	if cfg.Store == nil && len(cfg.Outboxes) == 0 {
		return nil, errors.New("dead-letter API: no store")
	}
	if cfg.Tokens == nil {
		return nil, errors.New("dead-letter API: no token; the API is off without one")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &api{cfg: cfg}
	table, err := h.routes()
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	p := strings.TrimSuffix(Prefix, "/")
	for _, rt := range table {
		handler := h.allow(rt.Role, h.in(rt.handler))
		mux.HandleFunc(rt.Method+" "+p+rt.Path, handler)
		mux.HandleFunc(rt.Method+" "+p+"/outboxes/{outbox}"+rt.Path, handler)
	}
	mux.HandleFunc(p+"/", func(w http.ResponseWriter, r *http.Request) {
		if allow := methods.Allowed(mux, r, p+"/"); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+"; it takes "+methods.List(allow))
			return
		}
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return h.authenticate(mux), nil
}

type api struct {
	cfg HandlerConfig
}

// Route is one of the API's endpoints, below Prefix (and below
// Prefix/outboxes/{outbox}), and the role it needs.
type Route struct {
	Method, Path string
	Role         access.Role
	handler      http.HandlerFunc
}

// Routes are the API's endpoints, each with the role it needs.
func Routes() []Route {
	table, _ := (&api{}).routes()
	return table
}

// routes is the API's table of endpoints: every one names the role it
// needs. Reads need a viewer (a reader to see payloads); what changes
// rows, dry runs included, needs an operator.
func (h *api) routes() ([]Route, error) {
	var table []Route
	handle := func(route string, role access.Role, handler http.HandlerFunc) {
		method, path, _ := strings.Cut(route, " ")
		table = append(table, Route{Method: method, Path: path, Role: role, handler: handler})
	}
	handle("GET /dead-letters", access.Viewer, h.list)
	handle("GET /dead-letters/{ref}", access.Viewer, h.show)
	handle("GET /dead-letter-groups", access.Viewer, h.groups)
	handle("GET /parked-keys", access.Viewer, h.keys)
	// Actions on a selection share one handler; edit and release have
	// their own.
	actions := map[string]http.HandlerFunc{deadletter.ActionEdit: h.edit, deadletter.ActionRelease: h.release}
	for _, a := range deadletter.Actions {
		handler, ok := actions[a.Name]
		if a.Apply != nil {
			handler, ok = h.selection(a), true
		}
		if !ok {
			return nil, fmt.Errorf("dead-letter API: no handler for action %s", a.Name)
		}
		handle(a.Route, access.Operator, handler)
	}
	handle("GET /audit", access.Viewer, h.audit)
	handle("GET /stats", access.Viewer, h.stats)
	handle("GET /find", access.Viewer, h.find)
	return table, nil
}

type principalKey struct{}

// principal is who the request comes from.
func principal(r *http.Request) access.Principal {
	p, _ := r.Context().Value(principalKey{}).(access.Principal)
	return p
}

// allow runs next for a principal whose role allows needs, and answers
// others 403, naming the role.
func (h *api) allow(needs access.Role, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p := principal(r); !p.Role.Allows(needs) {
			writeError(w, http.StatusForbidden, p.Denied(needs))
			return
		}
		next(w, r)
	}
}

// showsPayloads says the request's principal may see payloads.
func showsPayloads(r *http.Request) bool { return principal(r).Role.Allows(access.Reader) }

type storeKey struct{}

// in runs next on the store of the request's outbox: the one its path
// names, or Store.
func (h *api) in(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st := h.cfg.Store
		if name := r.PathValue("outbox"); name != "" {
			st = h.cfg.Outboxes[name]
			if st == nil {
				writeError(w, http.StatusNotFound, fmt.Sprintf("no outbox %q; this relay serves %s", name, strings.Join(h.outboxNames(), ", ")))
				return
			}
		} else if st == nil {
			writeError(w, http.StatusNotFound, fmt.Sprintf("this relay serves several outboxes (%s): name one, as in %soutboxes/{outbox}%s",
				strings.Join(h.outboxNames(), ", "), Prefix, strings.TrimPrefix(r.URL.Path, strings.TrimSuffix(Prefix, "/"))))
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), storeKey{}, st)))
	}
}

func (h *api) outboxNames() []string {
	names := slices.Collect(maps.Keys(h.cfg.Outboxes))
	slices.Sort(names)
	return names
}

// store is the store of the request's outbox.
func store(r *http.Request) *deadletter.Store {
	return r.Context().Value(storeKey{}).(*deadletter.Store)
}

// authenticate answers 401 to any request without an accepted token,
// before anything else is looked at, and passes on the token's name.
func (h *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := h.cfg.Throttle.Client(r)
		if wait := h.cfg.Throttle.Wait(client); wait > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many wrong tokens from %s: try again in %s", client, wait.Round(time.Second)))
			return
		}
		given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		name, role, matched := h.cfg.Tokens.Match(given)
		if ok && !matched {
			h.cfg.Throttle.Failed(client, "API token")
		}
		if !ok || !matched {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outbox-relay"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		p := access.Principal{Name: name, Source: "api", Credential: name, Role: role}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

func (h *api) list(w http.ResponseWriter, r *http.Request) {
	q, f, limit, err := filteredQuery(r, "status", "cursor")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	page, err := store(r).List(r.Context(), deadletter.ListParams{Filter: f, Status: q.Get("status"), Limit: limit, Cursor: q.Get("cursor")})
	h.reply(w, r, page, err)
}

func (h *api) groups(w http.ResponseWriter, r *http.Request) {
	_, f, limit, err := filteredQuery(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	page, err := store(r).Groups(r.Context(), deadletter.GroupParams{Filter: f, Limit: limit})
	h.reply(w, r, page, err)
}

// filteredQuery reads a query of a Filter's parameters, limit, and the
// other parameters named: the query, the filter and the limit.
func filteredQuery(r *http.Request, other ...string) (url.Values, deadletter.Filter, int, error) {
	q, err := query(r, append(append(deadletter.FilterFieldNames(), "limit"), other...)...)
	if err != nil {
		return nil, deadletter.Filter{}, 0, err
	}
	f, err := deadletter.ParseFilter(q.Get)
	if err != nil {
		return nil, deadletter.Filter{}, 0, err
	}
	limit, err := intParam(q, "limit")
	return q, f, limit, err
}

func (h *api) show(w http.ResponseWriter, r *http.Request) {
	if _, err := query(r); err != nil {
		h.fail(w, r, err)
		return
	}
	ref, err := deadletter.ParseRef(r.PathValue("ref"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d, err := store(r).Get(r.Context(), ref)
	switch {
	case err != nil:
	case showsPayloads(r):
		w.Header().Set("ETag", strconv.Quote(d.Version))
	default:
		// The version is a digest of the payload: it would confirm a
		// guess of it. A viewer cannot edit, and needs none.
		d.HidePayload()
	}
	h.reply(w, r, d, err)
}

// bulkRequest is the body of replay and discard.
type bulkRequest struct {
	IDs       refList           `json:"ids"`
	Filter    deadletter.Filter `json:"filter"`
	All       bool              `json:"all"`
	DryRun    bool              `json:"dry_run"`
	BatchSize int               `json:"batch_size"`
	// Rate is at most this many rows per second; 0 for no limit.
	Rate   float64 `json:"rate"`
	Reason string  `json:"reason"`
	Actor  string  `json:"actor"`
}

// selection handles an action on a selection: the fields of bulkRequest,
// and the action's inputs as JSON strings.
func (h *api) selection(a deadletter.ActionInfo) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var fields map[string]json.RawMessage
		if err := decode(r, &fields); err != nil {
			h.fail(w, r, err)
			return
		}
		in := deadletter.Inputs{}
		for _, i := range a.Inputs {
			raw, ok := fields[i.Name]
			delete(fields, i.Name)
			if !ok || string(raw) == "null" {
				continue
			}
			var v string
			if err := json.Unmarshal(raw, &v); err != nil {
				h.fail(w, r, &deadletter.InputError{Problems: []string{fmt.Sprintf("%s: give a string: %s", i.Name, i.Usage)}})
				return
			}
			in[i.Name] = v
		}
		var req bulkRequest
		if err := strictJSON(fields, &req); err != nil {
			h.fail(w, r, err)
			return
		}
		refs, err := deadletter.ParseRefs(req.IDs)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		p := deadletter.BulkParams{
			Selection: deadletter.Selection{Refs: refs, Filter: req.Filter, All: req.All},
			DryRun:    req.DryRun, BatchSize: req.BatchSize, Rate: req.Rate, Actor: apiActor(r, req.Actor), Reason: req.Reason,
		}
		res, err := a.Run(r.Context(), store(r), p, in)
		h.reply(w, r, res, err)
	}
}

// strictJSON decodes the object fields into v, refusing unknown fields.
func strictJSON(fields map[string]json.RawMessage, v any) error {
	b, err := json.Marshal(fields)
	if err != nil {
		return &deadletter.InputError{Problems: []string{"request body: " + err.Error()}}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &deadletter.InputError{Problems: []string{"request body: " + err.Error()}}
	}
	return nil
}

// refList reads row ids given as numbers and event ids as strings.
type refList []string

func (l *refList) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return errors.New("ids must be an array of row ids and event ids")
	}
	out := make(refList, 0, len(raw))
	for _, r := range raw {
		var s string
		if err := json.Unmarshal(r, &s); err == nil {
			out = append(out, s)
			continue
		}
		var n json.Number
		if err := json.Unmarshal(r, &n); err != nil {
			return fmt.Errorf("ids: %s is neither a row id nor an event id", r)
		}
		out = append(out, n.String())
	}
	*l = out
	return nil
}

// editRequest is the body of edit. The payload is given in one of three
// forms: a JSON value, text, or base64.
type editRequest struct {
	Topic         string          `json:"topic"`
	Headers       json.RawMessage `json:"headers"`
	Payload       json.RawMessage `json:"payload"`
	PayloadText   *string         `json:"payload_text"`
	PayloadBase64 *string         `json:"payload_base64"`
	AllowNonJSON  bool            `json:"allow_non_json"`
	At            time.Time       `json:"at"`
	Reason        string          `json:"reason"`
	Actor         string          `json:"actor"`
}

func (h *api) edit(w http.ResponseWriter, r *http.Request) {
	ref, err := deadletter.ParseRef(r.PathValue("ref"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var req editRequest
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	p := deadletter.EditParams{Ref: ref, Topic: req.Topic, AllowNonJSON: req.AllowNonJSON, At: req.At, Actor: apiActor(r, req.Actor),
		Reason: req.Reason}
	// If-Match with the ETag of the row's GET: the edit applies only to
	// the content it was made from. * matches any row (a missing one is a
	// 404 anyway); a list of tags is refused: an edit is made from one
	// reading.
	if ms := r.Header.Values("If-Match"); len(ms) > 0 {
		m := strings.TrimSpace(strings.Join(ms, ","))
		if m != "*" {
			v, ok := strings.CutPrefix(m, `"`)
			v, closed := strings.CutSuffix(v, `"`)
			if !ok || !closed || v == "" || strings.ContainsAny(v, `",`) {
				h.fail(w, r, &deadletter.InputError{Problems: []string{"If-Match: give the one ETag the row's GET answered, in quotes"}})
				return
			}
			p.Version = v
		}
	}
	if req.Headers != nil && string(req.Headers) != "null" {
		p.Headers = req.Headers
	}
	forms := 0
	if req.Payload != nil && string(req.Payload) != "null" {
		p.Payload = []byte(req.Payload)
		forms++
	}
	if req.PayloadText != nil {
		p.Payload = []byte(*req.PayloadText)
		forms++
	}
	if req.PayloadBase64 != nil {
		b, err := base64.StdEncoding.DecodeString(*req.PayloadBase64)
		if err != nil {
			h.fail(w, r, &deadletter.InputError{Problems: []string{"payload_base64: " + err.Error()}})
			return
		}
		p.Payload = b
		forms++
	}
	if forms > 1 {
		h.fail(w, r, &deadletter.InputError{Problems: []string{"give the payload once: payload, payload_text or payload_base64"}})
		return
	}
	res, err := store(r).Edit(r.Context(), p)
	h.reply(w, r, res, err)
}

func (h *api) keys(w http.ResponseWriter, r *http.Request) {
	if _, err := query(r); err != nil {
		h.fail(w, r, err)
		return
	}
	keys, err := store(r).Keys(r.Context(), 0)
	// At most MaxListLimit keys are listed; limited says the list may
	// have been cut there.
	h.reply(w, r, map[string]any{"parked_keys": keys, "limited": len(keys) == deadletter.MaxListLimit}, err)
}

func (h *api) release(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Key     string `json:"key"`
		Discard bool   `json:"discard"`
		Reason  string `json:"reason"`
		Actor   string `json:"actor"`
	}
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := store(r).Release(r.Context(), deadletter.ReleaseParams{Key: req.Key, Discard: req.Discard, Reason: req.Reason, Actor: apiActor(r, req.Actor)})
	h.reply(w, r, res, err)
}

func (h *api) audit(w http.ResponseWriter, r *http.Request) {
	q, err := query(r, "action", "actor", "row", "since", "until", "limit", "cursor")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	p := deadletter.AuditParams{Action: q.Get("action"), Actor: q.Get("actor"), Cursor: q.Get("cursor")}
	var problems []string
	if p.Limit, err = intParam(q, "limit"); err != nil {
		problems = append(problems, err.Error())
	}
	row, err := intParam(q, "row")
	if err != nil {
		problems = append(problems, err.Error())
	}
	p.Row = int64(row)
	var window *deadletter.InputError
	if p.Since, p.Until, err = deadletter.ParseWindow(q.Get("since"), q.Get("until")); errors.As(err, &window) {
		problems = append(problems, window.Problems...)
	}
	if len(problems) > 0 {
		h.fail(w, r, &deadletter.InputError{Problems: problems})
		return
	}
	page, err := store(r).Audit(r.Context(), p)
	if err == nil && !showsPayloads(r) {
		page.HidePayloads()
	}
	h.reply(w, r, page, err)
}

func (h *api) stats(w http.ResponseWriter, r *http.Request) {
	if _, err := query(r); err != nil {
		h.fail(w, r, err)
		return
	}
	st, err := store(r).Stats(r.Context())
	h.reply(w, r, st, err)
}

// find finds a message: ?q= an event id, row id or key, with kind (event,
// row or key) to say which, and limit for a key's rows.
func (h *api) find(w http.ResponseWriter, r *http.Request) {
	q, err := query(r, "q", "kind", "limit")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	p := deadletter.FindParams{Query: q.Get("q"), Kind: q.Get("kind")}
	if l := q.Get("limit"); l != "" {
		if p.Limit, err = strconv.Atoi(l); err != nil || p.Limit < 1 {
			h.fail(w, r, &deadletter.InputError{Problems: []string{fmt.Sprintf("limit %q is not a positive integer", deadletter.ClipText(l))}})
			return
		}
	}
	f, err := store(r).Find(r.Context(), p)
	if err == nil && !showsPayloads(r) {
		f.HidePayloads()
	}
	h.reply(w, r, f, err)
}

// apiActor records who acted through the API: the name the caller gives
// (the token's name when it gives none), marked as coming from the API
// with the token it authenticated with and its role.
func apiActor(r *http.Request, name string) deadletter.Actor {
	p := principal(r)
	if strings.TrimSpace(name) == "" {
		name = p.Name
	}
	return deadletter.Actor{Name: name, Source: p.Source, Credential: p.Credential, Role: p.Role.String()}
}

// query returns the request's query parameters, refusing unknown and
// repeated ones.
func query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, &deadletter.InputError{Problems: []string{"query: " + err.Error()}}
	}
	var p []string
	for k, v := range q {
		switch {
		case !slices.Contains(allowed, k):
			p = append(p, fmt.Sprintf("unknown query parameter %q", k))
		case len(v) > 1:
			p = append(p, fmt.Sprintf("query parameter %q is given %d times", k, len(v)))
		}
	}
	if len(p) > 0 {
		slices.Sort(p)
		return nil, &deadletter.InputError{Problems: p}
	}
	return q, nil
}

func intParam(q url.Values, name string) (int, error) {
	s := q.Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, &deadletter.InputError{Problems: []string{fmt.Sprintf("%s %q is not a non-negative integer", name, s)}}
	}
	return n, nil
}

// decode reads a request body of exactly one JSON object with only known
// fields, whatever its content type says (curl -d sends form encoding).
func decode(r *http.Request, v any) error {
	if _, err := query(r); err != nil {
		return err
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, MaxRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return &deadletter.InputError{Problems: []string{"the request body is empty: send a JSON object"}}
		}
		return &deadletter.InputError{Problems: []string{"request body: " + err.Error()}}
	}
	if dec.More() {
		return &deadletter.InputError{Problems: []string{"request body: more than one JSON value"}}
	}
	return nil
}

func (h *api) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ie *deadletter.InputError
	switch {
	case errors.As(err, &ie):
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "invalid input", "problems": ie.Problems})
	case errors.Is(err, deadletter.ErrNotFound), errors.Is(err, deadletter.ErrNotParked):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, deadletter.ErrNotDeadLettered):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, deadletter.ErrChanged):
		writeError(w, http.StatusPreconditionFailed, err.Error())
	case r.Context().Err() != nil:
		// The caller went away; nothing to answer.
	default:
		h.cfg.Logger.Error("dead-letter API request failed", slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.Any("error", err))
		writeError(w, http.StatusInternalServerError, "internal error; see the relay's log")
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
