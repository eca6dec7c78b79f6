// Package rabbitmq is the relay's RabbitMQ sink: it publishes each record
// to the destination's exchange with the record's topic (or its route's
// topic) as the routing key, persistent, mandatory, and with publisher
// confirms: a record is delivered once the broker confirms it and did not
// return it as unroutable. message_id is the event id; the row's headers
// travel as AMQP headers beside outbox-event-id, outbox-id and outbox-key.
//
// A key's records are published in id order: each batch goes in rounds,
// the n-th record of every key in round n, and a round is confirmed
// before the next is sent, so that a key's record is sent only once the
// one before it is stored.
package rabbitmq

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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
	DefaultDialTimeout    = 5 * time.Second
	DefaultConfirmTimeout = 10 * time.Second
	// MessageSlack is what a message's limit exceeds relay.max_batch_bytes
	// by unless max_message_bytes is set.
	MessageSlack = 64 << 10
	// maxShortString bounds an AMQP short string: routing keys, exchange
	// names.
	maxShortString = 255
)

// Config configures a Publisher. Zero values take the defaults.
type Config struct {
	// Name is the destination's, for errors.
	Name string
	// URL is the broker's; Password its user's.
	URL, Password string
	// Exchange receives the messages; empty is the default exchange.
	Exchange string
	// TLS, when set, is used for amqps URLs.
	TLS *tls.Config
	// MaxMessageBytes bounds a message's body and headers; 0 is
	// unbounded.
	MaxMessageBytes int
	// DialTimeout bounds connecting; ConfirmTimeout a round's confirms.
	DialTimeout, ConfirmTimeout time.Duration
	// ClientName names the connection at the broker; default outbox-relay
	// and Name.
	ClientName string
}

// Publisher publishes records to a RabbitMQ exchange. Publishes take
// turns on one channel, whose confirms come in order.
type Publisher struct {
	mu     sync.Mutex
	cfg    Config
	conn   *amqp.Connection
	ch     *channel
	closed bool

	blockedMu sync.Mutex
	blocked   string // why the broker blocks publishing, or ""
}

// channel is a confirming channel with what it reports: closing, and the
// messages returned as unroutable.
type channel struct {
	ch     *amqp.Channel
	closes chan *amqp.Error
	// returns is drained by a goroutine into returned. A flush request
	// is answered once every return received before it has been noted;
	// done closes when the library closes returns.
	returns  chan amqp.Return
	flushes  chan chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	returned map[string]amqp.Return
}

// forget drops the returns noted so far: a round notes its own, and one
// that came too late for its round must not speak for a later one.
func (c *channel) forget() {
	c.mu.Lock()
	clear(c.returned)
	c.mu.Unlock()
}

// flush waits until every return received so far has been noted, or the
// channel is gone.
func (c *channel) flush() {
	reply := make(chan struct{})
	select {
	case c.flushes <- reply:
		<-reply
	case <-c.done:
	}
}

// New returns a Publisher for c. It connects as it publishes: a broker
// that is down fails the records as the destination's failure.
func New(c Config) (*Publisher, error) {
	if c.URL == "" {
		return nil, errors.New("rabbitmq: url is required")
	}
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.ConfirmTimeout = cmp.Or(c.ConfirmTimeout, DefaultConfirmTimeout)
	return &Publisher{cfg: c}, nil
}

// dial connects with c.
func (p *Publisher) dial(c Config) (*amqp.Connection, error) {
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, err
	}
	if c.Password != "" {
		u.User = url.UserPassword(u.User.Username(), c.Password)
	}
	dial := amqp.DefaultDial(c.DialTimeout)
	conn, err := amqp.DialConfig(u.String(), amqp.Config{
		TLSClientConfig: c.TLS,
		// A broker that stops reading (an alarm raised while a batch is
		// written) fails the write after a while rather than holding it.
		Dial: func(network, addr string) (net.Conn, error) {
			nc, err := dial(network, addr)
			if err != nil {
				return nil, err
			}
			return &deadlineConn{Conn: nc, timeout: c.ConfirmTimeout}, nil
		},
		Properties: amqp.Table{"connection_name": cmp.Or(c.ClientName, "outbox-relay "+c.Name)},
	})
	if err != nil {
		return nil, err
	}
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		for b := range blocks {
			p.blockedMu.Lock()
			p.blocked = ""
			if b.Active {
				p.blocked = cmp.Or(b.Reason, "blocked")
			}
			p.blockedMu.Unlock()
		}
	}()
	return conn, nil
}

