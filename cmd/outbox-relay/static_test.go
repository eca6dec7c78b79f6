package main

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/dev/containertest"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// The image's build command, taken from the Dockerfile, makes a static
// binary that runs: no dynamic loader, no shared libraries, the version
// linked in.
func TestStaticBuildOfTheImage(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the image is built for Linux")
	}
	df, err := os.ReadFile(filepath.Join("..", "..", "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// The RUN line's continuation lines, joined.
	text := strings.ReplaceAll(string(df), "\\\n", " ")
	m := regexp.MustCompile(`CGO_ENABLED=0 go build ([^\n]*?) -o \S+ (\./cmd/outbox-relay)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no 'CGO_ENABLED=0 go build ... -o ... ./cmd/outbox-relay' in deploy/Dockerfile")
	}
	flags := strings.NewReplacer("${VERSION}", "v0.0.0-test", "${REVISION}", "abc123").Replace(m[1])
	ldflags := regexp.MustCompile(`-ldflags="([^"]*)"`).FindStringSubmatch(flags)
	if ldflags == nil {
		t.Fatalf("no -ldflags in %q", flags)
	}
	args := []string{"build"}
	args = append(args, strings.Fields(strings.Replace(flags, ldflags[0], "", 1))...)
	bin := filepath.Join(t.TempDir(), "outbox-relay")
	args = append(args, "-ldflags="+ldflags[1], "-o", bin, ".")
	// The image builds compile the same packages the same way: in turns,
	// the second finds them in the build cache.
	unlock, err := containertest.LockBuilds()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	unlock()
	if err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, out)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary asks for a dynamic loader: it is not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	out, err = exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v0.0.0-test") {
		t.Errorf("%s --version: %v: %s", bin, err, out)
	}
}
