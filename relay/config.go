package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/problems"
	"github.com/outbox-relay/outbox-relay/internal/testsignal"
	"github.com/outbox-relay/outbox-relay/relay/flow"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Defaults of Config.
const (
	DefaultWorkers = 2
	// DefaultBatchSize is the fastest measured with the default workers
	// (docs/performance.md): a claim's fixed costs, its start on the
	// pending index among them, are paid per batch. MaxBatchBytes still
	// bounds a batch of large rows.
	DefaultBatchSize = 2000
	// MaxBatchSize is the most rows one claim may take.
	MaxBatchSize = 10000
	// DefaultMaxBatchBytes is relay.max_batch_bytes's default, which
	// sinks size their message limits by.
	DefaultMaxBatchBytes   = sink.DefaultMaxBatchBytes
	DefaultPollInterval    = time.Second
	DefaultPublishTimeout  = 15 * time.Second
	DefaultDrainTimeout    = 30 * time.Second
	DefaultQueryTimeout    = 30 * time.Second
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 5000
	// DefaultDeadLetterRetention keeps unhandled dead letters until an
	// operator replays or discards them: they are evidence.
	DefaultDeadLetterRetention = retry.Forever
	// DefaultDiscardedRetention is how long discarded rows are kept after
	// an operator discarded them.
	DefaultDiscardedRetention = 14 * 24 * time.Hour
	// DefaultAuditRetention keeps the audit trail.
	DefaultAuditRetention = retry.Forever
	DefaultPauseBase      = time.Second
	DefaultPauseMax       = 30 * time.Second

	// RecordOverhead is counted for each record against MaxBatchBytes,
	// beside its payload, key and headers: a generous allowance for a
	// Kafka record's own lengths and timestamps and the two headers the
	// relay adds. A sink's own batch limit should exceed MaxBatchBytes by
	// some slack, so it never splits what the relay sends as one batch.
	RecordOverhead = 128
)

