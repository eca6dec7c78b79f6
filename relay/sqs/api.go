package sqs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// targets remembers the queue URLs or topic ARNs topics name.
type targets struct {
	mu sync.Mutex
	m  map[string]string
}

func (t *targets) get(topic string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[topic]
	return v, ok
}

func (t *targets) put(topic, target string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]string{}
	}
	t.m[topic] = target
}

func (t *targets) forget(topic string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, topic)
}

// endpoint is the address the service answers on, host:port.
type endpoint string

func (e endpoint) ping(ctx context.Context) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", string(e))
	if err != nil {
		return err
	}
	return c.Close()
}

// sqsAPI sends to SQS queues: a topic is a queue's name, or its URL.
type sqsAPI struct {
	client  *sqs.Client
	timeout time.Duration
	targets
	endpoint
}

func (a *sqsAPI) target(ctx context.Context, topic string) (string, error) {
	if strings.HasPrefix(topic, "https://") || strings.HasPrefix(topic, "http://") {
		return topic, nil
	}
	if url, ok := a.get(topic); ok {
		return url, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	out, err := a.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(topic)})
	if err != nil {
		return "", err
	}
	a.put(topic, aws.ToString(out.QueueUrl))
	return aws.ToString(out.QueueUrl), nil
}

func (a *sqsAPI) send(ctx context.Context, url string, entries []*entry) (map[string]refusal, error) {
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: make([]sqstypes.SendMessageBatchRequestEntry, len(entries))}
	for i, e := range entries {
		attrs := make(map[string]sqstypes.MessageAttributeValue, len(e.attrs))
		for _, kv := range e.attrs {
			attrs[kv[0]] = sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(kv[1])}
		}
		in.Entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(e.id), MessageBody: aws.String(e.body), MessageAttributes: attrs}
		if e.group != "" {
			in.Entries[i].MessageGroupId, in.Entries[i].MessageDeduplicationId = aws.String(e.group), aws.String(e.dedup)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	out, err := a.client.SendMessageBatch(ctx, in)
	if err != nil {
		return nil, err
	}
	refused := map[string]refusal{}
	for _, f := range out.Failed {
		refused[aws.ToString(f.Id)] = refusal{code: aws.ToString(f.Code), message: aws.ToString(f.Message), senderFault: f.SenderFault}
	}
	sent := make([]string, len(out.Successful))
	for i, ok := range out.Successful {
		sent[i] = aws.ToString(ok.Id)
	}
	return unanswered(entries, sent, refused), nil
}

// snsAPI publishes to SNS topics: a topic is a topic's name (found with
// ListTopics), or its ARN.
type snsAPI struct {
	client  *sns.Client
	timeout time.Duration
	targets
	endpoint
}

func (a *snsAPI) target(ctx context.Context, topic string) (string, error) {
	if strings.HasPrefix(topic, "arn:") {
		return topic, nil
	}
	if arn, ok := a.get(topic); ok {
		return arn, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	pages := sns.NewListTopicsPaginator(a.client, &sns.ListTopicsInput{})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return "", err
		}
		for _, t := range page.Topics {
			if arn := aws.ToString(t.TopicArn); strings.HasSuffix(arn, ":"+topic) {
				a.put(topic, arn)
				return arn, nil
			}
		}
	}
	return "", sink.TopicFailure(sink.ClassSystemic, fmt.Errorf("sns: no topic is named %s", topic))
}

func (a *snsAPI) send(ctx context.Context, arn string, entries []*entry) (map[string]refusal, error) {
	in := &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: make([]snstypes.PublishBatchRequestEntry, len(entries))}
	for i, e := range entries {
		attrs := make(map[string]snstypes.MessageAttributeValue, len(e.attrs))
		for _, kv := range e.attrs {
			attrs[kv[0]] = snstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(kv[1])}
		}
		in.PublishBatchRequestEntries[i] = snstypes.PublishBatchRequestEntry{Id: aws.String(e.id), Message: aws.String(e.body), MessageAttributes: attrs}
		if e.group != "" {
			in.PublishBatchRequestEntries[i].MessageGroupId = aws.String(e.group)
			in.PublishBatchRequestEntries[i].MessageDeduplicationId = aws.String(e.dedup)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	out, err := a.client.PublishBatch(ctx, in)
	if err != nil {
		return nil, err
	}
	refused := map[string]refusal{}
	for _, f := range out.Failed {
		refused[aws.ToString(f.Id)] = refusal{code: aws.ToString(f.Code), message: aws.ToString(f.Message), senderFault: f.SenderFault}
	}
	sent := make([]string, len(out.Successful))
	for i, ok := range out.Successful {
		sent[i] = aws.ToString(ok.Id)
	}
	return unanswered(entries, sent, refused), nil
}

// unanswered adds to refused the entries an answer named neither sent
// nor refused: not sent, as far as the relay knows.
func unanswered(entries []*entry, sent []string, refused map[string]refusal) map[string]refusal {
	if len(sent)+len(refused) == len(entries) {
		return refused
	}
	for _, e := range entries {
		if _, ok := refused[e.id]; !ok && !slices.Contains(sent, e.id) {
			refused[e.id] = refusal{code: "Unanswered", message: "the answer names this entry neither sent nor failed"}
		}
	}
	return refused
}

