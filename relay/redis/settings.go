package redis

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

var _ sink.Reloader = (*Settings)(nil)

func init() {
	sink.Register(sink.Sink{
		Kind:            "redis",
		New:             func() sink.Config { return new(Settings) },
		MessagingSystem: "redis",
		ValidateTopic:   ValidateStream,
	})
}

// Settings are a Redis Streams destination's settings in the
// configuration, destinations.<name>.redis. Zero values take the
// defaults of Config.
type Settings struct {
	// Addresses are host:port of the server; several are a cluster's
	// seeds, or sentinels with master_name. Required.
	Addresses []string `koanf:"addresses"`
	// MasterName, with sentinels as addresses, follows that master.
	MasterName string `koanf:"master_name"`
	// DB is the database number (not in a cluster). Default 0.
	DB int `koanf:"db"`
	// Username and a password (ACL, or requirepass without a username).
	Username     string `koanf:"username"`
	PasswordEnv  string `koanf:"password_env"`
	PasswordFile string `koanf:"password_file"`
	// TLS holds roots and a client certificate; enabled turns TLS on.
	TLS sink.TLS `koanf:"tls"`
	// MaxLen trims each stream to about this many entries as it grows
	// (XADD MAXLEN ~); 0 keeps every entry.
	MaxLen int64 `koanf:"max_len"`
	// MaxEntryBytes is the largest entry written; a larger row is
	// dead-lettered too_large. Default relay.max_batch_bytes and some.
	MaxEntryBytes int `koanf:"max_entry_bytes"`
	// DialTimeout bounds connecting; Timeout one round trip of commands.
	// Defaults 5s and 5s.
	DialTimeout time.Duration `koanf:"dial_timeout"`
	Timeout     time.Duration `koanf:"timeout"`
	// ClientName names the connection at the server (CLIENT SETNAME).
	// Default outbox-relay.
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
	if len(s.Addresses) == 0 {
		errs = append(errs, errors.New("addresses is required"))
	}
	for _, a := range s.Addresses {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("addresses: %q is not host:port", a))
		}
	}
	if s.Username != "" && s.password == "" {
		errs = append(errs, errors.New("username needs a password (password_env or password_file)"))
	}
	if s.DB < 0 {
		errs = append(errs, fmt.Errorf("db is %d; it must not be negative", s.DB))
	}
	if s.DB != 0 && len(s.Addresses) > 1 && s.MasterName == "" {
		errs = append(errs, errors.New("db: a cluster has only database 0"))
	}
	if s.MaxLen < 0 || s.MaxEntryBytes < 0 {
		errs = append(errs, errors.New("max_len and max_entry_bytes must not be negative"))
	}
	for name, d := range map[string]time.Duration{"dial_timeout": s.DialTimeout, "timeout": s.Timeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s is %s; it must not be negative", name, d))
		}
	}
	if s.TLS.Enabled || s.TLS.Customised() {
		if err := s.TLS.Validate(); err != nil {
			errs = append(errs, err)
		}
		if !s.TLS.Enabled {
			errs = append(errs, errors.New("tls settings are given but tls.enabled is false"))
		}
	}
	return errors.Join(errs...)
}

// Files are the files s reads: the password and TLS material.
func (s *Settings) Files() []string { return append([]string{s.PasswordFile}, s.TLS.Files()...) }

// Reload gives p the password and TLS material of s, which Resolve has
// read anew: p connects with them, and keeps its client if it cannot.
func (s *Settings) Reload(p sink.Publisher) error {
	rp, ok := p.(*Publisher)
	if !ok {
		return fmt.Errorf("redis: cannot reload a %T", p)
	}
	c, err := s.Config(rp.cfg.Name, rp.cfg.MaxEntryBytes)
	if err != nil {
		return err
	}
	return rp.Reload(c)
}

// Open returns a Publisher for the destination s describes.
func (s *Settings) Open(o sink.Options) (sink.Publisher, error) {
	maxEntry := cmp.Or(s.MaxEntryBytes, o.MessageBytes(EntrySlack))
	c, err := s.Config(o.Name, maxEntry)
	if err != nil {
		return nil, err
	}
	return New(c)
}

// Config maps s onto the Publisher's Config, for the destination named
// name, with entries up to maxEntry bytes.
func (s *Settings) Config(name string, maxEntry int) (Config, error) {
	c := Config{
		Name: name, Addresses: s.Addresses, MasterName: s.MasterName, DB: s.DB,
		Username: s.Username, Password: s.password, MaxLen: s.MaxLen, MaxEntryBytes: maxEntry,
		DialTimeout: s.DialTimeout, Timeout: s.Timeout, ClientName: s.ClientName,
	}
	if s.TLS.Enabled {
		tc, err := s.TLS.ClientConfig()
		if err != nil {
			return c, err
		}
		c.TLS = tc
	}
	return c, nil
}
