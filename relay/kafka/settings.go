package kafka

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

var (
	_ sink.Reloader  = (*Settings)(nil)
	_ sink.Inheritor = (*Settings)(nil)
)

func init() {
	sink.Register(sink.Sink{
		Kind:            "kafka",
		New:             func() sink.Config { return new(Settings) },
		MessagingSystem: "kafka",
		ValidateTopic:   ValidateTopic,
		// The Kafka protocol binding's prefix.
		CloudEventsPrefix: "ce_",
		Section:           &sink.Section{Name: "kafka", Defaults: func() sink.Config { return SectionDefaults() }},
	})
}

// MessageSlack is what a destination's message limit exceeds the relay's
// max_batch_bytes by. A row's payload is at most payload_cap, itself at
// most max_batch_bytes, so only a row whose key and headers add more than
// the slack to it is refused as too large.
const MessageSlack = 64 << 10

// ErrNoBrokers is the problem of settings without brokers.
var ErrNoBrokers error = &sink.RequiredError{Setting: "brokers", Format: "comma-separated host:port"}

// Settings are a Kafka destination's settings in the configuration: the
// kafka section, or destinations.<name>.kafka. A destination's client
// settings left zero take the kafka section's (see Inherit); the section's
// defaults are Config's, but for Compression (DefaultCompression).
type Settings struct {
	// Brokers are the bootstrap brokers, host:port; comma-separated in
	// an environment variable.
	Brokers []string `koanf:"brokers"`
	// ClientID names the relay to the brokers. Default outbox-relay.
	ClientID string `koanf:"client_id"`
	// DialTimeout bounds connecting to a broker. Default 5s.
	DialTimeout time.Duration `koanf:"dial_timeout"`
	// Compression is none, gzip, snappy, lz4 or zstd. Default
	// DefaultCompression.
	Compression string `koanf:"compression"`
	// Timestamp is publish (the time of sending) or created_at (the
	// row's). Default publish.
	Timestamp string   `koanf:"timestamp"`
	TLS       sink.TLS `koanf:"tls"`
	SASL      SASL     `koanf:"sasl"`
}

// SASL configures SASL authentication.
type SASL struct {
	// Mechanism is plain, scram-sha-256 or scram-sha-512; empty disables
	// SASL.
	Mechanism string `koanf:"mechanism"`
	Username  string `koanf:"username"`
	// PasswordEnv and PasswordFile name the variable or the file that
	// holds the password. Password, the password itself in the
	// configuration (or OUTBOX_KAFKA_SASL_PASSWORD), still works but is
	// deprecated: see Deprecated.
	Password     string `koanf:"password"`
	PasswordEnv  string `koanf:"password_env"`
	PasswordFile string `koanf:"password_file"`

	inline, read bool // Password was given as it is; Resolve read it
}

// SASLMechanisms are the mechanisms SASL.Mechanism may name.
var SASLMechanisms = []string{"plain", "scram-sha-256", "scram-sha-512"}

// DefaultCompression is the kafka section's compression. lz4 compresses
// JSON to about a third at a fraction of the CPU of gzip or zstd, which
// compress more; Kafka's own clients send uncompressed unless told.
const DefaultCompression = "lz4"

// Compressions are the values Settings.Compression may take.
var Compressions = []string{"none", "gzip", "snappy", "lz4", "zstd"}

// SectionDefaults are the kafka section's settings before the file: the
// client's defaults, and DefaultCompression.
func SectionDefaults() *Settings {
	return &Settings{ClientID: DefaultClientID, DialTimeout: DefaultDialTimeout,
		Compression: DefaultCompression, Timestamp: string(TimestampPublish)}
}

// Inherit fills what s leaves unset that belongs to the client rather
// than to a cluster (client_id, dial_timeout, compression, timestamp)
// from the kafka section.
func (s *Settings) Inherit(c sink.Config) {
	section, ok := c.(*Settings)
	if !ok {
		return
	}
	s.Compression = cmp.Or(s.Compression, section.Compression)
	s.Timestamp = cmp.Or(s.Timestamp, section.Timestamp)
	s.ClientID = cmp.Or(s.ClientID, section.ClientID)
	s.DialTimeout = cmp.Or(s.DialTimeout, section.DialTimeout)
}

