package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/kafka"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
)

const secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func TestLoadDestinationsAndRoutes(t *testing.T) {
	t.Parallel()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, `
kafka:
  brokers: [k1:9092]
destinations:
  analytics:
    kafka:
      brokers: [a1:9092, a2:9092]
  billing:
    on_dead_letter: block
    breaker: {failures: 3}
    http:
      url: https://billing.example.com/hooks
      timeout: 5s
      auth: {bearer_token_file: `+token+`}
      signing: {secrets_env: BILLING_SECRETS}
      status_classes: {"409": transient}
routes:
  - topics: ["billing.*"]
    destination: billing
  - topics: ["clicks", "views"]
    destination: analytics
    topic: events
  - topics: ["*"]
    destination: kafka
`)
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "OUTBOX_DATABASE_URL=postgres://db/app",
		"BILLING_SECRETS=" + secretA}, config.NeedDatabase|config.NeedDestinations)
	if err != nil {
		t.Fatal(err)
	}
	dests, routes := cfg.DestinationList()
	var names []string
	for _, d := range dests {
		names = append(names, d.Name)
	}
	if strings.Join(names, ",") != "kafka,analytics,billing" {
		t.Fatalf("destinations %v", names)
	}
	if len(routes) != 3 || routes[1].Topic != "events" || routes[1].Destination != "analytics" {
		t.Fatalf("routes %+v", routes)
	}
	an, ok := dests[1].Settings.(*kafka.Settings)
	if !ok || dests[1].Sink.Kind != "kafka" || len(an.Brokers) != 2 || an.ClientID != "outbox-relay" || an.DialTimeout != 5*time.Second {
		t.Fatalf("analytics = %+v", dests[1])
	}
	b := dests[2]
	if b.Relay.OnDeadLetter != "block" || b.Relay.Breaker.Failures != 3 || b.Relay.MaxInFlight != webhook.DefaultMaxInFlight {
		t.Fatalf("billing relay settings %+v", b.Relay)
	}
	hs, ok := b.Settings.(*webhook.Settings)
	if !ok || hs.Timeout != 5*time.Second || hs.StatusClasses["409"] != "transient" {
		t.Fatalf("billing = %+v", b)
	}
	wc, err := hs.Config("billing")
	if err != nil {
		t.Fatal(err)
	}
	if wc.BearerToken != "s3cret-token" || len(wc.SigningSecrets) != 1 || wc.SigningSecrets[0] != secretA ||
		wc.Timeout != 5*time.Second || wc.StatusClasses[409] != sink.ClassTransient {
		t.Fatalf("webhook config %+v", wc)
	}
}

func TestLoadWithoutRoutesSendsEverythingToKafka(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(nil, []string{"OUTBOX_DATABASE_URL=postgres://db/app", "OUTBOX_KAFKA_BROKERS=k1:9092,k2:9092"},
		config.NeedDatabase|config.NeedDestinations)
	if err != nil {
		t.Fatal(err)
	}
	dests, routes := cfg.DestinationList()
	if len(dests) != 1 || dests[0].Name != "kafka" || len(routes) != 1 || routes[0].Topics[0] != "*" {
		t.Fatalf("destinations %+v, routes %+v", dests, routes)
	}
}

