package webhook

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// DefaultMaxInFlight is an HTTP destination's bulkhead unless it sets
// one: endpoints are rarely sized for a backlog delivered at once.
const DefaultMaxInFlight = 64

var _ sink.Reloader = (*Settings)(nil)

func init() {
	sink.Register(sink.Sink{
		Kind:        "http",
		New:         func() sink.Config { return new(Settings) },
		MaxInFlight: DefaultMaxInFlight,
		// The HTTP protocol binding's prefix.
		CloudEventsPrefix: "ce-",
	})
}

// Settings are an HTTP destination's settings in the configuration,
// destinations.<name>.http. Zero values take the defaults of Config.
type Settings struct {
	// URL receives a POST per row. Required.
	URL string `koanf:"url"`
	// ContentType is sent for rows without a content-type header. Default
	// application/json.
	ContentType string `koanf:"content_type"`
	// Headers are added to every request.
	Headers map[string]string `koanf:"headers"`
	// ClientName is the requests' User-Agent. Default outbox-relay.
	ClientName string  `koanf:"client_name"`
	Auth       Auth    `koanf:"auth"`
	Signing    Signing `koanf:"signing"`
	// TLS holds roots and a client certificate (mTLS) for https URLs.
	TLS sink.TLS `koanf:"tls"`
	// Timeouts: connecting, the TLS handshake, waiting for response
	// headers, and the whole request. Defaults 5s, 5s, 10s, 30s.
	ConnectTimeout        time.Duration `koanf:"connect_timeout"`
	TLSHandshakeTimeout   time.Duration `koanf:"tls_handshake_timeout"`
	ResponseHeaderTimeout time.Duration `koanf:"response_header_timeout"`
	Timeout               time.Duration `koanf:"timeout"`
	// MaxResponseBytes of a response body are quoted in last_error.
	// Default 1024.
	MaxResponseBytes int `koanf:"max_response_bytes"`
	// Concurrency is the most requests one batch makes at once. Default 8.
	Concurrency int `koanf:"concurrency"`
	// AllowPrivateNetworks turns off the SSRF guard (loopback, private and
	// link-local addresses), for endpoints inside the network.
	AllowPrivateNetworks bool `koanf:"allow_private_networks"`
	// StatusClasses overrides how response codes are treated: "409":
	// transient; classes permanent, transient, systemic.
	StatusClasses map[string]string `koanf:"status_classes"`

	bearerToken, password string // read by Resolve
	secrets               []string
}

// Auth authenticates to an endpoint: a bearer token or basic auth, secrets
// from an environment variable or a file.
type Auth struct {
	BearerTokenEnv  string `koanf:"bearer_token_env"`
	BearerTokenFile string `koanf:"bearer_token_file"`
	Username        string `koanf:"username"`
	PasswordEnv     string `koanf:"password_env"`
	PasswordFile    string `koanf:"password_file"`
}

// Signing configures Standard Webhooks signatures: whsec_ secrets,
// whitespace-separated, from an environment variable or a file. Give two
// while rotating.
type Signing struct {
	SecretsEnv  string `koanf:"secrets_env"`
	SecretsFile string `koanf:"secrets_file"`
}

// Resolve reads the bearer token, the basic-auth password and the signing
// secrets from the variables or files the settings name.
func (s *Settings) Resolve(lookupEnv func(string) (string, bool)) error {
	var errs []error
	read := func(setting, env, file string) string {
		v, err := sink.Secret(lookupEnv, setting, env, file)
		errs = append(errs, err)
		return v
	}
	s.bearerToken = read("auth.bearer_token", s.Auth.BearerTokenEnv, s.Auth.BearerTokenFile)
	s.password = read("auth.password", s.Auth.PasswordEnv, s.Auth.PasswordFile)
	s.secrets = strings.Fields(read("signing.secrets", s.Signing.SecretsEnv, s.Signing.SecretsFile))
	if (s.Signing.SecretsEnv != "" || s.Signing.SecretsFile != "") && len(s.secrets) == 0 && errors.Join(errs...) == nil {
		errs = append(errs, errors.New("signing: no secrets found; signing would be off"))
	}
	return errors.Join(errs...)
}

// Validate reports every problem of s at once.
func (s *Settings) Validate() error {
	c, err := s.Config("")
	errs := []error{err, c.Validate()}
	if s.TLS.Enabled {
		errs = append(errs, errors.New("tls.enabled is not used: an https URL turns TLS on"))
	}
	return errors.Join(errs...)
}

// Files are the files s reads: secrets and TLS material.
func (s *Settings) Files() []string {
	return append([]string{s.Auth.BearerTokenFile, s.Auth.PasswordFile, s.Signing.SecretsFile}, s.TLS.Files()...)
}

// Reload gives p the secrets and TLS configuration of s, which Resolve has
// read anew.
func (s *Settings) Reload(p sink.Publisher) error {
	wp, ok := p.(*Publisher)
	if !ok {
		return fmt.Errorf("webhook: cannot reload a %T", p)
	}
	c, err := s.Config(wp.cfg.Name)
	if err != nil {
		return err
	}
	return wp.Reload(c)
}

// Open returns a Publisher for the destination s describes.
func (s *Settings) Open(o sink.Options) (sink.Publisher, error) {
	c, err := s.Config(o.Name)
	if err != nil {
		return nil, err
	}
	return New(c)
}

// Config maps s onto the Publisher's Config, for the destination named name.
func (s *Settings) Config(name string) (Config, error) {
	c := Config{
		Name:                  name,
		URL:                   s.URL,
		ContentType:           s.ContentType,
		Headers:               s.Headers,
		ClientName:            s.ClientName,
		BearerToken:           s.bearerToken,
		Username:              s.Auth.Username,
		Password:              s.password,
		SigningSecrets:        s.secrets,
		ConnectTimeout:        s.ConnectTimeout,
		TLSHandshakeTimeout:   s.TLSHandshakeTimeout,
		ResponseHeaderTimeout: s.ResponseHeaderTimeout,
		Timeout:               s.Timeout,
		MaxResponseBytes:      s.MaxResponseBytes,
		Concurrency:           s.Concurrency,
		AllowPrivateNetworks:  s.AllowPrivateNetworks,
	}
	var errs []error
	for code, class := range s.StatusClasses {
		n, err := strconv.Atoi(code)
		if err != nil {
			errs = append(errs, fmt.Errorf("status_classes: %q is not a status code", code))
			continue
		}
		cl, ok := map[string]sink.Class{"permanent": sink.ClassPermanent, "transient": sink.ClassTransient, "systemic": sink.ClassSystemic}[class]
		if !ok {
			errs = append(errs, fmt.Errorf("status_classes: %s is %q; use permanent, transient or systemic", code, class))
			continue
		}
		if c.StatusClasses == nil {
			c.StatusClasses = map[int]sink.Class{}
		}
		c.StatusClasses[n] = cl
	}
	if s.TLS.Customised() {
		tc, err := s.TLS.ClientConfig()
		errs = append(errs, err)
		c.TLS = tc
	}
	return c, errors.Join(errs...)
}
