// Package nats is the relay's NATS JetStream sink: it publishes each
// record to the subject named by its topic (or its route's topic) and waits
// for the stream's acknowledgement, with the event id as Nats-Msg-Id so
// that the stream drops the duplicates a redelivery sends within its
// duplicate window.
//
// A key's records are published one after another, each once the one
// before it is stored; different keys go at once (Concurrency). NATS has
// no message key: the key travels in the outbox-key header, beside
// outbox-event-id, outbox-id and the row's own headers.
package nats

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Headers the sink adds to every message.
const (
	HeaderEventID = sink.HeaderEventID
	HeaderID      = sink.HeaderID
	HeaderKey     = sink.HeaderKey
)

// Defaults of Config.
const (
	DefaultClientName     = "outbox-relay"
	DefaultConnectTimeout = 5 * time.Second
	DefaultAckTimeout     = 5 * time.Second
	DefaultConcurrency    = 256
	// reconnectWait is the pause between attempts to reach a server
	// again; the relay's breaker decides when rows are tried.
	reconnectWait = time.Second
)

// Config configures a Publisher. Zero values take the defaults.
type Config struct {
	// Name is the destination's, for errors.
	Name string
	// Servers are the servers' URLs. Required.
	Servers []string
	// ClientName names the connection to the servers.
	ClientName string
	// Username and Password, Token, or CredsFile authenticate; at most
	// one of them.
	Username, Password string
	Token              string
	CredsFile          string
	// TLS, when set, is used to connect.
	TLS *tls.Config
	// ConnectTimeout bounds connecting to a server; AckTimeout the wait
	// for one message's acknowledgement.
	ConnectTimeout, AckTimeout time.Duration
	// Concurrency is the most keys of a batch published at once.
	Concurrency int
}

func (c *Config) setDefaults() {
	c.ClientName = cmp.Or(c.ClientName, DefaultClientName)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.AckTimeout = cmp.Or(c.AckTimeout, DefaultAckTimeout)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
}

// Publisher publishes records to JetStream streams.
type Publisher struct {
	cfg Config

	// closing is held to read by each publish while it takes the
	// connection, and to write by Reload and Close as they replace or
	// close it.
	closing sync.RWMutex
	closed  bool
	conn    *connection

	// denied are the subjects the servers refused a publish to, for lack
	// of permission, and when.
	denied sync.Map // string → time.Time
	// refused is the last error the connection was lost or refused with.
	// A pointer, not an atomic.Value: the errors' types differ, which
	// an atomic.Value refuses (it panics).
	refused atomic.Pointer[error]
}

// connection is one connection to the servers, with the publishes in
// flight on it.
type connection struct {
	nc       *natsgo.Conn
	js       jetstream.JetStream
	inflight sync.WaitGroup
	tries    tries
}

// tries tells of the end of each attempt to reconnect.
type tries struct {
	mu    sync.Mutex
	ended chan struct{}
}

// next returns what is closed when the next attempt ends.
func (t *tries) next() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended == nil {
		t.ended = make(chan struct{})
	}
	return t.ended
}

func (t *tries) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended != nil {
		close(t.ended)
		t.ended = nil
	}
}

// New returns a Publisher for c. It does not wait for a server: a
// destination that is down when the relay starts is connected to once it
// is up, and until then its rows fail as the destination's failure.
func New(c Config) (*Publisher, error) {
	c.setDefaults()
	if len(c.Servers) == 0 {
		return nil, errors.New("nats: servers are required")
	}
	p := &Publisher{cfg: c}
	conn, err := p.connect(c, true)
	if err != nil {
		return nil, err
	}
	p.conn = conn
	return p, nil
}

