package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/relay/logsource"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
	"github.com/outbox-relay/outbox-relay/tracing"
)

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
	policy, err := retry.NewPolicy(cfg.Retry.PolicyConfig)
	if err != nil {
		return err
	}
	if err := a.schemaGate(ctx); err != nil {
		return err
	}
	b := currentBuild()
	ver := b.Version
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewBuildInfo(b.Version, b.Revision, b.Date),
	)
	relayMetrics, err := metrics.NewRelay(reg)
	if err != nil {
		return err
	}
	wrap := func(name, _ string, p sink.Publisher) sink.Publisher { return relayMetrics.Publisher(name, p) }
	headerBytes := 0
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
		wrap = func(name, system string, p sink.Publisher) sink.Publisher {
			return relayMetrics.Publisher(name, tr.Publisher(name, system, p))
		}
		// Each record may gain a traceparent header on the way.
		headerBytes = traceHeaderBytes
		a.log.Info("tracing deliveries")
	}
	destinations, routes, publishers, closeAll, err := buildDestinations(cfg, wrap, headerBytes)
	if err != nil {
		return err
	}
	defer closeAll()
	names := make([]string, 0, len(destinations))
	for _, d := range destinations {
		names = append(names, d.Name)
	}

	var outboxes []*runOutbox
	defer func() {
		for _, o := range outboxes {
			o.close()
		}
	}()
	// This process's name among the relays: in the fleet, and among the
	// processes that share each outbox's partitions.
	replica := replicaName()
	fleetCfg, closeFleet, err := a.openFleet(ctx, replica)
	if err != nil {
		return err
	}
	defer closeFleet()
	var relayOutboxes []relay.Outbox
	for _, settings := range cfg.Outboxes() {
		o, err := a.openOutbox(ctx, settings, reg, relayMetrics, names, replica)
		if err != nil {
			return err
		}
		outboxes = append(outboxes, o)
		relayOutboxes = append(relayOutboxes, o.relay)
	}
	rc := cfg.RelayConfig()
	rc.Outboxes, rc.Destinations, rc.Routes = relayOutboxes, destinations, routes
	rc.Policy, rc.Logger, rc.Fleet = policy, a.log, fleetCfg
	r, err := relay.New(rc)
	if err != nil {
		return err
	}
	reg.MustRegister(metrics.NewDestinations(r.Destinations), metrics.NewFleet(r.Fleet))
	tokens, err := adminTokens(cfg.Admin)
	if err != nil {
		return err
	}
	certs, err := adminCertificate(cfg.Admin.TLS)
	if err != nil {
		return err
	}
	stopAdmin, err := a.startAdmin(admin{
		outboxes: outboxes,
		registry: reg,
		relay:    r,
		redact:   cfg.RedactURLs,
		draining: ctx.Done(),
		tokens:   tokens,
		certs:    certs,
		fleet:    fleetStore(fleetCfg),
	})
	if err != nil {
		return err
	}
	defer stopAdmin()
	// Secrets and certificates are read again when their files change,
	// or on SIGHUP.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reloadCtx, stopReload := context.WithCancel(ctx)
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		newReloader(a, config.NeedDatabase|config.NeedDestinations, tokens, certs, publishers).run(reloadCtx, hup)
	}()
	defer func() { stopReload(); <-reloaded }()
	for _, o := range outboxes {
		for _, w := range o.watches() {
			watchCtx, stopWatch := context.WithCancel(ctx)
			watched := make(chan struct{})
			go func() { defer close(watched); w.Run(watchCtx) }()
			defer func() { stopWatch(); <-watched }()
		}
	}
	// The history goes on while the relay drains, and writes its last
	// counts once the relay has stopped.
	historyCtx, stopHistory := context.WithCancel(context.WithoutCancel(ctx))
	var recorders sync.WaitGroup
	for i, o := range outboxes {
		rec := &history.Recorder{Store: o.history, Outbox: o.name, Replica: replica, Gatherer: relayMetrics.Gatherer(),
			Backlog: o.backlog, Interval: cfg.Admin.HistoryInterval, Logger: a.log}
		if i == 0 {
			// The destinations' breakers, in the first outbox's history,
			// where the console reads them.
			rec.Changes = func() []relay.BreakerChange {
				var out []relay.BreakerChange
				for _, d := range r.Destinations() {
					out = append(out, d.Changes...)
				}
				return out
			}
		}
		recorders.Go(func() { rec.Run(historyCtx) })
	}
	defer func() { stopHistory(); recorders.Wait() }()
	attrs := []any{slog.Any("destinations", names), slog.Bool("strict_order", cfg.Relay.StrictOrder)}
	if len(cfg.OutboxList) > 0 {
		outboxNames := make([]string, 0, len(outboxes))
		for _, o := range outboxes {
			outboxNames = append(outboxNames, o.name)
		}
		attrs = append(attrs, slog.Any("outboxes", outboxNames))
	} else {
		attrs = append([]any{slog.String("schema", cfg.Database.Schema)}, attrs...)
	}
	a.log.Info("delivering outbox rows", attrs...)
	for _, d := range cfg.Deprecations() {
		setting, use, _ := strings.Cut(d, ": ")
		a.log.Warn("deprecated setting", slog.String("setting", setting), slog.String("use", use))
	}
	for _, o := range outboxes {
		if o.settings.OrderScope != relay.OrderScopeGlobal {
			// Earlier versions kept a key's order across destinations.
			a.log.Info("a key's rows keep their order within each "+o.settings.OrderScope+", not across "+o.settings.OrderScope+"s: set relay.order_scope: global to keep it across every destination (docs/ordering.md)",
				slog.String("outbox", o.name), slog.String("order_scope", o.settings.OrderScope))
		}
	}
	return r.Run(ctx)
}