// Error codes, by what they say.
var (
	// missingCodes: the queue or topic does not exist.
	missingCodes = codes("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "AWS.SimpleQueueService.QueueDeletedRecently",
		"QueueDeletedRecently", "NotFound", "NotFoundException")
	// deniedCodes: not allowed on this queue or topic (a policy can deny
	// one queue and allow the others), or its KMS key cannot be used.
	deniedCodes = codes("AccessDenied", "AccessDeniedException", "AuthorizationError", "AuthorizationErrorException",
		"KmsAccessDenied", "KmsDisabled", "KmsNotFound", "KmsInvalidState", "KmsInvalidKeyUsage", "KmsOptInRequired",
		"KMSAccessDenied", "KMSDisabled", "KMSNotFound", "KMSInvalidState", "KMSOptInRequired", "InvalidSecurity")
	// credentialCodes: the credentials themselves, whatever the queue.
	credentialCodes = codes("InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "ExpiredToken",
		"ExpiredTokenException", "MissingAuthenticationToken", "IncompleteSignature", "InvalidAccessKeyId", "OptInRequired")
	// throttleCodes: the service asks for less.
	throttleCodes = codes("Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "RequestLimitExceeded",
		"TooManyRequestsException", "KmsThrottled", "KMSThrottling", "KMSThrottlingException")
	// contentCodes: what one message holds.
	contentCodes = codes("InvalidParameterValue", "InvalidParameter", "InvalidParameterException", "InvalidMessageContents",
		"InvalidAttributeName", "InvalidAttributeValue", "ParameterValueInvalid", "MessageTooLong", "InvalidParameterValueException",
		"ValidationError")
	// batchCodes: the call as a whole, for what one of its entries may be.
	batchCodes = codes("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", "BatchEntryIdsNotDistinct",
		"InvalidBatchEntryId", "TooManyEntriesInBatchRequest", "EmptyBatchRequest")
)

func codes(cs ...string) map[string]bool {
	m := make(map[string]bool, len(cs))
	for _, c := range cs {
		m[c] = true
	}
	return m
}

func apiCode(err error) (string, bool) {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode(), true
	}
	return "", false
}

// malformed reports whether a call was refused for what its entries hold.
func malformed(err error) bool {
	code, ok := apiCode(err)
	return ok && (contentCodes[code] || batchCodes[code])
}

// isMissing reports whether err says the queue or topic does not exist.
func isMissing(err error) bool {
	code, ok := apiCode(err)
	return ok && missingCodes[code]
}

// classify gives a failed call (or a failed lookup of the call's queue or
// topic) its class and scope.
func (p *Publisher) classify(ctx context.Context, topic string, err error) error {
	if ctx.Err() != nil {
		return sink.ContextFailure(p.lower(), ctx.Err())
	}
	var classified *sink.Error
	if errors.As(err, &classified) {
		return err
	}
	wrapped := fmt.Errorf("%s: %s: %w", p.lower(), topic, err)
	code, ok := apiCode(err)
	if !ok {
		// No answer: the network's classification.
		return sink.NetworkFailure(wrapped)
	}
	var re *smithyhttp.ResponseError
	switch {
	case missingCodes[code]:
		return sink.TopicFailure(sink.ClassSystemic, fmt.Errorf("%s: %s does not exist: %w", p.lower(), topic, err))
	case deniedCodes[code]:
		return sink.TopicFailure(sink.ClassSystemic, wrapped)
	case credentialCodes[code]:
		return sink.Systemic(wrapped)
	case throttleCodes[code]:
		return sink.DestinationFailure(sink.ClassTransient, wrapped)
	case code == "BatchRequestTooLong" || code == "AWS.SimpleQueueService.BatchRequestTooLong" || contentCodes[code] && tooLarge(code, err.Error()):
		return sink.Permanent(wrapped, sink.ReasonTooLarge)
	case contentCodes[code]:
		return sink.Permanent(wrapped, sink.ReasonInvalidMessage)
	case errors.As(err, &re) && re.HTTPStatusCode() >= 500:
		return sink.DestinationFailure(sink.ClassTransient, wrapped)
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorFault() == smithy.FaultServer {
		return sink.DestinationFailure(sink.ClassTransient, wrapped)
	}
	// A refusal this sink does not know: held with its topic, counting no
	// attempt, until an operator sees it (rather than dead-lettering
	// every row for what may be the queue's settings).
	return sink.TopicFailure(sink.ClassSystemic, wrapped)
}

// refused gives an entry the service refused its class and scope.
func (p *Publisher) refused(topic string, r refusal) error {
	err := fmt.Errorf("%s: %s: %s: %s", p.lower(), topic, r.code, r.message)
	switch {
	case throttleCodes[r.code]:
		return sink.DestinationFailure(sink.ClassTransient, err)
	case missingCodes[r.code]:
		return sink.TopicFailure(sink.ClassSystemic, err)
	case deniedCodes[r.code]:
		return sink.TopicFailure(sink.ClassSystemic, err)
	case !r.senderFault:
		return sink.Transient(err, 0)
	case tooLarge(r.code, r.message):
		return sink.Permanent(err, sink.ReasonTooLarge)
	}
	return sink.Permanent(err, sink.ReasonInvalidMessage)
}

// tooLarge reports whether a refusal is of a message's size: the codes
// and wording SQS and SNS use ("Message must be shorter than 262144
// bytes", "MessageTooLong", "exceeds the maximum size").
func tooLarge(code, message string) bool {
	lower := strings.ToLower(code + " " + message)
	for _, s := range []string{"toolong", "too long", "shorter than", "too large", "toolarge", "maximum size", "maximum allowed size", "exceeds the size"} {
		if strings.Contains(lower, s) {
			return true
		}
	}
	return false
}