// connect opens a connection for c; with retry, one that keeps trying to
// reach the servers, without, one that must connect now.
func (p *Publisher) connect(c Config, retry bool) (*connection, error) {
	conn := &connection{}
	opts := []natsgo.Option{
		natsgo.Name(c.ClientName),
		natsgo.Timeout(c.ConnectTimeout),
		natsgo.RetryOnFailedConnect(retry),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(reconnectWait),
		// While disconnected a publish fails at once rather than waiting
		// in a buffer: the relay defers its rows.
		natsgo.ReconnectBufSize(-1),
		// The client would give up on servers that refuse its credentials
		// twice; the relay keeps trying, so that credentials fixed on the
		// servers' side are taken up without a restart.
		natsgo.IgnoreAuthErrorAbort(),
		natsgo.NoCallbacksAfterClientClose(),
		natsgo.ErrorHandler(func(_ *natsgo.Conn, _ *natsgo.Subscription, err error) { p.noteDenied(err) }),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) { p.noteRefused(err) }),
		natsgo.ConnectHandler(func(*natsgo.Conn) { conn.tries.end() }),
		natsgo.ReconnectHandler(func(*natsgo.Conn) { conn.tries.end() }),
		natsgo.ReconnectErrHandler(func(*natsgo.Conn, error) { conn.tries.end() }),
	}
	switch {
	case c.Username != "":
		opts = append(opts, natsgo.UserInfo(c.Username, c.Password))
	case c.Token != "":
		opts = append(opts, natsgo.Token(c.Token))
	case c.CredsFile != "":
		opts = append(opts, natsgo.UserCredentials(c.CredsFile))
	}
	if c.TLS != nil {
		opts = append(opts, natsgo.Secure(c.TLS))
	}
	nc, err := natsgo.Connect(strings.Join(c.Servers, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("nats: connect: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: %w", err)
	}
	conn.nc, conn.js = nc, js
	return conn, nil
}

// Reload connects with c's credentials and TLS material and, once
// connected, publishes through the new connection; the old one closes
// when its publishes end. When it cannot connect, p keeps its connection.
func (p *Publisher) Reload(c Config) error {
	c.setDefaults()
	conn, err := p.connect(c, false)
	if err != nil {
		return err
	}
	p.closing.Lock()
	if p.closed {
		p.closing.Unlock()
		conn.nc.Close()
		return errors.New("nats: publisher closed")
	}
	old := p.conn
	// Only the connection changes: the settings publishes read stay.
	p.conn = conn
	p.closing.Unlock()
	go func() {
		old.inflight.Wait()
		old.nc.Close()
	}()
	return nil
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.closing.Lock()
	defer p.closing.Unlock()
	if !p.closed {
		p.closed = true
		p.conn.inflight.Wait()
		p.conn.nc.Close()
	}
	return nil
}

// acquire returns the connection for a publish, or nil once closed.
func (p *Publisher) acquire() *connection {
	p.closing.RLock()
	defer p.closing.RUnlock()
	if p.closed {
		return nil
	}
	p.conn.inflight.Add(1)
	return p.conn
}

// Publish publishes records, each key's in order and the keys at once,
// and returns one error per record.
func (p *Publisher) Publish(ctx context.Context, records []sink.Record) []error {
	errs := make([]error, len(records))
	conn := p.acquire()
	if conn == nil {
		fill(errs, sink.DestinationFailure(sink.ClassTransient, errors.New("nats: publisher closed")))
		return errs
	}
	defer conn.inflight.Done()
	if !conn.nc.IsConnected() && !p.reconnectNow(ctx, conn) {
		// Nothing can be sent: say so for every record at once.
		fill(errs, p.unreachable(conn))
		return errs
	}
	maxPayload := conn.nc.MaxPayload()
	runs := sink.KeyRuns(records)
	sem := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, run := range runs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			failed := false
			for _, i := range run {
				if failed {
					errs[i] = sink.ErrNotSent
					continue
				}
				errs[i] = p.publish(ctx, conn, &records[i], maxPayload)
				failed = errs[i] != nil
			}
		}()
	}
	wg.Wait()
	return errs
}

// Ping says whether the server answers (sink.Pinger): a connection that
// waits to reconnect tries at once (see reconnectNow), and the server
// answers a flush.
func (p *Publisher) Ping(ctx context.Context) error {
	conn := p.acquire()
	if conn == nil {
		return errors.New("nats: publisher closed")
	}
	defer conn.inflight.Done()
	if !conn.nc.IsConnected() && !p.reconnectNow(ctx, conn) {
		return p.unreachable(conn)
	}
	return conn.nc.FlushWithContext(ctx)
}