// Config configures a Relay. Zero values take the defaults
// (WithDefaults). Its settings carry the names of the configuration
// file's relay section, which decodes into this type; the fields tagged
// "-" are what a program gives (stores, publishers, a logger) or the
// settings of other sections (QueryTimeout, Pause).
type Config struct {
	// Store claims rows and writes outcomes back: the relay's one
	// outbox, named DefaultOutbox. Either give Store or Outboxes.
	Store *store.Store `koanf:"-"`
	// Outboxes are the outbox tables the relay delivers from, each with
	// its own workers, listener and maintenance.
	Outboxes []Outbox `koanf:"-"`
	// Destinations are where rows go, chosen by Routes. Either give
	// Destinations and Routes, or a single Publisher: a destination named
	// "default" that every topic is routed to.
	Destinations []Destination `koanf:"-"`
	// Routes map topics to Destinations; a row that no route matches is
	// dead-lettered no_route.
	Routes []Route `koanf:"-"`
	// Publisher is the single destination of a relay without Destinations.
	Publisher sink.Publisher `koanf:"-"`
	// Listener wakes Store's workers when rows are inserted; without one
	// they only poll.
	Listener *store.Listener `koanf:"-"`
	// Policy decides what happens to failed rows. Default retry defaults.
	Policy *retry.Policy `koanf:"-"`
	// Logger receives the relay's logs. Default discards.
	Logger *slog.Logger `koanf:"-"`
	// Observer is told of claims and outcomes, for metrics, for the
	// outboxes without an Observer of their own. Optional.
	Observer Observer `koanf:"-"`
	// Fleet, when set, shares each destination's flow control with the
	// relay's other replicas (see FleetConfig). Without it, each relay
	// process has its own.
	Fleet *FleetConfig `koanf:"-"`

	// Workers is the number of batches published at once, by all
	// outboxes together; each outbox runs this many workers unless it sets
	// its own, and they take turns fairly (see turns). While a backlog
	// lasts, each worker also claims its next batch while it publishes,
	// when the pool has connections to spare: it holds two batches at
	// most. While the database rather than publishing bounds an outbox's
	// backlog, one of its workers takes the batches and the others stand
	// by (see pace). Default 2.
	Workers int `koanf:"workers"`
	// BatchSize is the most rows claimed per batch, at most MaxBatchSize.
	// Default DefaultBatchSize (2000).
	BatchSize int `koanf:"batch_size"`
	// MaxBatchBytes bounds the bytes of one published batch: payloads,
	// keys, headers and RecordOverhead per record for Kafka's own
	// overhead; rows past it wait for the next batch. Default 921600
	// (900 KiB), under a broker's default max.message.bytes (1 MiB) with
	// room to spare.
	MaxBatchBytes int `koanf:"max_batch_bytes"`
	// PayloadCap is the largest payload delivered; larger rows are
	// dead-lettered too_large without being loaded. Default MaxBatchBytes,
	// which it must not exceed.
	PayloadCap int `koanf:"payload_cap"`
	// PollInterval is the longest an idle worker waits before looking for
	// rows without a wake-up notification. Default 1s.
	PollInterval time.Duration `koanf:"poll_interval"`
	// PublishTimeout bounds one publish; a publish that times out has an
	// unknown outcome and is retried. It bounds a batch's wait for a turn
	// too. Default 15s.
	PublishTimeout time.Duration `koanf:"publish_timeout"`
	// DrainTimeout is how long in-flight batches may finish after Run's
	// context ends before they are abandoned (their rows stay pending).
	// Default 30s.
	DrainTimeout time.Duration `koanf:"drain_timeout"`
	// SentRetention keeps delivered rows as sent for this long, or
	// forever (retry.Forever); 0 (the default) deletes them as they are
	// delivered. It must agree with the Store's KeepSent.
	SentRetention time.Duration `koanf:"sent_retention"`
	// DeadLetterRetention deletes dead-lettered rows this long after they
	// were dead-lettered, handled or not. A row that parks its key is
	// kept until released. Default forever: dead letters are evidence,
	// kept until an operator replays or discards them.
	DeadLetterRetention time.Duration `koanf:"dead_letter_retention"`
	// DiscardedRetention keeps discarded rows this long after they were
	// discarded, or forever. Default 336h (14 days).
	DiscardedRetention time.Duration `koanf:"discarded_retention"`
	// AuditRetention keeps audit records this long, or forever (the
	// default).
	AuditRetention time.Duration `koanf:"audit_retention"`
	// CleanupInterval is how often rows past their retention are deleted.
	// Default 1m.
	CleanupInterval time.Duration `koanf:"cleanup_interval"`
	// OnDeadLetter is release (a dead-lettered row lets its key's later
	// rows go on; the default) or block (it parks the key), for the
	// destinations that do not set their own.
	OnDeadLetter string `koanf:"on_dead_letter"`
	// OrderScope is where a key's rows keep their id order, for the
	// outboxes that do not set their own: destination (the default:
	// within each destination, so one destination's outage, backoff or
	// parked key never holds back another's rows), topic (within each
	// destination and topic) or global (across every topic and
	// destination). A parked key parks it in its scope only.
	OrderScope string `koanf:"order_scope"`
	// Capture is where the outboxes that do not set their own take their
	// messages from: table (the default: rows producers insert) or log
	// (messages producers write into the write-ahead log with
	// outbox_emit, streamed from the outbox's replication slot; messages
	// that must wait go into the table).
	Capture string `koanf:"capture"`

	// QueryTimeout bounds each claim, write-back and cleanup batch: a
	// database that does not answer in time (a crash, a network black
	// hole) is given up on, the connection dropped, and the batch's rows
	// stay pending until the server ends its transaction. Default 30s.
	// (The database section's query_timeout.)
	QueryTimeout time.Duration `koanf:"-"`
	// Pause bounds the cool-down of a destination's circuit breaker.
	// (The retry section's pause_base and pause_max.)
	Pause PauseConfig `koanf:"-"`
}