// destinations.kafka gives the kafka section's destination the relay
// settings every other destination has.
func TestKafkaSectionTakesDestinationSettings(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
kafka:
  brokers: [k:9092]
destinations:
  kafka:
    max_in_flight: 2000
    on_dead_letter: block
    breaker: {failures: 7}
    retry_budget: {ratio: 0.5}
    rate_limit: {rows_per_second: 250.5, burst: 40}
    visibility_timeout: 1m
`)
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "OUTBOX_DATABASE_URL=postgres://db/app"}, config.NeedDatabase|config.NeedDestinations)
	if err != nil {
		t.Fatal(err)
	}
	dests, routes := cfg.DestinationList()
	if len(dests) != 1 || len(routes) != 1 || routes[0].Destination != "kafka" {
		t.Fatalf("destinations %+v, routes %+v", dests, routes)
	}
	d := dests[0].Relay
	if dests[0].Name != "kafka" || dests[0].Sink.Kind != "kafka" || d.Name != "kafka" || d.MaxInFlight != 2000 || d.OnDeadLetter != "block" ||
		d.Breaker.Failures != 7 || d.RetryBudget.Ratio != 0.5 || d.RateLimit != (relay.RateLimitConfig{PerSecond: 250.5, Burst: 40}) ||
		d.VisibilityTimeout != time.Minute {
		t.Fatalf("kafka destination %+v", d)
	}
}

func TestLoadReportsEveryDestinationProblem(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
destinations:
  kafka:
    kafka: {brokers: [x:1]}
  Bad_Name:
    http: {url: "https://x.example"}
  both:
    kafka: {brokers: [x:1]}
    http: {url: "https://x.example"}
  hooks:
    on_dead_letter: park
    http:
      url: "ftp://files.example/up"
      headers: {"Idempotency-Key": "x"}
      auth: {bearer_token_env: MISSING_TOKEN, username: u}
      signing: {secrets_env: HOOK_SECRETS}
      status_classes: {"409": retryable, "abc": transient}
  analytics:
    kafka: {brokers: [a:9092]}
  unused:
    kafka: {brokers: [nohost]}
    visibility_timeout: 500ms
    max_in_flight: -1
    breaker: {failures: -2, failing_for: -1s}
    retry_budget: {ratio: -0.5}
    rate_limit: {rows_per_second: -1, burst: -2}
  quota:
    http: {url: "https://x.example"}
    rate_limit: {burst: 5}
routes:
  - topics: ["[x"]
    destination: nowhere
  - topics: ["a.*"]
    destination: hooks
    topic: renamed
  - topics: ["b"]
    destination: Bad_Name
  - topics: ["c"]
    destination: both
  - topics: ["d"]
    destination: kafka
    topic: "orders placed"
  - topics: ["e"]
    destination: analytics
    topic: ".."
`)
	_, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "OUTBOX_DATABASE_URL=postgres://db/app", "HOOK_SECRETS=not-a-secret"},
		config.NeedDatabase|config.NeedDestinations)
	if err == nil {
		t.Fatal("loaded")
	}
	msg := err.Error()
	for _, want := range []string{
		"destinations.kafka holds the relay settings of the kafka section's destination (max_in_flight, breaker, rate_limit, …), not a sink",
		"destinations.kafka sets the kafka section's destination, which needs kafka.brokers",
		"destinations.Bad_Name: a destination name is lowercase",
		"destinations.both needs exactly one of http, kafka, nats, pubsub, rabbitmq, redis, sns or sqs",
		`destinations.hooks.on_dead_letter is "park"`,
		`destinations.hooks.http.url "ftp://files.example/up" must be http or https`,
		`header "Idempotency-Key" is set by the relay`,
		"destinations.hooks.http.auth.bearer_token_env: environment variable MISSING_TOKEN is not set",
		"basic auth needs both username and password",
		"signing secret 1: must start with whsec_",
		`status_classes: 409 is "retryable"`,
		`status_classes: "abc" is not a status code`,
		"destinations.unused is not used by any route",
		`destinations.unused.kafka.brokers: "nohost" is not host:port`,
		"destinations.unused.visibility_timeout is 500ms; use 0 (deliver inside the claim) or at least 1s",
		"destinations.unused.max_in_flight is -1; it must not be negative",
		"destinations.unused.breaker.failures is -2; it must not be negative",
		"destinations.unused.breaker.failing_for is -1s; it must not be negative",
		"destinations.unused.retry_budget.ratio is -0.5; it must not be negative",
		"destinations.unused.rate_limit.rows_per_second is -1; it must not be negative (0 is unlimited)",
		"destinations.unused.rate_limit.burst is -2; it must not be negative",
		"destinations.quota.rate_limit.burst is 5 without rate_limit.rows_per_second",
		`routes: route 1: topic pattern "[x" is not a valid glob`,
		`routes: route 1: destination "nowhere" is not defined`,
		"routes: route 2: topic is only for kafka, nats, pubsub, rabbitmq, redis, sns or sqs destinations",
		`routes: route 5: kafka: topic name "orders placed" has an illegal character at byte 6`,
		`routes: route 6: kafka: ".." is not a legal topic name`, // a named Kafka destination
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "not-a-secret") {
		t.Errorf("a secret appears in the error:\n%s", msg)
	}
}

