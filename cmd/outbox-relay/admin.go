package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/api"
	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/console"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/fleet"
	"github.com/outbox-relay/outbox-relay/relay"
)

// adminShutdown bounds how long the admin listener waits for requests in
// progress when the relay stops.
const adminShutdown = 5 * time.Second

// deadLetters is the configuration of an outbox's dead-letter store, for
// the relay's API and console and the command line alike: what an edit or
// a reroute must fit (the relay's payload cap, a route for a topic), and
// how Find tells a key's order.
func deadLetters(cfg *config.Config, schema, orderScope string) deadletter.Config {
	_, routes := cfg.DestinationList()
	return deadletter.Config{Schema: schema, AuditPayloads: cfg.Relay.AuditPayloads, SentRetention: cfg.Relay.SentRetention,
		OrderScope: relay.OrderScopeOf(routes, orderScope), MaxPayload: cfg.RelayConfig().EffectivePayloadCap(),
		CheckTopic: func(t string) error {
			if _, ok := relay.MatchRoute(routes, t); !ok {
				return errors.New("no route matches it")
			}
			return nil
		}}
}

// routeOf names the destination of a topic's rows and the topic they are
// published as.
func routeOf(cfg *config.Config) func(string) (string, string, bool) {
	_, routes := cfg.DestinationList()
	return func(topic string) (string, string, bool) {
		r, ok := relay.MatchRoute(routes, topic)
		return r.Destination, cmp.Or(r.Topic, topic), ok
	}
}

// admin is what the admin listener serves.
type admin struct {
	outboxes []*runOutbox
	registry *prometheus.Registry
	relay    *relay.Relay
	// redact takes the database URLs' passwords out of errors.
	redact func(string) string
	// draining is closed when the relay begins to stop.
	draining <-chan struct{}
	// tokens are the dead-letter API's; nil turns it off.
	tokens *access.Tokens
	// certs is the listeners' certificate; nil serves plain HTTP.
	certs *certificate
	// fleet is the coordination tables' store; nil outside a fleet.
	fleet *fleet.Store
}

// consoleShares reads a destination's shares for the console, nil outside
// a fleet.
func (ad admin) consoleShares() func(context.Context, string) ([]console.FleetShare, error) {
	if ad.fleet == nil {
		return nil
	}
	return func(ctx context.Context, destination string) ([]console.FleetShare, error) {
		shares, err := ad.fleet.Shares(ctx, destination)
		out := make([]console.FleetShare, len(shares))
		for i, sh := range shares {
			out[i] = console.FleetShare(sh)
		}
		return out, err
	}
}

// readyTimeout bounds the database check of one readiness probe.
const readyTimeout = 2 * time.Second

