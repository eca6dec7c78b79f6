package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// reloader loads the configuration again when a file it reads changes
// (Kubernetes updates a mounted Secret in place) or on SIGHUP, and applies
// what may change while the relay runs: the dead-letter API's tokens, the
// admin listeners' certificate, and each destination's secrets and TLS
// material. A configuration that does not load is refused with a log line,
// and everything keeps what it had. Routes, destinations and every other
// setting apply at the next start; a changed configuration file is logged
// as such.
type reloader struct {
	a      *app
	need   config.Need
	tokens *access.Tokens // nil when the API is off
	certs  *certificate   // nil without admin TLS
	// publishers are the destinations' own publishers, by name.
	publishers map[string]sink.Publisher

	cfg  *config.Config    // the configuration last applied
	sums map[string]string // what was applied, by part: a digest each
	log  *slog.Logger
}

// reloadDebounce gathers the events of one update: Kubernetes swaps a
// Secret's files in a few renames.
const reloadDebounce = 200 * time.Millisecond

func newReloader(a *app, need config.Need, tokens *access.Tokens, certs *certificate, publishers map[string]sink.Publisher) *reloader {
	r := &reloader{a: a, need: need, tokens: tokens, certs: certs, publishers: publishers, cfg: a.cfg, log: a.log}
	byName, _ := r.readTokens(a.cfg)
	r.sums = r.digests(a.cfg, byName)
	return r
}

// readTokens reads the API's tokens of cfg; none when the API is off.
func (r *reloader) readTokens(cfg *config.Config) (map[string]access.Token, []string) {
	if r.tokens == nil {
		return nil, nil
	}
	return cfg.Admin.ReadTokens()
}

// digests fingerprints each part of cfg that a reload may apply, with the
// contents of the files it reads; byName are its API tokens.
func (r *reloader) digests(cfg *config.Config, byName map[string]access.Token) map[string]string {
	out := map[string]string{"configuration file": fileDigest(config.File(r.a.flags, r.a.env))}
	if r.tokens != nil {
		names := make([]string, 0, len(byName))
		for n := range byName {
			names = append(names, n)
		}
		sort.Strings(names)
		h := sha256.New()
		for _, n := range names {
			fmt.Fprintf(h, "%q=%q %s\n", n, byName[n].Value, byName[n].Role)
		}
		out["admin tokens"] = hex.EncodeToString(h.Sum(nil))
	}
	if r.certs != nil {
		out["admin certificate"] = fileDigest(cfg.Admin.TLS.CertFile, cfg.Admin.TLS.KeyFile)
	}
	settings, _ := cfg.DestinationList()
	for _, s := range settings {
		if rl, ok := s.Settings.(sink.Reloader); ok {
			// The settings as resolved, secrets included, and the
			// files they name (certificates are read only on use).
			out["destination "+s.Name] = fileDigest(rl.Files()...) + digest(fmt.Sprintf("%#v", s.Settings))
		}
	}
	return out
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// fileDigest fingerprints the contents of files; a file that cannot be
// read counts by its error.
func fileDigest(files ...string) string {
	h := sha256.New()
	for _, f := range files {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			b = []byte(err.Error())
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// reload loads the configuration again and applies what changed. trigger
// says why, for the log.
func (r *reloader) reload(trigger string) {
	cfg, err := config.Load(r.a.flags, r.a.env, r.need)
	if err != nil {
		r.log.Warn("configuration not reloaded: the running one is kept", slog.String("trigger", trigger),
			slog.String("error", oneLine(r.cfg.RedactURLs(err.Error()))))
		return
	}
	byName, problems := r.readTokens(cfg)
	sums := r.digests(cfg, byName)
	var applied, kept []string
	apply := func(part string, do func() error) {
		if sums[part] == r.sums[part] {
			return
		}
		if err := do(); err != nil {
			kept = append(kept, part+": "+oneLine(err.Error()))
			return
		}
		r.sums[part] = sums[part]
		applied = append(applied, part)
	}
	if r.tokens != nil {
		apply("admin tokens", func() error {
			if len(problems) > 0 { // changed since Load read them
				return &config.Error{Problems: problems}
			}
			return r.tokens.Replace(byName)
		})
	}
	if r.certs != nil && cfg.Admin.TLS.Enabled() {
		apply("admin certificate", func() error {
			cert, err := cfg.Admin.TLS.Load()
			if err == nil {
				r.certs.cur.Store(&cert)
			}
			return err
		})
	}
	settings, _ := cfg.DestinationList()
	for _, s := range settings {
		p, ok := r.publishers[s.Name]
		rl, reloadable := s.Settings.(sink.Reloader)
		if ok && reloadable {
			apply("destination "+s.Name, func() error { return rl.Reload(p) })
		}
	}
	if part := "configuration file"; sums[part] != r.sums[part] {
		r.sums[part] = sums[part]
		r.log.Warn("the configuration file changed: its secrets are applied, its other settings (routes, destinations, relay) at the next start",
			slog.String("file", config.File(r.a.flags, r.a.env)))
	}
	r.cfg = cfg
	for _, k := range kept {
		r.log.Warn("not reloaded, the running value is kept: "+k, slog.String("trigger", trigger))
	}
	switch {
	case len(applied) > 0:
		r.log.Info("reloaded", slog.Any("parts", applied), slog.String("trigger", trigger))
	case len(kept) == 0 && trigger == "SIGHUP":
		r.log.Info("reloaded: nothing changed", slog.String("trigger", trigger))
	}
}

// watched are the directories holding the files the configuration reads.
// A directory, not a file, is watched: Kubernetes updates a mounted
// Secret by swapping a symbolic link beside its files.
func (r *reloader) watched() []string {
	cfg := r.cfg
	files := []string{config.File(r.a.flags, r.a.env), cfg.Admin.TokenFile, cfg.Admin.TLS.CertFile, cfg.Admin.TLS.KeyFile}
	settings, _ := cfg.DestinationList()
	for _, s := range settings {
		if rl, ok := s.Settings.(sink.Reloader); ok {
			files = append(files, rl.Files()...)
		}
	}
	var dirs []string
	for _, f := range files {
		if f != "" {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	if cfg.Admin.TokensDir != "" {
		dirs = append(dirs, cfg.Admin.TokensDir)
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// run reloads after the watched files change, and on every value of hup,
// until ctx ends.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	// Without a watcher, events and errs stay nil and SIGHUP still works.
	var (
		events <-chan fsnotify.Event
		errs   <-chan error
		watch  = func() {}
	)
	if w, err := fsnotify.NewWatcher(); err != nil {
		r.log.Warn("cannot watch the configuration's files; reload with SIGHUP", slog.Any("error", err))
	} else {
		defer w.Close()
		events, errs = w.Events, w.Errors
		watch = func() {
			for _, d := range r.watched() {
				// Again after each reload: a watched directory replaced
				// by a new one (a Secret's swapped data) is watched anew.
				if err := w.Add(d); err != nil {
					r.log.Debug("cannot watch a directory of the configuration's files", slog.String("directory", d), slog.Any("error", err))
				}
			}
		}
	}
	watch()
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload("SIGHUP")
		case _, ok := <-events:
			if !ok {
				return
			}
			if settle == nil {
				settle = time.After(reloadDebounce)
			}
		case err, ok := <-errs:
			if ok {
				r.log.Warn("watching the configuration's files failed; reload with SIGHUP", slog.Any("error", err))
			}
		case <-settle:
			settle = nil
			r.reload("files changed")
			watch()
		}
	}
}