// ready returns the channel to publish on, connecting and opening it as
// needed. p.mu is held.
func (p *Publisher) ready() (*channel, error) {
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := p.dial(p.cfg)
		if err != nil {
			return nil, err
		}
		p.conn, p.ch = conn, nil
		p.blockedMu.Lock()
		p.blocked = ""
		p.blockedMu.Unlock()
	}
	if p.ch != nil && !p.ch.ch.IsClosed() {
		return p.ch, nil
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	c := &channel{ch: ch, closes: ch.NotifyClose(make(chan *amqp.Error, 1)),
		returns: make(chan amqp.Return), flushes: make(chan chan struct{}), done: make(chan struct{}),
		returned: map[string]amqp.Return{}}
	ch.NotifyReturn(c.returns)
	go func() {
		defer close(c.done)
		for {
			// A return the library handed over before a confirm is
			// received before that confirm is; the loop notes it before it
			// takes the next flush request.
			select {
			case r, ok := <-c.returns:
				if !ok {
					return
				}
				c.mu.Lock()
				c.returned[r.MessageId] = r
				c.mu.Unlock()
			case reply := <-c.flushes:
				close(reply)
			}
		}
	}()
	p.ch = c
	return c, nil
}

// Reload connects with c's password and TLS material and, once
// connected, publishes through the new connection. When it cannot
// connect, p keeps its connection.
func (p *Publisher) Reload(c Config) error {
	c.DialTimeout, c.ConfirmTimeout = p.cfg.DialTimeout, p.cfg.ConfirmTimeout
	conn, err := p.dial(c)
	if err != nil {
		return fmt.Errorf("rabbitmq: reload: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = conn.Close()
		return errors.New("rabbitmq: publisher closed")
	}
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch, p.cfg = conn, nil, c
	return nil
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn.Close()
	}
	return nil
}

// Ping says whether the broker answers (sink.Pinger): it connects as
// needed, and opens and closes a channel, a round trip to the broker. A
// publish under way holds the connection: the ping is then skipped.
func (p *Publisher) Ping(ctx context.Context) error {
	if !p.mu.TryLock() {
		return sink.ErrPingSkipped
	}
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("rabbitmq: publisher closed")
	}
	if _, err := p.ready(); err != nil {
		return err
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return err
	}
	return ch.Close()
}

// Publish publishes records in rounds, each key's in order, and returns
// one error per record.
func (p *Publisher) Publish(ctx context.Context, records []sink.Record) []error {
	errs := make([]error, len(records))
	fill := func(err error) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		fill(sink.DestinationFailure(sink.ClassTransient, errors.New("rabbitmq: publisher closed")))
		return errs
	}
	ch, err := p.ready()
	if err != nil {
		fill(p.classify(ctx, "", err))
		return errs
	}
	p.blockedMu.Lock()
	blocked := p.blocked
	p.blockedMu.Unlock()
	if blocked != "" {
		fill(sink.Systemic(fmt.Errorf("rabbitmq: the broker blocks publishing (%s): a memory or disk alarm", blocked)))
		return errs
	}
	runs := sink.KeyRuns(records)
	failed := make([]bool, len(runs))
	settled := make([]bool, len(records)) // confirmed, or failed for good
	for round := 0; ; round++ {
		ch.forget()
		var sent []pending
		left := false
		for ri, run := range runs {
			if round >= len(run) {
				continue
			}
			left = true
			i := run[round]
			if failed[ri] {
				errs[i] = sink.ErrNotSent
				continue
			}
			msg, err := p.message(&records[i])
			if err != nil {
				errs[i], failed[ri] = err, true
				continue
			}
			dc, err := ch.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, records[i].Topic, true, false, msg)
			if err != nil {
				// The channel or the connection is gone: nothing more goes
				// in this publish. The records confirmed in earlier rounds
				// stay delivered; this round's are waited for first.
				// A key whose record failed in this round keeps its later
				// records unsent, as it would in the next round.
				p.confirm(ctx, ch, records, errs, failed, settled, sent)
				err = p.classify(ctx, records[i].Topic, err)
				for ri, run := range runs {
					for _, j := range run {
						switch {
						case errs[j] != nil || settled[j]:
						case failed[ri]:
							errs[j] = sink.ErrNotSent
						default:
							errs[j] = err
						}
					}
				}
				return errs
			}
			sent = append(sent, pending{ri, i, msg.MessageId, dc})
		}
		if !left {
			return errs
		}
		p.confirm(ctx, ch, records, errs, failed, settled, sent)
	}
}

