package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
)

// adminShutdown bounds how long the admin listener waits for requests in
// progress when the relay stops.
const adminShutdown = 5 * time.Second

// editChecks are what an edited dead letter must fit, for the command
// line and the API alike: the relay's payload cap, and a route for its
// topic.
func editChecks(cfg *config.Config) (maxPayload int, checkTopic func(string) error) {
	maxPayload = cfg.Relay.PayloadCap
	if maxPayload == 0 {
		maxPayload = cfg.Relay.MaxBatchBytes // the relay's default cap
	}
	_, routes := cfg.DestinationList()
	return maxPayload, func(t string) error {
		if _, ok := relay.MatchRoute(routes, t); !ok {
			return errors.New("no route matches it")
		}
		return nil
	}
}

// admin is what the admin listener serves.
type admin struct {
	pool     *pgxpool.Pool
	dead     *deadletter.Store
	registry *prometheus.Registry
	relay    *relay.Relay
	// listener is nil when wake-up notifications are off.
	listener *outbox.Listener
	// dsn is redacted from errors.
	dsn string
	// draining is closed when the relay begins to stop.
	draining <-chan struct{}
}

// readyTimeout bounds the database check of one readiness probe.
const readyTimeout = 2 * time.Second

// startAdmin starts the admin listener: health, metrics, and the
// dead-letter API when a token is configured. It returns a function that
// stops it.
func (a *app) startAdmin(ad admin) (stop func(), err error) {
	cfg := a.cfg
	if cfg.Admin.Listen == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /livez", ad.livez)
	mux.HandleFunc("GET /readyz", ad.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(ad.registry, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	}))
	api := "off (no admin.token)"
	if cfg.Admin.Token != "" {
		maxPayload, checkTopic := editChecks(cfg)
		h, err := deadletter.NewHandler(deadletter.HandlerConfig{
			Store:      ad.dead,
			Token:      cfg.Admin.Token,
			MaxPayload: maxPayload,
			CheckTopic: checkTopic,
			Logger:     a.log,
		})
		if err != nil {
			return nil, err
		}
		mux.Handle(deadletter.APIPrefix, h)
		api = deadletter.APIPrefix
	}
	ln, err := net.Listen("tcp", cfg.Admin.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("admin listener failed", slog.Any("error", err))
		}
	}()
	a.log.Info("admin listener started", slog.String("address", ln.Addr().String()), slog.String("dead_letter_api", api))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminShutdown)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// livez answers 200 while every worker loop makes progress, and 503 when
// one has been on a batch for longer than any batch can take, so that
// Kubernetes restarts the process.
func (ad admin) livez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := ad.relay.Wedged(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintln(w, "ok")
}

// readiness is the body of /readyz.
type readiness struct {
	Ready bool `json:"ready"`
	// Problems say why it is not ready, a line each.
	Problems      []string           `json:"problems,omitempty"`
	Draining      bool               `json:"draining"`
	Database      string             `json:"database"`
	Notifications notifications      `json:"notifications"`
	Destinations  []destinationState `json:"destinations"`
}

type notifications struct {
	// State is off, starting, arriving, or "not arriving; polling".
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

type destinationState struct {
	Name string `json:"name"`
	// Circuit is closed, open or half-open.
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
// no destination's circuit is open, and the relay is not stopping.
// Otherwise 503. Either way the JSON body shows the database, the wake-up
// notifications (which a transaction-mode pooler silently stops: the
// relay then polls, and stays ready), every destination's circuit and its
// paused topics and partitions with their errors. A half-open circuit
// (cool-down over, probes allowed) is ready: it stays half-open until
// traffic confirms, which an idle destination may never send. A paused
// topic or partition is a fault of its rows' producers or of the cluster's
// set-up, not of this replica: it stays ready, and says so.
func (ad admin) readyz(w http.ResponseWriter, r *http.Request) {
	rd := readiness{Database: "ok", Notifications: notifications{State: "off"}, Destinations: []destinationState{}}
	select {
	case <-ad.draining:
		rd.Draining = true
		rd.Problems = append(rd.Problems, "draining: the relay is stopping")
	default:
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := ad.pool.Ping(ctx); err != nil {
		rd.Database = "not reachable: " + config.Redact(oneLine(err.Error()), ad.dsn)
		rd.Problems = append(rd.Problems, "database: not reachable")
	}
	if ad.listener != nil {
		rd.Notifications.State, rd.Notifications.Error = ad.listener.Status()
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
