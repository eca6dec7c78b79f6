package sink_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

type nothing struct{}

func (nothing) Resolve(func(string) (string, bool)) error { return nil }
func (nothing) Validate() error                           { return nil }
func (nothing) Open(sink.Options) (sink.Publisher, error) { return nil, nil }

func TestRegister(t *testing.T) {
	sink.Register(sink.Sink{Kind: "test-nothing", New: func() sink.Config { return nothing{} }, MaxInFlight: 3})
	s, ok := sink.Lookup("test-nothing")
	if !ok || s.MaxInFlight != 3 || !slices.Contains(sink.Kinds(), "test-nothing") {
		t.Fatalf("lookup %+v %v, kinds %v", s, ok, sink.Kinds())
	}
	if _, ok := sink.Lookup("smtp"); ok {
		t.Fatal("an unregistered kind was found")
	}
	for name, s := range map[string]sink.Sink{
		"twice":   {Kind: "test-nothing", New: func() sink.Config { return nothing{} }},
		"no kind": {New: func() sink.Config { return nothing{} }},
		"no New":  {Kind: "test-other"},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Register did not panic", name)
				}
			}()
			sink.Register(s)
		}()
	}
}

func TestSecret(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(name string) (string, bool) {
		v, ok := map[string]string{"TOKEN": " from-env ", "EMPTY": ""}[name]
		return v, ok
	}
	for _, c := range []struct {
		env, file, want, err string
	}{
		{want: ""},
		{env: "TOKEN", want: "from-env"},
		{file: file, want: "from-file"},
		{env: "TOKEN", file: file, err: "auth.token: give auth.token_env or auth.token_file, not both"},
		{env: "MISSING", err: "auth.token_env: environment variable MISSING is not set"},
		{env: "EMPTY", err: "auth.token_env: environment variable EMPTY is not set"},
		{file: file + ".missing", err: "auth.token_file: open "},
	} {
		got, err := sink.Secret(env, "auth.token", c.env, c.file)
		switch {
		case c.err != "" && (err == nil || !strings.HasPrefix(err.Error(), c.err)):
			t.Errorf("env %q file %q: error %v, want %q", c.env, c.file, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("env %q file %q: %q, %v; want %q", c.env, c.file, got, err, c.want)
		}
	}
}

func TestTLSValidate(t *testing.T) {
	t.Parallel()
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for tls, want := range map[sink.TLS]string{
		{CertFile: "c.pem"}:        "tls.cert_file and tls.key_file go together",
		{CAFile: notPEM}:           "tls.ca_file: " + notPEM + " holds no PEM certificate",
		{CAFile: notPEM + ".none"}: "tls.ca_file: open ",
	} {
		if err := tls.Validate(); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%+v: %v, want %q", tls, err, want)
		}
	}
	if err := (sink.TLS{ServerName: "x"}).Validate(); err != nil {
		t.Errorf("system roots: %v", err)
	}
}
