package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
)

// DefaultKafkaDestination names the destination the kafka section
// defines.
const DefaultKafkaDestination = "kafka"

// Destination is a named Kafka cluster or HTTP endpoint: exactly one of
// kafka and http.
type Destination struct {
	Kafka *Kafka `koanf:"kafka"`
	HTTP  *HTTP  `koanf:"http"`
	// OnDeadLetter is release or block; default relay.on_dead_letter.
	OnDeadLetter string `koanf:"on_dead_letter"`
	// MaxInFlight is the bulkhead: the most rows of this destination being
	// delivered at once. Default 0, unlimited, for Kafka; 64 for HTTP.
	MaxInFlight int         `koanf:"max_in_flight"`
	Breaker     Breaker     `koanf:"breaker"`
	RetryBudget RetryBudget `koanf:"retry_budget"`
	// VisibilityTimeout, when set (at least 1s), delivers on a lease
	// outside the claim's transaction: for slow endpoints. A relay that
	// dies mid-delivery leaves rows that are delivered again after it.
	VisibilityTimeout time.Duration `koanf:"visibility_timeout"`
}

// Breaker configures a destination's circuit breaker, which opens only on
// failures of the destination as a whole (see relay.BreakerConfig). The
// cool-down is retry.pause_base, doubling up to retry.pause_max.
type Breaker struct {
	// Failures is the run of consecutive transient failures of the
	// destination (no answer) that opens it; a systemic failure opens it
	// at once. Default 5.
	Failures int `koanf:"failures"`
	// Successes is the number of successful probes that close it.
	// Default 2.
	Successes int `koanf:"successes"`
	// FailingRows and FailingFor open it when every row given to the
	// destination failed, across at least FailingRows distinct rows for at
	// least FailingFor. Defaults 10 and 2s.
	FailingRows int           `koanf:"failing_rows"`
	FailingFor  time.Duration `koanf:"failing_for"`
}

// RetryBudget limits failing retries. See relay.RetryBudgetConfig.
type RetryBudget struct {
	// Ratio is the retries earned per first attempt. Default 0.2.
	Ratio float64 `koanf:"ratio"`
	// MinPerSecond is the floor: retries earned per second. Default 10.
	MinPerSecond float64 `koanf:"min_per_second"`
	// Disabled turns the budget off.
	Disabled bool `koanf:"disabled"`
}

// DefaultHTTPMaxInFlight is an HTTP destination's default bulkhead.
const DefaultHTTPMaxInFlight = 64

// HTTP configures a webhook endpoint.
type HTTP struct {
	// URL receives a POST per row. Required.
	URL string `koanf:"url"`
	// ContentType is sent for rows without a content-type header. Default
	// application/json.
	ContentType string `koanf:"content_type"`
	// Headers are added to every request.
	Headers map[string]string `koanf:"headers"`
	Auth    HTTPAuth          `koanf:"auth"`
	Signing Signing           `koanf:"signing"`
	// TLS holds roots and a client certificate (mTLS) for https URLs.
	TLS TLS `koanf:"tls"`
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
}

// HTTPAuth authenticates to an endpoint: a bearer token or basic auth,
// secrets from an environment variable or a file.
type HTTPAuth struct {
	BearerTokenEnv  string `koanf:"bearer_token_env"`
	BearerTokenFile string `koanf:"bearer_token_file"`
	Username        string `koanf:"username"`
	PasswordEnv     string `koanf:"password_env"`
	PasswordFile    string `koanf:"password_file"`

	bearerToken, password string
}

// Signing configures Standard Webhooks signatures: whsec_ secrets,
// whitespace-separated, from an environment variable or a file. Give two
// while rotating.
type Signing struct {
	SecretsEnv  string `koanf:"secrets_env"`
	SecretsFile string `koanf:"secrets_file"`

	secrets []string
}

// Route maps topics to a destination.
type Route struct {
	// Topics are names or globs (*, ?, [a-z]).
	Topics []string `koanf:"topics"`
	// Destination is kafka (the kafka section) or a destinations entry.
	Destination string `koanf:"destination"`
	// Topic replaces the row's topic on a Kafka destination.
	Topic string `koanf:"topic"`
}

var destinationName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// routesTo reports whether a route names dest.
func (c *Config) routesTo(dest string) bool {
	for _, r := range c.Routes {
		if r.Destination == dest {
			return true
		}
	}
	return false
}

