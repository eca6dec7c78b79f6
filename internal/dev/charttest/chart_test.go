package charttest_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir     = "../../../deploy/helm/outbox-relay"
	manifestsDir = "../../../deploy/kubernetes"
	alertsFile   = "../../../deploy/prometheus/alerts.yaml"
)

// objects are the rendered objects, by kind and name.
type objects map[string]any

func key(kind, name string) string { return kind + "/" + name }

// newObject is the typed object of a kind.
func newObject(kind string) (any, bool) {
	switch kind {
	case "ConfigMap":
		return &corev1.ConfigMap{}, true
	case "Secret":
		return &corev1.Secret{}, true
	case "Service":
		return &corev1.Service{}, true
	case "Deployment":
		return &appsv1.Deployment{}, true
	case "Job":
		return &batchv1.Job{}, true
	case "NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	case "PrometheusRule":
		return &monitoringv1.PrometheusRule{}, true
	}
	return nil, false
}

// decode decodes one manifest strictly: a field the type does not have,
// or a field given twice, fails.
func decode(t *testing.T, where, manifest string) (kind, name string, obj any) {
	t.Helper()
	var head struct {
		Kind     string
		Metadata struct{ Name string }
	}
	if err := yaml.Unmarshal([]byte(manifest), &head); err != nil {
		t.Fatalf("%s: %v\n%s", where, err, manifest)
	}
	obj, ok := newObject(head.Kind)
	if !ok {
		t.Fatalf("%s: a %q, which the chart is not expected to make", where, head.Kind)
	}
	if err := yaml.UnmarshalStrict([]byte(manifest), obj); err != nil {
		t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", where, head.Kind, head.Metadata.Name, err, manifest)
	}
	return head.Kind, head.Metadata.Name, obj
}

// rendered is a release of the chart: its objects, and its hooks with
// their events and weights.
type rendered struct {
	objects objects
	hooks   map[string]hook // by kind/name
	notes   string
}

type hook struct {
	events         []string
	weight         int
	deletePolicies []string
}

// render lints the chart with values (a file under testdata, or none) and
// renders it as a first install named orders in namespace shop.
func render(t *testing.T, valuesFile string) rendered {
	t.Helper()
	lintWith(t, valuesFile)
	r, err := renderAs(t, valuesFile, "orders")
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return r
}

// values reads a values file under testdata; none for "".
func values(t *testing.T, valuesFile string) map[string]any {
	t.Helper()
	if valuesFile == "" {
		return map[string]any{}
	}
	v, err := chartutil.ReadValuesFile(filepath.Join("testdata", valuesFile))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// lintWith lints the chart with the values of valuesFile: no warning, no
// error.
func lintWith(t *testing.T, valuesFile string) {
	t.Helper()
	linter := lint.All(chartDir, values(t, valuesFile), "shop", false)
	for _, m := range linter.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint (%s): %s", cmpOr(valuesFile, "default values"), m)
		}
	}
}

// renderAs renders the chart as a first install named release.
func renderAs(t *testing.T, valuesFile, release string) (rendered, error) {
	t.Helper()
	values := values(t, valuesFile)
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	rv, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{Name: release, Namespace: "shop", Revision: 1, IsInstall: true}, caps)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		return rendered{}, err
	}
	var r rendered
	r.objects, r.hooks = objects{}, map[string]hook{}
	for name, content := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			r.notes = content
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		t.Fatalf("sort the manifests: %v", err)
	}
	for _, m := range manifests {
		kind, name, obj := decode(t, m.Name, m.Content)
		r.objects[key(kind, name)] = obj
	}
	for _, h := range hooks {
		kind, name, obj := decode(t, h.Path, h.Manifest)
		r.objects[key(kind, name)] = obj
		var events []string
		for _, e := range h.Events {
			events = append(events, string(e))
		}
		sort.Strings(events)
		var policies []string
		for _, p := range h.DeletePolicies {
			policies = append(policies, string(p))
		}
		sort.Strings(policies)
		r.hooks[key(kind, name)] = hook{events: events, weight: h.Weight, deletePolicies: policies}
	}
	return r, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// manifests are deploy/kubernetes's objects, decoded the same way.
