// Package pubsub is the relay's Google Cloud Pub/Sub sink: it publishes
// each record to the topic its topic (or its route's topic) names in the
// destination's project, with the row's key as the ordering key and its
// headers as attributes beside outbox-event-id and outbox-id.
//
// Ordered publishing keeps a key's records in order: the client sends a
// key's messages one batch at a time, and after a failure it publishes
// nothing more of that key until the relay resumes it, so a key's record
// is never sent past one that failed. Records without a key are not
// ordered.
package pubsub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	"github.com/googleapis/gax-go/v2"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Attributes the sink adds to every message.
const (
	AttributeEventID = sink.HeaderEventID
	AttributeID      = sink.HeaderID
)

// Pub/Sub's limits on a message.
const (
	// MaxMessageBytes is the largest message Pub/Sub takes.
	MaxMessageBytes = 10 << 20
	maxAttributes   = 100
	maxAttrKey      = 256
	maxAttrValue    = 1024
	maxOrderingKey  = 1024
)

// Defaults of Config.
const DefaultTimeout = 10 * time.Second

// DefaultClientName is the requests' User-Agent unless client_name says
// otherwise.
const DefaultClientName = "outbox-relay"

// Config configures a Publisher.
type Config struct {
	// Name is the destination's, for errors.
	Name string
	// Project is the Google Cloud project of the topics. Required.
	Project string
	// CredentialsFile is a service account key (JSON); empty uses the
	// environment's default credentials.
	CredentialsFile string
	// Emulator, when set, is the host:port of a Pub/Sub emulator, spoken
	// to without TLS or credentials.
	Emulator string
	// MaxMessageBytes bounds a message's data and attributes; default
	// Pub/Sub's 10 MB.
	MaxMessageBytes int
	// Timeout bounds a publish. Default 10s.
	Timeout time.Duration
	// ClientName is the requests' User-Agent. Default outbox-relay.
	ClientName string
}

// Publisher publishes records to Pub/Sub topics.
type Publisher struct {
	cfg    Config
	client *gpubsub.Client

	mu     sync.Mutex
	topics map[string]*gpubsub.Publisher
}

// New returns a Publisher for c.
func New(c Config) (*Publisher, error) {
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, MaxMessageBytes)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	client, err := newClient(c)
	if err != nil {
		return nil, err
	}
	return &Publisher{cfg: c, client: client, topics: map[string]*gpubsub.Publisher{}}, nil
}

func newClient(c Config) (*gpubsub.Client, error) {
	if c.Project == "" {
		return nil, errors.New("pubsub: project is required")
	}
	opts := []option.ClientOption{option.WithUserAgent(cmp.Or(c.ClientName, DefaultClientName))}
	switch {
	case c.Emulator != "":
		opts = append(opts, option.WithEndpoint(c.Emulator), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	case c.CredentialsFile != "":
		opts = append(opts, option.WithAuthCredentialsFile(option.ServiceAccount, c.CredentialsFile))
	}
	// The relay retries; the client's own retries would only hold a
	// publish while the service is down.
	noRetry := []gax.CallOption{gax.WithRetry(func() gax.Retryer { return gax.OnCodes(nil, gax.Backoff{}) })}
	client, err := gpubsub.NewClientWithConfig(context.Background(), c.Project,
		&gpubsub.ClientConfig{TopicAdminCallOptions: &vkit.TopicAdminCallOptions{Publish: noRetry}}, opts...)
	if err != nil {
		return nil, fmt.Errorf("pubsub: %w", err)
	}
	return client, nil
}

// Reload switches to a client for c (its credentials file read anew);
// the old one closes once its publishes are flushed.
func (p *Publisher) Reload(c Config) error {
	c.MaxMessageBytes, c.Timeout = p.cfg.MaxMessageBytes, p.cfg.Timeout
	client, err := newClient(c)
	if err != nil {
		return err
	}
	p.mu.Lock()
	old, oldTopics := p.client, p.topics
	// Only the client changes: the settings publishes read stay.
	p.client, p.topics = client, map[string]*gpubsub.Publisher{}
	p.mu.Unlock()
	go func() {
		for _, t := range oldTopics {
			t.Stop()
		}
		_ = old.Close()
	}()
	return nil
}

// Close stops the topics' publishers and closes the client.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.topics {
		t.Stop()
	}
	p.topics = map[string]*gpubsub.Publisher{}
	return p.client.Close()
}

