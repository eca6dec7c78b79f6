package config

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The configuration knows sinks only through their registry: it imports
// none of them, the kafka section's included. The packages of this module
// that the built-in sinks bring beyond the sink API must not be among its
// dependencies.
func TestConfigImportsNoSink(t *testing.T) {
	t.Parallel()
	deps := func(pkg string) map[string]bool {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		m := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			m[p] = true
		}
		return m
	}
	config, sinks, api := deps("."), deps("../relay/sink/builtin"), deps("../relay/sink")
	if !sinks["github.com/outbox-relay/outbox-relay/relay/kafka"] {
		t.Fatalf("go list does not find the kafka sink among the built-in sinks: %v", sinks)
	}
	for p := range sinks {
		if strings.HasPrefix(p, "github.com/outbox-relay/outbox-relay/") && !api[p] && config[p] {
			t.Errorf("config imports %s, which only the sinks need", p)
		}
	}
}

// Every setting keeps its path, its variable and its default: the golden
// file lists them as they were when the sections became the libraries'
// own types and the kafka section a sink's.
func TestSettingsKeepTheirNamesAndDefaults(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile("testdata/settings.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got := settingsTable(); got != string(want) {
		t.Errorf("the settings changed; if on purpose, update testdata/settings.golden:\n%s", lineDiff(string(want), got))
	}
}

// settingsTable lists each setting's path, variable and default, sorted.
func settingsTable() string {
	def := defaultSettings()
	paths := settingPaths()
	slices.Sort(paths)
	var b strings.Builder
	for _, p := range paths {
		d := "-"
		if v, ok := def[p]; ok {
			d = fmt.Sprint(v)
		}
		fmt.Fprintf(&b, "%s %s %s\n", p, EnvName(p), d)
	}
	return b.String()
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
