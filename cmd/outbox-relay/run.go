package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
	"github.com/outbox-relay/outbox-relay/tracing"
)

// kafkaMessageSlack is what the Kafka sink's message limit exceeds the
// relay's max_batch_bytes by. A row's payload is at most payload_cap, so
// only a row whose key and headers add more than the slack to it is
// refused as too large.
const kafkaMessageSlack = 64 << 10

func (a *app) runCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Deliver outbox rows until SIGTERM or SIGINT",
		Long: `Deliver outbox rows to Kafka and HTTP destinations until SIGTERM or SIGINT.

On a signal the relay stops claiming, lets in-flight batches finish within
relay.drain_timeout and exits 0; rows of an abandoned batch stay pending and
are delivered again later. A second signal exits at once.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(config.NeedDatabase | config.NeedDestinations); err != nil {
				return err
			}
			return a.run(cmd.Context())
		},
	}
}

func (a *app) run(ctx context.Context) error {
	cfg := a.cfg
	pool, err := a.connect(ctx, map[string]string{
		// A claim's transaction stays open while its batch is published,
		// and a batch claimed ahead also waits for the one before it: two
		// publishes at most. If the relay vanishes behind a network black
		// hole, the server ends the transaction and releases the rows
		// rather than waiting for TCP.
		"idle_in_transaction_session_timeout": strconv.FormatInt((2*cfg.Relay.PublishTimeout + idleGrace).Milliseconds(), 10),
		// The relay's writes only record progress: a write-back lost in a
		// database crash makes its rows pending again, delivered once
		// more, never lost. Not waiting for the WAL flush at every batch
		// commit keeps slow disks from throttling delivery.
		"synchronous_commit": "off",
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool, cfg.Database.Schema); err != nil {
		return err
	}
	store, err := outbox.NewStore(pool, outbox.StoreConfig{
		Schema: cfg.Database.Schema, KeepSent: cfg.Relay.SentRetention > 0, StrictOrder: cfg.Relay.StrictOrder,
	})
	if err != nil {
		return err
	}
	if cfg.Relay.StrictOrder {
		if err := store.CheckStrictOrder(ctx); err != nil {
			return err
		}
	}
	policy, err := retry.NewPolicy(retry.PolicyConfig{
		MaxAttempts:   cfg.Retry.MaxAttempts,
		MaxAge:        cfg.Retry.MaxAge,
		Strategy:      retry.Strategy(cfg.Retry.Strategy),
		BaseDelay:     cfg.Retry.BaseDelay,
		MaxDelay:      cfg.Retry.MaxDelay,
		MaxRetryAfter: cfg.Retry.MaxRetryAfter,
	})
	if err != nil {
		return err
	}
	ver, rev := buildInfo()
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewBuildInfo(ver, rev),
	)
	relayMetrics, err := metrics.NewRelay(reg)
	if err != nil {
		return err
	}
	wrap := func(name, _ string, p relay.Publisher) relay.Publisher { return relayMetrics.Publisher(name, p) }
	traceSlack := 0
	if getenv := a.getenv(); tracing.Enabled(getenv) {
		tr, err := tracing.FromEnv(ctx, getenv, ver)
		if err != nil {
			return err
		}
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			a.log.Warn("tracing failed", slog.Any("error", err))
		}))
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlush)
			defer cancel()
			if err := tr.Shutdown(sctx); err != nil {
				a.log.Warn("flushing traces failed", slog.Any("error", err))
			}
		}()
		wrap = func(name, system string, p relay.Publisher) relay.Publisher {
			return relayMetrics.Publisher(name, tr.Publisher(name, system, p))
		}
		// Each record may gain a traceparent header on the way.
		traceSlack = traceHeaderBytes
		a.log.Info("tracing deliveries")
	}
	destinations, routes, closeAll, err := buildDestinations(cfg, wrap, traceSlack)
	if err != nil {
		return err
	}
	defer closeAll()

	var listener *outbox.Listener
	if cfg.Relay.Listen {
		listener, err = outbox.NewListener(pool, outbox.ListenerConfig{Schema: cfg.Database.Schema, Logger: a.log})
		if err != nil {
			return err
		}
	}
	r, err := relay.New(relay.Config{
		Store:               store,
		Destinations:        destinations,
		Routes:              routes,
		Listener:            listener,
		Policy:              policy,
		Logger:              a.log,
		Observer:            relayMetrics,
		Workers:             cfg.Relay.Workers,
		BatchSize:           cfg.Relay.BatchSize,
		MaxBatchBytes:       cfg.Relay.MaxBatchBytes,
		PayloadCap:          cfg.Relay.PayloadCap,
		PollInterval:        cfg.Relay.PollInterval,
		PublishTimeout:      cfg.Relay.PublishTimeout,
		DrainTimeout:        cfg.Relay.DrainTimeout,
		QueryTimeout:        cfg.Database.QueryTimeout,
		OnDeadLetter:        cfg.Relay.OnDeadLetter,
		SentRetention:       cfg.Relay.SentRetention,
		DeadLetterRetention: cfg.Relay.DeadLetterRetention,
		CleanupInterval:     cfg.Relay.CleanupInterval,
		PauseBase:           cfg.Retry.PauseBase,
		PauseMax:            cfg.Retry.PauseMax,
	})
	if err != nil {
		return err
	}
	dead, err := deadletter.NewStore(pool, deadletter.Config{Schema: cfg.Database.Schema})
	if err != nil {
		return err
	}
	reg.MustRegister(
		metrics.NewDestinations(r.Destinations),
		metrics.NewBacklog(metrics.BacklogConfig{Backlog: store, DeadLetters: dead, Logger: a.log}),
	)
	names := make([]string, 0, len(destinations))
	for _, d := range destinations {
		names = append(names, d.Name)
		relayMetrics.Destination(d.Name)
	}
	stopAdmin, err := a.startAdmin(admin{
		pool:     pool,
		dead:     dead,
		registry: reg,
		relay:    r,
		draining: ctx.Done(),
	})
	if err != nil {
		return err
	}
	defer stopAdmin()
	if cfg.Relay.StrictOrder {
		watch, err := metrics.NewOrderHoldWatch(reg, store, a.log)
		if err != nil {
			return err
		}
		watchCtx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() { defer close(watched); watch.Run(watchCtx) }()
		defer func() { stopWatch(); <-watched }()
	}
	a.log.Info("delivering outbox rows", slog.String("schema", cfg.Database.Schema), slog.Any("destinations", names),
		slog.Bool("strict_order", cfg.Relay.StrictOrder))
	return r.Run(ctx)
}

// idleGrace is added to the publish timeout for the server-side idle
// transaction timeout: a publish that times out is still written back.
const idleGrace = 30 * time.Second

// checkSchema fails clearly when the outbox table is missing.
func checkSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, "outbox"}.Sanitize()).Scan(&exists); err != nil {
		return fmt.Errorf("check the outbox table: %w", err)
	}
	if !exists {
		return fmt.Errorf("table %s.outbox does not exist: run 'outbox-relay migrate up' first", schema)
	}
	return nil
}

// tracingFlush bounds the export of the last spans at exit.
const tracingFlush = 5 * time.Second

// traceHeaderBytes is what a traceparent header adds to a Kafka record.
const traceHeaderBytes = 96

// buildDestinations makes a publisher for every configured destination,
// wrapped by wrap (with the messaging system, "kafka" or ""); closeAll
// releases them. slack is added to the Kafka sink's message limit for
// headers the wrappers add.
func buildDestinations(cfg *config.Config, wrap func(name, system string, p relay.Publisher) relay.Publisher, slack int) (_ []relay.Destination, _ []relay.Route, closeAll func(), err error) {
	settings, routes := cfg.DestinationList()
	var closers []func()
	closeAll = func() {
		for _, c := range closers {
			c()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	out := make([]relay.Destination, 0, len(settings))
	for _, s := range settings {
		d := s.Relay
		switch {
		case s.Kafka != nil:
			kc, err := kafkaConfig(*s.Kafka, s.Name, cfg.Relay)
			if err != nil {
				return nil, nil, nil, err
			}
			kc.MaxMessageBytes += slack
			p, err := kafka.New(kc)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("destination %s: %w", s.Name, err)
			}
			closers = append(closers, func() { p.Close() })
			d.Publisher = wrap(s.Name, "kafka", p)
			d.Partitioner = p // the wrappers hide it
		case s.HTTP != nil:
			wc, err := s.HTTP.Webhook(s.Name)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("destination %s: %w", s.Name, err)
			}
			p, err := webhook.New(wc)
			if err != nil {
				return nil, nil, nil, err
			}
			closers = append(closers, func() { p.Close() })
			d.Publisher = wrap(s.Name, "", p)
		}
		out = append(out, d)
	}
	return out, routes, closeAll, nil
}

func kafkaConfig(k config.Kafka, name string, r config.Relay) (kafka.Config, error) {
	kc := kafka.Config{
		Brokers:         k.Brokers,
		ClientID:        k.ClientID,
		MaxMessageBytes: r.MaxBatchBytes + kafkaMessageSlack,
		DialTimeout:     k.DialTimeout,
	}
	if k.TLS.Enabled {
		tc, err := k.TLS.ClientConfig()
		if err != nil {
			return kc, fmt.Errorf("destination %s: %w", name, err)
		}
		kc.TLS = tc
	}
	mech, err := saslMechanism(k.SASL)
	if err != nil {
		return kc, fmt.Errorf("destination %s: %w", name, err)
	}
	kc.SASL = mech
	return kc, nil
}

func saslMechanism(s config.KafkaSASL) (sasl.Mechanism, error) {
	switch s.Mechanism {
	case "":
		return nil, nil
	case "plain":
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case "scram-sha-256", "scram-sha-512":
		algo := scram.SHA256
		if s.Mechanism == "scram-sha-512" {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, s.Username, s.Password)
		if err != nil {
			return nil, fmt.Errorf("kafka.sasl: %w", err)
		}
		return m, nil
	}
	return nil, errors.New("kafka.sasl.mechanism: unknown mechanism " + s.Mechanism)
}