// startAdmin starts the admin listeners: health and metrics on
// admin.listen, and the dead-letter API when a token is configured, on
// admin.api_listen when set and otherwise beside them. With admin.tls they
// serve HTTPS. It returns a function that stops them.
func (a *app) startAdmin(ad admin) (stop func(), err error) {
	cfg := a.cfg
	ops := http.NewServeMux()
	ops.HandleFunc("GET /livez", ad.livez)
	ops.HandleFunc("GET /readyz", ad.readyz)
	ops.Handle("GET /metrics", promhttp.HandlerFor(ad.registry, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	}))
	apiState := "off (no admin token)"
	var apiH, ui http.Handler
	// One throttle for both: a guess is a guess, wherever it is made.
	throttle := access.DefaultThrottle(a.log)
	throttle.Proxies, _ = cfg.Admin.Proxies() // checked by Load
	if ad.tokens != nil {
		stores := make(map[string]*deadletter.Store, len(ad.outboxes))
		for _, o := range ad.outboxes {
			stores[o.name] = o.dead
		}
		var only *deadletter.Store
		if len(ad.outboxes) == 1 {
			only = ad.outboxes[0].dead
		}
		apiH, err = api.NewHandler(api.HandlerConfig{
			Store:    only,
			Outboxes: stores,
			Tokens:   ad.tokens,
			Throttle: throttle,
			Logger:   a.log,
		})
		if err != nil {
			return nil, err
		}
		apiState = api.Prefix
	}
	if ad.tokens != nil || cfg.Admin.OIDC.Enabled() {
		var outboxes []console.Outbox
		for _, o := range ad.outboxes {
			outboxes = append(outboxes, console.Outbox{Name: o.name, Dead: o.dead, History: o.history})
		}
		sso, err := consoleOIDC(cfg.Admin.OIDC, ad.outboxes[0])
		if err != nil {
			return nil, err
		}
		ui, err = console.New(console.Config{
			Outboxes:        outboxes,
			Tokens:          ad.tokens,
			OIDC:            sso,
			NoTokenLogin:    !cfg.Admin.ConsoleTokenLogin,
			Throttle:        throttle,
			Status:          consoleStatus(ad.relay, ad.outboxes, ad.redact),
			Route:           routeOf(a.cfg),
			Shares:          ad.consoleShares(),
			HistoryInterval: a.cfg.Admin.HistoryInterval,
			Redact:          ad.redact,
			Secure:          ad.certs != nil,
			Logger:          a.log,
		})
		if err != nil {
			return nil, err
		}
	}
	var tlsConf *tls.Config
	if ad.certs != nil {
		tlsConf = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: ad.certs.get}
	}
	var stops []func()
	stopAll := func() {
		for _, s := range stops {
			s()
		}
	}
	serve := func(what, addr string, h http.Handler, attrs ...any) (string, error) {
		bound, s, err := a.serveAdmin(what, addr, h, tlsConf, attrs...)
		if err != nil {
			stopAll()
			return "", err
		}
		stops = append(stops, s)
		return bound, nil
	}
	mount := func(mux *http.ServeMux) {
		if apiH != nil {
			mux.Handle(api.Prefix, apiH)
		}
		if ui != nil {
			mux.Handle(console.Prefix, ui)
		}
	}
	if ui != nil && cfg.Admin.APIListen != "" {
		only := http.NewServeMux()
		mount(only)
		bound, err := serve("dead-letter API listener", cfg.Admin.APIListen, only, slog.Any("tokens", ad.tokens.Names()),
			slog.String("console", console.Prefix))
		if err != nil {
			return nil, err
		}
		apiState = "on " + bound
	} else {
		mount(ops)
	}
	if cfg.Admin.Listen != "" {
		if _, err := serve("admin listener", cfg.Admin.Listen, ops, slog.String("dead_letter_api", apiState)); err != nil {
			return nil, err
		}
	}
	return stopAll, nil
}

// consoleOIDC is the console's single sign-on, its sessions kept in the
// first outbox's schema; nil when admin.oidc is not set.
func consoleOIDC(cfg config.AdminOIDC, first *runOutbox) (*console.OIDC, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	sessions, err := console.NewSessions(first.pool, first.settings.Database.Schema)
	if err != nil {
		return nil, err
	}
	roles, _ := cfg.Roles() // checked by Load
	return &console.OIDC{Issuer: cfg.Issuer, ClientID: cfg.ClientID, ClientSecret: cfg.Secret, RedirectURL: cfg.RedirectURL,
		Scopes: cfg.Scopes, GroupsClaim: cfg.GroupsClaim, GroupRoles: roles, Name: cfg.Name, Sessions: sessions}, nil
}

// adminTokens reads the dead-letter API's tokens; nil when none is
// configured.
func adminTokens(cfg config.Admin) (*access.Tokens, error) {
	if !cfg.APIEnabled() {
		return nil, nil
	}
	byName, problems := cfg.ReadTokens()
	if len(problems) > 0 {
		return nil, &config.Error{Problems: problems}
	}
	return access.NewTokens(byName)
}

