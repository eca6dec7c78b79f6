package rabbitmq

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

var _ sink.Reloader = (*Settings)(nil)

func init() {
	sink.Register(sink.Sink{
		Kind:            "rabbitmq",
		New:             func() sink.Config { return new(Settings) },
		MessagingSystem: "rabbitmq",
		ValidateTopic:   ValidateRoutingKey,
		// The AMQP protocol binding's prefix, for application headers.
		CloudEventsPrefix: "cloudEvents_",
	})
}

// Settings are a RabbitMQ destination's settings in the configuration,
// destinations.<name>.rabbitmq. Zero values take the defaults of Config.
type Settings struct {
	// URL is the broker, amqp://user@host:5672/vhost or amqps:// for TLS,
	// without the password. Required.
	URL string `koanf:"url"`
	// PasswordEnv or PasswordFile gives the URL's user's password.
	PasswordEnv  string `koanf:"password_env"`
	PasswordFile string `koanf:"password_file"`
	// Exchange receives every message, with the row's topic (or its
	// route's topic) as the routing key; empty is the default exchange,
	// which routes to the queue named by the routing key.
	Exchange string `koanf:"exchange"`
	// TLS holds roots and a client certificate for amqps URLs.
	TLS sink.TLS `koanf:"tls"`
	// MaxMessageBytes is the largest message sent; a larger row is
	// dead-lettered too_large. Default relay.max_batch_bytes and some.
	MaxMessageBytes int `koanf:"max_message_bytes"`
	// DialTimeout bounds connecting; ConfirmTimeout the wait for a round
	// of publisher confirms. Defaults 5s and 10s.
	DialTimeout    time.Duration `koanf:"dial_timeout"`
	ConfirmTimeout time.Duration `koanf:"confirm_timeout"`
	// ClientName names the connection at the broker (connection_name).
	// Default outbox-relay and the destination's name.
	ClientName string `koanf:"client_name"`

	password string // read by Resolve
}

// Resolve reads the password from the variable or file the settings name.
func (s *Settings) Resolve(lookupEnv func(string) (string, bool)) error {
	var err error
	s.password, err = sink.Secret(lookupEnv, "password", s.PasswordEnv, s.PasswordFile)
	return err
}

// Validate reports every problem of s at once.
func (s *Settings) Validate() error {
	var errs []error
	if s.URL == "" {
		errs = append(errs, errors.New("url is required"))
	} else if u, err := url.Parse(s.URL); err != nil || u.Host == "" || (u.Scheme != "amqp" && u.Scheme != "amqps") {
		errs = append(errs, fmt.Errorf("url %q: use amqp://user@host:5672/vhost or amqps://", redactURL(s.URL)))
	} else if _, ok := u.User.Password(); ok {
		errs = append(errs, errors.New("url: no password in it; use password_env or password_file"))
	} else if u.Scheme == "amqp" && s.TLS.Customised() {
		errs = append(errs, errors.New("tls settings are given but the url is amqp://; use amqps://"))
	}
	if err := ValidateRoutingKey(s.Exchange); err != nil && s.Exchange != "" {
		errs = append(errs, fmt.Errorf("exchange: %w", err))
	}
	if s.TLS.Enabled {
		errs = append(errs, errors.New("tls.enabled is not used: an amqps URL turns TLS on"))
	}
	if err := s.TLS.Validate(); err != nil && s.TLS.Customised() {
		errs = append(errs, err)
	}
	if s.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max_message_bytes is %d; it must not be negative", s.MaxMessageBytes))
	}
	for name, d := range map[string]time.Duration{"dial_timeout": s.DialTimeout, "confirm_timeout": s.ConfirmTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must not be negative", name, d))
		}
	}
	return errors.Join(errs...)
}

// Files are the files s reads: the password and TLS material.
func (s *Settings) Files() []string { return append([]string{s.PasswordFile}, s.TLS.Files()...) }

// Reload gives p the password and TLS material of s, which Resolve has
// read anew: p connects with them, and keeps its connection if it cannot.
func (s *Settings) Reload(p sink.Publisher) error {
	rp, ok := p.(*Publisher)
	if !ok {
		return fmt.Errorf("rabbitmq: cannot reload a %T", p)
	}
	c, err := s.Config(rp.cfg.Name, rp.cfg.MaxMessageBytes)
	if err != nil {
		return err
	}
	return rp.Reload(c)
}

// Open returns a Publisher for the destination s describes.
func (s *Settings) Open(o sink.Options) (sink.Publisher, error) {
	maxMessage := cmp.Or(s.MaxMessageBytes, o.MessageBytes(MessageSlack))
	c, err := s.Config(o.Name, maxMessage)
	if err != nil {
		return nil, err
	}
	return New(c)
}

// Config maps s onto the Publisher's Config, for the destination named
// name, with messages up to maxMessage bytes.
func (s *Settings) Config(name string, maxMessage int) (Config, error) {
	c := Config{Name: name, URL: s.URL, Password: s.password, Exchange: s.Exchange, MaxMessageBytes: maxMessage,
		DialTimeout: s.DialTimeout, ConfirmTimeout: s.ConfirmTimeout, ClientName: s.ClientName}
	if s.TLS.Customised() {
		tc, err := s.TLS.ClientConfig()
		if err != nil {
			return c, err
		}
		c.TLS = tc
	}
	return c, nil
}

// redactURL drops a password from a URL, for errors.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