// runOutbox is an outbox of the running relay, with what serves it.
type runOutbox struct {
	name     string
	settings config.OutboxSettings
	pool     *pgxpool.Pool
	store    *store.Store
	dead     *deadletter.Store
	// listener is nil when wake-up notifications are off.
	listener *store.Listener
	// watch measures strict order's holds; nil without strict order.
	watch *metrics.OrderHoldWatch
	// horizon shows what holds the database's xmin horizon.
	horizon *metrics.HorizonWatch
	// capture shows the replication slot of an outbox captured from the
	// log; nil for the table.
	capture *metrics.CaptureWatch
	relay   relay.Outbox
	// history is the console's per-minute history of the outbox.
	history *history.Store
}

func (o *runOutbox) close() { o.pool.Close() }

// backlog counts the outbox's pending rows and the age of the oldest.
func (o *runOutbox) backlog(ctx context.Context) (history.Backlog, error) {
	topics, err := o.store.Backlog(ctx)
	if err != nil {
		return history.Backlog{}, err
	}
	var b history.Backlog
	for _, t := range topics {
		b.Pending += t.Pending
		b.OldestPending = max(b.OldestPending, t.OldestAge)
	}
	return b, nil
}

// watches are the outbox's loops that look at its database's state.
func (o *runOutbox) watches() []interface{ Run(context.Context) } {
	w := []interface{ Run(context.Context) }{o.horizon}
	if o.watch != nil {
		w = append(w, o.watch)
	}
	if o.capture != nil {
		w = append(w, o.capture)
	}
	return w
}