// pending is a published record of a round, awaiting its confirm.
type pending struct {
	run, rec int
	id       string
	dc       *amqp.DeferredConfirmation
}

// confirm waits for the confirms of a round and sets each record's
// outcome: confirmed, returned as unroutable, refused, or lost with the
// channel.
func (p *Publisher) confirm(ctx context.Context, ch *channel, records []sink.Record, errs []error, failed, settled []bool, sent []pending) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	type outcome struct {
		run, rec int
		id       string
		ack      bool
		err      error
	}
	var outcomes []outcome
	for _, s := range sent {
		ack, err := s.dc.WaitContext(cctx)
		outcomes = append(outcomes, outcome{s.run, s.rec, s.id, ack, err})
	}
	// Returns come before their confirms: once flushed, every return of
	// this round has been noted.
	ch.flush()
	var closeErr *amqp.Error
	select {
	case closeErr = <-ch.closes:
		p.ch = nil
	default:
	}
	// The record the broker closed the channel over: the one of the size
	// its reason names, or else the first it left unconfirmed. A channel
	// that closed with its connection (lost, reset, or closed by the
	// client's reader or writer) was closed over no record: every record
	// left unconfirmed went down with it.
	culprit := -1
	if closeErr != nil && closeErr.Server && closeErr.Recover {
		if m := tooLarge.FindStringSubmatch(closeErr.Reason); m != nil {
			for _, o := range outcomes {
				if !o.ack && strconv.Itoa(len(records[o.rec].Payload)) == m[1] {
					culprit = o.rec
					break
				}
			}
		}
		for _, o := range outcomes {
			if culprit < 0 && !o.ack {
				culprit = o.rec
			}
		}
	}
	for _, o := range outcomes {
		topic := records[o.rec].Topic
		ch.mu.Lock()
		ret, returned := ch.returned[o.id]
		delete(ch.returned, o.id)
		ch.mu.Unlock()
		var err error
		switch {
		case returned:
			err = sink.TopicFailure(sink.ClassSystemic, fmt.Errorf("rabbitmq: routing key %s: unroutable, returned by exchange %q (%d %s): bind a queue for it, or route the topic elsewhere",
				topic, p.cfg.Exchange, ret.ReplyCode, ret.ReplyText))
		case o.err != nil:
			err = p.classify(ctx, topic, o.err)
		case !o.ack && closeErr != nil && o.rec == culprit:
			// The others went down with it.
			err = p.classify(ctx, topic, closeErr)
		case !o.ack && culprit >= 0 && records[o.rec].HasKey && records[culprit].HasKey && records[o.rec].Key == records[culprit].Key:
			err = sink.ErrNotSent
		case !o.ack && culprit >= 0:
			err = sink.DestinationFailure(sink.ClassTransient, fmt.Errorf("rabbitmq: the channel closed under the message, over another one's failure: %w", closeErr))
		case !o.ack && closeErr != nil:
			err = p.classify(ctx, topic, closeErr)
		case !o.ack:
			err = sink.TopicFailure(sink.ClassSystemic, fmt.Errorf("rabbitmq: routing key %s: the broker refused the message (nack): a queue full with overflow reject-publish, or an internal error", topic))
		}
		if err != nil {
			errs[o.rec], failed[o.run] = err, true
		}
		settled[o.rec] = true
	}
}

