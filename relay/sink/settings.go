package sink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Secret returns the secret a pair of settings names: an environment
// variable (envVar, set by <setting>_env) or a file (file, set by
// <setting>_file), trimmed of surrounding space; "" when neither is
// given. setting is the pair's path, for errors.
func Secret(lookupEnv func(string) (string, bool), setting, envVar, file string) (string, error) {
	switch {
	case envVar != "" && file != "":
		return "", fmt.Errorf("%s: give %s_env or %s_file, not both", setting, setting, setting)
	case envVar != "":
		v, ok := lookupEnv(envVar)
		if !ok || strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%s_env: environment variable %s is not set", setting, envVar)
		}
		return strings.TrimSpace(v), nil
	case file != "":
		return ReadSecretFile(setting+"_file", file)
	}
	return "", nil
}

// ReadSecretFile reads a secret from the file a setting names, such as a
// mounted Kubernetes Secret, trimmed of surrounding space.
func ReadSecretFile(setting, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", setting, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// TLS are the settings of TLS to a destination, read from PEM files.
type TLS struct {
	// Enabled turns TLS on where the sink does not tell from an address
	// (Kafka); an HTTP destination uses TLS for https URLs.
	Enabled bool `koanf:"enabled"`
	// CAFile is a PEM bundle of extra roots.
	CAFile string `koanf:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and key (mTLS).
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
	// ServerName overrides the name verified in servers' certificates.
	ServerName string `koanf:"server_name"`
	// InsecureSkipVerify disables certificate verification. Never in
	// production.
	InsecureSkipVerify bool `koanf:"insecure_skip_verify"`
}

// Files are the files t names.
func (t TLS) Files() []string { return []string{t.CAFile, t.CertFile, t.KeyFile} }

// Customised reports whether any setting but Enabled is given.
func (t TLS) Customised() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// Validate reports every problem of the files t names, each prefixed
// with tls., by loading them as ClientConfig does.
func (t TLS) Validate() error {
	_, err := t.ClientConfig()
	return err
}

// ClientConfig builds the TLS client configuration t describes, with the
// system roots unless CAFile is given.
func (t TLS) ClientConfig() (*tls.Config, error) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("tls.cert_file and tls.key_file go together")
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // an explicit operator choice
	}
	var errs []error
	if t.CAFile != "" {
		roots := x509.NewCertPool()
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("tls.ca_file: %w", err))
		} else if !roots.AppendCertsFromPEM(pem) {
			errs = append(errs, fmt.Errorf("tls.ca_file: %s holds no PEM certificate", t.CAFile))
		}
		tc.RootCAs = roots
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("tls.cert_file: %w", err))
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return tc, nil
}
