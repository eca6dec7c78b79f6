package sink

import (
	"time"

	"github.com/google/uuid"
)

// Record is a claimed outbox row, ready to publish.
type Record struct {
	ID      int64
	EventID uuid.UUID
	Topic   string
	// Key is the ordering and Kafka message key; HasKey is false for a
	// null key.
	Key    string
	HasKey bool
	// Payload is nil when PayloadSize is above the claim's payload cap: an
	// oversized payload is never loaded.
	Payload     []byte
	PayloadSize int
	Headers     map[string]string
	CreatedAt   time.Time
	// RetryCount is the number of failed attempts so far.
	RetryCount int
	// LastDelay is the delay chosen after the previous failure, if any.
	LastDelay time.Duration
	// Undeliverable says why the row cannot be delivered as it is (empty
	// when it can); UndeliverableReason is its dead-letter reason.
	Undeliverable       string
	UndeliverableReason string
}