// Kafka's SASL password comes from a variable or a file, as every
// destination's secrets do; the password written as it is still works,
// and is named among the deprecated settings the relay logs at start.
func TestKafkaPasswordFromAVariableAndTheDeprecatedInlineOne(t *testing.T) {
	t.Parallel()
	path := writeFile(t, `
kafka:
  brokers: [k:9092]
  sasl: {mechanism: plain, username: relay, password_env: KAFKA_PW}
destinations:
  analytics:
    kafka:
      brokers: [a:9092]
      sasl: {mechanism: plain, username: relay, password: inline-pass}
routes:
  - topics: ["a.*"]
    destination: analytics
  - topics: ["*"]
    destination: kafka
`)
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path, "KAFKA_PW=from-env"}, config.NeedDestinations)
	if err != nil {
		t.Fatal(err)
	}
	dests, _ := cfg.DestinationList()
	for _, d := range dests {
		want := map[string]string{"kafka": "from-env", "analytics": "inline-pass"}[d.Name]
		if got := d.Settings.(*kafka.Settings).SASL.Password; got != want {
			t.Errorf("%s: password %q, want %q", d.Name, got, want)
		}
	}
	got := cfg.Deprecations()
	if len(got) != 1 || !strings.HasPrefix(got[0], "destinations.analytics.kafka.sasl.password: ") || !strings.Contains(got[0], "sasl.password_env") {
		t.Errorf("deprecations %q, want the analytics destination's inline password alone", got)
	}
	if _, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDestinations); err == nil || !strings.Contains(err.Error(), "KAFKA_PW is not set") {
		t.Errorf("password_env naming a variable that is not set: %v", err)
	}
}

// Each sink reads its own settings and secrets; a key that no sink
// registered is an unknown setting, and forever is refused where it would
// mean a timeout that never ends.
func TestSinkSettings(t *testing.T) {
	t.Parallel()
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte("kafka-pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, `
kafka:
  client_id: shop
  brokers: [k:9092]
destinations:
  analytics:
    kafka:
      brokers: [a:9092]
      sasl: {mechanism: scram-sha-512, username: relay, password_file: `+pwFile+`}
routes:
  - topics: ["*"]
    destination: analytics
`)
	cfg, err := config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDestinations)
	if err != nil {
		t.Fatal(err)
	}
	dests, _ := cfg.DestinationList()
	k := dests[0].Settings.(*kafka.Settings)
	if dests[0].Name != "analytics" || k.SASL.Password != "kafka-pass" || k.ClientID != "shop" || k.DialTimeout != kafka.DefaultDialTimeout {
		t.Fatalf("analytics = %+v", k)
	}

	path = writeFile(t, `
destinations:
  mail:
    smtp: {host: mail.example}
  hook:
    http: {url: "https://h.example", timeout: forever}
    breaker: {failing_for: forever}
    sasl: {}
routes:
  - topics: ["*"]
    destination: hook
  - topics: ["m"]
    destination: mail
`)
	_, err = config.Load(nil, []string{"OUTBOX_CONFIG=" + path}, config.NeedDestinations)
	for _, want := range []string{
		"unknown setting destinations.mail.smtp",
		"destinations.mail needs exactly one of http, kafka, nats, pubsub, rabbitmq, redis, sns or sqs",
		"unknown setting destinations.hook.sasl",
		"destinations.hook.http.timeout cannot be forever",
		"destinations.hook.breaker.failing_for cannot be forever",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}
