package sqs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

var _ sink.Reloader = (*Settings)(nil)

// Defaults of Settings.
const (
	DefaultTimeout    = 10 * time.Second
	DefaultClientName = "outbox-relay"
)

func init() {
	sink.Register(sink.Sink{
		Kind:              "sqs",
		New:               func() sink.Config { return &Settings{service: "SQS"} },
		MessagingSystem:   "aws_sqs",
		ValidateTopic:     ValidateQueue,
		CloudEventsPrefix: "ce-",
	})
	sink.Register(sink.Sink{
		Kind:              "sns",
		New:               func() sink.Config { return &Settings{service: "SNS"} },
		MessagingSystem:   "aws_sns",
		ValidateTopic:     ValidateTopic,
		CloudEventsPrefix: "ce-",
	})
}

// Settings are an SQS or SNS destination's settings in the configuration,
// destinations.<name>.sqs or .sns. Zero values take the defaults; without
// access_key_id, credentials come from the SDK's default chain
// (environment, shared files and profile, web identity, the instance's
// role).
type Settings struct {
	// Region is the queues' or topics' region; default the SDK's
	// (AWS_REGION, or the profile's).
	Region string `koanf:"region"`
	// Endpoint replaces AWS's endpoint for the region (an emulator, a VPC
	// endpoint).
	Endpoint string `koanf:"endpoint"`
	// Profile is the shared configuration's profile to take.
	Profile string `koanf:"profile"`
	// AccessKeyID with a secret access key (and a session token) are
	// static credentials, read from a variable or a file and reloaded.
	AccessKeyID         string `koanf:"access_key_id"`
	SecretAccessKeyEnv  string `koanf:"secret_access_key_env"`
	SecretAccessKeyFile string `koanf:"secret_access_key_file"`
	SessionTokenEnv     string `koanf:"session_token_env"`
	SessionTokenFile    string `koanf:"session_token_file"`
	// MaxMessageBytes is the largest message, body and attributes: a
	// larger row is dead-lettered too_large. Default the service's limit,
	// 1 MiB for SQS and 256 KiB for SNS.
	MaxMessageBytes int `koanf:"max_message_bytes"`
	// GroupID is the MessageGroupId of rows without a key on FIFO queues
	// and topics. Default outbox.
	GroupID string `koanf:"group_id"`
	// ClientName is the application id the requests carry (in their
	// User-Agent). Default outbox-relay.
	ClientName string `koanf:"client_name"`
	// Timeout bounds one request. Default 10s.
	Timeout time.Duration `koanf:"timeout"`

	service              string // SQS or SNS
	secret, sessionToken string // read by Resolve
}

// Resolve reads the secret access key and session token from the
// variables or files the settings name.
func (s *Settings) Resolve(lookupEnv func(string) (string, bool)) error {
	var err1, err2 error
	s.secret, err1 = sink.Secret(lookupEnv, "secret_access_key", s.SecretAccessKeyEnv, s.SecretAccessKeyFile)
	s.sessionToken, err2 = sink.Secret(lookupEnv, "session_token", s.SessionTokenEnv, s.SessionTokenFile)
	return errors.Join(err1, err2)
}

// Validate reports every problem of s at once.
func (s *Settings) Validate() error {
	var errs []error
	if (s.AccessKeyID == "") != (s.secret == "") {
		errs = append(errs, errors.New("access_key_id and a secret access key (secret_access_key_env or secret_access_key_file) go together"))
	}
	if s.sessionToken != "" && s.AccessKeyID == "" {
		errs = append(errs, errors.New("a session token needs access_key_id"))
	}
	if s.Endpoint != "" {
		if u, err := url.Parse(s.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("endpoint: %q is not an http or https URL", s.Endpoint))
		}
	}
	limit := DefaultSQSMessageBytes
	if s.service == "SNS" {
		limit = DefaultSNSMessageBytes
	}
	if s.MaxMessageBytes < 0 || s.MaxMessageBytes > limit {
		errs = append(errs, fmt.Errorf("max_message_bytes is %d; %s takes 1 to %d", s.MaxMessageBytes, s.service, limit))
	}
	if len(s.GroupID) > 128 {
		errs = append(errs, fmt.Errorf("group_id is %d bytes; a MessageGroupId takes at most 128", len(s.GroupID)))
	}
	if s.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout is %s; it must not be negative", s.Timeout))
	}
	return errors.Join(errs...)
}

