// Package sqs is the relay's Amazon SQS and SNS sink: a destination of
// kind sqs sends each record to the queue its topic (or its route's topic)
// names, one of kind sns publishes it to the topic so named, both with the
// batch calls (SendMessageBatch, PublishBatch) of up to ten entries.
//
// A message's body is the row's payload; its message attributes are the
// event id (outbox-event-id), the row id (outbox-id), the key
// (outbox-key, for a row with one) and the row's headers, ten at most as
// SQS allows. On a FIFO queue or topic (a name ending in .fifo) the key is
// the MessageGroupId (rows without a key share a configurable group) and
// the event id the MessageDeduplicationId, so a redelivery within the
// five-minute deduplication window is dropped by the queue.
//
// A key's records are sent in id order: each batch goes in rounds, the
// n-th record of every key in round n, so that a key's record is sent
// only once the one before it is stored.
package sqs

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Limits of SQS and SNS.
const (
	// MaxEntries is the most entries a batch call takes.
	MaxEntries = 10
	// MaxAttributes is the most message attributes a message carries
	// (SQS's limit, which SNS applies to messages it delivers to SQS).
	MaxAttributes = 10
	// DefaultSQSMessageBytes and DefaultSNSMessageBytes are the largest
	// message, body and attributes, each service takes; a batch call
	// carries at most as much in all.
	DefaultSQSMessageBytes = 1 << 20
	DefaultSNSMessageBytes = 256 << 10
	// DefaultGroupID is the MessageGroupId of rows without a key on a
	// FIFO queue or topic.
	DefaultGroupID = "outbox"
	// inFlight is how many batch calls a publish makes at once.
	inFlight = 8
)

// Config configures a Publisher. Zero values take the defaults.
type Config struct {
	// Name is the destination's, for errors.
	Name string
	// MaxMessageBytes bounds a message and a batch call: a larger row is
	// dead-lettered too_large.
	MaxMessageBytes int
	// GroupID is the MessageGroupId of rows without a key on FIFO queues
	// and topics.
	GroupID string
}

// Publisher sends records to SQS queues or SNS topics.
type Publisher struct {
	cfg     Config
	service string // SQS or SNS, for errors

	// closing is held to read by each publish while it takes the API,
	// and to write by Reload and Close as they replace it.
	closing sync.RWMutex
	closed  bool
	api     api
}

// api is one service's calls, behind which the Publisher is the same for
// SQS and SNS.
type api interface {
	// target returns the queue URL or topic ARN that topic names,
	// remembering it; an unknown one fails as its topic's failure.
	target(ctx context.Context, topic string) (string, error)
	// forget drops what target remembers of topic.
	forget(topic string)
	// send makes one batch call and returns the failure of each entry it
	// refused, by entry id, or the call's own error.
	send(ctx context.Context, target string, entries []*entry) (map[string]refusal, error)
	// ping connects to the service's endpoint, and hangs up.
	ping(ctx context.Context) error
}

// refusal is a batch entry the service refused.
type refusal struct {
	code, message string
	senderFault   bool
}

func newPublisher(service string, c Config, a api) *Publisher {
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultSQSMessageBytes
		if service == "SNS" {
			c.MaxMessageBytes = DefaultSNSMessageBytes
		}
	}
	c.GroupID = cmp.Or(c.GroupID, DefaultGroupID)
	return &Publisher{cfg: c, service: service, api: a}
}

// Close stops p; later publishes fail as the destination's failure.
func (p *Publisher) Close() error {
	p.closing.Lock()
	defer p.closing.Unlock()
	p.closed = true
	return nil
}

// reload switches p to a, built with new credentials.
func (p *Publisher) reload(a api) error {
	p.closing.Lock()
	defer p.closing.Unlock()
	if p.closed {
		return fmt.Errorf("%s: publisher closed", strings.ToLower(p.service))
	}
	p.api = a
	return nil
}

func (p *Publisher) current() api {
	p.closing.RLock()
	defer p.closing.RUnlock()
	if p.closed {
		return nil
	}
	return p.api
}

// entry is one record as a batch entry.
type entry struct {
	rec          int    // index in the publish's records
	id           string // the entry's id in its call: the row id
	body         string
	attrs        [][2]string // name, value; in a stable order
	group, dedup string      // FIFO only
	size         int
}