// resolveDestinations applies the defaults to named destinations and reads
// their secrets; it returns the problems found doing so.
func (c *Config) resolveDestinations(env map[string]string, readFile func(path, file string, into *string)) []string {
	var p []string
	fromEnv := func(path, name string, into *string) {
		if name == "" || *into != "" {
			return
		}
		v, ok := env[name]
		if !ok || v == "" {
			p = append(p, fmt.Sprintf("%s: environment variable %s is not set", path, name))
			return
		}
		*into = strings.TrimSpace(v)
	}
	for name, d := range c.Destinations {
		at := "destinations." + name
		if d.Kafka != nil {
			if d.Kafka.ClientID == "" {
				d.Kafka.ClientID = c.Kafka.ClientID
			}
			if d.Kafka.DialTimeout == 0 {
				d.Kafka.DialTimeout = c.Kafka.DialTimeout
			}
			readFile(at+".kafka.sasl.password_file", d.Kafka.SASL.PasswordFile, &d.Kafka.SASL.Password)
		}
		if h := d.HTTP; h != nil {
			for _, pair := range [][3]string{
				{"auth.bearer_token", h.Auth.BearerTokenEnv, h.Auth.BearerTokenFile},
				{"auth.password", h.Auth.PasswordEnv, h.Auth.PasswordFile},
				{"signing.secrets", h.Signing.SecretsEnv, h.Signing.SecretsFile},
			} {
				if pair[1] != "" && pair[2] != "" {
					p = append(p, fmt.Sprintf("%s.http.%s: give _env or _file, not both", at, pair[0]))
				}
			}
			fromEnv(at+".http.auth.bearer_token_env", h.Auth.BearerTokenEnv, &h.Auth.bearerToken)
			readFile(at+".http.auth.bearer_token_file", h.Auth.BearerTokenFile, &h.Auth.bearerToken)
			fromEnv(at+".http.auth.password_env", h.Auth.PasswordEnv, &h.Auth.password)
			readFile(at+".http.auth.password_file", h.Auth.PasswordFile, &h.Auth.password)
			var secrets string
			fromEnv(at+".http.signing.secrets_env", h.Signing.SecretsEnv, &secrets)
			readFile(at+".http.signing.secrets_file", h.Signing.SecretsFile, &secrets)
			h.Signing.secrets = strings.Fields(secrets)
			if (h.Signing.SecretsEnv != "" || h.Signing.SecretsFile != "") && len(h.Signing.secrets) == 0 {
				p = append(p, at+".http.signing: no secrets found; signing would be off")
			}
			if d.MaxInFlight == 0 {
				d.MaxInFlight = DefaultHTTPMaxInFlight
			}
		}
		c.Destinations[name] = d
	}
	return p
}

// destinationProblems checks the named destinations and the routes.
func (c *Config) destinationProblems(need Need) []string {
	var p []string
	names := []string{}
	if len(c.Kafka.Brokers) > 0 {
		names = append(names, DefaultKafkaDestination)
	}
	for name, d := range c.Destinations {
		at := "destinations." + name
		names = append(names, name)
		if name == DefaultKafkaDestination {
			p = append(p, at+": the name kafka is taken by the kafka section; choose another")
		} else if !destinationName.MatchString(name) {
			p = append(p, at+": a destination name is lowercase letters, digits, - and _")
		}
		switch {
		case (d.Kafka == nil) == (d.HTTP == nil):
			p = append(p, at+" needs exactly one of kafka or http")
		case d.Kafka != nil:
			p = append(p, d.Kafka.problems(at+".kafka", true)...)
		default:
			wc, err := d.HTTP.Webhook(name)
			for _, err := range []error{err, wc.Validate()} {
				if err != nil {
					for _, line := range strings.Split(err.Error(), "\n") {
						p = append(p, at+".http: "+line)
					}
				}
			}
			p = append(p, d.HTTP.TLS.problems(at+".http.tls")...)
			if d.HTTP.TLS.Enabled {
				p = append(p, at+".http.tls.enabled is not used: an https URL turns TLS on")
			}
		}
		settings := d.relayDestination(name)
		if err := settings.ValidateSettings(); err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				p = append(p, at+"."+line)
			}
		}
		if len(c.Routes) > 0 && !c.routesTo(name) {
			p = append(p, at+" is not used by any route")
		}
	}
	if len(c.Routes) == 0 {
		if len(c.Destinations) > 0 {
			p = append(p, "routes are required with destinations: say which topics go where")
		}
	} else if err := relay.ValidateRoutes(c.relayRoutes(), names); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p = append(p, "routes: "+line)
		}
	}
	for i, r := range c.Routes {
		if r.Topic == "" {
			continue
		}
		d, named := c.Destinations[r.Destination]
		switch {
		case named && d.Kafka == nil:
			p = append(p, fmt.Sprintf("routes: route %d: topic is only for Kafka destinations", i+1))
		case named || r.Destination == DefaultKafkaDestination:
			if err := kafka.ValidateTopic(r.Topic); err != nil {
				p = append(p, fmt.Sprintf("routes: route %d: %v", i+1, err))
			}
		}
	}
	sort.Strings(p)
	return p
}