func manifests(t *testing.T) objects {
	t.Helper()
	var kz struct {
		Resources []string
		Images    []struct{ Name, NewName, NewTag string }
	}
	b, err := os.ReadFile(filepath.Join(manifestsDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kz); err != nil {
		t.Fatal(err)
	}
	out := objects{}
	for _, f := range kz.Resources {
		b, err := os.ReadFile(filepath.Join(manifestsDir, f))
		if err != nil {
			t.Fatal(err)
		}
		kind, name, obj := decode(t, f, string(b))
		out[key(kind, name)] = obj
	}
	// The image as kustomize sets it.
	for _, img := range kz.Images {
		for _, o := range out {
			for _, spec := range podSpecs(o) {
				for i := range spec.Containers {
					if spec.Containers[i].Image == img.Name {
						spec.Containers[i].Image = img.NewName + ":" + img.NewTag
					}
				}
			}
		}
	}
	out["order"] = kz.Resources
	return out
}

func podSpecs(o any) []*corev1.PodSpec {
	switch o := o.(type) {
	case *appsv1.Deployment:
		return []*corev1.PodSpec{&o.Spec.Template.Spec}
	case *batchv1.Job:
		return []*corev1.PodSpec{&o.Spec.Template.Spec}
	}
	return nil
}

func get[T any](t *testing.T, objs objects, kind, name string) T {
	t.Helper()
	o, ok := objs[key(kind, name)]
	if !ok {
		have := slices.Sorted(func(yield func(string) bool) {
			for k := range objs {
				if !yield(k) {
					return
				}
			}
		})
		t.Fatalf("no %s %s among %v", kind, name, have)
	}
	return o.(T)
}

// mounted lists the files a pod's config volume holds, by path under
// /etc/outbox-relay, each as "configmap/NAME/KEY" or "secret/NAME/KEY".
func mounted(spec *corev1.PodSpec) map[string]string {
	out := map[string]string{}
	for _, v := range spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			switch {
			case s.ConfigMap != nil:
				for _, it := range s.ConfigMap.Items {
					out[it.Path] = "configmap/" + s.ConfigMap.Name + "/" + it.Key
				}
			case s.Secret != nil:
				for _, it := range s.Secret.Items {
					out[it.Path] = "secret/" + s.Secret.Name + "/" + it.Key
				}
			}
		}
	}
	return out
}

// relayYAML parses a ConfigMap's relay.yaml.
func relayYAML(t *testing.T, cm *corev1.ConfigMap) map[string]any {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["relay.yaml"]), &cfg); err != nil {
		t.Fatalf("%s: relay.yaml: %v", cm.Name, err)
	}
	return cfg
}

func diff(t *testing.T, what string, chart, plain any) {
	t.Helper()
	if !reflect.DeepEqual(chart, plain) {
		c, _ := yaml.Marshal(chart)
		p, _ := yaml.Marshal(plain)
		t.Errorf("%s: the chart and deploy/kubernetes differ:\nchart:\n%s\nmanifests:\n%s", what, c, p)
	}
}

