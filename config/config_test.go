package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadDefaultsAndEnv(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://u:p@db/app", "HOME=/root"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Database{URL: "postgres://u:p@db/app", Schema: "public", MaxConns: 10, ConnectTimeout: 10 * time.Second, QueryTimeout: 30 * time.Second}
	if cfg.Database != want {
		t.Fatalf("database = %+v, want %+v", cfg.Database, want)
	}
	if cfg.Log.Level != "info" || cfg.Log.Format != "text" {
		t.Fatalf("log = %+v", cfg.Log)
	}
}

func TestLoadPrecedence(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
database:
  url: postgres://file@db/app
  schema: from_file
  max_conns: 4
  connect_timeout: 3s
log:
  level: warn
  format: json
`)
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	flags := config.Bind(fs)
	if err := fs.Parse([]string{"--config", path, "--schema", "from_flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(flags, []string{"OUTBOX_DATABASE_MAX_CONNS=7", "OUTBOX_DATABASE_SCHEMA=from_env", "OUTBOX_LOG_LEVEL=debug"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Database
	if got.URL != "postgres://file@db/app" || got.Schema != "from_flag" || got.MaxConns != 7 || got.ConnectTimeout != 3*time.Second {
		t.Fatalf("database = %+v: want url from file, schema from flag, max_conns from env, timeout from file", got)
	}
	if cfg.Log.Level != "debug" || cfg.Log.Format != "json" {
		t.Fatalf("log = %+v: want level from env, format from file", cfg.Log)
	}
}

func TestLoadConfigFileFromEnvAndURLFile(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(secret, []byte("postgres://u:s3cret@db/app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "database:\n  url_file: "+secret+"\n")
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database.URL != "postgres://u:s3cret@db/app" {
		t.Fatalf("url = %q, want the file's content", cfg.Database.URL)
	}
}

func TestLoadReportsEveryProblem(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
database:
  schema: "bad-schema"
  max_conns: lots
  connect_timeout: soon
  pasword: oops
log:
  level: loud
  format: xml
`)
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDatabase)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *config.Error", err)
	}
	msg := err.Error()
	for _, want := range []string{"database.url is required", "max_conns", "connect_timeout", "pasword", "log.level", "log.format"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	// Decode errors prevent a valid struct, but the schema problem is
	// still found when decoding succeeds.
	_, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_DATABASE_SCHEMA=bad-schema", "OUTBOX_LOG_FORMAT=xml"}, config.NeedDatabase)
	if err == nil || !strings.Contains(err.Error(), "database.schema") || !strings.Contains(err.Error(), "log.format") {
		t.Errorf("err = %v, want both the schema and the log format", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=/nonexistent/relay.yaml", "OUTBOX_DATABASE_URL=postgres://db/app"}, config.NeedDatabase)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/relay.yaml") {
		t.Fatalf("err = %v, want the missing file named", err)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, in string }{
		{"postgres://app:hunter2@db:5432/x", "cannot connect to postgres://app:hunter2@db:5432/x"},
		{"postgres://app:p%40ss@db/x", "failed: postgres://app:p%40ss@db/x and p@ss"},
		{"host=db user=app password=hunter2 dbname=x", "bad dsn host=db user=app password=hunter2"},
		{"postgres://app@db/x?password=hunter2", "dsn postgres://app@db/x?password=hunter2"},
		{"host=db user=app password='hunter2 with spaces' dbname=x", "bad dsn password='hunter2 with spaces'"},
	} {
		out := config.Redact(tc.in, tc.dsn)
		if strings.Contains(out, "hunter2") || strings.Contains(out, "p@ss") || strings.Contains(out, "p%40ss") {
			t.Errorf("Redact(%q) = %q still shows the password", tc.in, out)
		}
	}
	if got := config.RedactURL("postgres://app:hunter2@db/x"); got != "postgres://app:xxxxx@db/x" {
		t.Errorf("RedactURL = %q", got)
	}
}

func TestAdminSettings(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("from-a-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_ADMIN_TOKEN_FILE=" + tokenFile, "OUTBOX_ADMIN_ROLES=admin=reader"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.Listen != ":9780" || cfg.Admin.Token != "from-a-file-0123456789" || cfg.Relay.DeadLetterRetention != retry.Forever {
		t.Fatalf("admin %+v, dead-letter retention %s", cfg.Admin, cfg.Relay.DeadLetterRetention)
	}

	_, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_ADMIN_LISTEN=9780",
		"OUTBOX_ADMIN_TOKEN=short-secret", "OUTBOX_ADMIN_ROLES=admin=viewer", "OUTBOX_RELAY_DEAD_LETTER_RETENTION=-1h"}, config.NeedDatabase)
	var ce *config.Error
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("err = %v, want three problems", err)
	}
	msg := err.Error()
	for _, want := range []string{`admin.listen: "9780" is not host:port`, "admin.token is 12 characters", "relay.dead_letter_retention is -1h0m0s"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "short-secret") {
		t.Errorf("the error shows the token:\n%s", msg)
	}
	if cfg.Admin.HistoryInterval != time.Minute {
		t.Errorf("admin.history_interval defaults to %s, want 1m", cfg.Admin.HistoryInterval)
	}
	for _, bad := range []string{"0s", "500ms", "2m", "45s", "7s"} {
		_, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_ADMIN_HISTORY_INTERVAL=" + bad}, config.NeedDatabase)
		if err == nil || !strings.Contains(err.Error(), "admin.history_interval is") || !strings.Contains(err.Error(), "divide a minute") {
			t.Errorf("admin.history_interval %s: %v", bad, err)
		}
	}
	for _, good := range []string{"1s", "5s", "15s", "30s", "1m"} {
		if _, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_ADMIN_HISTORY_INTERVAL=" + good}, config.NeedDatabase); err != nil {
			t.Errorf("admin.history_interval %s: %v", good, err)
		}
	}
}

