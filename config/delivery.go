package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/internal/problems"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
)

// Relay configures delivery. Its delivery settings are the relay's own
// type, which defaults and validates them (see relay.Config); the rest
// configure the outbox's store and dead letters.
type Relay struct {
	relay.Config `koanf:",squash"`
	// AuditPayloads is full (the default: an edit's audit record keeps
	// the payload before and after) or digest (only their SHA-256 and
	// length, for payloads that hold personal data).
	AuditPayloads string `koanf:"audit_payloads"`
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

// Retry configures the retry policy and the circuit breakers' cool-down.
// Both are their own packages' types, which default and validate them
// (see retry.PolicyConfig and relay.PauseConfig).
type Retry struct {
	retry.PolicyConfig `koanf:",squash"`
	Pause              relay.PauseConfig `koanf:",squash"`
}

// defaultRelay is the relay section before the file: the relay's
// defaults, but for payload_cap, which follows max_batch_bytes unless set.
func defaultRelay() Relay {
	rc := relay.Config{}.WithDefaults()
	rc.PayloadCap = 0
	return Relay{Config: rc, AuditPayloads: deadletter.AuditPayloadsFull, Listen: true}
}

// RelayConfig is the relay's configuration from the relay section and
// the settings of other sections it takes (the database's query_timeout,
// the retry section's pauses). The caller adds what a program gives:
// outboxes, destinations, routes, policy, logger; relay.New applies the
// defaults of what is left unset (payload_cap).
func (c *Config) RelayConfig() relay.Config {
	rc := c.Relay.Config
	rc.QueryTimeout = c.Database.QueryTimeout
	rc.Pause = c.Retry.Pause
	return rc
}

// connsNeeded says why a pool needs two connections more than its
// outbox's workers.
const connsNeeded = "one connection per worker, one for wake-ups, one for maintenance"

// tooFewConns says whether a pool of maxConns (0 or 1: not checked here)
// is too small for workers.
func tooFewConns(maxConns int32, workers int) bool {
	return maxConns >= 2 && workers >= 1 && int(maxConns) < workers+2
}

func (r Relay) problems(maxConns int32) []string {
	p := lines("relay.", r.ValidateSettings())
	if err := deadletter.ValidateAuditPayloads(r.AuditPayloads); err != nil {
		p = append(p, "relay."+err.Error())
	}
	if tooFewConns(maxConns, r.Workers) {
		p = append(p, fmt.Sprintf("database.max_conns %d is below relay.workers + 2 (%d): %s", maxConns, r.Workers+2, connsNeeded))
	}
	sort.Strings(p)
	return p
}

func (r Retry) problems() []string {
	p := append(lines("retry.", r.PolicyConfig.Validate()), lines("retry.", r.Pause.Validate())...)
	sort.Strings(p)
	return p
}

// lines splits a Validate error, one problem per line, putting at (the
// section's path) in front of each.
func lines(at string, err error) []string { return problems.Under(at, err) }

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