// The chart with its default values renders, lints clean, and makes the
// objects of deploy/kubernetes, agreeing with them on what matters: the
// image, the user, the read-only root, the probes, the ports, the
// configuration and its mounted secrets, the disruption budget, the
// network policy, and the migration before the relays.
func TestChartMatchesTheManifests(t *testing.T) {
	t.Parallel()
	r := render(t, "")
	plain := manifests(t)
	const name = "orders-outbox-relay"
	for _, k := range []string{key("ConfigMap", name), key("Secret", name), key("Deployment", name), key("Service", name),
		key("NetworkPolicy", name), key("PodDisruptionBudget", name),
		key("ConfigMap", name+"-migrate"), key("Secret", name+"-migrate"), key("Job", name+"-migrate")} {
		if _, ok := r.objects[k]; !ok {
			t.Errorf("the chart makes no %s", k)
		}
	}
	if len(r.objects) != 9 {
		t.Errorf("the chart makes %d objects, want the 9 above (no ServiceMonitor or PrometheusRule by default)", len(r.objects))
	}

	dep := get[*appsv1.Deployment](t, r.objects, "Deployment", name)
	pdep := get[*appsv1.Deployment](t, plain, "Deployment", "outbox-relay")
	job := get[*batchv1.Job](t, r.objects, "Job", name+"-migrate")
	pjob := get[*batchv1.Job](t, plain, "Job", "outbox-relay-migrate")
	c, pc := dep.Spec.Template.Spec.Containers[0], pdep.Spec.Template.Spec.Containers[0]
	jc, pjc := job.Spec.Template.Spec.Containers[0], pjob.Spec.Template.Spec.Containers[0]

	diff(t, "the relay's image", c.Image, pc.Image)
	diff(t, "the migration's image", jc.Image, pjc.Image)
	diff(t, "the relay's arguments", c.Args, pc.Args)
	diff(t, "the migration's arguments", jc.Args, pjc.Args)
	diff(t, "the relay pods' security context (user, group, seccomp)", dep.Spec.Template.Spec.SecurityContext, pdep.Spec.Template.Spec.SecurityContext)
	diff(t, "the migration pods' security context", job.Spec.Template.Spec.SecurityContext, pjob.Spec.Template.Spec.SecurityContext)
	diff(t, "the relay container's security context (read-only root, no privilege)", c.SecurityContext, pc.SecurityContext)
	diff(t, "the migration container's security context", jc.SecurityContext, pjc.SecurityContext)
	diff(t, "the startup probe", c.StartupProbe, pc.StartupProbe)
	diff(t, "the liveness probe", c.LivenessProbe, pc.LivenessProbe)
	diff(t, "the readiness probe", c.ReadinessProbe, pc.ReadinessProbe)
	diff(t, "the container ports", c.Ports, pc.Ports)
	diff(t, "the relay's resources", c.Resources, pc.Resources)
	diff(t, "the migration's resources", jc.Resources, pjc.Resources)
	diff(t, "the relay's environment", c.Env, pc.Env)
	diff(t, "the rollout", dep.Spec.Strategy, pdep.Spec.Strategy)
	diff(t, "the replicas", dep.Spec.Replicas, pdep.Spec.Replicas)
	diff(t, "minReadySeconds", dep.Spec.MinReadySeconds, pdep.Spec.MinReadySeconds)
	diff(t, "the grace period", dep.Spec.Template.Spec.TerminationGracePeriodSeconds, pdep.Spec.Template.Spec.TerminationGracePeriodSeconds)
	diff(t, "the service account token", dep.Spec.Template.Spec.AutomountServiceAccountToken, pdep.Spec.Template.Spec.AutomountServiceAccountToken)
	// helm waits for a hook 5 minutes by default, then gives up on it and
	// deletes the configuration it reads: the Job ends first.
	if d := *job.Spec.ActiveDeadlineSeconds; d >= 300 {
		t.Errorf("the migration's deadline is %ds, not under helm's default --timeout of 5m", d)
	}

	// The same configuration, read from the same files.
	cm := get[*corev1.ConfigMap](t, r.objects, "ConfigMap", name)
	diff(t, "relay.yaml", relayYAML(t, cm), relayYAML(t, get[*corev1.ConfigMap](t, plain, "ConfigMap", "outbox-relay")))
	diff(t, "the migration's relay.yaml", relayYAML(t, get[*corev1.ConfigMap](t, r.objects, "ConfigMap", name+"-migrate")), relayYAML(t, cm))
	strip := func(files map[string]string, names ...string) map[string]string {
		out := map[string]string{}
		for p, src := range files {
			for _, n := range names {
				src = strings.Replace(src, "/"+n+"/", "/NAME/", 1)
			}
			out[p] = src
		}
		return out
	}
	diff(t, "the relay's mounted files", strip(mounted(&dep.Spec.Template.Spec), name), strip(mounted(&pdep.Spec.Template.Spec), "outbox-relay"))
	diff(t, "the migration's mounted files", strip(mounted(&job.Spec.Template.Spec), name+"-migrate"), strip(mounted(&pjob.Spec.Template.Spec), "outbox-relay"))
	secretKeys := func(s *corev1.Secret) []string {
		return slices.Sorted(func(yield func(string) bool) {
			for k := range s.StringData {
				if !yield(k) {
					return
				}
			}
		})
	}
	diff(t, "the Secret's keys", secretKeys(get[*corev1.Secret](t, r.objects, "Secret", name)), secretKeys(get[*corev1.Secret](t, plain, "Secret", "outbox-relay")))

	svc, psvc := get[*corev1.Service](t, r.objects, "Service", name), get[*corev1.Service](t, plain, "Service", "outbox-relay")
	diff(t, "the Service's ports", svc.Spec.Ports, psvc.Spec.Ports)
	diff(t, "publishNotReadyAddresses", svc.Spec.PublishNotReadyAddresses, psvc.Spec.PublishNotReadyAddresses)
	pdb, ppdb := get[*policyv1.PodDisruptionBudget](t, r.objects, "PodDisruptionBudget", name), get[*policyv1.PodDisruptionBudget](t, plain, "PodDisruptionBudget", "outbox-relay")
	diff(t, "the disruption budget", []any{pdb.Spec.MinAvailable, pdb.Spec.UnhealthyPodEvictionPolicy}, []any{ppdb.Spec.MinAvailable, ppdb.Spec.UnhealthyPodEvictionPolicy})
	np, pnp := get[*networkingv1.NetworkPolicy](t, r.objects, "NetworkPolicy", name), get[*networkingv1.NetworkPolicy](t, plain, "NetworkPolicy", "outbox-relay")
	diff(t, "the network policy's ingress", np.Spec.Ingress, pnp.Spec.Ingress)

	// Every selector selects the relay's pods, and only them.
	podLabels := dep.Spec.Template.Labels
	for what, sel := range map[string]map[string]string{"Deployment": dep.Spec.Selector.MatchLabels, "Service": svc.Spec.Selector,
		"PodDisruptionBudget": pdb.Spec.Selector.MatchLabels, "NetworkPolicy": np.Spec.PodSelector.MatchLabels} {
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("the %s selects %s=%s, which the relay's pods do not have", what, k, v)
			}
		}
		if sel["app.kubernetes.io/component"] != "relay" || sel["app.kubernetes.io/instance"] != "orders" {
			t.Errorf("the %s's selector %v would select the migration's or another release's pods", what, sel)
		}
	}

	// The migration before the relays: in the chart, a pre-install and
	// pre-upgrade hook, after the copies of the configuration it reads; in
	// deploy/kubernetes, listed before the Deployment (and applied first,
	// as deploy/README.md says).
	want := []string{"pre-install", "pre-upgrade"}
	jh, cmh, sh := r.hooks[key("Job", name+"-migrate")], r.hooks[key("ConfigMap", name+"-migrate")], r.hooks[key("Secret", name+"-migrate")]
	if !reflect.DeepEqual(jh.events, want) || !reflect.DeepEqual(cmh.events, want) || !reflect.DeepEqual(sh.events, want) {
		t.Errorf("the migration's hooks: Job %v, ConfigMap %v, Secret %v; want each %v", jh.events, cmh.events, sh.events, want)
	}
	if !(cmh.weight < jh.weight && sh.weight < jh.weight) {
		t.Errorf("the Job's weight %d does not come after its ConfigMap's %d and Secret's %d", jh.weight, cmh.weight, sh.weight)
	}
	// Each is replaced at the next upgrade, and removed once the
	// migration succeeded (a failed Job stays, for its logs).
	for _, h := range []hook{jh, cmh, sh} {
		if want := []string{"before-hook-creation", "hook-succeeded"}; !reflect.DeepEqual(h.deletePolicies, want) {
			t.Errorf("a migration hook's delete policies are %v, want %v", h.deletePolicies, want)
		}
	}
	for k := range r.objects {
		if _, isHook := r.hooks[k]; isHook != strings.HasSuffix(k, "-migrate") {
			t.Errorf("%s: hook %v", k, isHook)
		}
	}
	order := plain["order"].([]string)
	if slices.Index(order, "migration-job.yaml") > slices.Index(order, "deployment.yaml") {
		t.Errorf("kustomization.yaml lists the migration after the Deployment: %v", order)
	}
	if !strings.Contains(r.notes, "secret.values.admin-token is still a placeholder") {
		t.Errorf("the notes do not warn of the placeholder secrets:\n%s", r.notes)
	}
}