// Files are the files s reads: the secret access key and session token.
func (s *Settings) Files() []string { return []string{s.SecretAccessKeyFile, s.SessionTokenFile} }

// Reload gives p the credentials of s, which Resolve has read anew.
func (s *Settings) Reload(p sink.Publisher) error {
	sp, ok := p.(*Publisher)
	if !ok {
		return fmt.Errorf("%s: cannot reload a %T", strings.ToLower(s.service), p)
	}
	a, err := s.api()
	if err != nil {
		return err
	}
	return sp.reload(a)
}

// Open returns a Publisher for the destination s describes.
func (s *Settings) Open(o sink.Options) (sink.Publisher, error) {
	a, err := s.api()
	if err != nil {
		return nil, err
	}
	return newPublisher(s.service, Config{Name: o.Name, MaxMessageBytes: s.MaxMessageBytes, GroupID: s.GroupID}, a), nil
}

// api builds the service's client from s.
func (s *Settings) api() (api, error) {
	opts := []func(*config.LoadOptions) error{
		config.WithAppID(cmp.Or(s.ClientName, DefaultClientName)),
		// The relay retries, with its backoff and breaker: a retry in the
		// client would only hide an outage.
		config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
	}
	if s.Region != "" {
		opts = append(opts, config.WithRegion(s.Region))
	}
	if s.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(s.Profile))
	}
	if s.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(s.AccessKeyID, s.secret, s.sessionToken)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.ToLower(s.service), err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("%s: no region: set region, AWS_REGION, or a profile with one", strings.ToLower(s.service))
	}
	timeout := cmp.Or(s.Timeout, DefaultTimeout)
	at := s.address(cfg.Region)
	if s.service == "SNS" {
		return &snsAPI{timeout: timeout, endpoint: at, client: sns.NewFromConfig(cfg, func(o *sns.Options) {
			if s.Endpoint != "" {
				o.BaseEndpoint = aws.String(s.Endpoint)
			}
		})}, nil
	}
	return &sqsAPI{timeout: timeout, endpoint: at, client: sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if s.Endpoint != "" {
			o.BaseEndpoint = aws.String(s.Endpoint)
		}
	})}, nil
}

// address is where the service answers: the endpoint's host and port, or
// the region's AWS endpoint.
func (s *Settings) address(region string) endpoint {
	if u, err := url.Parse(s.Endpoint); err == nil && u.Host != "" {
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		return endpoint(net.JoinHostPort(u.Hostname(), port))
	}
	return endpoint(net.JoinHostPort(strings.ToLower(s.service)+"."+region+".amazonaws.com", "443"))
}

// ValidateQueue reports whether name can name an SQS queue: its URL, or a
// name of 1 to 80 letters, digits, - and _ (a FIFO queue's ending in
// .fifo).
func ValidateQueue(name string) error {
	if strings.HasPrefix(name, "https://") || strings.HasPrefix(name, "http://") {
		return nil
	}
	if err := validName(name, 80); err != nil {
		return fmt.Errorf("sqs: queue %q: %w", name, err)
	}
	return nil
}

// ValidateTopic reports whether name can name an SNS topic: its ARN, or a
// name of 1 to 256 letters, digits, - and _ (a FIFO topic's ending in
// .fifo).
func ValidateTopic(name string) error {
	if strings.HasPrefix(name, "arn:") {
		return nil
	}
	if err := validName(name, 256); err != nil {
		return fmt.Errorf("sns: topic %q: %w", name, err)
	}
	return nil
}

// validName checks a name of at most max characters, .fifo included.
func validName(name string, max int) error {
	if name == "" || len(name) > max {
		return fmt.Errorf("a name has 1 to %d characters", max)
	}
	for _, c := range strings.TrimSuffix(name, ".fifo") {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%q is not a letter, digit, - or _", c)
		}
	}
	return nil
}