// serveAdmin serves h on addr until the returned function is called, and
// returns the address it listens on.
func (a *app) serveAdmin(what, addr string, h http.Handler, tlsConf *tls.Config, attrs ...any) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", what, err)
	}
	bound = ln.Addr().String()
	scheme := "http"
	if tlsConf != nil {
		ln, scheme = tls.NewListener(ln, tlsConf), "https"
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error(what+" failed", slog.Any("error", err))
		}
	}()
	a.log.Info(what+" started", append([]any{slog.String("address", bound), slog.String("scheme", scheme)}, attrs...)...)
	return bound, func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminShutdown)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// certificate is a server certificate that can be replaced while it is
// served.
type certificate struct {
	cur atomic.Pointer[tls.Certificate]
}

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil }

// adminCertificate loads the admin listeners' certificate; nil without
// admin.tls.
func adminCertificate(t config.AdminTLS) (*certificate, error) {
	if !t.Enabled() {
		return nil, nil
	}
	cert, err := t.Load()
	if err != nil {
		return nil, err
	}
	c := &certificate{}
	c.cur.Store(&cert)
	return c, nil
}

// livez answers 200 while every worker loop makes progress, and 503 when
// one has been on a batch for longer than any batch can take, so that
// Kubernetes restarts the process. Its JSON names the build too.
func (ad admin) livez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	answer := struct {
		Status string `json:"status"`
		Error  string `json:"error,omitempty"`
		build
	}{Status: "ok", build: currentBuild()}
	if err := ad.relay.Wedged(); err != nil {
		answer.Status, answer.Error = "wedged", err.Error()
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(answer)
}

// readiness is the body of /readyz.
type readiness struct {
	Ready bool `json:"ready"`
	// Problems say why it is not ready, a line each.
	Problems []string `json:"problems,omitempty"`
	Draining bool     `json:"draining"`
	// Database and Notifications are the only outbox's, when there is
	// one; Outboxes lists every outbox's.
	Database      string         `json:"database,omitempty"`
	Notifications *notifications `json:"notifications,omitempty"`
	Outboxes      []outboxState  `json:"outboxes"`
	// Coordination is the fleet's: off without one, up while flow control
	// is shared, down while each replica has its own.
	Coordination *coordination      `json:"coordination,omitempty"`
	Destinations []destinationState `json:"destinations"`
}

type coordination struct {
	State    string `json:"state"` // up or down
	Replicas int    `json:"replicas"`
}

type outboxState struct {
	Name string `json:"name"`
	// Database is ok, "not reachable: …", or "starting" while the relay
	// waits for it or checks its schema.
	Database      string        `json:"database"`
	Notifications notifications `json:"notifications"`
	Capture       *captureState `json:"capture,omitempty"`
}

// captureState is an outbox captured from the write-ahead log.
type captureState struct {
	Slot string `json:"slot"`
	// Streaming says this replica streams from the slot; the others
	// stand by.
	Streaming bool `json:"streaming"`
	// Problem is why no replica can stream: the slot is missing or lost.
	Problem string `json:"problem,omitempty"`
}