// WithDefaults returns c with every setting it leaves zero set to its
// default. SentRetention stays as given: 0 means delete on send.
func (c Config) WithDefaults() Config {
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.MaxBatchBytes = cmp.Or(c.MaxBatchBytes, DefaultMaxBatchBytes)
	c.PayloadCap = c.EffectivePayloadCap()
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, DefaultQueryTimeout)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, DefaultCleanupInterval)
	c.DeadLetterRetention = cmp.Or(c.DeadLetterRetention, DefaultDeadLetterRetention)
	c.DiscardedRetention = cmp.Or(c.DiscardedRetention, DefaultDiscardedRetention)
	c.AuditRetention = cmp.Or(c.AuditRetention, DefaultAuditRetention)
	c.OnDeadLetter = cmp.Or(c.OnDeadLetter, OnDeadLetterRelease)
	c.OrderScope = cmp.Or(c.OrderScope, OrderScopeDestination)
	c.Capture = cmp.Or(c.Capture, CaptureTable)
	c.Pause = c.Pause.WithDefaults()
	return c
}

// EffectivePayloadCap is the largest payload delivered: PayloadCap, or
// else MaxBatchBytes (or its default).
func (c Config) EffectivePayloadCap() int {
	return cmp.Or(c.PayloadCap, c.MaxBatchBytes, DefaultMaxBatchBytes)
}