// topic returns the publisher of topic id.
func (p *Publisher) topic(id string) *gpubsub.Publisher {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.topics[id]
	if !ok {
		t = p.client.Publisher(id)
		t.EnableMessageOrdering = true
		t.PublishSettings.DelayThreshold = time.Millisecond
		t.PublishSettings.CountThreshold = 1000
		t.PublishSettings.Timeout = p.cfg.Timeout
		p.topics[id] = t
	}
	return t
}

// Publish publishes records, each key's in order, and returns one error
// per record. A key whose records go to one topic is ordered by the
// topic's ordering key; a key whose records go to several topics is
// published one record at a time, each once the one before is stored.
func (p *Publisher) Publish(ctx context.Context, records []sink.Record) []error {
	errs := make([]error, len(records))
	topicOf := map[string]string{}
	spread := map[string]bool{} // keys whose records go to several topics
	for _, r := range records {
		if !r.HasKey {
			continue
		}
		if t, ok := topicOf[r.Key]; ok && t != r.Topic {
			spread[r.Key] = true
		}
		topicOf[r.Key] = r.Topic
	}
	results := make([]*gpubsub.PublishResult, len(records))
	failedKeys := map[string]bool{}
	sequences := map[string][]int{}
	for i := range records {
		r := &records[i]
		if r.HasKey && spread[r.Key] {
			sequences[r.Key] = append(sequences[r.Key], i)
			continue
		}
		if r.HasKey && failedKeys[r.Key] {
			errs[i] = sink.ErrNotSent
			continue
		}
		msg, err := p.message(r)
		if err != nil {
			errs[i] = err
			if r.HasKey {
				failedKeys[r.Key] = true
			}
			continue
		}
		results[i] = p.topic(r.Topic).Publish(ctx, msg)
	}
	var wg sync.WaitGroup
	for _, seq := range sequences {
		wg.Go(func() {
			for j, i := range seq {
				r := &records[i]
				msg, err := p.message(r)
				if err == nil {
					_, err = p.wait(ctx, r, p.topic(r.Topic).Publish(ctx, msg))
				}
				if err != nil {
					errs[i] = err
					for _, later := range seq[j+1:] {
						errs[later] = sink.ErrNotSent
					}
					return
				}
			}
		})
	}
	for i, res := range results {
		if res != nil {
			_, errs[i] = p.wait(ctx, &records[i], res)
		}
	}
	wg.Wait()
	// A key's rows after its first failure count as not sent, whatever
	// the bundle they shared said; once every outcome is in, the key may
	// publish again: the relay decides when its rows go.
	failed := map[string]bool{}
	for i, r := range records {
		if !r.HasKey {
			continue
		}
		if failed[r.Key] && errs[i] != nil {
			errs[i] = sink.ErrNotSent
		}
		if errs[i] != nil {
			failed[r.Key] = true
			p.topic(r.Topic).ResumePublish(r.Key)
		}
	}
	return errs
}

// wait returns the outcome of r's publish.
func (p *Publisher) wait(ctx context.Context, r *sink.Record, res *gpubsub.PublishResult) (string, error) {
	id, err := res.Get(ctx)
	if err == nil {
		return id, nil
	}
	var paused gpubsub.ErrPublishingPaused
	if errors.As(err, &paused) {
		return "", sink.ErrNotSent
	}
	return "", p.classify(ctx, r.Topic, err)
}

