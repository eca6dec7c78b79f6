// Package sink is the contract between the relay and a kind of
// destination, and everything a sink needs of the relay: the record it is
// given (Record), the publisher it returns (Publisher, and its optional
// io.Closer and Partitioner, kept through wrappers by Decorate), the failure
// classes its errors carry (failure.go, network.go), the header names,
// the options it opens with, and registration. It imports nothing of the
// engine: a sink imports this package and its client library.
//
// A sink owns its settings: a type decoded from destinations.<name>.<kind>
// of the configuration (koanf tags), which reads the secrets it names,
// validates itself and opens the destination's Publisher. The
// configuration maps YAML and the environment onto that type and calls
// it; nothing else knows a sink's settings.
//
// Sinks register once, from their package's init, as database/sql drivers
// do: importing github.com/outbox-relay/outbox-relay/relay/kafka and
// .../relay/webhook registers kafka and http. A new sink implements
// Config, passes relay/publishertest, and registers itself. A sink may
// also have a top-level section of its own (Section: the kafka section),
// which the configuration finds here too: it imports no sink.
package sink

import (
	"fmt"
	"slices"
	"sync"
)

// Config is one destination's settings for a sink.
type Config interface {
	// Resolve reads the secrets the settings name: environment variables
	// (through lookupEnv, os.LookupEnv in production) and files.
	Resolve(lookupEnv func(string) (string, bool)) error
	// Validate reports every problem of the resolved settings at once,
	// one per joined error; a problem about one setting starts with its
	// path below the sink (url is required, tls.ca_file: ...).
	Validate() error
	// Open returns the destination's Publisher. When it is an io.Closer,
	// Close releases it; when it is a Partitioner, the relay pauses
	// a failing partition alone.
	Open(Options) (Publisher, error)
}

// Reloader is implemented by settings whose secrets and TLS material a
// running destination can take without being opened again: tokens and
// passwords rotated, certificates renewed.
type Reloader interface {
	// Files are the files the settings read ("" for those not set), so
	// that the relay can read them again when they change.
	Files() []string
	// Reload gives p, opened from this destination's settings before,
	// the secrets and TLS material of these settings, resolved and
	// validated anew. Other settings need the destination opened again
	// (a restart). On error p keeps what it had.
	Reload(p Publisher) error
}

// Header names the relay sets on every delivery; producers may not set
// them.
const (
	// HeaderEventID carries the row's event id, the consumers'
	// deduplication key.
	HeaderEventID = "outbox-event-id"
	// HeaderID carries the row's id.
	HeaderID = "outbox-id"
	// HeaderKey carries a row's key in the messages of sinks whose
	// messages have no key of their own (NATS, RabbitMQ); a row without a
	// key has none.
	HeaderKey = "outbox-key"
)

// DefaultMaxBatchBytes keeps a full batch, with the per-record overhead
// counted, well under a broker's default max.message.bytes (1 MiB).
const DefaultMaxBatchBytes = 900 << 10

// Options are what a sink is told when it opens a destination.
type Options struct {
	// Name is the destination's name, for errors and logs.
	Name string
	// MaxBatchBytes is relay.max_batch_bytes: no payload delivered is
	// larger. A sink with a message size limit allows at least this plus
	// its own framing.
	MaxBatchBytes int
	// HeaderBytes is what wrappers around the Publisher (trace context)
	// add to each record.
	HeaderBytes int
}

// MessageBytes is the largest message a sink with a size limit must
// accept: MaxBatchBytes (DefaultMaxBatchBytes when unset), the
// sink's own framing (slack) and the wrappers' headers.
func (o Options) MessageBytes(slack int) int {
	batch := o.MaxBatchBytes
	if batch <= 0 {
		batch = DefaultMaxBatchBytes
	}
	return batch + slack + o.HeaderBytes
}

// Sink describes a kind of destination.
type Sink struct {
	// Kind is the key of its settings under destinations.<name>, such as
	// kafka or http.
	Kind string
	// New returns empty settings to decode the configuration onto; a
	// setting left zero takes the sink's default when it opens.
	New func() Config
	// MessagingSystem names the system in traces (OpenTelemetry's
	// messaging.system), or is empty.
	MessagingSystem string
	// MaxInFlight is the bulkhead of its destinations that set none: the
	// most rows being delivered at once. 0 is unlimited.
	MaxInFlight int
	// ValidateTopic, when set, lets a route give the sink's destinations a
	// topic of its own, and checks its name.
	ValidateTopic func(topic string) error
	// CloudEventsPrefix is the prefix of the headers that carry a
	// CloudEvent's attributes in binary mode, as the sink's protocol
	// binding says (ce_ for Kafka, ce- for HTTP); empty for a sink that
	// carries CloudEvents only structured.
	CloudEventsPrefix string
	// Section, when set, is a top-level section of the configuration that
	// defines a destination of this sink named as the section (the kafka
	// section, from before named destinations). Its settings have
	// environment variables by path (OUTBOX_KAFKA_BROKERS), and the
	// sink's named destinations may inherit from it (see Inheritor).
	Section *Section
}

// Section is a sink's top-level section of the configuration. It defines
// its destination once its settings are valid but for missing required
// settings (RequiredError): until then no route may send to it, and what
// is missing is reported only when routes would.
type Section struct {
	// Name is the section's key and its destination's name.
	Name string
	// Defaults returns the section's settings before the file, the
	// environment and the flags: what the reference documents as the
	// section's defaults.
	Defaults func() Config
}

// Deprecator is implemented by settings that can hold a form that still
// works but will be removed: each line starts with the setting's path
// below the sink and says what to use instead, for the relay to log at
// start.
type Deprecator interface {
	Deprecated() []string
}

// Inheritor is implemented by settings of a named destination that take
// what they leave unset from their sink's section (client settings rather
// than a cluster's).
type Inheritor interface {
	Inherit(section Config)
}

// RequiredError is the problem of a required setting left unset: the
// configuration reports it with where the setting can be given.
type RequiredError struct {
	// Setting is the setting's path below the sink (brokers).
	Setting string
	// Format says how to write it in an environment variable, or is
	// empty.
	Format string
}

func (e *RequiredError) Error() string { return e.Setting + " is required" }

var registry = struct {
	sync.RWMutex
	sinks map[string]Sink
}{sinks: map[string]Sink{}}

// Register makes a sink available to the configuration. It panics if the
// kind is empty, registered twice, or New is nil: a programming error
// found at start.
func Register(s Sink) {
	if s.Kind == "" || s.New == nil {
		panic("sink: Register needs a kind and New")
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.sinks[s.Kind]; dup {
		panic(fmt.Sprintf("sink: %s is registered twice", s.Kind))
	}
	registry.sinks[s.Kind] = s
}

// Lookup returns the sink registered as kind.
func Lookup(kind string) (Sink, bool) {
	registry.RLock()
	defer registry.RUnlock()
	s, ok := registry.sinks[kind]
	return s, ok
}

// Kinds lists the registered kinds, sorted.
func Kinds() []string {
	registry.RLock()
	defer registry.RUnlock()
	out := make([]string, 0, len(registry.sinks))
	for k := range registry.sinks {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