// One configuration with a mistake of every kind: each is reported once,
// in one error, and nothing else is.
func TestLoadReportsEveryKindOfProblemAtOnce(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
database:
  connect_timeout: soon
relay:
  workers: -1
  poll_intervall: 1s
log:
  level: loud
destinations:
  hook:
    http:
      timeout: 5s
routes:
  - topics: ["a.*"]
    destination: hook
  - topics: ["b"]
    destination: nowhere
`)
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "OUTBOX_ADMIN_TOKEN=too-short", "OUTBOX_ADMIN_ROLES=admin=operator"},
		config.NeedDatabase|config.NeedDestinations)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *config.Error", err)
	}
	want := []string{
		"database.connect_timeout: ",                            // a bad duration
		"unknown setting relay.poll_intervall",                  // an unknown key
		"relay.workers is -1",                                   // a negative count
		"log.level: unknown level",                              // a bad name
		"database.url is required",                              // a missing secret
		"destinations.hook.http.url is required",                // a missing URL
		"admin.token is 9 characters",                           // a short token
		`routes: route 2: destination "nowhere" is not defined`, // a bad route
	}
	found := make([]int, len(want))
	for _, p := range ce.Problems {
		n := 0
		for i, w := range want {
			if strings.Contains(p, w) {
				found[i]++
				n++
			}
		}
		if n != 1 {
			t.Errorf("problem %q matches %d of the mistakes, want 1", p, n)
		}
	}
	for i, w := range want {
		if found[i] != 1 {
			t.Errorf("%q is reported %d times, want once:\n%s", w, found[i], err)
		}
	}
}

// A database URL that cannot be used is reported without its password,
// whether it comes from the environment, the file or url_file, and in
// every form the driver accepts.
func TestLoadProblemsHideTheDatabasePassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:hunter2@db:notaport/app",               // the URL does not parse
		"postgresql://app:hunter2@db:5432/app?sslmode=bogus",   // it parses, a setting does not
		"postgres://app:hunter2@db:5432/app?connect_timeout=x", // the driver quotes the setting
		"postgres://app:hunter2@[::1/app",                      // a broken IPv6 host
		"postgres://app:hunter2%zz@db/app",                     // a broken escape in the password
		"postgres://app:hun%40ter2@db:notaport/app",            // an escaped password
		"postgres://app@db:notaport/app?password=hunter2",      // the password as a parameter
		"host=db user=app password=hunter2 port=notaport",
		"host=db user=app password='hunter2 with spaces' sslmode=bogus",
		"host=db password = hunter2 port=notaport",           // spaces around =
		"postgres://app:hun@ter2@db:5432/x?sslmode=bogus",    // an unescaped @ in the password
		`host=db user=app password=hun\ ter2 port=notaport`,  // an escaped space
		"host=db user=app sslpassword=hunter2 port=notaport", // the client key's password
	} {
		secretFile := filepath.Join(t.TempDir(), "url")
		if err := os.WriteFile(secretFile, []byte(dsn+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for source, env := range map[string][]string{
			"env":      {"OUTBOX_DATABASE_URL=" + dsn},
			"file":     {"OUTBOX_CONFIG=" + writeFile(t, "database:\n  url: \""+dsn+"\"\n")},
			"url_file": {"OUTBOX_DATABASE_URL_FILE=" + secretFile},
		} {
			// Another problem alongside, so the message has several lines.
			_, err := config.Load(nil, append(env, "OUTBOX_LOG_LEVEL=loud"), config.NeedDatabase)
			var ce *config.Error
			if !errors.As(err, &ce) || len(ce.Problems) != 2 || !strings.Contains(err.Error(), "database.url: ") {
				t.Errorf("%s from %s: err = %v, want a database.url problem and a log.level one", dsn, source, err)
				continue
			}
			for _, secret := range []string{"hunter2", "hun%40ter2", "hun@ter2", "ter2"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("%s from %s: the error shows the password:\n%s", dsn, source, err)
				}
			}
		}
	}
}

// A destination whose settings do not decode is reported once: the routes
// that name it are not reported as naming an undefined destination.
func TestUndecodedDestinationIsOneProblem(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
destinations:
  hook:
    http:
      url: https://hooks.example.com/h
      timeout: soon
routes:
  - topics: ["a"]
    destination: hook
  - topics: ["b"]
    destination: nowhere
`)
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "OUTBOX_DATABASE_URL=postgres://app@db/app"},
		config.NeedDatabase|config.NeedDestinations)
	var ce *config.Error
	if !errors.As(err, &ce) || len(ce.Problems) != 2 ||
		!strings.Contains(err.Error(), "http.timeout") || !strings.Contains(err.Error(), `"nowhere" is not defined`) {
		t.Fatalf("err = %v, want the timeout and the route to nowhere, nothing else", err)
	}
}