// Resolve reads the SASL password from the variable sasl.password_env
// names, or the file sasl.password_file names, when no password is given
// as it is.
func (s *Settings) Resolve(lookupEnv func(string) (string, bool)) error {
	if s.SASL.Password != "" {
		s.SASL.inline = !s.SASL.read
		return nil
	}
	if s.SASL.PasswordEnv == "" && s.SASL.PasswordFile == "" {
		return nil
	}
	pw, err := sink.Secret(lookupEnv, "sasl.password", s.SASL.PasswordEnv, s.SASL.PasswordFile)
	s.SASL.Password, s.SASL.read = pw, err == nil
	return err
}

// Deprecated names the settings of s that still work but will not: a
// password written as it is.
func (s *Settings) Deprecated() []string {
	if s.SASL.inline {
		return []string{"sasl.password: a password written into the configuration or its variable is deprecated; " +
			"name the variable that holds it with sasl.password_env, or a file with sasl.password_file"}
	}
	return nil
}

// Validate reports every problem of s at once; ErrNoBrokers among them
// when no broker is given.
func (s *Settings) Validate() error {
	var errs []error
	if len(s.Brokers) == 0 {
		errs = append(errs, ErrNoBrokers)
	}
	for _, b := range s.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("brokers: %q is not host:port", b))
		}
	}
	if s.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("dial_timeout is %s; it must not be negative", s.DialTimeout))
	}
	if c := s.Compression; c != "" && !slices.Contains(Compressions, c) {
		errs = append(errs, fmt.Errorf("compression is %q; use none, gzip, snappy, lz4 or zstd", c))
	}
	switch Timestamp(s.Timestamp) {
	case "", TimestampPublish, TimestampCreatedAt:
	default:
		errs = append(errs, fmt.Errorf("timestamp is %q; use publish or created_at", s.Timestamp))
	}
	if m := s.SASL.Mechanism; m != "" {
		if !slices.Contains(SASLMechanisms, m) {
			errs = append(errs, fmt.Errorf("sasl.mechanism is %q; use plain, scram-sha-256 or scram-sha-512", m))
		}
		if s.SASL.Username == "" || s.SASL.Password == "" {
			errs = append(errs, errors.New("sasl needs username and password (from sasl.password_env or sasl.password_file)"))
		}
	}
	if !s.TLS.Enabled && s.TLS.Customised() {
		errs = append(errs, errors.New("tls settings are given but tls.enabled is false"))
	}
	if s.TLS.Enabled {
		errs = append(errs, s.TLS.Validate())
	}
	return errors.Join(errs...)
}

// Open returns a Publisher for the destination s describes.
func (s *Settings) Open(o sink.Options) (sink.Publisher, error) {
	c := Config{
		Brokers:         s.Brokers,
		ClientID:        s.ClientID,
		DialTimeout:     s.DialTimeout,
		MaxMessageBytes: o.MessageBytes(MessageSlack),
		Timestamp:       Timestamp(s.Timestamp),
	}
	if s.Compression != "" {
		if err := c.Compression.UnmarshalText([]byte(s.Compression)); err != nil {
			return nil, fmt.Errorf("compression: %w", err)
		}
	}
	var err error
	if c.TLS, c.SASL, err = s.credentials(); err != nil {
		return nil, err
	}
	return New(c)
}

// credentials builds the TLS configuration and SASL mechanism of s.
func (s *Settings) credentials() (*tls.Config, sasl.Mechanism, error) {
	var tc *tls.Config
	if s.TLS.Enabled {
		var err error
		if tc, err = s.TLS.ClientConfig(); err != nil {
			return nil, nil, err
		}
	}
	mech, err := s.SASL.mechanism()
	if err != nil {
		return nil, nil, err
	}
	return tc, mech, nil
}

// Files are the files s reads: the SASL password and TLS material.
func (s *Settings) Files() []string {
	return append([]string{s.SASL.PasswordFile}, s.TLS.Files()...)
}

// Reload gives p the TLS configuration and SASL mechanism of s, which
// Resolve has read anew.
func (s *Settings) Reload(p sink.Publisher) error {
	kp, ok := p.(*Publisher)
	if !ok {
		return fmt.Errorf("kafka: cannot reload a %T", p)
	}
	tc, mech, err := s.credentials()
	if err != nil {
		return err
	}
	return kp.Reload(tc, mech)
}

func (s SASL) mechanism() (sasl.Mechanism, error) {
	switch s.Mechanism {
	case "":
		return nil, nil
	case "plain":
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case "scram-sha-256", "scram-sha-512":
		algo := scram.SHA256
		if s.Mechanism == "scram-sha-512" {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, s.Username, s.Password)
		if err != nil {
			return nil, fmt.Errorf("sasl: %w", err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("sasl.mechanism: unknown mechanism %s", s.Mechanism)
}
