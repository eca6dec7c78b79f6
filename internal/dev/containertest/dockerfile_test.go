package containertest

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// The image built without a registry runs as the multi-stage one does.
func TestDockerfilesDescribeTheSameRuntime(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := ReadRuntime(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	local, err := ReadRuntime(filepath.Join(root, "deploy", "Dockerfile.local"))
	if err != nil {
		t.Fatal(err)
	}
	if shipped.User == "" || len(shipped.Entrypoint) == 0 || len(shipped.Labels) == 0 {
		t.Fatalf("deploy/Dockerfile's final stage read as %+v: the reading is broken", shipped)
	}
	for _, c := range []struct {
		what           string
		shipped, local any
	}{
		{"USER", shipped.User, local.User},
		{"ENTRYPOINT", shipped.Entrypoint, local.Entrypoint},
		{"CMD", shipped.Cmd, local.Cmd},
		{"EXPOSE", shipped.Expose, local.Expose},
		{"LABEL", shipped.Labels, local.Labels},
		{"HEALTHCHECK", shipped.Healthcheck, local.Healthcheck},
		{"STOPSIGNAL", shipped.StopSignal, local.StopSignal},
	} {
		if !reflect.DeepEqual(c.shipped, c.local) {
			t.Errorf("%s: deploy/Dockerfile has %q, deploy/Dockerfile.local %q", c.what, c.shipped, c.local)
		}
	}
	if want := shipped.Entrypoint[0]; !slices.Contains(local.Copied, want) || !slices.Contains(shipped.Copied, want) {
		t.Errorf("the entrypoint %s is not where both copy the binary: %q and %q", want, shipped.Copied, local.Copied)
	}
}

// The reading catches what the comparison relies on.
func TestReadRuntimeRefusesWhatItCannotCompare(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"shell form": "FROM scratch\nENTRYPOINT /bin/outbox-relay run\n",
		"unknown":    "FROM scratch\nVOLUME /data\n",
		"label":      "FROM scratch\nLABEL a=unquoted\n",
		"no from":    "USER nonroot\n",
	} {
		path := filepath.Join(dir, "Dockerfile")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if rt, err := ReadRuntime(path); err == nil {
			t.Errorf("%s: read as %+v, want an error", name, rt)
		}
	}
}