func (c *Config) relayRoutes() []relay.Route {
	out := make([]relay.Route, 0, len(c.Routes))
	for _, r := range c.Routes {
		out = append(out, relay.Route{Topics: r.Topics, Destination: r.Destination, Topic: r.Topic})
	}
	return out
}

// DestinationSettings are the relay settings of every destination: the
// kafka section's, if it has brokers, and the named ones, sorted by name.
// Kafka and HTTP hold the sink configuration of each.
type DestinationSettings struct {
	Name  string
	Kafka *Kafka
	HTTP  *HTTP
	Relay relay.Destination // without a Publisher
}

// DestinationList lists the destinations and the routes for the relay.
// Without routes, every topic goes to kafka.
func (c *Config) DestinationList() ([]DestinationSettings, []relay.Route) {
	var out []DestinationSettings
	if len(c.Kafka.Brokers) > 0 && (len(c.Routes) == 0 || c.routesTo(DefaultKafkaDestination)) {
		k := c.Kafka
		out = append(out, DestinationSettings{Name: DefaultKafkaDestination, Kafka: &k,
			Relay: relay.Destination{Name: DefaultKafkaDestination}})
	}
	names := make([]string, 0, len(c.Destinations))
	for name := range c.Destinations {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		d := c.Destinations[name]
		out = append(out, DestinationSettings{Name: name, Kafka: d.Kafka, HTTP: d.HTTP, Relay: d.relayDestination(name)})
	}
	routes := c.relayRoutes()
	if len(routes) == 0 {
		routes = []relay.Route{{Topics: []string{"*"}, Destination: DefaultKafkaDestination}}
	}
	return out, routes
}

// relayDestination maps d's relay settings onto the relay's type, which
// validates them.
func (d Destination) relayDestination(name string) relay.Destination {
	return relay.Destination{
		Name:              name,
		VisibilityTimeout: d.VisibilityTimeout,
		OnDeadLetter:      d.OnDeadLetter,
		MaxInFlight:       d.MaxInFlight,
		Breaker: relay.BreakerConfig{Failures: d.Breaker.Failures, Successes: d.Breaker.Successes,
			FailingRows: d.Breaker.FailingRows, FailingFor: d.Breaker.FailingFor},
		RetryBudget: relay.RetryBudgetConfig{Ratio: d.RetryBudget.Ratio, MinPerSecond: d.RetryBudget.MinPerSecond, Disabled: d.RetryBudget.Disabled},
	}
}

// Webhook returns the HTTP sink configuration of h.
func (h *HTTP) Webhook(name string) (webhook.Config, error) {
	wc := webhook.Config{
		Name:                  name,
		URL:                   h.URL,
		ContentType:           h.ContentType,
		Headers:               h.Headers,
		BearerToken:           h.Auth.bearerToken,
		Username:              h.Auth.Username,
		Password:              h.Auth.password,
		SigningSecrets:        h.Signing.secrets,
		ConnectTimeout:        h.ConnectTimeout,
		TLSHandshakeTimeout:   h.TLSHandshakeTimeout,
		ResponseHeaderTimeout: h.ResponseHeaderTimeout,
		Timeout:               h.Timeout,
		MaxResponseBytes:      h.MaxResponseBytes,
		Concurrency:           h.Concurrency,
		AllowPrivateNetworks:  h.AllowPrivateNetworks,
	}
	var errs []error
	for code, class := range h.StatusClasses {
		n, err := strconv.Atoi(code)
		if err != nil {
			errs = append(errs, fmt.Errorf("status_classes: %q is not a status code", code))
			continue
		}
		c, ok := map[string]retry.Class{"permanent": retry.ClassPermanent, "transient": retry.ClassTransient, "systemic": retry.ClassSystemic}[class]
		if !ok {
			errs = append(errs, fmt.Errorf("status_classes: %s is %q; use permanent, transient or systemic", code, class))
			continue
		}
		if wc.StatusClasses == nil {
			wc.StatusClasses = map[int]retry.Class{}
		}
		wc.StatusClasses[n] = c
	}
	if h.TLS.CAFile != "" || h.TLS.CertFile != "" || h.TLS.ServerName != "" || h.TLS.InsecureSkipVerify {
		tc, err := h.TLS.ClientConfig()
		if err != nil {
			errs = append(errs, err)
		}
		wc.TLS = tc
	}
	return wc, errors.Join(errs...)
}

// ClientConfig builds the TLS client configuration t describes.
func (t TLS) ClientConfig() (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // an explicit operator choice
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.ca_file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_file %s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = roots
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// allEnv maps every environment variable, for settings that name one.
func allEnv(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
