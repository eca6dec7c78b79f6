package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/outbox-relay/outbox-relay/relay/sink/builtin"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
)

// The example configuration and the configuration reference document
// every setting; these tests keep them in step with Config.
const (
	examplePath   = "../deploy/relay.example.yaml"
	referencePath = "../docs/configuration.md"
)

// exampleSecrets are the settings the example shows only commented out:
// secrets are never written in it, and the files the *_file forms (and the
// admin listeners' tokens directory and certificate) name do not exist
// where the example is tried; the tokens' roles go with the tokens.
var exampleSecrets = map[string]bool{
	"database.url":                  true,
	"database.url_file":             true,
	"admin.token":                   true,
	"admin.token_file":              true,
	"admin.tokens_dir":              true,
	"admin.roles":                   true,
	"admin.oidc.issuer":             true,
	"admin.oidc.client_id":          true,
	"admin.oidc.client_secret":      true,
	"admin.oidc.client_secret_file": true,
	"admin.oidc.redirect_url":       true,
	"admin.oidc.group_roles":        true,
	"admin.tls.cert_file":           true,
	"admin.tls.key_file":            true,
	"kafka.sasl.password":           true,
	"kafka.sasl.password_env":       true,
	"kafka.sasl.password_file":      true,
}

// exampleDiffers lists the settings the example sets to something other
// than their default, and why.
var exampleDiffers = map[string]string{
	"kafka.brokers": "it has no default, and the example's routes send to the kafka destination, which needs brokers",
}

// destinationSecrets are the destination settings, by path prefix, that
// the example shows only commented out: each names a variable or a file
// holding a secret, which would have to exist for the example to load.
var destinationSecrets = []string{"http.auth.", "http.signing.", "kafka.sasl.password", "nats.auth.", "redis.password_", "rabbitmq.password_", "sqs.secret_access_key_", "sqs.session_token_", "sns.secret_access_key_", "sns.session_token_"}

