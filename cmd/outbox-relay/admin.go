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

// startAdmin starts the admin listener, with the dead-letter API when a
// token is configured, and returns a function that stops it.
func (a *app) startAdmin(pool *pgxpool.Pool) (stop func(), err error) {
	cfg := a.cfg
	if cfg.Admin.Listen == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	api := "off (no admin.token)"
	if cfg.Admin.Token != "" {
		store, err := deadletter.NewStore(pool, deadletter.Config{Schema: cfg.Database.Schema})
		if err != nil {
			return nil, err
		}
		maxPayload, checkTopic := editChecks(cfg)
		h, err := deadletter.NewHandler(deadletter.HandlerConfig{
			Store:      store,
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