// Ping says whether the service's endpoint takes a connection
// (sink.Pinger): an emulator or a VPC endpoint that was down is back.
func (p *Publisher) Ping(ctx context.Context) error {
	a := p.current()
	if a == nil {
		return fmt.Errorf("%s: publisher closed", p.lower())
	}
	if err := a.ping(ctx); err != nil {
		return fmt.Errorf("%s: %w", p.lower(), err)
	}
	return nil
}

// Publish sends records in rounds, each key's in order, and returns one
// error per record.
func (p *Publisher) Publish(ctx context.Context, records []sink.Record) []error {
	errs := make([]error, len(records))
	a := p.current()
	if a == nil {
		for i := range errs {
			errs[i] = sink.DestinationFailure(sink.ClassTransient, fmt.Errorf("%s: publisher closed", strings.ToLower(p.service)))
		}
		return errs
	}
	runs := sink.KeyRuns(records)
	failed := make([]bool, len(runs))
	runOf := make([]int, len(records))
	for ri, run := range runs {
		for _, i := range run {
			runOf[i] = ri
		}
	}
	// A queue or topic that could not be found is looked up once a
	// publish, not once a row.
	missing := map[string]error{}
	for round := 0; ; round++ {
		byTarget := map[string][]*entry{}
		var order []string // targets in the order of their first entry
		more := false
		for ri, run := range runs {
			if round >= len(run) {
				continue
			}
			more = true
			i := run[round]
			if failed[ri] {
				errs[i] = sink.ErrNotSent
				continue
			}
			target, err := "", missing[records[i].Topic]
			if err == nil {
				if target, err = a.target(ctx, records[i].Topic); err != nil {
					missing[records[i].Topic] = err
				}
			}
			if err == nil {
				var e *entry
				e, err = p.entry(&records[i], i, target)
				if err == nil {
					if _, seen := byTarget[target]; !seen {
						order = append(order, target)
					}
					byTarget[target] = append(byTarget[target], e)
					continue
				}
			}
			errs[i], failed[ri] = p.classify(ctx, records[i].Topic, err), true
		}
		if !more {
			return errs
		}
		calls := p.batches(order, byTarget)
		p.sendAll(ctx, a, records, calls, errs)
		for _, c := range calls {
			for _, e := range c.entries {
				if errs[e.rec] != nil {
					failed[runOf[e.rec]] = true
				}
			}
		}
	}
}

// call is one batch call of a round.
type call struct {
	target  string
	entries []*entry
}

// batches splits a round's entries into calls of at most MaxEntries
// entries and MaxMessageBytes bytes each.
func (p *Publisher) batches(order []string, byTarget map[string][]*entry) []call {
	var calls []call
	for _, target := range order {
		var cur call
		size := 0
		for _, e := range byTarget[target] {
			if len(cur.entries) == MaxEntries || (len(cur.entries) > 0 && size+e.size > p.cfg.MaxMessageBytes) {
				calls = append(calls, cur)
				cur, size = call{}, 0
			}
			cur.target = target
			cur.entries = append(cur.entries, e)
			size += e.size
		}
		if len(cur.entries) > 0 {
			calls = append(calls, cur)
		}
	}
	return calls
}

// sendAll makes a round's calls, inFlight at a time, and sets the error
// of each entry that failed.
func (p *Publisher) sendAll(ctx context.Context, a api, records []sink.Record, calls []call, errs []error) {
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for _, c := range calls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p.send(ctx, a, records, c, errs)
		})
	}
	wg.Wait()
}

// send makes one call. A call refused as a whole for what one of its
// entries may be (a request the service calls malformed) is made again
// entry by entry, so that only the entry at fault fails for good.
func (p *Publisher) send(ctx context.Context, a api, records []sink.Record, c call, errs []error) {
	refused, err := a.send(ctx, c.target, c.entries)
	if err != nil {
		if len(c.entries) > 1 && malformed(err) {
			for _, e := range c.entries {
				p.send(ctx, a, records, call{target: c.target, entries: []*entry{e}}, errs)
			}
			return
		}
		if isMissing(err) {
			a.forget(records[c.entries[0].rec].Topic)
		}
		for _, e := range c.entries {
			errs[e.rec] = p.classify(ctx, records[e.rec].Topic, err)
		}
		return
	}
	for _, e := range c.entries {
		if r, ok := refused[e.id]; ok {
			errs[e.rec] = p.refused(records[e.rec].Topic, r)
		}
	}
}