func readExample(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseYAML(t *testing.T, b []byte) map[string]any {
	t.Helper()
	m, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return m
}

// commentedSetting is a commented-out setting, "# key: value", as opposed
// to prose, which never starts with a lowercase word and a colon.
var commentedSetting = regexp.MustCompile(`^(\s*)# (\s*[a-z_]+:(\s.*)?)$`)

// uncomment returns the YAML b with its commented-out settings made
// active.
func uncomment(b []byte) []byte {
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if m := commentedSetting.FindStringSubmatch(l); m != nil {
			lines[i] = m[1] + m[2]
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// lookup returns the value at the dotted path in m, and whether a key is
// there (even with a null value).
func lookup(m map[string]any, path string) (any, bool) {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = mm[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// fieldPaths lists the dotted paths of the settings of t, through structs
// and pointers to structs. Maps and lists are settings of their own.
func fieldPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, squash := settingTag(f)
		if tag == "" && !squash {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case squash:
			out = append(out, fieldPaths(ft, prefix)...)
		case ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Time{}):
			out = append(out, fieldPaths(ft, prefix+tag+".")...)
		default:
			out = append(out, prefix+tag)
		}
	}
	return out
}

// envMentioned reports whether text names the variable exactly, not as
// the start of a longer name (OUTBOX_DATABASE_URL in
// OUTBOX_DATABASE_URL_FILE).
func envMentioned(text, name string) bool {
	return regexp.MustCompile(`\b` + name + `\b`).MatchString(text)
}

func TestExampleDocumentsEverySetting(t *testing.T) {
	t.Parallel()
	raw := readExample(t)
	text := string(raw)
	active := parseYAML(t, raw)
	all := parseYAML(t, uncomment(raw))

	for _, path := range settingPaths() {
		_, set := lookup(active, path)
		_, shown := lookup(all, path)
		switch {
		case exampleSecrets[path] && set:
			t.Errorf("%s is set in the example; show it commented out, as the other secrets are", path)
		case !exampleSecrets[path] && !set:
			t.Errorf("%s is not set in the example", path)
		case !shown:
			t.Errorf("%s is not shown in the example, not even commented out", path)
		}
		if !envMentioned(text, EnvName(path)) {
			t.Errorf("the example does not name %s's variable %s", path, EnvName(path))
		}
	}
	for path := range exampleSecrets {
		if !slices.Contains(settingPaths(), path) {
			t.Errorf("exampleSecrets lists %s, which is not a setting", path)
		}
	}

	fs := pflag.NewFlagSet("outbox-relay", pflag.ContinueOnError)
	Bind(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "config" && !strings.Contains(text, "--"+f.Name) {
			t.Errorf("the example does not mention the flag --%s", f.Name)
		}
	})
}

func TestExampleDocumentsEveryDestinationField(t *testing.T) {
	t.Parallel()
	raw := readExample(t)
	active := parseYAML(t, raw)
	all := parseYAML(t, uncomment(raw))

	dests, _ := lookup(all, "destinations")
	byKind := map[string]string{} // a sink's kind → a destination of that kind
	for name, d := range dests.(map[string]any) {
		for _, kind := range sink.Kinds() {
			if _, ok := d.(map[string]any)[kind]; ok {
				byKind[kind] = name
			}
		}
	}
	if len(sink.Kinds()) < 2 {
		t.Fatalf("registered sinks %v: the binary's are missing", sink.Kinds())
	}
	for _, kind := range sink.Kinds() {
		name, ok := byKind[kind]
		if !ok {
			t.Errorf("the example has no %s destination", kind)
			continue
		}
		s, _ := sink.Lookup(kind)
		fields := fieldPaths(reflect.TypeOf(Destination{}), "")
		fields = append(fields, fieldPaths(reflect.TypeOf(s.New()).Elem(), kind+".")...)
		for _, field := range fields {
			if strings.HasPrefix(field, ",") {
				continue // the sinks' settings, listed after the rest
			}
			path := "destinations." + name + "." + field
			if _, ok := lookup(all, path); !ok {
				t.Errorf("%s is not shown in the example", path)
				continue
			}
			secret := slices.ContainsFunc(destinationSecrets, func(p string) bool { return strings.HasPrefix(field, p) })
			if _, set := lookup(active, path); !set && !secret {
				t.Errorf("%s is only commented out in the example", path)
			}
		}
	}

	routes, _ := lookup(active, "routes")
	shown := map[string]bool{}
	for _, r := range routes.([]any) {
		for k := range r.(map[string]any) {
			shown[k] = true
		}
	}
	for _, field := range fieldPaths(reflect.TypeOf(Route{}), "") {
		if !shown[field] {
			t.Errorf("no route of the example shows %s", field)
		}
	}
}

// TestExampleLoads loads the example as run would, with only the database
// URL from the environment, and checks that it sets every setting to its
// default: the example documents the defaults.
func TestExampleLoads(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("outbox-relay", pflag.ContinueOnError)
	flags := Bind(fs)
	if err := fs.Parse([]string{"--config", examplePath}); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(flags, []string{"OUTBOX_DATABASE_URL=postgres://relay@db/app"}, NeedDatabase|NeedDestinations)
	if err != nil {
		t.Fatalf("the example does not load for run: %v", err)
	}

	active := parseYAML(t, readExample(t))
	got, want := cfg.values(), defaultSettings()
	for _, path := range settingPaths() {
		if _, set := lookup(active, path); !set {
			continue // a secret, checked by TestExampleDocumentsEverySetting
		}
		reason, differs := exampleDiffers[path]
		same := reflect.DeepEqual(got[path], want[path])
		switch {
		case differs && same:
			t.Errorf("%s is listed as differing from the default (%s) but is %v, the default", path, reason, got[path])
		case !differs && !same:
			t.Errorf("%s is %#v in the example, but its default is %#v", path, got[path], want[path])
		}
	}
	for path := range exampleDiffers {
		if _, ok := want[path]; !ok {
			t.Errorf("exampleDiffers lists %s, which is not a setting", path)
		}
	}

	dests, routes := cfg.DestinationList()
	var names []string
	for _, d := range dests {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"kafka", "activity", "analytics", "analytics-gcp", "events-stream", "fulfilment", "notifications", "orders-hook", "payments-queue"}) || len(routes) != 9 {
		t.Fatalf("destinations %v and %d routes, want kafka, activity, analytics, analytics-gcp, events-stream, fulfilment, notifications, orders-hook and payments-queue and 9 routes", names, len(routes))
	}
	// The destinations show their defaults too.
	k, h := cfg.Destinations["analytics"], cfg.Destinations["orders-hook"]
	_, ks := k.Sink()
	_, hs := h.Sink()
	kafkaSettings, httpSettings := ks.(*kafka.Settings), hs.(*webhook.Settings)
	section := cfg.Section("kafka").(*kafka.Settings)
	for name, c := range map[string]struct{ got, want any }{
		"analytics.kafka.client_id":                {kafkaSettings.ClientID, section.ClientID},
		"analytics.kafka.dial_timeout":             {kafkaSettings.DialTimeout, section.DialTimeout},
		"analytics.max_in_flight":                  {k.MaxInFlight, 0},
		"analytics.breaker.failures":               {k.Breaker.Failures, relay.DefaultBreakerFailures},
		"analytics.breaker.successes":              {k.Breaker.Successes, relay.DefaultBreakerSuccesses},
		"analytics.breaker.failing_rows":           {k.Breaker.FailingRows, relay.DefaultBreakerFailingRows},
		"analytics.breaker.failing_for":            {k.Breaker.FailingFor, relay.DefaultBreakerFailingFor},
		"analytics.retry_budget.ratio":             {k.RetryBudget.Ratio, relay.DefaultRetryBudgetRatio},
		"analytics.retry_budget.min_per_second":    {k.RetryBudget.MinPerSecond, relay.DefaultRetryBudgetMinRate},
		"orders-hook.max_in_flight":                {h.MaxInFlight, webhook.DefaultMaxInFlight},
		"orders-hook.breaker.failures":             {h.Breaker.Failures, relay.DefaultBreakerFailures},
		"orders-hook.breaker.successes":            {h.Breaker.Successes, relay.DefaultBreakerSuccesses},
		"orders-hook.breaker.failing_rows":         {h.Breaker.FailingRows, relay.DefaultBreakerFailingRows},
		"orders-hook.breaker.failing_for":          {h.Breaker.FailingFor, relay.DefaultBreakerFailingFor},
		"orders-hook.retry_budget.ratio":           {h.RetryBudget.Ratio, relay.DefaultRetryBudgetRatio},
		"orders-hook.retry_budget.min_per_second":  {h.RetryBudget.MinPerSecond, relay.DefaultRetryBudgetMinRate},
		"orders-hook.http.content_type":            {httpSettings.ContentType, webhook.DefaultContentType},
		"orders-hook.http.connect_timeout":         {httpSettings.ConnectTimeout, webhook.DefaultConnectTimeout},
		"orders-hook.http.tls_handshake_timeout":   {httpSettings.TLSHandshakeTimeout, webhook.DefaultTLSHandshakeTimeout},
		"orders-hook.http.response_header_timeout": {httpSettings.ResponseHeaderTimeout, webhook.DefaultResponseHeaderTimeout},
		"orders-hook.http.timeout":                 {httpSettings.Timeout, webhook.DefaultTimeout},
		"orders-hook.http.max_response_bytes":      {httpSettings.MaxResponseBytes, webhook.DefaultMaxResponseBytes},
		"orders-hook.http.concurrency":             {httpSettings.Concurrency, webhook.DefaultConcurrency},
		"orders-hook.http.allow_private_networks":  {httpSettings.AllowPrivateNetworks, false},
		"orders-hook.visibility_timeout (inline)":  {h.VisibilityTimeout, time.Duration(0)},
		"orders-hook.on_dead_letter (the relay's)": {h.OnDeadLetter, ""},
		"analytics.on_dead_letter (the relay's)":   {k.OnDeadLetter, ""},
		"analytics.visibility_timeout (inline)":    {k.VisibilityTimeout, time.Duration(0)},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("destinations.%s is %#v in the example, but its default is %#v", name, c.got, c.want)
		}
	}
}

