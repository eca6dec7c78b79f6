package nats

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

var _ sink.Reloader = (*Settings)(nil)

func init() {
	sink.Register(sink.Sink{
		Kind:            "nats",
		New:             func() sink.Config { return new(Settings) },
		MessagingSystem: "nats",
		ValidateTopic:   ValidateSubject,
		// The NATS protocol binding's prefix.
		CloudEventsPrefix: "ce-",
	})
}

// Settings are a NATS JetStream destination's settings in the
// configuration, destinations.<name>.nats. Zero values take the defaults
// of Config.
type Settings struct {
	// Servers are the server URLs, nats://host:4222 (tls://host:4222 for
	// TLS); comma-separated in an environment variable. Required.
	Servers []string `koanf:"servers"`
	// ClientName names the relay's connection to the servers. Default
	// outbox-relay.
	ClientName string `koanf:"client_name"`
	Auth       Auth   `koanf:"auth"`
	// TLS holds roots and a client certificate; enabled turns TLS on for
	// nats:// URLs too.
	TLS sink.TLS `koanf:"tls"`
	// ConnectTimeout bounds connecting to a server. Default 5s.
	ConnectTimeout time.Duration `koanf:"connect_timeout"`
	// AckTimeout bounds the wait for a stream's acknowledgement of one
	// message (the publish timeout bounds the batch). Default 5s.
	AckTimeout time.Duration `koanf:"ack_timeout"`
	// Concurrency is the most keys of one batch published at once; a
	// key's messages go one after another. Default 256.
	Concurrency int `koanf:"concurrency"`

	password, token string // read by Resolve
}

// Auth authenticates to the servers: a username and password, a token,
// or a credentials file (a user JWT and its NKey seed, as nsc writes
// it). Secrets come from an environment variable or a file.
type Auth struct {
	Username     string `koanf:"username"`
	PasswordEnv  string `koanf:"password_env"`
	PasswordFile string `koanf:"password_file"`
	TokenEnv     string `koanf:"token_env"`
	TokenFile    string `koanf:"token_file"`
	// CredsFile is a .creds file; it is read again at each connection.
	CredsFile string `koanf:"creds_file"`
}

// Resolve reads the password and the token from the variables or files
// the settings name.
func (s *Settings) Resolve(lookupEnv func(string) (string, bool)) error {
	var errs []error
	read := func(setting, env, file string) string {
		v, err := sink.Secret(lookupEnv, setting, env, file)
		errs = append(errs, err)
		return v
	}
	s.password = read("auth.password", s.Auth.PasswordEnv, s.Auth.PasswordFile)
	s.token = read("auth.token", s.Auth.TokenEnv, s.Auth.TokenFile)
	return errors.Join(errs...)
}

// Validate reports every problem of s at once.
func (s *Settings) Validate() error {
	var errs []error
	if len(s.Servers) == 0 {
		errs = append(errs, errors.New("servers is required"))
	}
	for _, srv := range s.Servers {
		u, err := url.Parse(srv)
		if err != nil || u.Host == "" {
			errs = append(errs, fmt.Errorf("servers: %q is not a server URL; use nats://host:4222", srv))
			continue
		}
		switch u.Scheme {
		case "nats", "tls":
		default:
			errs = append(errs, fmt.Errorf("servers: %q: use nats:// or tls://", srv))
		}
	}
	methods := 0
	for _, given := range []bool{s.Auth.Username != "" || s.password != "", s.token != "", s.Auth.CredsFile != ""} {
		if given {
			methods++
		}
	}
	if methods > 1 {
		errs = append(errs, errors.New("auth: give a username and password, a token or a creds_file, not several"))
	}
	if (s.Auth.Username == "") != (s.password == "") {
		errs = append(errs, errors.New("auth: username and password go together"))
	}
	if s.Auth.CredsFile != "" {
		if _, err := readCreds(s.Auth.CredsFile); err != nil {
			errs = append(errs, fmt.Errorf("auth.creds_file: %w", err))
		}
	}
	if err := s.TLS.Validate(); err != nil {
		errs = append(errs, err)
	}
	for name, d := range map[string]time.Duration{"connect_timeout": s.ConnectTimeout, "ack_timeout": s.AckTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must not be negative", name, d))
		}
	}
	if s.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("concurrency is %d; it must not be negative", s.Concurrency))
	}
	return errors.Join(errs...)
}

// Files are the files s reads: secrets and TLS material.
func (s *Settings) Files() []string {
	return append([]string{s.Auth.PasswordFile, s.Auth.TokenFile, s.Auth.CredsFile}, s.TLS.Files()...)
}

// Reload gives p the credentials and TLS material of s, which Resolve has
// read anew: p connects again with them, and keeps its connection if it
// cannot.
func (s *Settings) Reload(p sink.Publisher) error {
	np, ok := p.(*Publisher)
	if !ok {
		return fmt.Errorf("nats: cannot reload a %T", p)
	}
	c, err := s.Config(np.cfg.Name)
	if err != nil {
		return err
	}
	return np.Reload(c)
}

// Open returns a Publisher for the destination s describes.
func (s *Settings) Open(o sink.Options) (sink.Publisher, error) {
	c, err := s.Config(o.Name)
	if err != nil {
		return nil, err
	}
	return New(c)
}

// Config maps s onto the Publisher's Config, for the destination named
// name.
func (s *Settings) Config(name string) (Config, error) {
	c := Config{
		Name:           name,
		Servers:        s.Servers,
		ClientName:     s.ClientName,
		Username:       s.Auth.Username,
		Password:       s.password,
		Token:          s.token,
		CredsFile:      s.Auth.CredsFile,
		ConnectTimeout: s.ConnectTimeout,
		AckTimeout:     s.AckTimeout,
		Concurrency:    s.Concurrency,
	}
	if s.TLS.Enabled || s.TLS.Customised() {
		tc, err := s.TLS.ClientConfig()
		if err != nil {
			return c, err
		}
		c.TLS = tc
	}
	return c, nil
}