// entry makes r a batch entry for target, or returns a permanent error
// for a row that cannot be a message.
func (p *Publisher) entry(r *sink.Record, i int, target string) (*entry, error) {
	topic := r.Topic
	if len(r.Payload) == 0 {
		return nil, sink.Permanent(fmt.Errorf("%s: %s: the payload of row %d is empty; a message body must not be", p.lower(), topic, r.ID), sink.ReasonInvalidMessage)
	}
	if bad := invalidText(r.Payload); bad != "" {
		return nil, sink.Permanent(fmt.Errorf("%s: %s: the payload of row %d is not text %s allows: %s", p.lower(), topic, r.ID, p.service, bad), sink.ReasonInvalidMessage)
	}
	e := &entry{rec: i, id: strconv.FormatInt(r.ID, 10), body: string(r.Payload)}
	e.attrs = append(e.attrs, [2]string{sink.HeaderEventID, r.EventID.String()}, [2]string{sink.HeaderID, e.id})
	if r.HasKey {
		e.attrs = append(e.attrs, [2]string{sink.HeaderKey, r.Key})
	}
	for _, name := range slices.Sorted(maps.Keys(r.Headers)) {
		e.attrs = append(e.attrs, [2]string{name, r.Headers[name]})
	}
	if len(e.attrs) > MaxAttributes {
		return nil, sink.Permanent(fmt.Errorf("%s: %s: row %d needs %d message attributes (%d headers and the relay's %d); %s takes at most %d",
			p.lower(), topic, r.ID, len(e.attrs), len(r.Headers), len(e.attrs)-len(r.Headers), p.service, MaxAttributes), sink.ReasonInvalidMessage)
	}
	e.size = len(e.body)
	for _, kv := range e.attrs {
		if err := checkAttribute(kv[0], kv[1]); err != nil {
			return nil, sink.Permanent(fmt.Errorf("%s: %s: row %d: %w", p.lower(), topic, r.ID, err), sink.ReasonInvalidMessage)
		}
		e.size += len(kv[0]) + len("String") + len(kv[1])
	}
	if e.size > p.cfg.MaxMessageBytes {
		return nil, sink.Permanent(fmt.Errorf("%s: %s: the message of row %d is %d bytes; the limit is %d", p.lower(), topic, r.ID, e.size, p.cfg.MaxMessageBytes), sink.ReasonTooLarge)
	}
	if strings.HasSuffix(target, ".fifo") {
		e.group, e.dedup = p.cfg.GroupID, r.EventID.String()
		if r.HasKey {
			e.group = r.Key
		}
		if len(e.group) > 128 {
			return nil, sink.Permanent(fmt.Errorf("%s: %s: the key of row %d is %d bytes; a MessageGroupId takes at most 128", p.lower(), topic, r.ID, len(e.group)), sink.ReasonInvalidMessage)
		}
	}
	return e, nil
}

func (p *Publisher) lower() string { return strings.ToLower(p.service) }

// invalidText says what in b a message body cannot hold (not UTF-8, or a
// character outside #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD |
// #x10000 to #x10FFFF), or "" when it can hold b.
func invalidText(b []byte) string {
	if !utf8.Valid(b) {
		return "it is not valid UTF-8"
	}
	for _, c := range string(b) {
		switch {
		case c == 0x9 || c == 0xA || c == 0xD:
		case c >= 0x20 && c <= 0xD7FF, c >= 0xE000 && c <= 0xFFFD, c >= 0x10000 && c <= 0x10FFFF:
		default:
			return fmt.Sprintf("the character %U", c)
		}
	}
	return ""
}

// checkAttribute reports what makes name and value no message attribute.
func checkAttribute(name, value string) error {
	switch {
	case name == "" || len(name) > 256:
		return fmt.Errorf("the header name %q must be 1 to 256 characters long", name)
	case strings.HasPrefix(strings.ToLower(name), "aws.") || strings.HasPrefix(strings.ToLower(name), "amazon."):
		return fmt.Errorf("the header name %q begins with a prefix AWS reserves", name)
	case strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, ".."):
		return fmt.Errorf("the header name %q may not begin or end with a period, or have two in a row", name)
	case value == "":
		return fmt.Errorf("the header %q is empty; a message attribute's value may not be", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("the header name %q has %q: a message attribute's name has letters, digits, -, _ and . only", name, c)
		}
	}
	if bad := invalidText([]byte(value)); bad != "" {
		return fmt.Errorf("the header %q is not text a message attribute holds: %s", name, bad)
	}
	return nil
}