type notifications struct {
	// State is off, starting, arriving, or "not arriving; polling".
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

type destinationState struct {
	Name string `json:"name"`
	// Circuit is closed, open or half_open, as the metrics name them.
	Circuit   string        `json:"circuit"`
	OpenUntil *time.Time    `json:"open_until,omitempty"`
	LastError string        `json:"last_error,omitempty"`
	Paused    []pausedState `json:"paused,omitempty"`
}

type pausedState struct {
	Topic     string `json:"topic"`
	Partition *int   `json:"partition,omitempty"`
	// State is waiting, or probing once the cool-down is over.
	State     string     `json:"state"`
	OpenUntil *time.Time `json:"open_until,omitempty"`
	LastError string     `json:"last_error"`
}

// readyz answers 200 while the relay can deliver: the database answers,
// no destination's circuit is open, an outbox captured from the log has a
// slot to stream from (not missing or lost), and the relay is not stopping.
// Otherwise 503. Either way the JSON body shows the database, the wake-up
// notifications (which a transaction-mode pooler silently stops: the
// relay then polls, and stays ready), every destination's circuit and its
// paused topics and partitions with their errors. A half-open circuit
// (cool-down over, probes allowed) is ready: it stays half-open until
// traffic confirms, which an idle destination may never send. A paused
// topic or partition is a fault of its rows' producers or of the cluster's
// set-up, not of this replica: it stays ready, and says so.
func (ad admin) readyz(w http.ResponseWriter, r *http.Request) {
	rd := readiness{Outboxes: []outboxState{}, Destinations: []destinationState{}}
	select {
	case <-ad.draining:
		rd.Draining = true
		rd.Problems = append(rd.Problems, "draining: the relay is stopping")
	default:
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	started := map[string]bool{}
	for _, o := range ad.relay.Outboxes() {
		started[o.Name] = o.Started
	}
	states := make([]outboxState, len(ad.outboxes))
	var wg sync.WaitGroup
	for i, o := range ad.outboxes {
		wg.Go(func() {
			st := outboxState{Name: o.name, Database: "ok", Notifications: notifications{State: "off"}}
			if err := o.pool.Ping(ctx); err != nil {
				st.Database = "not reachable: " + ad.redact(oneLine(err.Error()))
			} else if !started[o.name] {
				st.Database = "starting"
			}
			if o.listener != nil {
				st.Notifications.State, st.Notifications.Error = o.listener.Status()
			}
			if src := o.relay.Log; src != nil {
				st.Capture = &captureState{Slot: src.Slot(), Streaming: src.Streaming(), Problem: src.Problem()}
			}
			states[i] = st
		})
	}
	wg.Wait()
	for _, st := range states {
		what := "database"
		if len(states) > 1 {
			what = "outbox " + st.Name + ": database"
		}
		switch {
		case strings.HasPrefix(st.Database, "not reachable"):
			rd.Problems = append(rd.Problems, what+": not reachable")
		case st.Database == "starting":
			rd.Problems = append(rd.Problems, what+": starting")
		}
		if st.Capture != nil && st.Capture.Problem != "" {
			capture := "capture: "
			if len(states) > 1 {
				capture = "outbox " + st.Name + ": capture: "
			}
			rd.Problems = append(rd.Problems, capture+st.Capture.Problem)
		}
		rd.Outboxes = append(rd.Outboxes, st)
	}
	if len(states) == 1 {
		rd.Database, rd.Notifications = states[0].Database, &states[0].Notifications
	}
	if f, ok := ad.relay.Fleet(); ok {
		// Coordination down leaves the relay ready: each replica keeps
		// to its own share of the limits meanwhile.
		rd.Coordination = &coordination{State: "down", Replicas: f.Replicas}
		if f.Up {
			rd.Coordination.State = "up"
		}
	}
	for _, d := range ad.relay.Destinations() {
		ds := destinationState{Name: d.Name, Circuit: d.Breaker.String(), LastError: d.LastError}
		if d.Breaker == relay.BreakerOpen {
			ds.OpenUntil = &d.OpenUntil
			rd.Problems = append(rd.Problems, fmt.Sprintf("destination %s: failing; circuit open, its rows wait: %s", d.Name, d.LastError))
		}
		for _, p := range d.Paused {
			ps := pausedState{Topic: p.Topic, State: "probing", LastError: p.LastError}
			if p.Partition >= 0 {
				ps.Partition = &p.Partition
			}
			if p.State == relay.BreakerOpen {
				ps.State, ps.OpenUntil = "waiting", &p.OpenUntil
			}
			ds.Paused = append(ds.Paused, ps)
		}
		rd.Destinations = append(rd.Destinations, ds)
	}
	rd.Ready = len(rd.Problems) == 0
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !rd.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rd)
}