// openOutbox sets up an outbox: its pool, store, listener, dead-letter
// store and metrics, labelled with its name. Nothing connects yet: the
// relay prepares each outbox (connect, check the schema) on its own, so
// that a database that is down holds only its own outbox.
func (a *app) openOutbox(ctx context.Context, s config.OutboxSettings, reg prometheus.Registerer, m *metrics.Relay, destinations []string, replica string) (_ *runOutbox, err error) {
	cfg := a.cfg
	log := a.log
	if len(cfg.OutboxList) > 0 {
		log = log.With(slog.String("outbox", s.Name))
	}
	pool, err := newPool(ctx, s.Database)
	if err != nil {
		return nil, fmt.Errorf("outbox %s: %w", s.Name, err)
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()
	o := &runOutbox{name: s.Name, settings: s, pool: pool}
	schema := s.Database.Schema
	o.store, err = store.New(pool, store.Config{
		Schema: schema, KeepSent: cfg.Relay.SentRetention > 0, StrictOrder: cfg.Relay.StrictOrder,
		// A claim's transaction stays open while its batch waits for a
		// turn and is published, and a batch claimed ahead also waits for
		// the one before it: three publish timeouts at most. If the relay
		// vanishes behind a network black hole, the server ends the
		// transaction and releases the rows rather than waiting for TCP.
		IdleInTransactionTimeout: 3*cfg.Relay.PublishTimeout + idleGrace,
		// The partitions' lease lasts as long as a replica's in the
		// fleet: a replica that vanishes leaves both at once.
		Claimer: replica, ClaimLease: cfg.Coordination.Lease, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	if cfg.Relay.Listen {
		o.listener, err = store.NewListener(pool, store.ListenerConfig{Schema: schema, Logger: log})
		if err != nil {
			return nil, err
		}
	}
	o.dead, err = deadletter.NewStore(pool, deadLetters(cfg, schema, s.OrderScope))
	if err != nil {
		return nil, err
	}
	if o.history, err = history.New(pool, schema); err != nil {
		return nil, err
	}
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"outbox": s.Name}, reg)
	if err := labelled.Register(metrics.NewBacklog(metrics.BacklogConfig{Backlog: o.store, DeadLetters: o.dead, Logger: log})); err != nil {
		return nil, err
	}
	if cfg.Relay.StrictOrder {
		if o.watch, err = metrics.NewOrderHoldWatch(labelled, o.store, log); err != nil {
			return nil, err
		}
	}
	if o.horizon, err = metrics.NewHorizonWatch(labelled, o.store, log); err != nil {
		return nil, err
	}
	observer := m.Outbox(s.Name, destinations)
	o.relay = s.Outbox
	o.relay.Store, o.relay.Listener, o.relay.Observer = o.store, o.listener, observer
	if s.Capture == relay.CaptureLog {
		o.relay.Log, err = logsource.New(logsource.Config{Conn: &pool.Config().ConnConfig.Config, Schema: schema, Store: o.store, Log: log})
		if err != nil {
			return nil, err
		}
		if o.capture, err = metrics.NewCaptureWatch(labelled, slotOf{o.relay.Log, pool}, log); err != nil {
			return nil, err
		}
	}
	o.relay.Prepare = func(ctx context.Context) error { return a.prepareOutbox(ctx, o, log) }
	return o, nil
}

// prepareOutbox waits for the outbox's database, then checks its schema
// and, with strict order, the server's setting for it. A check that fails
// for a reason the relay can name and outlive (a pooler that loses
// prepared statements, a failover, a statement timeout) is logged with
// its hint and tried again, as the relay does once running; a schema it
// cannot run on ends it.
func (a *app) prepareOutbox(ctx context.Context, o *runOutbox, log *slog.Logger) error {
	delay := time.Second
	for {
		if up, err := waitForDatabase(ctx, o.pool, log); !up {
			return err
		}
		err := checkSchema(ctx, o.pool, o.settings.Database.Schema, log)
		if err == nil && a.cfg.Relay.StrictOrder {
			err = o.store.CheckStrictOrder(ctx)
		}
		p, known := store.ExplainDBError(err)
		if err == nil || !known || ctx.Err() != nil {
			return err
		}
		log.Warn("database: "+p.Hint, slog.Any("error", err), slog.Duration("retry_in", delay))
		if p.Reconnect {
			o.pool.Reset()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// waitForDatabase waits until the pool's database answers, while it
// cannot take the relay yet: down, starting up, failing over, or out of
// connection slots. A restart would not help with those, and a relay that
// exits leaves Kubernetes to restart it in a loop. Refused credentials and
// a database that does not exist are configuration problems and fail at
// once. It reports false when ctx ends first.
func waitForDatabase(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (bool, error) {
	delay := time.Second
	for {
		err := pool.Ping(ctx)
		if ctx.Err() != nil {
			return false, nil
		}
		if err == nil {
			return true, nil
		}
		if !worthWaiting(err) {
			return false, fmt.Errorf("connect to database: %w", err)
		}
		hint := "the database cannot be reached"
		if p, ok := store.ExplainDBError(err); ok {
			hint = p.Hint
		}
		log.Warn("waiting for the database: "+hint, slog.Any("error", err), slog.Duration("retry_in", delay))
		select {
		case <-ctx.Done():
			return false, nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// worthWaiting reports whether a failed connection may succeed later
// without a change of configuration.
func worthWaiting(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// invalid_authorization_specification (28…), invalid_catalog_name
		return !strings.HasPrefix(pgErr.Code, "28") && pgErr.Code != "3D000"
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// idleGrace is added to the publish timeout for the server-side idle
// transaction timeout: a publish that times out is still written back.
const idleGrace = 30 * time.Second

// schemaGate checks every outbox's schema before the relay listens, joins
// the fleet or writes anything: a database without the schema, or with
// one this binary cannot run on, ends run at once with the one line that
// says what to do (exit 2), and refused credentials or a database that
// does not exist end it too. A database that does not answer yet is left
// to the relay, which waits for it and checks its schema then, before it
// claims a row.
func (a *app) schemaGate(ctx context.Context) error {
	several := len(a.cfg.OutboxList) > 0
	for _, s := range a.cfg.Outboxes() {
		err := func() error {
			pool, err := newPool(ctx, s.Database)
			if err != nil {
				return err
			}
			defer pool.Close()
			pctx, cancel := context.WithTimeout(ctx, gateWait)
			defer cancel()
			if err := pool.Ping(pctx); err != nil {
				if ctx.Err() == nil && !worthWaiting(err) {
					return fmt.Errorf("connect to database: %w", err)
				}
				return nil // down for now: checked once it answers
			}
			_, err = migrations.Check(pctx, pool, s.Database.Schema)
			if err != nil && !errors.As(err, new(*migrations.VersionError)) {
				return nil // not answering in time: checked once it does
			}
			return err
		}()
		if err != nil && several {
			return fmt.Errorf("outbox %s: %w", s.Name, err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// gateWait bounds how long the schema gate waits for a database.
const gateWait = 5 * time.Second

// checkSchema fails clearly when the schema is older than this binary
// needs, or newer and no longer compatible with it.
func checkSchema(ctx context.Context, pool *pgxpool.Pool, schema string, log *slog.Logger) error {
	sv, err := migrations.Check(ctx, pool, schema)
	if err != nil {
		return err
	}
	if sv.Found > migrations.Version {
		log.Info("the schema is newer than this relay and compatible with it",
			slog.Int64("schema_version", sv.Found), slog.Int64("relay_version", migrations.Version),
			slog.Int64("compatible_from", sv.CompatibleFrom))
	}
	return nil
}

// tracingFlush bounds the export of the last spans at exit.
const tracingFlush = 5 * time.Second

// traceHeaderBytes is what a traceparent header adds to a Kafka record.
const traceHeaderBytes = 96

// buildDestinations opens a publisher for every configured destination,
// wrapped by wrap (with the sink's messaging system); closeAll releases
// them. headerBytes is what the wrappers add to each record. publishers
// are the sinks' own, unwrapped, by destination name.
func buildDestinations(cfg *config.Config, wrap func(name, system string, p sink.Publisher) sink.Publisher, headerBytes int) (
	_ []relay.Destination, _ []relay.Route, publishers map[string]sink.Publisher, closeAll func(), err error) {
	settings, routes := cfg.DestinationList()
	var closers []io.Closer
	closeAll = func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	out := make([]relay.Destination, 0, len(settings))
	publishers = make(map[string]sink.Publisher, len(settings))
	for _, s := range settings {
		p, err := s.Settings.Open(sink.Options{Name: s.Name, MaxBatchBytes: cfg.Relay.MaxBatchBytes,
			HeaderBytes: headerBytes + s.Format.Overhead(cfg.Relay.MaxBatchBytes)})
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("destination %s: %w", s.Name, err)
		}
		publishers[s.Name] = p
		if c, ok := p.(io.Closer); ok {
			closers = append(closers, c)
		}
		d := s.Relay
		d.Publisher = wrap(s.Name, s.Sink.MessagingSystem, cloudevents.Wrap(p, s.Format, s.Sink.CloudEventsPrefix))
		out = append(out, d)
	}
	return out, routes, publishers, closeAll, nil
}

// slotOf is an outbox's replication slot, read through its pool.
type slotOf struct {
	*logsource.Source
	pool *pgxpool.Pool
}

func (s slotOf) State(ctx context.Context) (logsource.SlotState, error) {
	return s.Source.State(ctx, s.pool)
}