// TestReferenceDocumentsEverySetting checks the configuration reference:
// a row per setting with its variable, every flag, and no variable that
// names no setting.
func TestReferenceDocumentsEverySetting(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	lines := strings.Split(doc, "\n")
	known := map[string]bool{"OUTBOX_CONFIG": true}
	for _, path := range settingPaths() {
		setting, env := "`"+path+"`", "`"+EnvName(path)+"`"
		known[EnvName(path)] = true
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, setting) && strings.Contains(l, env) }) {
			t.Errorf("%s has no line with %s and %s", referencePath, setting, env)
		}
	}
	for _, v := range regexp.MustCompile("`(OUTBOX_[A-Z0-9_]+)`").FindAllStringSubmatch(doc, -1) {
		if !known[v[1]] {
			t.Errorf("%s documents %s, which sets nothing", referencePath, v[1])
		}
	}
	fs := pflag.NewFlagSet("outbox-relay", pflag.ContinueOnError)
	Bind(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(doc, "`--"+f.Name) {
			t.Errorf("%s does not mention the flag --%s", referencePath, f.Name)
		}
	})
	for _, want := range []string{"`OUTBOX_CONFIG`", "deploy/relay.example.yaml", "Destinations and routing"} {
		if !strings.Contains(doc, want) {
			t.Errorf("%s does not mention %s", referencePath, want)
		}
	}
}

// Every setting's variable names it alone.
func TestEnvNamesAreDistinct(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for _, path := range settingPaths() {
		name := EnvName(path)
		if other, ok := seen[name]; ok {
			t.Errorf("%s and %s share the variable %s", path, other, name)
		}
		seen[name] = path
	}
}

// Every exported field of the configuration is a setting by its tag, a
// squashed type of a library's (its settings are its parent's), or marked
// "-": an untagged field would take a key of its own Go name from YAML.
func TestEverySettingFieldIsTagged(t *testing.T) {
	t.Parallel()
	seen := map[reflect.Type]bool{}
	var walk func(t2 reflect.Type, at string)
	walk = func(ty reflect.Type, at string) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice || ty.Kind() == reflect.Map {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.Struct || ty == reflect.TypeOf(time.Time{}) || seen[ty] {
			return
		}
		seen[ty] = true
		for i := range ty.NumField() {
			f := ty.Field(i)
			if !f.IsExported() {
				continue
			}
			tag := f.Tag.Get("koanf")
			if tag == "" {
				t.Errorf("%s.%s has no koanf tag", at, f.Name)
				continue
			}
			if tag != "-" {
				walk(f.Type, at+"."+f.Name)
			}
		}
	}
	walk(reflect.TypeOf(Config{}), "Config")
	if paths := settingPaths(); !slices.Contains(paths, "retry.max_attempts") || !slices.Contains(paths, "retry.pause_base") {
		t.Errorf("the retry section's settings are not walked: %v", paths)
	}
}
