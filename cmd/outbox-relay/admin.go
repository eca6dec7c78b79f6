package main

import (
	"context"
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
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
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

// readyz answers 200 while the relay can deliver: the database answers,
// no destination's circuit is open, and the relay is not stopping.
// Otherwise 503, with a line per problem. Paused topics and partitions
// are listed either way, a line each. A half-open circuit (cool-down
// over, probes allowed) is ready: it stays half-open until traffic
// confirms, which an idle destination may never send.
func (ad admin) readyz(w http.ResponseWriter, r *http.Request) {
	var problems []string
	select {
	case <-ad.draining:
		problems = append(problems, "draining: the relay is stopping")
	default:
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := ad.pool.Ping(ctx); err != nil {
		problems = append(problems, "database: not reachable")
	}
	var notes []string
	for _, d := range ad.relay.Destinations() {
		if d.Breaker == relay.BreakerOpen {
			problems = append(problems, fmt.Sprintf("destination %s: failing; circuit open, its rows wait", d.Name))
		}
		for _, p := range d.Paused {
			what := "topic " + p.Topic
			if p.Partition >= 0 {
				what = fmt.Sprintf("partition %d of topic %s", p.Partition, p.Topic)
			}
			state := "paused, its rows wait"
			if p.State != relay.BreakerOpen {
				state = "paused, its next rows probe it"
			}
			notes = append(notes, fmt.Sprintf("destination %s: %s failing; %s: %s", d.Name, what, state, p.LastError))
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if len(problems) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		for _, p := range append(problems, notes...) {
			fmt.Fprintln(w, p)
		}
		return
	}
	// A paused topic or partition is a fault of its rows' producers or of
	// the cluster's set-up, not of this replica: it stays ready, and says
	// so.
	fmt.Fprintln(w, "ok")
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}