// Every option on: a Secret of one's own, TLS, the Prometheus Operator's
// objects, placement. What each option turns on is in the objects, and
// every file the configuration names is mounted.
func TestChartWithEveryOption(t *testing.T) {
	t.Parallel()
	r := render(t, "all-on.yaml")
	plain := manifests(t)
	const name = "orders-outbox-relay"
	if _, ok := r.objects[key("Secret", name)]; ok {
		t.Error("the chart makes a Secret beside secret.existingSecret")
	}
	if _, ok := r.objects[key("Secret", name+"-migrate")]; ok {
		t.Error("the chart makes a migration Secret beside secret.existingSecret")
	}
	dep := get[*appsv1.Deployment](t, r.objects, "Deployment", name)
	job := get[*batchv1.Job](t, r.objects, "Job", name+"-migrate")
	c := dep.Spec.Template.Spec.Containers[0]
	const image = "registry.example.com/outbox-relay@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if c.Image != image || job.Spec.Template.Spec.Containers[0].Image != image {
		t.Errorf("images %s and %s, want the digest", c.Image, job.Spec.Template.Spec.Containers[0].Image)
	}
	for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("a probe of %s is %s, want HTTPS", p.HTTPGet.Path, p.HTTPGet.Scheme)
		}
	}
	if *dep.Spec.Replicas != 3 || dep.Spec.Template.Spec.PriorityClassName != "business-critical" || dep.Spec.Template.Spec.ServiceAccountName != "outbox-relay" ||
		dep.Spec.Template.Spec.Affinity == nil || len(dep.Spec.Template.Spec.Tolerations) != 1 || dep.Spec.Template.Spec.NodeSelector["kubernetes.io/os"] != "linux" ||
		len(dep.Spec.Template.Spec.ImagePullSecrets) != 1 || dep.Spec.Template.Annotations["example.com/team"] != "payments" ||
		dep.Spec.Template.Labels["example.com/cost-center"] != "42" || c.Env[len(c.Env)-1].Name != "OTEL_TRACES_EXPORTER" {
		t.Errorf("the Deployment does not carry the options:\n%+v", dep.Spec.Template)
	}
	// The migration runs as the relays do: their environment, labels,
	// annotations and placement.
	js := job.Spec.Template
	ds := dep.Spec.Template
	jc := js.Spec.Containers[0]
	diff(t, "the migration's extra environment", jc.Env[1:], c.Env[2:])
	if js.Labels["example.com/cost-center"] != "42" || js.Annotations["example.com/team"] != "payments" {
		t.Errorf("the migration's pods lack podLabels or podAnnotations: %v %v", js.Labels, js.Annotations)
	}
	diff(t, "the migration's placement", []any{js.Spec.Affinity, js.Spec.Tolerations, js.Spec.NodeSelector, js.Spec.PriorityClassName, js.Spec.ServiceAccountName, js.Spec.ImagePullSecrets},
		[]any{ds.Spec.Affinity, ds.Spec.Tolerations, ds.Spec.NodeSelector, ds.Spec.PriorityClassName, ds.Spec.ServiceAccountName, ds.Spec.ImagePullSecrets})
	// Every file relay.yaml names is in the pods' config volume.
	cfg := relayYAML(t, get[*corev1.ConfigMap](t, r.objects, "ConfigMap", name))
	admin := cfg["admin"].(map[string]any)
	tlsCfg := admin["tls"].(map[string]any)
	oidc := admin["oidc"].(map[string]any)
	for _, spec := range []*corev1.PodSpec{&dep.Spec.Template.Spec, &job.Spec.Template.Spec} {
		files := mounted(spec)
		for _, f := range []any{cfg["database"].(map[string]any)["url_file"], admin["token_file"], tlsCfg["cert_file"], tlsCfg["key_file"], oidc["client_secret_file"]} {
			p, _ := strings.CutPrefix(f.(string), "/etc/outbox-relay/")
			if files[p] == "" {
				t.Errorf("relay.yaml names %s, which is not mounted: %v", f, files)
			}
		}
		if files["tls/tls.crt"] != "secret/outbox-relay-tls/tls.crt" || files["secrets/oidc-client-secret"] != "secret/outbox-relay-secrets/oidc-client-secret" {
			t.Errorf("mounted: %v", files)
		}
	}
	if admin["listen"] != ":9780" || admin["api_listen"] != ":9781" {
		t.Errorf("listeners %v and %v", admin["listen"], admin["api_listen"])
	}

	sm := get[*monitoringv1.ServiceMonitor](t, r.objects, "ServiceMonitor", name)
	psm := get[*monitoringv1.ServiceMonitor](t, plain, "ServiceMonitor", "outbox-relay")
	ep, pep := sm.Spec.Endpoints[0], psm.Spec.Endpoints[0]
	if ep.Port != pep.Port || ep.Path != pep.Path || ep.Interval != pep.Interval || ep.ScrapeTimeout != pep.ScrapeTimeout {
		t.Errorf("the ServiceMonitor's endpoint %+v, the manifests' %+v", ep, pep)
	}
	if ep.Scheme == nil || strings.ToLower(string(*ep.Scheme)) != "https" || ep.TLSConfig == nil || sm.Labels["release"] != "prometheus" {
		t.Errorf("the ServiceMonitor with TLS: %+v", sm)
	}
	// The scrape's job is outbox-relay, as the alerts select, whatever the
	// release is called; the ServiceMonitor selects the Service, and its
	// port is the Service's.
	svc := get[*corev1.Service](t, r.objects, "Service", name)
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the Service does not have", k, v)
		}
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
		t.Errorf("the ServiceMonitor scrapes port %q, which the Service does not have", ep.Port)
	}
	if sm.Spec.JobLabel == "" || svc.Labels[sm.Spec.JobLabel] != "outbox-relay" {
		t.Errorf("the job label: %q on the Service is %q, want outbox-relay", sm.Spec.JobLabel, svc.Labels[sm.Spec.JobLabel])
	}

	rule := get[*monitoringv1.PrometheusRule](t, r.objects, "PrometheusRule", name)
	prule := get[*monitoringv1.PrometheusRule](t, plain, "PrometheusRule", "outbox-relay")
	diff(t, "the alert rules", rule.Spec, prule.Spec)
	var alerts monitoringv1.PrometheusRuleSpec
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &alerts); err != nil {
		t.Fatal(err)
	}
	diff(t, "the alert rules and deploy/prometheus/alerts.yaml", rule.Spec, alerts)
	if n := len(rule.Spec.Groups); n == 0 || len(rule.Spec.Groups[0].Rules) == 0 {
		t.Error("no alert rules")
	}
}

