package pubsub

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

var _ sink.Reloader = (*Settings)(nil)

func init() {
	sink.Register(sink.Sink{
		Kind:            "pubsub",
		New:             func() sink.Config { return new(Settings) },
		MessagingSystem: "gcp_pubsub",
		ValidateTopic:   ValidateTopic,
		// The Pub/Sub protocol binding carries attributes as ce-*.
		CloudEventsPrefix: "ce-",
	})
}

// Settings are a Google Cloud Pub/Sub destination's settings in the
// configuration, destinations.<name>.pubsub.
type Settings struct {
	// Project is the Google Cloud project of the topics. Required.
	Project string `koanf:"project"`
	// CredentialsFile is a service account key file (JSON); empty uses
	// the environment's default credentials (workload identity,
	// GOOGLE_APPLICATION_CREDENTIALS).
	CredentialsFile string `koanf:"credentials_file"`
	// Emulator is the host:port of a Pub/Sub emulator, for development;
	// no TLS, no credentials.
	Emulator string `koanf:"emulator"`
	// MaxMessageBytes is the largest message; a larger row is
	// dead-lettered too_large. Default Pub/Sub's 10 MB.
	MaxMessageBytes int `koanf:"max_message_bytes"`
	// Timeout bounds a publish. Default 10s.
	Timeout time.Duration `koanf:"timeout"`
	// ClientName is the requests' User-Agent. Default outbox-relay.
	ClientName string `koanf:"client_name"`
}

// Resolve does nothing: the client reads the credentials file itself.
func (s *Settings) Resolve(func(string) (string, bool)) error { return nil }

// Validate reports every problem of s at once.
func (s *Settings) Validate() error {
	var errs []error
	if s.Project == "" {
		errs = append(errs, errors.New("project is required"))
	}
	if s.CredentialsFile != "" {
		if s.Emulator != "" {
			errs = append(errs, errors.New("credentials_file: an emulator takes no credentials"))
		} else if _, err := os.Stat(s.CredentialsFile); err != nil {
			errs = append(errs, fmt.Errorf("credentials_file: %w", err))
		}
	}
	if s.Emulator != "" {
		if _, port, err := net.SplitHostPort(s.Emulator); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("emulator: %q is not host:port", s.Emulator))
		}
	}
	if s.MaxMessageBytes < 0 || s.MaxMessageBytes > MaxMessageBytes {
		errs = append(errs, fmt.Errorf("max_message_bytes is %d; use 0 to %d", s.MaxMessageBytes, MaxMessageBytes))
	}
	if s.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout is %s; it must not be negative", s.Timeout))
	}
	return errors.Join(errs...)
}

// Files are the files s reads: the credentials.
func (s *Settings) Files() []string { return []string{s.CredentialsFile} }

// Reload gives p a client with the credentials file as it is now.
func (s *Settings) Reload(p sink.Publisher) error {
	pp, ok := p.(*Publisher)
	if !ok {
		return fmt.Errorf("pubsub: cannot reload a %T", p)
	}
	return pp.Reload(s.Config(pp.cfg.Name))
}

// Open returns a Publisher for the destination s describes.
func (s *Settings) Open(o sink.Options) (sink.Publisher, error) {
	return New(s.Config(o.Name))
}

// Config maps s onto the Publisher's Config, for the destination named
// name.
func (s *Settings) Config(name string) Config {
	return Config{Name: name, Project: s.Project, CredentialsFile: s.CredentialsFile, Emulator: s.Emulator,
		MaxMessageBytes: s.MaxMessageBytes, Timeout: s.Timeout, ClientName: s.ClientName}
}
