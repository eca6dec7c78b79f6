package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/logsource"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	_ "github.com/outbox-relay/outbox-relay/relay/sink/builtin" // the deployed configuration names kafka and http destinations
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// deployDir holds the deployment artifacts. They are checked against what
// the relay really exposes and accepts: an alert or a panel on a misspelt
// metric or label is silently empty, and a manifest that points the relay
// at a file it does not mount fails only in production.
const deployDir = "../deploy"

// targetLabels are attached by the scraper, not by the relay.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// series maps every series name a query may select to its label names:
// counters and gauges by their name, histograms by _bucket (with le),
// _sum and _count, summaries by their name (with quantile), _sum and
// _count. A histogram's bare name selects nothing.
type series map[string][]string

// exposed builds every collector the relay registers, drives each so that
// every vector has a child, and returns what a scrape shows.
func exposed(t *testing.T) series {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.NewRelay(reg)
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	o := m.Outbox("default", []string{"kafka"})
	o.Claimed(3*time.Millisecond, 10)
	o.Settled("kafka", store.Sent, "", 250*time.Millisecond)
	o.Settled("kafka", store.Retried, "", 0)
	o.Settled("", store.Deferred, relay.DeferKeyWaiting, 0)
	o.Settled("kafka", store.Deferred, relay.DeferCircuitOpen, 0)
	o.Settled("kafka", store.DeadLettered, sink.ReasonPermanent, 0)
	o.Settled("", store.DeadLettered, sink.ReasonNoRoute, 0)
	o.Settled("kafka", store.Leased, "", 0)
	if errs := m.Publisher("kafka", nopPublisher{}).Publish(context.Background(), nil); len(errs) != 0 {
		t.Fatalf("Publish: %v", errs)
	}
	reg.MustRegister(
		metrics.NewDestinations(func() []relay.DestinationStatus {
			return []relay.DestinationStatus{{Name: "kafka", Breaker: relay.BreakerOpen, Paused: []relay.PauseStatus{
				{Topic: "orders-typo", Partition: -1, State: relay.BreakerOpen},
				{Topic: "orders", Partition: 3, State: relay.BreakerOpen},
			}}, {Name: "hooks", Breaker: relay.BreakerClosed}}
		}),
		metrics.NewFleet(func() (relay.FleetStatus, bool) { return relay.FleetStatus{Up: true, Replicas: 3, Syncs: 10}, true }),
		metrics.NewBuildInfo("v1.2.3", "0123abc", "2026-11-30T12:00:00Z"),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	// The outbox's own collectors carry its name, as the relay registers
	// them.
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "default"}, reg)
	labelled.MustRegister(metrics.NewBacklog(metrics.BacklogConfig{Backlog: fakeBacklog{}, DeadLetters: fakeDeadLetters{}, MaxAge: -1}))
	if _, err := metrics.NewOrderHoldWatch(labelled, nil, nil); err != nil {
		t.Fatalf("NewOrderHoldWatch: %v", err)
	}
	if _, err := metrics.NewHorizonWatch(labelled, nil, nil); err != nil {
		t.Fatalf("NewHorizonWatch: %v", err)
	}
	capture, err := metrics.NewCaptureWatch(labelled, fakeSlot{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("NewCaptureWatch: %v", err)
	}
	capture.Check(context.Background())
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	s := series{}
	for _, f := range families {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		names := slices.Sorted(maps.Keys(labels))
		name := f.GetName()
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			s[name+"_bucket"] = append(slices.Clone(names), "le")
			s[name+"_sum"] = names
			s[name+"_count"] = names
		case dto.MetricType_SUMMARY:
			s[name] = append(slices.Clone(names), "quantile")
			s[name+"_sum"] = names
			s[name+"_count"] = names
		default:
			s[name] = names
		}
	}
	// Guard against a registry that lost the relay's collectors: then every
	// outbox_ name would be reported unknown, which is right, but say why.
	for _, want := range []string{"outbox_delivered_total", "outbox_pending_rows", "outbox_circuit_state", "outbox_build_info", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := s[want]; !ok {
			t.Fatalf("the scrape lacks %s; got %v", want, slices.Sorted(maps.Keys(s)))
		}
	}
	return s
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []sink.Record) []error { return nil }

type fakeBacklog struct{}

func (fakeBacklog) Backlog(context.Context) ([]store.TopicBacklog, error) {
	return []store.TopicBacklog{{Topic: "orders.placed", Pending: 3, OldestAge: 2 * time.Second}}, nil
}

type fakeDeadLetters struct{}