// Options that change the objects' shape: the API on the admin port, a
// long release name, a name override, one replica, a Secret with more keys.
func TestChartEdges(t *testing.T) {
	t.Parallel()
	const release = "payments-eu-west-1-production-blue-green-canary-2026"
	lintWith(t, "edges.yaml")
	r, err := renderAs(t, "edges.yaml", release)
	if err != nil {
		t.Fatal(err)
	}
	const name = release + "-relay"
	if len(name) > 63 {
		t.Fatalf("the test's name %s is too long itself", name)
	}
	for k, o := range r.objects {
		n := o.(interface{ GetName() string }).GetName()
		if len(n) > 63 {
			t.Errorf("%s: a name of %d characters", k, len(n))
		}
	}
	job := get[*batchv1.Job](t, r.objects, "Job", name[:55]+"-migrate")
	if len(job.Name) > 63 {
		t.Errorf("the Job's name %q is longer than a label's value may be", job.Name)
	}
	dep := get[*appsv1.Deployment](t, r.objects, "Deployment", name)
	if got := dep.Spec.Template.Labels["app.kubernetes.io/name"]; got != "relay" {
		t.Errorf("the pods' name label %q, want the override", got)
	}
	// The API on the admin port: no api port, and its clients let in there.
	if ports := dep.Spec.Template.Spec.Containers[0].Ports; len(ports) != 1 || ports[0].Name != "admin" {
		t.Errorf("container ports %v, want admin alone", ports)
	}
	if ports := get[*corev1.Service](t, r.objects, "Service", name).Spec.Ports; len(ports) != 1 {
		t.Errorf("Service ports %v, want admin alone", ports)
	}
	admin := relayYAML(t, get[*corev1.ConfigMap](t, r.objects, "ConfigMap", name))["admin"].(map[string]any)
	if admin["api_listen"] != "" {
		t.Errorf("admin.api_listen %v, want none", admin["api_listen"])
	}
	np := get[*networkingv1.NetworkPolicy](t, r.objects, "NetworkPolicy", name)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 2 || np.Spec.Ingress[0].From[1].PodSelector == nil {
		t.Errorf("the network policy's ingress %+v, want the monitoring namespace and the API's clients on admin", np.Spec.Ingress)
	}
	// One replica: no budget that would block every drain.
	if _, ok := r.objects[key("PodDisruptionBudget", name)]; ok {
		t.Error("a PodDisruptionBudget for one replica with minAvailable 1")
	}
	// The Secret's extra key, made and mounted.
	secret := get[*corev1.Secret](t, r.objects, "Secret", name)
	if secret.StringData["oidc-client-secret"] != "from-the-values" {
		t.Errorf("the Secret's keys %v", secret.StringData)
	}
	if got := mounted(&dep.Spec.Template.Spec)["secrets/oidc-client-secret"]; got != "secret/"+name+"/oidc-client-secret" {
		t.Errorf("the extra key is mounted as %q", got)
	}

	// An empty list of peers is refused, not taken as everyone.
	if _, err := renderAs(t, "open-policy.yaml", "orders"); err == nil || !strings.Contains(err.Error(), "must each name a peer") {
		t.Errorf("an empty apiFrom: %v, want it refused", err)
	}
}