// message is the AMQP message of r, or a permanent error for a row that
// cannot be one.
func (p *Publisher) message(r *sink.Record) (amqp.Publishing, error) {
	if err := ValidateRoutingKey(r.Topic); err != nil {
		return amqp.Publishing{}, sink.Permanent(err, sink.ReasonInvalidMessage)
	}
	h := make(amqp.Table, len(r.Headers)+3)
	size := len(r.Payload)
	contentType := ""
	for k, v := range r.Headers {
		if k == "content-type" {
			contentType = v
			continue
		}
		if len(k) > maxShortString {
			return amqp.Publishing{}, sink.Permanent(fmt.Errorf("rabbitmq: header name %.40q... is longer than %d bytes", k, maxShortString), sink.ReasonInvalidMessage)
		}
		h[k] = v
		size += len(k) + len(v) + 6
	}
	id := r.EventID.String()
	h[HeaderEventID] = id
	h[HeaderID] = strconv.FormatInt(r.ID, 10)
	if r.HasKey {
		h[HeaderKey] = r.Key
		size += len(r.Key)
	}
	size += 128 // the ids and the properties
	if p.cfg.MaxMessageBytes > 0 && size > p.cfg.MaxMessageBytes {
		return amqp.Publishing{}, sink.Permanent(fmt.Errorf("rabbitmq: message of %d bytes; max_message_bytes is %d", size, p.cfg.MaxMessageBytes), sink.ReasonTooLarge)
	}
	return amqp.Publishing{Headers: h, ContentType: contentType, DeliveryMode: amqp.Persistent, MessageId: id,
		Timestamp: r.CreatedAt, Body: r.Payload}, nil
}

// classify gives a failure its class and scope.
func (p *Publisher) classify(ctx context.Context, topic string, err error) error {
	if ctx.Err() != nil {
		return sink.ContextFailure("rabbitmq", ctx.Err())
	}
	var aerr *amqp.Error
	if errors.As(err, &aerr) {
		wrapped := fmt.Errorf("rabbitmq: %w", err)
		switch aerr.Code {
		case amqp.FrameError:
			// amqp091-go reports any read or write error on the
			// connection as 501, frame error, whatever its cause (a
			// reset, a broker killed); from the broker it says the
			// connection's frames are broken. A property of the
			// connection, never of a message: the message may or may not
			// have reached the broker, so it is sent again, a duplicate
			// at worst.
			return sink.DestinationFailure(sink.ClassTransient, fmt.Errorf("rabbitmq: the connection failed under the publish: %w", err))
		case amqp.AccessRefused:
			// Authentication, or no permission on the vhost or the exchange.
			return sink.Systemic(wrapped)
		case amqp.NotFound:
			return sink.Systemic(fmt.Errorf("rabbitmq: exchange %q does not exist: declare it, or fix the destination's exchange: %w", p.cfg.Exchange, err))
		case amqp.ContentTooLarge, amqp.PreconditionFailed:
			switch {
			case !aerr.Server:
				// Not the broker's answer to a message: the client's.
				return sink.DestinationFailure(sink.ClassTransient, wrapped)
			case aerr.Code == amqp.ContentTooLarge, strings.Contains(aerr.Reason, "message size"):
				return sink.Permanent(wrapped, sink.ReasonTooLarge)
			}
			return sink.Permanent(wrapped, sink.ReasonPermanent)
		case amqp.ConnectionForced, amqp.ResourceError, amqp.InternalError, amqp.ChannelError:
			return sink.DestinationFailure(sink.ClassTransient, wrapped)
		}
		return sink.DestinationFailure(sink.ClassTransient, wrapped)
	}
	if errors.Is(err, amqp.ErrClosed) {
		return sink.DestinationFailure(sink.ClassTransient, fmt.Errorf("rabbitmq: the connection closed: %w", err))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return sink.DestinationFailure(sink.ClassTransient, fmt.Errorf("rabbitmq: no confirm within %s: %w", p.cfg.ConfirmTimeout, err))
	}
	return sink.NetworkFailure(fmt.Errorf("rabbitmq: %w", err))
}

// tooLarge finds the size in the reason of a channel closed over a
// message above the broker's max_message_size.
var tooLarge = regexp.MustCompile(`message size (\d+) is larger`)

// deadlineConn bounds each write.
type deadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// ValidateRoutingKey reports whether name can be a routing key (or an
// exchange's name): at most 255 bytes.
func ValidateRoutingKey(name string) error {
	if len(name) > maxShortString {
		return fmt.Errorf("rabbitmq: %.40q... is %d bytes; AMQP allows at most %d", name, len(name), maxShortString)
	}
	return nil
}