// Forever is written as such; 0 is refused where it once meant no limit,
// and forever is refused where it means nothing.
func TestForever(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_KAFKA_BROKERS=k:9092",
		"OUTBOX_RETRY_MAX_AGE=forever", "OUTBOX_RELAY_DEAD_LETTER_RETENTION=Forever"}, config.NeedDatabase|config.NeedDestinations)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Retry.MaxAge != retry.Forever || cfg.Relay.DeadLetterRetention != retry.Forever {
		t.Fatalf("max_age %s, dead_letter_retention %s; want retry.Forever", cfg.Retry.MaxAge, cfg.Relay.DeadLetterRetention)
	}
	_, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_KAFKA_BROKERS=k:9092",
		"OUTBOX_RETRY_MAX_AGE=0s", "OUTBOX_RELAY_DEAD_LETTER_RETENTION=0", "OUTBOX_RELAY_POLL_INTERVAL=forever"}, config.NeedDatabase|config.NeedDestinations)
	for _, want := range []string{
		"retry.max_age is 0s; it must be positive, or forever to turn the limit off",
		"relay.dead_letter_retention is 0s; it must be positive, or forever",
		"relay.poll_interval cannot be forever",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

// Every problem of the admin settings is reported at once, and a token
// read from a file counts only once.
func TestAdminProblems(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	for name, token := range map[string]string{
		"short": "tiny", "bad name!": "long-enough-token-0123", "twin-a": "the-same-token-0123456", "twin-b": "the-same-token-0123456",
	} {
		writeAt(t, filepath.Join(tokens, name), token)
	}
	check := func(env []string, want ...string) {
		t.Helper()
		_, err := config.Load(nil, append([]string{"OUTBOX_DATABASE_URL=postgres://db/app"}, env...), config.NeedDatabase)
		var ce *config.Error
		if !errors.As(err, &ce) {
			t.Fatalf("err = %v, want *config.Error", err)
		}
		if len(ce.Problems) != len(want) {
			t.Errorf("%d problems, want %d:\n%s", len(ce.Problems), len(want), err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("no problem says %q:\n%s", w, err)
			}
		}
	}
	check([]string{"OUTBOX_ADMIN_API_LISTEN=:9781", "OUTBOX_ADMIN_TLS_CERT_FILE=" + filepath.Join(dir, "missing.crt"),
		"OUTBOX_ADMIN_TOKENS_DIR=" + tokens, "OUTBOX_ADMIN_ROLES=twin-a=viewer,twin-b=viewer"},
		"admin.tokens_dir: short: the token is 4 characters",
		"admin.tokens_dir: bad name!: name the file with letters",
		"admin.tls: set both cert_file and key_file")
	check([]string{"OUTBOX_ADMIN_API_LISTEN=9781"},
		`admin.api_listen: "9781" is not host:port`,
		"admin.api_listen is set, but no token is")
	check([]string{"OUTBOX_ADMIN_API_LISTEN=:9780", "OUTBOX_ADMIN_TOKEN_FILE=" + filepath.Join(dir, "none")},
		"admin.api_listen is admin.listen",
		"admin.token_file: open")
	twins := filepath.Join(dir, "twins")
	writeAt(t, filepath.Join(twins, "twin-a"), "the-same-token-0123456")
	writeAt(t, filepath.Join(twins, "twin-b"), "the-same-token-0123456")
	check([]string{"OUTBOX_ADMIN_TOKENS_DIR=" + twins, "OUTBOX_ADMIN_ROLES=twin-a=viewer,twin-b=operator"}, "tokens twin-a and twin-b are the same token")
	// Every token needs a role, and a role is one of three.
	check([]string{"OUTBOX_ADMIN_TOKENS_DIR=" + twins, "OUTBOX_ADMIN_ROLES=twin-a=viewer"},
		"admin.roles: token twin-b has no role; grant it one of viewer, reader or operator, as in twin-b=viewer")
	check([]string{"OUTBOX_ADMIN_TRUSTED_PROXIES=10.0.0.0/8,192.0.2.7,::1,10.0.0.0/99,ingress"},
		`admin.trusted_proxies: "10.0.0.0/99" is not an address or a CIDR range`,
		`admin.trusted_proxies: "ingress" is not an address or a CIDR range`)
	check([]string{"OUTBOX_ADMIN_TOKEN=long-enough-token-0123", "OUTBOX_ADMIN_ROLES=admin=root,oncall"},
		`admin.roles: admin: "root" is not a role: use viewer, reader or operator`,
		`admin.roles: "oncall" is not name=role, such as oncall=viewer`)
	check([]string{"OUTBOX_ADMIN_TOKENS_DIR=" + filepath.Join(dir, "nowhere")}, "admin.tokens_dir: open")
	// Single sign-on: every missing or wrong setting at once.
	check([]string{"OUTBOX_ADMIN_OIDC_ISSUER=login.example.com", "OUTBOX_ADMIN_OIDC_REDIRECT_URL=https://relay.example.com/callback",
		"OUTBOX_ADMIN_OIDC_GROUP_ROLES=ops=admin", "OUTBOX_ADMIN_OIDC_GROUPS_CLAIM="},
		`admin.oidc.issuer: "login.example.com" is not an http(s) URL`,
		`admin.oidc.redirect_url: "https://relay.example.com/callback" must end in /console/oidc/callback`,
		"admin.oidc.client_id is not set",
		"admin.oidc.client_secret is not set",
		"admin.oidc.groups_claim is empty",
		`admin.oidc.group_roles: ops: "admin" is not a role`)
	check([]string{"OUTBOX_ADMIN_OIDC_ISSUER=https://login.example.com", "OUTBOX_ADMIN_OIDC_CLIENT_ID=console",
		"OUTBOX_ADMIN_OIDC_CLIENT_SECRET_FILE=" + filepath.Join(dir, "no-secret"),
		"OUTBOX_ADMIN_OIDC_REDIRECT_URL=https://relay.example.com/console/oidc/callback"},
		"admin.oidc.client_secret_file: open",
		"admin.oidc.group_roles is empty: nobody could sign in")
	check([]string{"OUTBOX_ADMIN_OIDC_CLIENT_ID=console", "OUTBOX_ADMIN_CONSOLE_TOKEN_LOGIN=false"},
		"admin.oidc is set, but admin.oidc.issuer is not",
		"admin.console_token_login is off, but admin.oidc is not set")
}

// The client secret is read from its file again at each sign-in: a
// rotated secret applies without a restart.
func TestOIDCSecretFileIsReadAgain(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "client-secret")
	writeAt(t, file, "first-secret\n")
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_ADMIN_OIDC_ISSUER=https://login.example.com",
		"OUTBOX_ADMIN_OIDC_CLIENT_ID=console", "OUTBOX_ADMIN_OIDC_CLIENT_SECRET_FILE=" + file,
		"OUTBOX_ADMIN_OIDC_REDIRECT_URL=https://relay.example.com/console/oidc/callback",
		"OUTBOX_ADMIN_OIDC_GROUP_ROLES=relay-operators=operator,support=viewer"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := cfg.Admin.OIDC.Secret(); s != "first-secret" || err != nil {
		t.Fatalf("secret %q, %v", s, err)
	}
	writeAt(t, file, "second-secret")
	if s, err := cfg.Admin.OIDC.Secret(); s != "second-secret" || err != nil {
		t.Fatalf("after the rotation: secret %q, %v", s, err)
	}
	roles, _ := cfg.Admin.OIDC.Roles()
	if len(roles) != 2 || roles["relay-operators"] != access.Operator || roles["support"] != access.Viewer {
		t.Fatalf("roles %v", roles)
	}
}