// reconnectNow has a connection that waits to reconnect try at once,
// rather than after its pause, and waits for the try (within ctx and the
// connect timeout). A publish while the server is down is the relay's
// probe of it: once the server is back, the probe finds it, rather than
// the next one a cool-down later. It reports whether the connection is
// up.
func (p *Publisher) reconnectNow(ctx context.Context, conn *connection) bool {
	if !conn.nc.IsReconnecting() {
		return false
	}
	tried := conn.tries.next()
	if conn.nc.ForceReconnect() != nil {
		return false
	}
	timeout := time.NewTimer(p.cfg.ConnectTimeout)
	defer timeout.Stop()
	select {
	case <-tried:
	case <-ctx.Done():
	case <-timeout.C:
	}
	return conn.nc.IsConnected()
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// publish publishes one record and waits for its acknowledgement.
func (p *Publisher) publish(ctx context.Context, conn *connection, r *sink.Record, maxPayload int64) error {
	if err := ctx.Err(); err != nil {
		return sink.Transient(fmt.Errorf("nats: %w", err), 0)
	}
	if err := ValidateSubject(r.Topic); err != nil {
		return sink.Permanent(err, sink.ReasonInvalidMessage)
	}
	msg := natsgo.NewMsg(r.Topic)
	msg.Data = r.Payload
	size := len(r.Payload) + len("NATS/1.0\r\n\r\n")
	for k, v := range r.Headers {
		if !validHeader(k, v) {
			return sink.Permanent(fmt.Errorf("nats: header %q cannot be sent in a NATS message", k), sink.ReasonInvalidMessage)
		}
		msg.Header[k] = []string{v}
		size += len(k) + len(v) + 4
	}
	id := r.EventID.String()
	msg.Header[HeaderEventID] = []string{id}
	msg.Header[HeaderID] = []string{strconv.FormatInt(r.ID, 10)}
	size += len(HeaderEventID) + len(id) + len(HeaderID) + 20 + 8
	if r.HasKey {
		if !validHeader(HeaderKey, r.Key) {
			return sink.Permanent(fmt.Errorf("nats: key %q cannot be sent in a NATS header", r.Key), sink.ReasonInvalidMessage)
		}
		msg.Header[HeaderKey] = []string{r.Key}
		size += len(HeaderKey) + len(r.Key) + 4
	}
	size += len(jetstream.MsgIDHeader) + len(id) + 4
	if maxPayload > 0 && int64(size) > maxPayload {
		return sink.Permanent(fmt.Errorf("nats: message of %d bytes; the server takes at most %d (max_payload)", size, maxPayload), sink.ReasonTooLarge)
	}
	actx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	_, err := conn.js.PublishMsg(actx, msg, jetstream.WithMsgID(id), jetstream.WithRetryAttempts(0))
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return sink.ContextFailure("nats", ctx.Err())
	}
	return p.classify(conn, r.Topic, err)
}

// JetStream's errors for a message whose expectations the stream does not
// meet, beside those the client names.
const (
	errStreamNotMatch jetstream.ErrorCode = 10060 // expected stream does not match
	errWrongLastMsgID jetstream.ErrorCode = 10070 // wrong last msg ID
)

