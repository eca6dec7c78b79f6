package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/internal/db/schema"
)

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	// Schema holds the outbox table; its wake-up channel is "<schema>.outbox".
	Schema string
	// ProbeInterval is how often the listener checks that notifications
	// still arrive, by sending itself one through the pool. Default 1m.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe may take. Default 10s.
	ProbeTimeout time.Duration
	// Logger receives warnings; default discards.
	Logger *slog.Logger
}

// Listener turns the outbox trigger's notifications into wake-ups. It holds
// one pooled connection while it listens. Behind a transaction-mode pooler
// LISTEN silently stops working; the listener notices because its own
// probes stop arriving, says so, and the relay keeps polling.
type Listener struct {
	pool      *pgxpool.Pool
	channel   string
	listenSQL string // the LISTEN on channel
	cfg       ListenerConfig
	log       *slog.Logger
	state     atomic.Int32 // listenUnknown, listenHealthy or listenBroken
	cause     atomic.Pointer[string]
	probeN    atomic.Int64
}

// NewListener returns a Listener on pool.
func NewListener(pool *pgxpool.Pool, cfg ListenerConfig) (*Listener, error) {
	if cfg.Schema == "" {
		cfg.Schema = schema.Default
	}
	if err := schema.Validate(cfg.Schema); err != nil {
		return nil, fmt.Errorf("outbox listener: %w", err)
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = time.Minute
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	channel := cfg.Schema + ".outbox"
	listen, err := outboxdb.Listen(channel)
	if err != nil {
		return nil, fmt.Errorf("outbox listener: %w", err)
	}
	return &Listener{pool: pool, channel: channel, listenSQL: listen, cfg: cfg, log: cfg.Logger}, nil
}

// Channel is the notification channel the listener listens on.
func (l *Listener) Channel() string { return l.channel }

const (
	listenUnknown int32 = iota
	listenHealthy
	listenBroken
)

// Healthy reports whether notifications are arriving.
func (l *Listener) Healthy() bool { return l.state.Load() == listenHealthy }

// States of the listener, for readiness.
const (
	ListenerStarting    = "starting"
	ListenerArriving    = "arriving"
	ListenerNotArriving = "not arriving; polling"
)

// Status reports whether notifications are arriving and, when they are
// not, why.
func (l *Listener) Status() (state, cause string) {
	switch l.state.Load() {
	case listenHealthy:
		return ListenerArriving, ""
	case listenBroken:
		if c := l.cause.Load(); c != nil {
			cause = *c
		}
		return ListenerNotArriving, cause
	}
	return ListenerStarting, ""
}

const probePrefix = "probe:"

// PartitionsNotice is the payload of the notification a process sends on
// the outbox's channel when the share of its partitions changes: one
// joined, or one gave partitions up (see Store.SyncPartitions).
const PartitionsNotice = "partitions"

// Run listens until ctx ends, calling wake for every notification of new
// rows and resync for every PartitionsNotice. It reconnects after errors,
// backing off, and returns nil when ctx ends.
func (l *Listener) Run(ctx context.Context, wake, resync func()) error {
	const minBackoff = 100 * time.Millisecond
	backoff := minBackoff
	for ctx.Err() == nil {
		started := time.Now()
		err := l.listen(ctx, wake, resync)
		if ctx.Err() != nil {
			break
		}
		if time.Since(started) > time.Minute {
			backoff = minBackoff // it listened for a while: a new failure
		}
		l.setHealthy(false, err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
	return nil
}

func (l *Listener) listen(ctx context.Context, wake, resync func()) error {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire listen connection: %w", err)
	}
	defer func() {
		// A connection that was listening must not go back to the pool.
		_ = conn.Conn().Close(context.Background())
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, l.listenSQL); err != nil {
		return fmt.Errorf("listen on %s: %w", l.channel, err)
	}
	// Rows may have arrived while nobody listened.
	wake()

	probeTick := time.NewTicker(l.cfg.ProbeInterval)
	defer probeTick.Stop()
	var (
		outstanding string // payload of the probe in flight
		deadline    time.Time
	)
	sendProbe := func() error {
		outstanding = probePrefix + strconv.FormatInt(l.probeN.Add(1), 10)
		deadline = time.Now().Add(l.cfg.ProbeTimeout)
		pctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		_, err := l.pool.Exec(pctx, outboxdb.Notify, l.channel, outstanding)
		return err
	}
	if err := sendProbe(); err != nil {
		return fmt.Errorf("probe notifications: %w", err)
	}
	for {
		wctx, cancel := context.WithDeadline(ctx, nextWake(deadline, outstanding, l.cfg.ProbeInterval))
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && outstanding != "" && n.Payload == outstanding:
			outstanding = ""
			l.setHealthy(true, nil)
		case err == nil && len(n.Payload) >= len(probePrefix) && n.Payload[:len(probePrefix)] == probePrefix:
			// Another replica's probe, or a late one of ours.
		case err == nil && n.Payload == PartitionsNotice:
			resync()
		case err == nil:
			wake()
		case errors.Is(err, context.DeadlineExceeded):
			// Woken to check the probe or send the next one.
		default:
			return fmt.Errorf("wait for notifications: %w", err)
		}
		if outstanding != "" && time.Now().After(deadline) {
			// The connection may be dead without knowing it (a network
			// black hole, a failover), or a pooler may have taken it
			// elsewhere: listen on a fresh one.
			return fmt.Errorf("a notification sent through the pool did not arrive within %s", l.cfg.ProbeTimeout)
		}
		select {
		case <-probeTick.C:
			if err := sendProbe(); err != nil {
				return fmt.Errorf("probe notifications: %w", err)
			}
		default:
		}
	}
}

// nextWake is when the wait must end to check a probe or send one.
func nextWake(deadline time.Time, outstanding string, interval time.Duration) time.Time {
	if outstanding != "" {
		return deadline
	}
	return time.Now().Add(interval)
}

func (l *Listener) setHealthy(ok bool, cause error) {
	next := listenBroken
	if ok {
		next = listenHealthy
	} else if cause != nil {
		c := cause.Error()
		l.cause.Store(&c)
	}
	if l.state.Swap(next) == next {
		return
	}
	if ok {
		l.log.Info("wake-up notifications are arriving", slog.String("channel", l.channel))
		return
	}
	l.log.Warn("wake-up notifications are not arriving; polling every relay.poll_interval instead. "+
		"Behind a transaction-mode pooler (PgBouncer pool_mode=transaction) LISTEN cannot work: use session mode, "+
		"or turn relay.listen off",
		slog.String("channel", l.channel), slog.Any("error", cause))
}
