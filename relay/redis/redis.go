// Package redis is the relay's Redis Streams sink: it appends each record
// to the stream its topic (or its route's topic) names with XADD, the
// stream trimmed to about max_len entries when set. An entry's fields are
// outbox-event-id, outbox-id, outbox-key (for a row with one), as every
// sink with headers names them, headers (a JSON object) and payload; and,
// for one release more, event_id, outbox_id and key, their old names.
//
// A key's records are appended in id order: each batch goes in rounds,
// one pipeline a round, the n-th record of every key in round n, so that
// a key's record is sent only once the one before it is stored.
// Consumers deduplicate by outbox-event-id: a redelivery appends the entry
// again.
package redis

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func init() {
	// The client's own log lines (failed dials) would interleave with the
	// relay's: failures reach the relay as errors instead.
	goredis.SetLogger(quiet{})
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Entry fields: the event id, row id and key under the names every sink
// with headers gives them (sink.HeaderEventID, HeaderID, HeaderKey).
const (
	FieldEventID = sink.HeaderEventID
	FieldID      = sink.HeaderID
	FieldKey     = sink.HeaderKey
	FieldHeaders = "headers"
	FieldPayload = "payload"
)

// The fields' old names, written beside the new ones for one release
// more, so that consumers reading them keep working: deprecated.
const (
	OldFieldEventID = "event_id"
	OldFieldID      = "outbox_id"
	OldFieldKey     = "key"
)

// Defaults of Config.
const (
	DefaultDialTimeout = 5 * time.Second
	DefaultTimeout     = 5 * time.Second
	DefaultClientName  = "outbox-relay"
	// EntrySlack is what an entry's limit exceeds relay.max_batch_bytes
	// by unless max_entry_bytes is set: room for its other fields.
	EntrySlack = 64 << 10
)

// Config configures a Publisher. Zero values take the defaults.
type Config struct {
	// Name is the destination's, for errors.
	Name string
	// Addresses of the server, a cluster's seeds, or sentinels (with
	// MasterName). Required.
	Addresses  []string
	MasterName string
	DB         int
	Username   string
	Password   string
	// TLS, when set, is used to connect.
	TLS *tls.Config
	// MaxLen trims streams to about this many entries; 0 does not.
	MaxLen int64
	// MaxEntryBytes bounds an entry; 0 is unbounded.
	MaxEntryBytes int
	// DialTimeout bounds connecting; Timeout a round of commands.
	DialTimeout, Timeout time.Duration
	// ClientName names the connection at the server; default
	// DefaultClientName.
	ClientName string
}

// Publisher appends records to Redis streams.
type Publisher struct {
	cfg Config

	// closing is held to read by each publish while it takes the client,
	// and to write by Reload and Close as they replace or close it.
	closing sync.RWMutex
	closed  bool
	client  *client
}

// client is one client of the server, with the publishes in flight on it.
type client struct {
	rdb      goredis.UniversalClient
	inflight sync.WaitGroup
}

// New returns a Publisher for c. It connects as it publishes: a server
// that is down fails the records as the destination's failure.
func New(c Config) (*Publisher, error) {
	if len(c.Addresses) == 0 {
		return nil, errors.New("redis: addresses are required")
	}
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	return &Publisher{cfg: c, client: newClient(c)}, nil
}

func newClient(c Config) *client {
	return &client{rdb: goredis.NewUniversalClient(&goredis.UniversalOptions{
		Addrs: c.Addresses, MasterName: c.MasterName, DB: c.DB, ClientName: cmp.Or(c.ClientName, DefaultClientName),
		Username: c.Username, Password: c.Password, TLSConfig: c.TLS,
		DialTimeout: c.DialTimeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout,
		// The relay retries; a retry here would only hide an outage.
		MaxRetries: -1, DialerRetries: 1,
	})}
}

// Reload switches to a client with c's credentials and TLS material once
// it answers; the old client closes when its publishes end. When the new
// one cannot connect, p keeps its client.
func (p *Publisher) Reload(c Config) error {
	c.DialTimeout, c.Timeout = p.cfg.DialTimeout, p.cfg.Timeout
	next := newClient(c)
	ctx, cancel := context.WithTimeout(context.Background(), c.DialTimeout+c.Timeout)
	defer cancel()
	if err := next.rdb.Ping(ctx).Err(); err != nil {
		_ = next.rdb.Close()
		return fmt.Errorf("redis: reload: %w", err)
	}
	p.closing.Lock()
	if p.closed {
		p.closing.Unlock()
		_ = next.rdb.Close()
		return errors.New("redis: publisher closed")
	}
	old := p.client
	// Only the client changes: the settings publishes read stay.
	p.client = next
	p.closing.Unlock()
	go func() {
		old.inflight.Wait()
		_ = old.rdb.Close()
	}()
	return nil
}

// Close closes the client.
func (p *Publisher) Close() error {
	p.closing.Lock()
	defer p.closing.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.client.inflight.Wait()
	return p.client.rdb.Close()
}

func (p *Publisher) acquire() *client {
	p.closing.RLock()
	defer p.closing.RUnlock()
	if p.closed {
		return nil
	}
	p.client.inflight.Add(1)
	return p.client
}

// Ping says whether the server answers a PING (sink.Pinger).
func (p *Publisher) Ping(ctx context.Context) error {
	c := p.acquire()
	if c == nil {
		return errors.New("redis: publisher closed")
	}
	defer c.inflight.Done()
	return c.rdb.Ping(ctx).Err()
}

// Publish appends records in rounds, each key's in order, and returns one
// error per record.
func (p *Publisher) Publish(ctx context.Context, records []sink.Record) []error {
	errs := make([]error, len(records))
	c := p.acquire()
	if c == nil {
		for i := range errs {
			errs[i] = sink.DestinationFailure(sink.ClassTransient, errors.New("redis: publisher closed"))
		}
		return errs
	}
	defer c.inflight.Done()
	runs := sink.KeyRuns(records)
	failed := make([]bool, len(runs))
	type pending struct {
		run, rec int
		cmd      *goredis.StringCmd
	}
	for round := 0; ; round++ {
		pipe := c.rdb.Pipeline()
		var sent []pending
		for ri, run := range runs {
			if round >= len(run) {
				continue
			}
			i := run[round]
			if failed[ri] {
				errs[i] = sink.ErrNotSent
				continue
			}
			args, err := p.entry(&records[i])
			if err != nil {
				errs[i], failed[ri] = err, true
				continue
			}
			sent = append(sent, pending{ri, i, pipe.XAdd(ctx, args)})
		}
		if len(sent) == 0 {
			if !p.anyLeft(runs, round) {
				return errs
			}
			continue
		}
		_, execErr := pipe.Exec(ctx)
		for _, s := range sent {
			err := s.cmd.Err()
			if err == nil && s.cmd.Val() == "" {
				// Not sent: the pipeline failed before this command (a
				// connection that could not be made or authenticated).
				err = cmp.Or(execErr, errors.New("no reply"))
			}
			if err != nil {
				errs[s.rec], failed[s.run] = p.classify(ctx, records[s.rec].Topic, err), true
			}
		}
	}
}

// anyLeft reports whether a run has records after round.
func (p *Publisher) anyLeft(runs [][]int, round int) bool {
	for _, run := range runs {
		if round+1 < len(run) {
			return true
		}
	}
	return false
}

// entry is the XADD of r, or a permanent error for a row that cannot be
// one.
func (p *Publisher) entry(r *sink.Record) (*goredis.XAddArgs, error) {
	if err := ValidateStream(r.Topic); err != nil {
		return nil, sink.Permanent(err, sink.ReasonInvalidMessage)
	}
	headers, err := json.Marshal(r.Headers)
	if err != nil {
		return nil, sink.Permanent(fmt.Errorf("redis: headers of row %d: %w", r.ID, err), sink.ReasonInvalidMessage)
	}
	id, rowID := r.EventID.String(), strconv.FormatInt(r.ID, 10)
	values := []any{FieldEventID, id, FieldID, rowID}
	if r.HasKey {
		values = append(values, FieldKey, r.Key)
	}
	values = append(values, OldFieldEventID, id, OldFieldID, rowID)
	if r.HasKey {
		values = append(values, OldFieldKey, r.Key)
	}
	values = append(values, FieldHeaders, headers, FieldPayload, r.Payload)
	size := 2*(len(id)+20+len(r.Key)) + len(headers) + len(r.Payload) + 96
	if p.cfg.MaxEntryBytes > 0 && size > p.cfg.MaxEntryBytes {
		return nil, sink.Permanent(fmt.Errorf("redis: entry of %d bytes; max_entry_bytes is %d", size, p.cfg.MaxEntryBytes), sink.ReasonTooLarge)
	}
	args := &goredis.XAddArgs{Stream: r.Topic, Values: values}
	if p.cfg.MaxLen > 0 {
		args.MaxLen, args.Approx = p.cfg.MaxLen, true
	}
	return args, nil
}

// classify gives a failed XADD its class and scope.
func (p *Publisher) classify(ctx context.Context, stream string, err error) error {
	if ctx.Err() != nil {
		return sink.ContextFailure("redis", ctx.Err())
	}
	wrapped := fmt.Errorf("redis: stream %s: %w", stream, err)
	var rerr goredis.Error
	if !errors.As(err, &rerr) {
		// No answer: the network's classification.
		return sink.NetworkFailure(wrapped)
	}
	code, _, _ := strings.Cut(strings.TrimPrefix(rerr.Error(), "ERR "), " ")
	switch code {
	case "WRONGTYPE":
		return sink.TopicFailure(sink.ClassSystemic, fmt.Errorf("redis: the key %s holds another type than a stream: %w", stream, err))
	case "NOPERM":
		return sink.TopicFailure(sink.ClassSystemic, wrapped)
	case "NOAUTH", "WRONGPASS", "OOM", "READONLY", "MISCONF":
		// Credentials; memory full; a replica; persistence failing:
		// nothing is written until an operator acts.
		return sink.Systemic(wrapped)
	case "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN":
		return sink.DestinationFailure(sink.ClassTransient, wrapped)
	}
	return sink.Transient(wrapped, 0)
}

// ValidateStream reports whether name can name a stream: not empty.
func ValidateStream(name string) error {
	if name == "" {
		return errors.New("redis: the stream name is empty")
	}
	return nil
}