// ValidateSettings reports every problem of c's settings (those with a
// name in the configuration file; 0 is a problem, so apply WithDefaults
// first), one per line, each starting with the setting's name, so that a
// configuration loader can put its own path in front. payload_cap may be
// 0: it follows max_batch_bytes.
func (c *Config) ValidateSettings() error {
	var errs []error
	for _, n := range []struct {
		name string
		v    int
	}{{"workers", c.Workers}, {"batch_size", c.BatchSize}, {"max_batch_bytes", c.MaxBatchBytes}} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("%s is %d; it must be at least 1", n.name, n.v))
		}
	}
	if err := batchSizeProblem(c.BatchSize); err != nil {
		errs = append(errs, err)
	}
	if c.PayloadCap < 0 {
		errs = append(errs, fmt.Errorf("payload_cap is %d; it must not be negative", c.PayloadCap))
	}
	if c.PayloadCap > c.MaxBatchBytes {
		errs = append(errs, fmt.Errorf("payload_cap %d is above max_batch_bytes %d: such a row could never be sent", c.PayloadCap, c.MaxBatchBytes))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"poll_interval", c.PollInterval}, {"publish_timeout", c.PublishTimeout}, {"drain_timeout", c.DrainTimeout}, {"cleanup_interval", c.CleanupInterval}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must be positive", d.name, d.v))
		}
	}
	if c.SentRetention < 0 {
		errs = append(errs, fmt.Errorf("sent_retention is %s; use 0 to delete rows as they are sent", c.SentRetention))
	}
	if c.DeadLetterRetention <= 0 {
		errs = append(errs, fmt.Errorf("dead_letter_retention is %s; it must be positive, or forever to keep dead letters until they are handled", c.DeadLetterRetention))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"discarded_retention", c.DiscardedRetention}, {"audit_retention", c.AuditRetention}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must be positive, or forever", d.name, d.v))
		}
	}
	if err := ValidateOnDeadLetter(c.OnDeadLetter); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateOrderScope(c.OrderScope); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateCapture(c.Capture); err != nil {
		errs = append(errs, err)
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// Validate reports every problem of c, its defaults applied, at once, or
// nil.
func (c *Config) Validate() error {
	errs := c.outboxProblems()
	switch {
	case c.Publisher == nil && len(c.Destinations) == 0:
		errs = append(errs, errors.New("relay: a publisher or destinations are required"))
	case c.Publisher != nil && len(c.Destinations) > 0:
		errs = append(errs, errors.New("relay: give a publisher or destinations, not both"))
	}
	names := make([]string, 0, len(c.Destinations))
	seen := map[string]bool{}
	for i := range c.Destinations {
		d := &c.Destinations[i]
		if err := d.Validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[d.Name] {
			errs = append(errs, fmt.Errorf("relay: destination %s is defined twice", d.Name))
		}
		seen[d.Name] = true
		names = append(names, d.Name)
	}
	if len(c.Destinations) > 0 {
		if len(c.Routes) == 0 {
			errs = append(errs, errors.New("relay: destinations need routes"))
		}
		if err := ValidateRoutes(c.Routes, names); err != nil {
			errs = append(errs, fmt.Errorf("relay: %w", err))
		}
	}
	errs = append(errs, problems.Errors("relay: ", c.ValidateSettings())...)
	if c.QueryTimeout <= 0 {
		errs = append(errs, fmt.Errorf("relay: query_timeout is %s; it must be positive", c.QueryTimeout))
	}
	errs = append(errs, problems.Errors("relay: ", c.Pause.Validate())...)
	if c.Fleet != nil {
		errs = append(errs, c.Fleet.Problems()...)
	}
	return errors.Join(errs...)
}

// batchSizeProblem says what is wrong with a batch size above MaxBatchSize.
func batchSizeProblem(n int) error {
	if n > MaxBatchSize {
		return fmt.Errorf("batch_size is %d; at most %d rows fit one claim", n, MaxBatchSize)
	}
	return nil
}

// assemble fills in what a program may leave out: the default policy and
// logger, the outbox of Store, the destination of Publisher.
func (c *Config) assemble() error {
	if c.Policy == nil {
		p, err := retry.NewPolicy(retry.PolicyConfig{})
		if err != nil {
			return err
		}
		c.Policy = p
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Outboxes = c.outboxes()
	if len(c.Destinations) == 0 {
		c.Destinations = []Destination{{Name: "default", Publisher: c.Publisher}}
		c.Routes = []Route{{Topics: []string{"*"}, Destination: "default"}}
	}
	return nil
}

// PauseConfig bounds the cool-down of each destination's circuit breaker:
// how long it stays open before a probe; it doubles while probes fail.
// The configuration file sets it in the retry section.
type PauseConfig struct {
	// Base is the first cool-down. Default 1s.
	Base time.Duration `koanf:"pause_base"`
	// Max is the longest. Default 30s, or Base if longer.
	Max time.Duration `koanf:"pause_max"`
}

// WithDefaults returns p with what it leaves zero set to the defaults.
func (p PauseConfig) WithDefaults() PauseConfig {
	p.Base = cmp.Or(p.Base, DefaultPauseBase)
	p.Max = cmp.Or(p.Max, max(DefaultPauseMax, p.Base))
	return p
}

// Validate reports every problem of p, one per line, each starting with
// the setting's name.
func (p PauseConfig) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"pause_base", p.Base}, {"pause_max", p.Max}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must be positive", d.name, d.v))
		}
	}
	if p.Max > 0 && p.Max < p.Base {
		errs = append(errs, fmt.Errorf("pause_max %s is below pause_base %s", p.Max, p.Base))
	}
	return errors.Join(errs...)
}

// destSettings is what each destination at work takes of c; changed hears
// of their breakers' changes.
func (c *Config) destSettings(changed *testsignal.Signal[BreakerChange]) flow.Settings {
	return flow.Settings{
		OnDeadLetter: c.OnDeadLetter, InFleet: c.Fleet != nil, LeasedBound: c.Workers * c.largestBatch(),
		PauseBase: c.Pause.Base, PauseMax: c.Pause.Max, Policy: c.Policy, Logger: c.Logger, Changed: changed,
	}
}

// Where an outbox's messages come from (Config.Capture).
const (
	CaptureTable = "table"
	CaptureLog   = "log"
)

// ValidateCapture checks a capture setting; "" takes the relay's.
func ValidateCapture(c string) error {
	switch c {
	case "", CaptureTable, CaptureLog:
		return nil
	}
	return fmt.Errorf("capture is %q; it must be table or log", c)
}