func writeAt(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The order scope is destination unless set; an outbox may set its own,
// and a bad one is named with every other problem.
func TestOrderScope(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Outboxes()[0].OrderScope; got != relay.OrderScopeDestination {
		t.Fatalf("order scope %q, want destination", got)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(file, []byte(`
relay: {order_scope: global}
outboxes:
  - {name: a, schema: a}
  - {name: b, schema: b, order_scope: topic}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_CONFIG=" + file}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := cfg.Outboxes()[0].OrderScope, cfg.Outboxes()[1].OrderScope; a != relay.OrderScopeGlobal || b != relay.OrderScopeTopic {
		t.Fatalf("order scopes %q and %q, want global (the relay's) and topic", a, b)
	}
	_, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_RELAY_ORDER_SCOPE=key",
		"OUTBOX_RELAY_WORKERS=0"}, config.NeedDatabase)
	if err == nil || !strings.Contains(err.Error(), `relay.order_scope is "key"; use destination, topic or global`) ||
		!strings.Contains(err.Error(), "relay.workers is 0") {
		t.Fatalf("err = %v, want the bad order scope named beside the other problem", err)
	}
}

// The relay section decodes into the relay's own configuration: the
// relay's defaults, its rules, and the settings of other sections it
// takes, with nothing copied by hand.
func TestRelaySectionIsTheRelaysConfig(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_RELAY_MAX_BATCH_BYTES=4096",
		"OUTBOX_DATABASE_QUERY_TIMEOUT=7s", "OUTBOX_RETRY_PAUSE_BASE=2s", "OUTBOX_RELAY_WORKERS=3"}, config.NeedDatabase)
	if err != nil {
		t.Fatal(err)
	}
	rc := cfg.RelayConfig()
	want := relay.Config{Workers: 3, MaxBatchBytes: 4096, QueryTimeout: 7 * time.Second,
		Pause: relay.PauseConfig{Base: 2 * time.Second, Max: relay.DefaultPauseMax}}.WithDefaults()
	want.PayloadCap = 0 // follows max_batch_bytes: relay.New sets it
	if !reflect.DeepEqual(rc, want) {
		t.Errorf("RelayConfig = %+v\nwant         %+v", rc, want)
	}
	if got := rc.EffectivePayloadCap(); got != 4096 {
		t.Errorf("EffectivePayloadCap = %d, want max_batch_bytes 4096", got)
	}
	_, err = config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_RELAY_BATCH_SIZE=0",
		"OUTBOX_RELAY_PAYLOAD_CAP=9999999", "OUTBOX_RETRY_PAUSE_MAX=0s"}, config.NeedDatabase)
	for _, line := range []string{"relay.batch_size is 0; it must be at least 1",
		"relay.payload_cap 9999999 is above max_batch_bytes 921600", "retry.pause_max is 0s; it must be positive"} {
		if err == nil || !strings.Contains(err.Error(), line) {
			t.Errorf("err = %v; want it to say %q", err, line)
		}
	}
}