func (fakeDeadLetters) Stats(context.Context) (*deadletter.Stats, error) {
	return &deadletter.Stats{DeadLettered: 1, ParkedKeys: 1, ByReason: map[string]int{sink.ReasonPermanent: 1}}, nil
}

// expr is a PromQL expression found in a file, with where it was.
type expr struct {
	file, where, query string
}

var (
	stringLit    = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	selector     = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}`)
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	rangeOrSub   = regexp.MustCompile(`\[[^\]]*\]`)
	grouping     = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	ourName      = regexp.MustCompile(`\b(?:outbox|go|process)_[a-zA-Z0-9_:]*`)
	labelName    = regexp.MustCompile(`[a-zA-Z_][a-zA-Z0-9_]*`)
)

// problems returns what is wrong with e's metric and label names: names
// with the relay's prefixes (outbox_, go_, process_) that a scrape does not
// show, label matchers on labels such a series does not have, and grouping
// labels that no series of the expression has.
func (s series) problems(e expr) []string {
	var out []string
	report := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("%s: %s: ", e.file, e.where)+fmt.Sprintf(format, args...))
	}
	q := stringLit.ReplaceAllString(e.query, `""`)
	// Selectors with their matchers, then the expression without matchers,
	// label lists and ranges, so that only metric names are left.
	selectors := selector.FindAllStringSubmatch(q, -1)
	q = selector.ReplaceAllString(q, "$1")
	groups := grouping.FindAllStringSubmatch(q, -1)
	q = rangeOrSub.ReplaceAllString(grouping.ReplaceAllString(q, ""), "")

	have := map[string]bool{}
	for _, l := range targetLabels {
		have[l] = true
	}
	for _, name := range ourName.FindAllString(q, -1) {
		labels, ok := s[name]
		if !ok {
			report("unknown metric %s in %q", name, e.query)
			continue
		}
		for _, l := range labels {
			have[l] = true
		}
	}
	for _, m := range selectors {
		labels, ok := s[m[1]]
		if !ok {
			continue // reported above, or not the relay's (up)
		}
		for _, lm := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			if l := lm[1]; !slices.Contains(labels, l) && !slices.Contains(targetLabels, l) && l != "__name__" {
				report("%s has no label %s (it has %v) in %q", m[1], l, labels, e.query)
			}
		}
	}
	for _, g := range groups {
		for _, l := range labelName.FindAllString(g[1], -1) {
			if !have[l] {
				report("no series of the expression has the label %s in %q", l, e.query)
			}
		}
	}
	return out
}

func TestCheckerRejectsUnknownNames(t *testing.T) {
	t.Parallel()
	s := series{
		"outbox_delivered_total":             {"destination"},
		"outbox_delivery_lag_seconds_bucket": {"destination", "le"},
		"outbox_pending_rows":                {"topic"},
	}
	for _, tc := range []struct {
		query string
		bad   int
	}{
		{`sum by (destination) (rate(outbox_delivered_total{job="outbox-relay"}[5m]))`, 0},
		{`histogram_quantile(0.99, sum by (le) (rate(outbox_delivery_lag_seconds_bucket[5m])))`, 0},
		{`max by (namespace, job, topic) (outbox_pending_rows{job=~"$job", topic!="x"})`, 0},
		{`count(up{job="outbox-relay", instance=~"outbox_bogus.*"} == 1)`, 0},
		{`sum(rate(outbox_delivered_totl[5m]))`, 1},
		{`rate(outbox_delivery_lag_seconds[5m])`, 1}, // a histogram's bare name
		{`rate(go_bogus_total[5m]) + process_bogus`, 2},
		{`outbox_pending_rows{destination="kafka"}`, 1},
		{`max by (destination) (outbox_pending_rows)`, 1},
	} {
		got := s.problems(expr{file: "f", where: "w", query: tc.query})
		if len(got) != tc.bad {
			t.Errorf("%s: %d problems, want %d: %q", tc.query, len(got), tc.bad, got)
		}
	}
}

// ruleGroups is the groups list of a Prometheus rules file.
type ruleGroups struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// decodeStrict decodes the YAML document of file into out, refusing
// fields out does not know.
func decodeStrict(t *testing.T, file string, out any) {
	t.Helper()
	f, err := os.Open(filepath.Join(deployDir, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// readYAML decodes every document of file.
func readYAML(t *testing.T, file string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, file))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	var docs []map[string]any
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return docs
			}
			t.Fatalf("%s: %v", file, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
}

// ruleExprs checks a rules file's rules and returns their expressions.
func ruleExprs(t *testing.T, file string, rg ruleGroups) []expr {
	t.Helper()
	var out []expr
	alerts := map[string]bool{}
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: rule %q has no expr", file, name)
			}
			out = append(out, expr{file: file, where: "rule " + name, query: r.Expr})
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: alert %s: for: %v", file, r.Alert, err)
				}
			}
			if sev := r.Labels["severity"]; sev != "warning" && sev != "critical" {
				t.Errorf("%s: alert %s: severity %q, want warning or critical", file, r.Alert, sev)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: alert %s has no %s annotation", file, r.Alert, a)
				}
			}
			if !strings.Contains(r.Expr, `job="outbox-relay"`) {
				t.Errorf("%s: alert %s does not select job=\"outbox-relay\": %s", file, r.Alert, r.Expr)
			}
		}
	}
	if len(alerts) < 4 {
		t.Errorf("%s: %d alerts, want at least 4", file, len(alerts))
	}
	for _, want := range []string{"OutboxDeadLettersGrowing", "OutboxDestinationPaused", "OutboxRelayDown"} {
		if !alerts[want] {
			t.Errorf("%s: no alert %s", file, want)
		}
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(alerts)), func(a string) bool { return strings.HasPrefix(a, "OutboxBacklogAge") }) {
		t.Errorf("%s: no OutboxBacklogAge* alert", file)
	}
	return out
}

// dashboardExprs returns the queries of every panel target and of the
// templating variables of the Grafana dashboard.
func dashboardExprs(t *testing.T, file string) []expr {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, file))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if v, _ := d["schemaVersion"].(float64); v < 36 {
		t.Errorf("%s: schemaVersion %v, want at least 36", file, d["schemaVersion"])
	}
	var out []expr
	var walk func(v any, where string)
	walk = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = fmt.Sprintf("panel %q", title)
			}
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					out = append(out, expr{file: file, where: where, query: s})
					if ds, _ := v["datasource"].(map[string]any); ds != nil && ds["uid"] != "${datasource}" {
						t.Errorf("%s: %s: a target's datasource is %v, want the ${datasource} variable", file, where, ds["uid"])
					}
					continue
				}
				walk(x, where)
			}
		case []any:
			for _, x := range v {
				walk(x, where)
			}
		}
	}
	walk(d["panels"], "")
	hasDatasource := false
	if tmpl, _ := d["templating"].(map[string]any); tmpl != nil {
		list, _ := tmpl["list"].([]any)
		for _, x := range list {
			v, _ := x.(map[string]any)
			if v["type"] == "datasource" && v["query"] == "prometheus" {
				hasDatasource = true
			}
			if v["type"] != "query" {
				continue
			}
			q, _ := v["query"].(string)
			if m, ok := v["query"].(map[string]any); ok {
				q, _ = m["query"].(string)
			}
			out = append(out, expr{file: file, where: fmt.Sprintf("variable %v", v["name"]), query: q})
		}
	}
	if !hasDatasource {
		t.Errorf("%s: no Prometheus datasource variable", file)
	}
	return out
}

func TestDeployNamesRealMetrics(t *testing.T) {
	t.Parallel()
	s := exposed(t)

	var rules ruleGroups
	decodeStrict(t, "prometheus/alerts.yaml", &rules)
	var exprs []expr
	exprs = append(exprs, ruleExprs(t, "prometheus/alerts.yaml", rules)...)

	var pr struct {
		APIVersion string         `yaml:"apiVersion"`
		Kind       string         `yaml:"kind"`
		Metadata   map[string]any `yaml:"metadata"`
		Spec       ruleGroups     `yaml:"spec"`
	}
	decodeStrict(t, "kubernetes/prometheusrule.yaml", &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Errorf("kubernetes/prometheusrule.yaml: %s %s, want monitoring.coreos.com/v1 PrometheusRule", pr.APIVersion, pr.Kind)
	}
	exprs = append(exprs, ruleExprs(t, "kubernetes/prometheusrule.yaml", pr.Spec)...)

	dash := dashboardExprs(t, "grafana/outbox-relay.json")
	if len(dash) < 10 {
		t.Errorf("grafana/outbox-relay.json: %d queries, want at least 10", len(dash))
	}
	exprs = append(exprs, dash...)

	for _, e := range exprs {
		for _, p := range s.problems(e) {
			t.Error(p)
		}
	}

	// Every metric of the relay is on the dashboard, so a new one is not
	// forgotten there.
	used := map[string]bool{}
	for _, e := range dash {
		for _, n := range ourName.FindAllString(e.query, -1) {
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
		}
	}
	for name := range s {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(name, "outbox_") && !used[base] {
			t.Errorf("grafana/outbox-relay.json: no panel shows %s", name)
		}
	}
}

func TestPrometheusRuleMatchesAlertsFile(t *testing.T) {
	t.Parallel()
	alerts := readYAML(t, "prometheus/alerts.yaml")
	rule := readYAML(t, "kubernetes/prometheusrule.yaml")
	if len(alerts) != 1 || len(rule) != 1 {
		t.Fatalf("want one document in each file, got %d and %d", len(alerts), len(rule))
	}
	spec, _ := rule[0]["spec"].(map[string]any)
	if !reflect.DeepEqual(spec["groups"], alerts[0]["groups"]) || alerts[0]["groups"] == nil {
		t.Error("kubernetes/prometheusrule.yaml: spec.groups differ from the groups of prometheus/alerts.yaml; copy them over")
	}
}

// loadConfig loads a relay configuration from env as outbox-relay run
// would. Secrets env does not set are made up, and override the files the
// configuration names, which exist only in a pod.
func loadConfig(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	all := map[string]string{
		"OUTBOX_DATABASE_URL": "postgres://relay:secret@localhost:5432/app",
		"OUTBOX_ADMIN_TOKEN":  "0123456789abcdef0123",
	}
	maps.Copy(all, env)
	var environ []string
	for k, v := range all {
		environ = append(environ, k+"="+v)
	}
	cfg, err := config.Load(nil, environ, config.NeedDatabase|config.NeedDestinations)
	if err != nil {
		t.Fatalf("the relay rejects the configuration: %v", err)
	}
	return cfg
}

// composeDefault resolves ${VAR:-default} to its default.
var composeDefault = regexp.MustCompile(`\$\{[A-Z_]+:-([^}]*)\}`)

func TestComposeFile(t *testing.T) {
	t.Parallel()
	type service struct {
		Image     string         `yaml:"image"`
		Build     map[string]any `yaml:"build"`
		Command   []string       `yaml:"command"`
		Restart   string         `yaml:"restart"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Environment     map[string]string `yaml:"environment"`
		Ports           []string          `yaml:"ports"`
		Healthcheck     map[string]any    `yaml:"healthcheck"`
		StopGracePeriod string            `yaml:"stop_grace_period"`
	}
	var compose struct {
		Services map[string]service `yaml:"services"`
	}
	b, err := os.ReadFile(filepath.Join(deployDir, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, name := range []string{"postgres", "kafka"} {
		if compose.Services[name].Healthcheck == nil {
			t.Errorf("docker-compose.yml: %s has no healthcheck", name)
		}
	}
	for _, name := range []string{"migrate", "relay"} {
		svc := compose.Services[name]
		ctx, _ := svc.Build["context"].(string)
		df, _ := svc.Build["dockerfile"].(string)
		if _, err := os.Stat(filepath.Join(deployDir, ctx, df)); err != nil || ctx != ".." {
			t.Errorf("docker-compose.yml: %s builds %q in %q; want deploy/Dockerfile in the repository root (%v)", name, df, ctx, err)
		}
	}
	migrate := compose.Services["migrate"]
	if !slices.Equal(migrate.Command, []string{"migrate", "up"}) || migrate.Restart != "no" {
		t.Errorf("docker-compose.yml: migrate runs %q with restart %q, want [migrate up] and no", migrate.Command, migrate.Restart)
	}
	if c := migrate.DependsOn["postgres"].Condition; c != "service_healthy" {
		t.Errorf("docker-compose.yml: migrate waits for postgres %q, want service_healthy", c)
	}
	r := compose.Services["relay"]
	if !slices.Equal(r.Command, []string{"run"}) {
		t.Errorf("docker-compose.yml: relay runs %q, want [run]", r.Command)
	}
	for dep, want := range map[string]string{"migrate": "service_completed_successfully", "kafka": "service_healthy"} {
		if c := r.DependsOn[dep].Condition; c != want {
			t.Errorf("docker-compose.yml: relay waits for %s %q, want %s", dep, c, want)
		}
	}
	env := map[string]string{}
	for k, v := range r.Environment {
		env[k] = composeDefault.ReplaceAllString(v, "$1")
	}
	for k, want := range map[string]string{"OUTBOX_KAFKA_BROKERS": "kafka:9092", "OUTBOX_LOG_FORMAT": "json"} {
		if env[k] != want {
			t.Errorf("docker-compose.yml: relay has %s=%q, want %q", k, env[k], want)
		}
	}
	if !strings.HasPrefix(env["OUTBOX_DATABASE_URL"], "postgres://") || !strings.Contains(env["OUTBOX_DATABASE_URL"], "@postgres:5432/") {
		t.Errorf("docker-compose.yml: relay has OUTBOX_DATABASE_URL=%q, want the postgres service", env["OUTBOX_DATABASE_URL"])
	}
	if env["OUTBOX_DATABASE_URL"] != composeDefault.ReplaceAllString(migrate.Environment["OUTBOX_DATABASE_URL"], "$1") {
		t.Error("docker-compose.yml: migrate and relay use different database URLs")
	}
	if !slices.ContainsFunc(r.Ports, func(p string) bool { return strings.HasSuffix(p, ":9780") }) {
		t.Errorf("docker-compose.yml: relay publishes %q, want the admin port 9780", r.Ports)
	}
	cfg := loadConfig(t, env)
	grace, err := time.ParseDuration(r.StopGracePeriod)
	if err != nil || grace < cfg.Relay.DrainTimeout+5*time.Second {
		t.Errorf("docker-compose.yml: relay stop_grace_period %q, want at least relay.drain_timeout (%s) + 5s", r.StopGracePeriod, cfg.Relay.DrainTimeout)
	}
}

// Kubernetes objects, as far as the checks need them.
type (
	object struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
	}
	podTemplate struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec podSpec `yaml:"spec"`
	}
	podSpec struct {
		RestartPolicy                 string          `yaml:"restartPolicy"`
		TerminationGracePeriodSeconds *int            `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               securityContext `yaml:"securityContext"`
		Containers                    []container     `yaml:"containers"`
		Volumes                       []volume        `yaml:"volumes"`
	}
	securityContext struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	}
	container struct {
		Name    string   `yaml:"name"`
		Image   string   `yaml:"image"`
		Command []string `yaml:"command"`
		Args    []string `yaml:"args"`
		Env     []struct {
			Name  string `yaml:"name"`
			Value string `yaml:"value"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		Resources struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		LivenessProbe   *probe          `yaml:"livenessProbe"`
		ReadinessProbe  *probe          `yaml:"readinessProbe"`
		SecurityContext securityContext `yaml:"securityContext"`
		VolumeMounts    []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	}
	probe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port any    `yaml:"port"`
		} `yaml:"httpGet"`
	}
	keyItems struct {
		Name  string `yaml:"name"`
		Items []struct {
			Key  string `yaml:"key"`
			Path string `yaml:"path"`
		} `yaml:"items"`
	}
	volume struct {
		Name      string    `yaml:"name"`
		ConfigMap *keyItems `yaml:"configMap"`
		Secret    *struct {
			SecretName string `yaml:"secretName"`
			Items      []struct {
				Key  string `yaml:"key"`
				Path string `yaml:"path"`
			} `yaml:"items"`
		} `yaml:"secret"`
		Projected *struct {
			Sources []struct {
				ConfigMap *keyItems `yaml:"configMap"`
				Secret    *keyItems `yaml:"secret"`
			} `yaml:"sources"`
		} `yaml:"projected"`
	}
)