// message is the Pub/Sub message of r, or a permanent error for a row
// that cannot be one.
func (p *Publisher) message(r *sink.Record) (*gpubsub.Message, error) {
	if err := ValidateTopic(r.Topic); err != nil {
		return nil, sink.Permanent(err, sink.ReasonInvalidMessage)
	}
	if len(r.Headers)+2 > maxAttributes {
		return nil, sink.Permanent(fmt.Errorf("pubsub: %d headers; a message takes %d attributes with the relay's two", len(r.Headers), maxAttributes), sink.ReasonInvalidMessage)
	}
	attrs := make(map[string]string, len(r.Headers)+2)
	size := len(r.Payload) + len(r.Key)
	for k, v := range r.Headers {
		if k == "" || len(k) > maxAttrKey || strings.HasPrefix(strings.ToLower(k), "goog") || len(v) > maxAttrValue {
			return nil, sink.Permanent(fmt.Errorf("pubsub: header %.40q cannot be an attribute (a name of 1 to %d bytes not starting with goog, a value of at most %d)", k, maxAttrKey, maxAttrValue), sink.ReasonInvalidMessage)
		}
		attrs[k] = v
		size += len(k) + len(v)
	}
	attrs[AttributeEventID] = r.EventID.String()
	attrs[AttributeID] = strconv.FormatInt(r.ID, 10)
	size += 80
	if len(r.Key) > maxOrderingKey {
		return nil, sink.Permanent(fmt.Errorf("pubsub: key of %d bytes; an ordering key takes at most %d", len(r.Key), maxOrderingKey), sink.ReasonInvalidMessage)
	}
	if size > p.cfg.MaxMessageBytes {
		return nil, sink.Permanent(fmt.Errorf("pubsub: message of %d bytes; the most is %d", size, p.cfg.MaxMessageBytes), sink.ReasonTooLarge)
	}
	return &gpubsub.Message{Data: r.Payload, Attributes: attrs, OrderingKey: r.Key}, nil
}

// classify gives a failed publish its class and scope.
func (p *Publisher) classify(ctx context.Context, topic string, err error) error {
	if ctx.Err() != nil {
		return sink.ContextFailure("pubsub", ctx.Err())
	}
	wrapped := fmt.Errorf("pubsub: topic %s: %w", topic, err)
	if errors.Is(err, gpubsub.ErrOversizedMessage) {
		return sink.Permanent(wrapped, sink.ReasonTooLarge)
	}
	switch status.Code(err) {
	case codes.NotFound:
		return sink.TopicFailure(sink.ClassSystemic, fmt.Errorf("pubsub: topic %s does not exist in project %s: create it, or route the topic elsewhere: %w", topic, p.cfg.Project, err))
	case codes.PermissionDenied:
		return sink.TopicFailure(sink.ClassSystemic, wrapped)
	case codes.Unauthenticated, codes.Unavailable, codes.FailedPrecondition:
		return sink.Systemic(wrapped)
	case codes.InvalidArgument:
		// The answer of a whole bundle, which may hold other rows than the
		// one at fault: retried, and dead-lettered only when it keeps
		// failing. Rows known to be invalid never get this far.
		return sink.Transient(wrapped, 0)
	case codes.ResourceExhausted, codes.Aborted, codes.Internal, codes.DeadlineExceeded:
		return sink.DestinationFailure(sink.ClassTransient, wrapped)
	}
	return sink.NetworkFailure(wrapped)
}

var topicID = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}$`)

// ValidateTopic reports whether id is a Pub/Sub topic ID: 3 to 255
// letters, digits and -_.~+%, starting with a letter, not with goog.
func ValidateTopic(id string) error {
	if !topicID.MatchString(id) || strings.HasPrefix(strings.ToLower(id), "goog") {
		return fmt.Errorf("pubsub: %q is not a topic ID (3 to 255 letters, digits and -_.~+%%, starting with a letter, not with goog)", id)
	}
	return nil
}
