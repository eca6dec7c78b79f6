package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// Relay configures delivery.
type Relay struct {
	// Workers is the number of batches published at once. While a
	// backlog lasts, each worker also claims its next batch while it
	// publishes, when the pool has connections to spare: it holds two
	// batches at most. Default 2.
	Workers int `koanf:"workers"`
	// BatchSize is the most rows claimed per batch. Default 2000.
	BatchSize int `koanf:"batch_size"`
	// MaxBatchBytes bounds the bytes of one batch: payloads, keys, headers
	// and 128 bytes per record for Kafka's own overhead. Default 921600
	// (900 KiB), under a broker's default max.message.bytes (1 MiB) with
	// room to spare.
	MaxBatchBytes int `koanf:"max_batch_bytes"`
	// PayloadCap is the largest payload delivered; larger rows are
	// dead-lettered too_large without being loaded. Default max_batch_bytes.
	PayloadCap int `koanf:"payload_cap"`
	// PollInterval is the longest an idle worker waits before looking for
	// rows without a wake-up notification. Default 1s.
	PollInterval time.Duration `koanf:"poll_interval"`
	// PublishTimeout bounds one publish. Default 15s.
	PublishTimeout time.Duration `koanf:"publish_timeout"`
	// DrainTimeout is how long in-flight batches may finish on shutdown.
	// Default 30s.
	DrainTimeout time.Duration `koanf:"drain_timeout"`
	// SentRetention keeps delivered rows as sent for this long, or
	// forever; 0 (the default) deletes them as they are delivered.
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
	// AuditPayloads is full (the default: an edit's audit record keeps
	// the payload before and after) or digest (only their SHA-256 and
	// length, for payloads that hold personal data).
	AuditPayloads string `koanf:"audit_payloads"`
	// CleanupInterval is how often rows past their retention are deleted.
	// Default 1m.
	CleanupInterval time.Duration `koanf:"cleanup_interval"`
	// OnDeadLetter is release (a dead-lettered row lets its key's later
	// rows go on; the default) or block (it parks the key).
	OnDeadLetter string `koanf:"on_dead_letter"`
	// OrderScope is where a key's rows keep their id order: destination
	// (the default: within each destination, so one destination's outage,
	// backoff or parked key never holds back another's rows), topic
	// (within each destination and topic) or global (across every topic
	// and destination, as before order scopes existed).
	OrderScope string `koanf:"order_scope"`
	// Listen enables LISTEN/NOTIFY wake-ups. Default true; polling covers
	// for it either way.
	Listen bool `koanf:"listen"`
	// StrictOrder delivers a key's rows in id order even when producers
	// write the key from concurrent transactions: a row waits until every
	// transaction that could still commit a smaller id has ended, so a
	// long write transaction anywhere in the database cluster delays
	// delivery. Default false (per-key order then assumes producers
	// serialise a key's writes).
	StrictOrder bool `koanf:"strict_order"`
}

// Retry configures the retry policy.
type Retry struct {
	// The retry policy's settings are its own type's, which validates
	// them (see retry.PolicyConfig).
	retry.PolicyConfig `koanf:",squash"`
	// PauseBase and PauseMax bound each destination's circuit breaker
	// cool-down: how long it stays open before a probe; it doubles while
	// probes fail. Defaults 1s and 30s.
	PauseBase time.Duration `koanf:"pause_base"`
	PauseMax  time.Duration `koanf:"pause_max"`
}