// classify gives a failed publish its class and scope.
func (p *Publisher) classify(conn *connection, subject string, err error) error {
	wrapped := fmt.Errorf("nats: subject %s: %w", subject, err)
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return sink.Permanent(wrapped, sink.ReasonTooLarge)
		case errStreamNotMatch, errWrongLastMsgID, jetstream.JSErrCodeStreamWrongLastSequence,
			jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			// The row's own Nats-Expected-* headers ask for what the
			// stream is not: it would be refused every time.
			return sink.Permanent(wrapped, sink.ReasonPermanent)
		case jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
			return sink.Systemic(wrapped)
		}
		// The stream refused: full (limits with discard new), no leader,
		// out of storage. Its subjects wait together.
		return sink.TopicFailure(sink.ClassSystemic, wrapped)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, natsgo.ErrNoResponders):
		return sink.TopicFailure(sink.ClassSystemic,
			fmt.Errorf("nats: no stream takes subject %s: add it to a stream's subjects, or route the topic elsewhere: %w", subject, err))
	case errors.Is(err, natsgo.ErrMaxPayload):
		return sink.Permanent(wrapped, sink.ReasonTooLarge)
	case errors.Is(err, natsgo.ErrBadSubject), errors.Is(err, natsgo.ErrBadHeaderMsg):
		return sink.Permanent(wrapped, sink.ReasonInvalidMessage)
	case errors.Is(err, context.DeadlineExceeded) && p.deniedRecently(subject):
		return sink.TopicFailure(sink.ClassSystemic,
			fmt.Errorf("nats: the servers refuse to let the relay's user publish to %s (permissions violation): %w", subject, err))
	case errors.Is(err, natsgo.ErrConnectionClosed), errors.Is(err, natsgo.ErrConnectionReconnecting),
		errors.Is(err, natsgo.ErrDisconnected), errors.Is(err, natsgo.ErrNoServers),
		errors.Is(err, natsgo.ErrConnectionDraining), errors.Is(err, natsgo.ErrAuthorization),
		errors.Is(err, natsgo.ErrAuthExpired), errors.Is(err, natsgo.ErrAuthRevoked),
		errors.Is(err, natsgo.ErrAccountAuthExpired):
		return p.unreachable(conn)
	}
	return sink.NetworkFailure(wrapped)
}

// unreachable is the failure of a publish while the connection is down,
// with the last error the connection had (refused, authorization, …).
func (p *Publisher) unreachable(conn *connection) error {
	err := fmt.Errorf("nats: not connected to %s (%s)", strings.Join(p.cfg.Servers, ","), conn.nc.Status())
	if last := conn.nc.LastError(); last != nil {
		err = fmt.Errorf("%w: %w", err, last)
	} else if refused := p.refused.Load(); refused != nil {
		err = fmt.Errorf("%w: %w", err, *refused)
	}
	return sink.DestinationFailure(sink.ClassSystemic, err)
}

// noteRefused keeps why the servers refused the connection last, for the
// errors of publishes while it is down.
func (p *Publisher) noteRefused(err error) {
	if err != nil {
		p.refused.Store(&err)
	}
}

var deniedPublish = regexp.MustCompile(`Publish to "(\S+)"`)

// deniedFor is how long a permissions violation explains the publishes
// to its subject that go unanswered.
const deniedFor = time.Minute

func (p *Publisher) noteDenied(err error) {
	if !errors.Is(err, natsgo.ErrPermissionViolation) {
		return
	}
	if m := deniedPublish.FindStringSubmatch(err.Error()); m != nil {
		p.denied.Store(m[1], time.Now())
	}
}

func (p *Publisher) deniedRecently(subject string) bool {
	at, ok := p.denied.Load(subject)
	return ok && time.Since(at.(time.Time)) < deniedFor
}

// ValidateSubject reports whether name is a subject a message can be
// published to: dot-separated tokens, none empty, no wildcard (* or >),
// no whitespace.
func ValidateSubject(name string) error {
	if name == "" {
		return errors.New("nats: the subject is empty")
	}
	if strings.ContainsAny(name, " \t\r\n") {
		return fmt.Errorf("nats: subject %q contains whitespace", name)
	}
	for _, tok := range strings.Split(name, ".") {
		switch tok {
		case "":
			return fmt.Errorf("nats: subject %q has an empty token", name)
		case "*", ">":
			return fmt.Errorf("nats: subject %q has a wildcard; messages are published to a subject without one", name)
		}
	}
	return nil
}

// validHeader reports whether a header can travel in a NATS message.
func validHeader(k, v string) bool {
	return k != "" && !strings.ContainsAny(k, ": \t\r\n") && !strings.ContainsAny(v, "\r\n")
}

// readCreds checks a credentials file: a user JWT and its NKey seed.
func readCreds(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if _, err := nkeys.ParseDecoratedJWT(b); err != nil {
		return nil, fmt.Errorf("no user JWT: %w", err)
	}
	if _, err := nkeys.ParseDecoratedNKey(b); err != nil {
		return nil, fmt.Errorf("no NKey seed: %w", err)
	}
	return b, nil
}