// files maps each file path the container sees from a ConfigMap or Secret
// to "configmap/NAME/KEY" or "secret/NAME/KEY". Volumes without items are
// not handled: the manifests name their keys.
func (p podSpec) files(c container) map[string]string {
	out := map[string]string{}
	for _, m := range c.VolumeMounts {
		for _, v := range p.Volumes {
			if v.Name != m.Name {
				continue
			}
			add := func(kind string, src *keyItems) {
				for _, it := range src.Items {
					out[filepath.Join(m.MountPath, it.Path)] = kind + "/" + src.Name + "/" + it.Key
				}
			}
			if v.ConfigMap != nil {
				add("configmap", v.ConfigMap)
			}
			if v.Secret != nil {
				for _, it := range v.Secret.Items {
					out[filepath.Join(m.MountPath, it.Path)] = "secret/" + v.Secret.SecretName + "/" + it.Key
				}
			}
			if v.Projected != nil {
				for _, s := range v.Projected.Sources {
					if s.ConfigMap != nil {
						add("configmap", s.ConfigMap)
					}
					if s.Secret != nil {
						add("secret", s.Secret)
					}
				}
			}
		}
	}
	return out
}

func (c container) env(name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// manifests decodes every resource listed in kustomization.yaml, checking
// that it lists exactly the manifests of the directory.
func manifests(t *testing.T) map[string][]byte {
	t.Helper()
	var k struct {
		Resources []string `yaml:"resources"`
	}
	decodeFile(t, "kubernetes/kustomization.yaml", &k)
	files, err := filepath.Glob(filepath.Join(deployDir, "kubernetes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var inDir []string
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" {
			inDir = append(inDir, base)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(k.Resources)), inDir) {
		t.Errorf("kubernetes/kustomization.yaml lists %v; the directory holds %v", k.Resources, inDir)
	}
	byKind := map[string][]byte{}
	for _, r := range k.Resources {
		for _, doc := range readYAML(t, "kubernetes/"+r) {
			b, err := yaml.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			var o object
			if err := yaml.Unmarshal(b, &o); err != nil {
				t.Fatalf("kubernetes/%s: %v", r, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("kubernetes/%s: a document lacks apiVersion, kind or metadata.name", r)
			}
			if byKind[o.Kind] != nil {
				t.Errorf("kubernetes/%s: a second %s", r, o.Kind)
			}
			byKind[o.Kind] = b
		}
	}
	return byKind
}

// decodeFile decodes the YAML document of file into out, ignoring fields
// out does not name.
func decodeFile(t *testing.T, file string, out any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// unmarshal decodes the object of kind into out.
func unmarshal(t *testing.T, kinds map[string][]byte, kind string, out any) {
	t.Helper()
	b := kinds[kind]
	if b == nil {
		t.Fatalf("deploy/kubernetes has no %s", kind)
	}
	if err := yaml.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v", kind, err)
	}
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	kinds := manifests(t)

	var secret struct {
		object     `yaml:",inline"`
		StringData map[string]string `yaml:"stringData"`
		Data       map[string]string `yaml:"data"`
	}
	unmarshal(t, kinds, "Secret", &secret)
	secretKey := func(ref string) bool {
		name, key, _ := strings.Cut(strings.TrimPrefix(ref, "secret/"), "/")
		_, inString := secret.StringData[key]
		_, inData := secret.Data[key]
		return strings.HasPrefix(ref, "secret/") && name == secret.Metadata.Name && (inString || inData)
	}

	var cm struct {
		object `yaml:",inline"`
		Data   map[string]string `yaml:"data"`
	}
	unmarshal(t, kinds, "ConfigMap", &cm)
	relayYAML := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(relayYAML, []byte(cm.Data["relay.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig(t, map[string]string{config.EnvConfigFile: relayYAML})
	if cfg.Database.URLFile == "" || cfg.Admin.TokenFile == "" {
		t.Errorf("configmap.yaml: relay.yaml should read the database URL and admin token from files, got %q and %q", cfg.Database.URLFile, cfg.Admin.TokenFile)
	}

	// checkPod checks what the Job and the Deployment share: a hardened
	// container that finds its configuration and secrets.
	checkPod := func(kind string, p podSpec) container {
		t.Helper()
		if len(p.Containers) != 1 {
			t.Fatalf("%s: %d containers, want 1", kind, len(p.Containers))
		}
		c := p.Containers[0]
		if c.Image != "outbox-relay" {
			t.Errorf("%s: image %q, want outbox-relay (kustomization.yaml's images sets the real one)", kind, c.Image)
		}
		if len(c.Command) != 0 {
			t.Errorf("%s: command %q replaces the image's entrypoint; use args", kind, c.Command)
		}
		nonRoot := p.SecurityContext.RunAsNonRoot
		if c.SecurityContext.RunAsNonRoot != nil {
			nonRoot = c.SecurityContext.RunAsNonRoot
		}
		if nonRoot == nil || !*nonRoot {
			t.Errorf("%s: runAsNonRoot is not true", kind)
		}
		if ro := c.SecurityContext.ReadOnlyRootFilesystem; ro == nil || !*ro {
			t.Errorf("%s: readOnlyRootFilesystem is not true", kind)
		}
		if esc := c.SecurityContext.AllowPrivilegeEscalation; esc == nil || *esc {
			t.Errorf("%s: allowPrivilegeEscalation is not false", kind)
		}
		if !slices.Equal(c.SecurityContext.Capabilities.Drop, []string{"ALL"}) {
			t.Errorf("%s: drops capabilities %q, want [ALL]", kind, c.SecurityContext.Capabilities.Drop)
		}
		if p.SecurityContext.SeccompProfile.Type != "RuntimeDefault" && c.SecurityContext.SeccompProfile.Type != "RuntimeDefault" {
			t.Errorf("%s: no RuntimeDefault seccomp profile", kind)
		}
		if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
			t.Errorf("%s: resources %+v, want cpu and memory requests and a memory limit", kind, c.Resources)
		}
		files := p.files(c)
		if ref := files[c.env(config.EnvConfigFile)]; ref != "configmap/"+cm.Metadata.Name+"/relay.yaml" {
			t.Errorf("%s: OUTBOX_CONFIG=%q is %q, want the ConfigMap's relay.yaml (mounted: %v)", kind, c.env(config.EnvConfigFile), ref, files)
		}
		for setting, path := range map[string]string{"database.url_file": cfg.Database.URLFile, "admin.token_file": cfg.Admin.TokenFile} {
			if path != "" && !secretKey(files[path]) {
				t.Errorf("%s: %s %q is not a key of the Secret %s (mounted: %v)", kind, setting, path, secret.Metadata.Name, files)
			}
		}
		if path := c.env("OUTBOX_DATABASE_URL_FILE"); path != "" && !secretKey(files[path]) {
			t.Errorf("%s: OUTBOX_DATABASE_URL_FILE %q is not a key of the Secret (mounted: %v)", kind, path, files)
		}
		return c
	}

	var job struct {
		object `yaml:",inline"`
		Spec   struct {
			BackoffLimit            *int        `yaml:"backoffLimit"`
			TTLSecondsAfterFinished *int        `yaml:"ttlSecondsAfterFinished"`
			Template                podTemplate `yaml:"template"`
		} `yaml:"spec"`
	}
	unmarshal(t, kinds, "Job", &job)
	jc := checkPod("Job", job.Spec.Template.Spec)
	if !slices.Equal(jc.Args, []string{"migrate", "up"}) {
		t.Errorf("Job: args %q, want [migrate up]", jc.Args)
	}
	if job.Spec.BackoffLimit == nil || job.Spec.TTLSecondsAfterFinished == nil {
		t.Error("Job: backoffLimit or ttlSecondsAfterFinished is not set")
	}
	if rp := job.Spec.Template.Spec.RestartPolicy; rp != "Never" && rp != "OnFailure" {
		t.Errorf("Job: restartPolicy %q", rp)
	}

	var dep struct {
		object `yaml:",inline"`
		Spec   struct {
			Replicas *int `yaml:"replicas"`
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Strategy struct {
				Type          string `yaml:"type"`
				RollingUpdate struct {
					MaxUnavailable any `yaml:"maxUnavailable"`
					MaxSurge       any `yaml:"maxSurge"`
				} `yaml:"rollingUpdate"`
			} `yaml:"strategy"`
			Template podTemplate `yaml:"template"`
		} `yaml:"spec"`
	}
	unmarshal(t, kinds, "Deployment", &dep)
	pod := dep.Spec.Template
	dc := checkPod("Deployment", pod.Spec)
	if !slices.Equal(dc.Args, []string{"run"}) {
		t.Errorf("Deployment: args %q, want [run]", dc.Args)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("Deployment: replicas %s, want 2", intOrUnset(dep.Spec.Replicas))
	}
	if ru := dep.Spec.Strategy.RollingUpdate; dep.Spec.Strategy.Type != "RollingUpdate" || fmt.Sprint(ru.MaxUnavailable) != "0" || fmt.Sprint(ru.MaxSurge) != "1" {
		t.Errorf("Deployment: strategy %+v, want RollingUpdate with maxUnavailable 0, maxSurge 1", dep.Spec.Strategy)
	}
	if !matches(dep.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("Deployment: selector %v does not match the pod labels %v", dep.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < cfg.Relay.DrainTimeout+5*time.Second {
		t.Errorf("Deployment: terminationGracePeriodSeconds %s, want at least relay.drain_timeout (%s) + 5s", intOrUnset(g), cfg.Relay.DrainTimeout)
	}
	portNames := map[int]string{}
	for _, p := range dc.Ports {
		portNames[p.ContainerPort] = p.Name
	}
	if portNames[9780] != "admin" || cfg.Admin.Listen != ":9780" {
		t.Errorf("Deployment: port 9780 is named %q and admin.listen is %q, want admin and :9780", portNames[9780], cfg.Admin.Listen)
	}
	if portNames[9781] != "api" || cfg.Admin.APIListen != ":9781" {
		t.Errorf("Deployment: port 9781 is named %q and admin.api_listen is %q, want api and :9781", portNames[9781], cfg.Admin.APIListen)
	}
	for name, pr := range map[string]struct {
		p    *probe
		path string
	}{"livenessProbe": {dc.LivenessProbe, "/livez"}, "readinessProbe": {dc.ReadinessProbe, "/readyz"}} {
		if pr.p == nil || pr.p.HTTPGet.Path != pr.path || fmt.Sprint(pr.p.HTTPGet.Port) != "admin" {
			t.Errorf("Deployment: %s %+v, want GET %s on port admin", name, pr.p, pr.path)
		}
	}

	var pdb struct {
		object `yaml:",inline"`
		Spec   struct {
			MinAvailable any `yaml:"minAvailable"`
			Selector     struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		} `yaml:"spec"`
	}
	unmarshal(t, kinds, "PodDisruptionBudget", &pdb)
	if fmt.Sprint(pdb.Spec.MinAvailable) != "1" || !matches(pdb.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("PodDisruptionBudget: minAvailable %v, selector %v; want 1 and the relay's pods", pdb.Spec.MinAvailable, pdb.Spec.Selector.MatchLabels)
	}

	var svc struct {
		object `yaml:",inline"`
		Spec   struct {
			Selector                 map[string]string `yaml:"selector"`
			PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
			Ports                    []struct {
				Name       string `yaml:"name"`
				TargetPort any    `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	unmarshal(t, kinds, "Service", &svc)
	var svcPorts []string
	for _, p := range svc.Spec.Ports {
		svcPorts = append(svcPorts, p.Name+"→"+fmt.Sprint(p.TargetPort))
	}
	if !matches(svc.Spec.Selector, pod.Metadata.Labels) || !svc.Spec.PublishNotReadyAddresses ||
		!slices.Equal(svcPorts, []string{"admin→admin", "api→api"}) {
		t.Errorf("Service: %+v; want the relay's pods, publishNotReadyAddresses and the admin and api ports", svc.Spec)
	}

	// The network policy selects the relay's pods and opens only their
	// named ports, the API to fewer clients than the metrics.
	var np struct {
		object `yaml:",inline"`
		Spec   struct {
			PodSelector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"podSelector"`
			PolicyTypes []string `yaml:"policyTypes"`
			Ingress     []struct {
				From  []map[string]any `yaml:"from"`
				Ports []struct {
					Port any `yaml:"port"`
				} `yaml:"ports"`
			} `yaml:"ingress"`
		} `yaml:"spec"`
	}
	unmarshal(t, kinds, "NetworkPolicy", &np)
	if !matches(np.Spec.PodSelector.MatchLabels, pod.Metadata.Labels) || !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
		t.Errorf("NetworkPolicy: %+v; want the relay's pods and Ingress", np.Spec)
	}
	opened := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 || len(rule.Ports) == 0 {
			t.Errorf("NetworkPolicy: rule %+v opens to everyone or every port", rule)
		}
		for _, p := range rule.Ports {
			name := fmt.Sprint(p.Port)
			if !slices.Contains([]string{"admin", "api"}, name) || opened[name] {
				t.Errorf("NetworkPolicy: port %s is not one of the container's named ports admin and api, or is opened twice", name)
			}
			if len(rule.Ports) > 1 {
				t.Errorf("NetworkPolicy: a rule opens %d ports to the same clients; the API's must be its own", len(rule.Ports))
			}
			opened[name] = true
		}
	}
	if !opened["admin"] || !opened["api"] {
		t.Errorf("NetworkPolicy: opens %v, want admin and api", opened)
	}
	if svc.Metadata.Name != "outbox-relay" {
		t.Errorf("Service: named %q; the alerts select job=\"outbox-relay\", which a ServiceMonitor takes from the Service's name", svc.Metadata.Name)
	}

	var sm struct {
		object `yaml:",inline"`
		Spec   struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Endpoints []struct {
				Port     string `yaml:"port"`
				Path     string `yaml:"path"`
				Interval string `yaml:"interval"`
			} `yaml:"endpoints"`
		} `yaml:"spec"`
	}
	unmarshal(t, kinds, "ServiceMonitor", &sm)
	if !matches(sm.Spec.Selector.MatchLabels, svc.Metadata.Labels) || len(sm.Spec.Endpoints) != 1 ||
		sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" || sm.Spec.Endpoints[0].Interval == "" {
		t.Errorf("ServiceMonitor: %+v; want the Service's admin port, /metrics, an interval", sm.Spec)
	}
	unmarshal(t, kinds, "PrometheusRule", &object{})
}

func intOrUnset(p *int) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// matches reports whether a label selector selects labels.
func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type fakeSlot struct{}

func (fakeSlot) State(context.Context) (logsource.SlotState, error) {
	return logsource.SlotState{Exists: true, Active: true, WALStatus: "reserved", Confirmed: "0/16B3748", LagBytes: 1024}, nil
}
func (fakeSlot) Streaming() bool { return true }