func (r Relay) problems(maxConns int32) []string {
	var p []string
	positive := func(name string, v int) {
		if v < 1 {
			p = append(p, fmt.Sprintf("relay.%s is %d; it must be at least 1", name, v))
		}
	}
	positive("workers", r.Workers)
	positive("batch_size", r.BatchSize)
	positive("max_batch_bytes", r.MaxBatchBytes)
	if r.BatchSize > 10000 {
		p = append(p, fmt.Sprintf("relay.batch_size is %d; at most 10000 rows fit one claim", r.BatchSize))
	}
	if r.PayloadCap < 0 {
		p = append(p, fmt.Sprintf("relay.payload_cap is %d; it must not be negative", r.PayloadCap))
	}
	if r.PayloadCap > r.MaxBatchBytes {
		p = append(p, fmt.Sprintf("relay.payload_cap %d is above relay.max_batch_bytes %d: such a row could never be sent", r.PayloadCap, r.MaxBatchBytes))
	}
	for name, d := range map[string]time.Duration{"poll_interval": r.PollInterval, "publish_timeout": r.PublishTimeout,
		"drain_timeout": r.DrainTimeout, "cleanup_interval": r.CleanupInterval} {
		if d <= 0 {
			p = append(p, fmt.Sprintf("relay.%s is %s; it must be positive", name, d))
		}
	}
	if r.SentRetention < 0 {
		p = append(p, fmt.Sprintf("relay.sent_retention is %s; use 0 to delete rows as they are sent", r.SentRetention))
	}
	if r.DeadLetterRetention <= 0 {
		p = append(p, fmt.Sprintf("relay.dead_letter_retention is %s; it must be positive, or forever to keep dead letters until they are handled", r.DeadLetterRetention))
	}
	for name, d := range map[string]time.Duration{"discarded_retention": r.DiscardedRetention, "audit_retention": r.AuditRetention} {
		if d <= 0 {
			p = append(p, fmt.Sprintf("relay.%s is %s; it must be positive, or forever", name, d))
		}
	}
	if err := deadletter.ValidateAuditPayloads(r.AuditPayloads); err != nil {
		p = append(p, "relay."+err.Error())
	}
	if err := relay.ValidateOnDeadLetter(r.OnDeadLetter); err != nil {
		p = append(p, "relay."+err.Error())
	}
	if err := relay.ValidateOrderScope(r.OrderScope); err != nil {
		p = append(p, "relay."+err.Error())
	}
	if maxConns >= 2 && r.Workers >= 1 && int(maxConns) < r.Workers+2 {
		p = append(p, fmt.Sprintf("database.max_conns %d is below relay.workers + 2 (%d): one connection per worker, one for wake-ups, one for maintenance", maxConns, r.Workers+2))
	}
	sort.Strings(p)
	return p
}

func (r Retry) problems() []string {
	var p []string
	if err := r.PolicyConfig.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p = append(p, "retry."+line)
		}
	}
	for name, d := range map[string]time.Duration{"pause_base": r.PauseBase, "pause_max": r.PauseMax} {
		if d <= 0 {
			p = append(p, fmt.Sprintf("retry.%s is %s; it must be positive", name, d))
		}
	}
	if r.PauseMax > 0 && r.PauseMax < r.PauseBase {
		p = append(p, fmt.Sprintf("retry.pause_max %s is below retry.pause_base %s", r.PauseMax, r.PauseBase))
	}
	sort.Strings(p)
	return p
}

// Forever is the value of a duration setting that has no end.
const Forever = "forever"

// foreverSettings are the duration settings that may be forever.
var foreverSettings = map[string]bool{
	"relay.sent_retention":        true,
	"relay.dead_letter_retention": true,
	"relay.discarded_retention":   true,
	"relay.audit_retention":       true,
	"retry.max_age":               true,
}

// foreverProblems reports the duration settings of v, at prefix, that
// are forever but may not be.
func foreverProblems(prefix string, v reflect.Value) []string {
	var p []string
	for path, x := range leaves(v, prefix) {
		if d, ok := x.(time.Duration); ok && d == retry.Forever && !foreverSettings[path] {
			p = append(p, path+" cannot be forever")
		}
	}
	return p
}

// foreverHook decodes forever into retry.Forever, the longest duration.
func foreverHook(from, to reflect.Type, data any) (any, error) {
	if s, ok := data.(string); ok && to == reflect.TypeOf(time.Duration(0)) && strings.EqualFold(strings.TrimSpace(s), Forever) {
		return retry.Forever, nil
	}
	return data, nil
}
