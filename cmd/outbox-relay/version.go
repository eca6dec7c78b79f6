package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"
)

// version, revision and buildDate name the build, set at build time with
// -ldflags "-X main.version=v1.2.3 -X main.revision=<commit>
// -X main.buildDate=<RFC 3339>" (make build, make dist and the images do);
// when empty, currentBuild takes them from the binary's build information:
// the module's version (v1.2.3 from go install ...@v1.2.3), the commit and
// its time.
var version, revision, buildDate string

// build says which build is running.
type build struct {
	Version  string `json:"version"`
	Revision string `json:"revision"`
	// Modified says the build was made from a work tree with changes
	// beyond its revision.
	Modified bool   `json:"modified,omitempty"`
	Date     string `json:"build_date"`
	Go       string `json:"go_version"`
	Platform string `json:"platform"`
}

func currentBuild() build {
	b := build{Version: version, Revision: revision, Date: buildDate, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.Revision == "" {
					b.Revision = s.Value
				}
			case "vcs.time":
				if b.Date == "" {
					b.Date = s.Value
				}
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Date != "" {
		if t, err := time.Parse(time.RFC3339, b.Date); err == nil {
			b.Date = t.UTC().Format(time.RFC3339)
		}
	}
	return b
}

func (a *app) versionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the relay's version, commit, build date and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			b := currentBuild()
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			}
			rev := b.Revision
			if rev == "" {
				rev = "unknown"
			}
			if b.Modified {
				rev += " (modified)"
			}
			date := b.Date
			if date == "" {
				date = "unknown"
			}
			fmt.Fprintf(a.stdout, "outbox-relay %s\n  commit:  %s\n  built:   %s\n  go:      %s %s\n", b.Version, rev, date, b.Go, b.Platform)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print it as JSON")
	return cmd
}
