// Package config loads the relay's configuration: defaults, then a YAML file,
// then OUTBOX_* environment variables, then command-line flags, each
// overriding the one before. Validation reports every problem at once.
//
// Every setting has an environment variable named after its path:
// database.url is OUTBOX_DATABASE_URL, log.level is OUTBOX_LOG_LEVEL. Secrets
// (the database URL) come from the environment, the file, or a *_file setting
// naming a file to read; they have no flags, because command lines are
// visible to every user of the machine.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// EnvPrefix starts the name of every configuration environment variable.
const EnvPrefix = "OUTBOX_"

// EnvConfigFile names the variable that points at the YAML file when
// --config is not given.
const EnvConfigFile = "OUTBOX_CONFIG"

// Defaults.
const (
	DefaultSchema         = migrations.DefaultSchema
	DefaultMaxConns       = 10
	DefaultConnectTimeout = 10 * time.Second
	DefaultLogLevel       = "info"
	DefaultLogFormat      = "text"
)

// Config is the whole configuration.
type Config struct {
	Database Database `koanf:"database"`
	Log      Log      `koanf:"log"`
}

// Database configures the PostgreSQL connection.
type Database struct {
	// URL is the connection string (postgres://user:pass@host/db or
	// key=value form). A secret: set it with OUTBOX_DATABASE_URL or in the
	// file, or put it in a file named by url_file.
	URL string `koanf:"url"`
	// URLFile names a file holding the connection string, such as a
	// mounted Kubernetes Secret. Used when URL is empty.
	URLFile string `koanf:"url_file"`
	// Schema holds the outbox table. Default "public".
	Schema string `koanf:"schema"`
	// MaxConns bounds the relay's connections to the database. Default 10.
	MaxConns int32 `koanf:"max_conns"`
	// ConnectTimeout bounds each connection attempt, unless the URL sets
	// connect_timeout itself. Default 10s.
	ConnectTimeout time.Duration `koanf:"connect_timeout"`
}

// Log configures logging.
type Log struct {
	// Level is debug, info, warn or error. Default info.
	Level string `koanf:"level"`
	// Format is text or json. Default text.
	Format string `koanf:"format"`
}

func defaults() Config {
	return Config{
		Database: Database{
			Schema:         DefaultSchema,
			MaxConns:       DefaultMaxConns,
			ConnectTimeout: DefaultConnectTimeout,
		},
		Log: Log{Level: DefaultLogLevel, Format: DefaultLogFormat},
	}
}

// Flags are the command-line flags that override settings, bound to a flag
// set by Bind.
type Flags struct {
	configFile string
	fs         *pflag.FlagSet
	keys       map[string]string // flag name → setting path
}

// Bind adds --config and one flag per non-secret setting that operators
// commonly override to fs.
func Bind(fs *pflag.FlagSet) *Flags {
	f := &Flags{fs: fs, keys: map[string]string{}}
	fs.StringVar(&f.configFile, "config", "", "YAML configuration file (default $"+EnvConfigFile+")")
	add := func(name, key, usage string) {
		fs.String(name, "", usage+" (env "+EnvName(key)+")")
		f.keys[name] = key
	}
	add("schema", "database.schema", "schema that holds the outbox table")
	add("log-level", "log.level", "log level: debug, info, warn, error")
	add("log-format", "log.format", "log format: text or json")
	return f
}

// EnvName is the environment variable for the setting at path.
func EnvName(path string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// Error is a configuration that cannot be used. It lists every problem.
type Error struct{ Problems []string }

func (e *Error) Error() string {
	if len(e.Problems) == 1 {
		return "invalid configuration: " + e.Problems[0]
	}
	return "invalid configuration:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// Load builds the configuration from the file (flag --config, else
// OUTBOX_CONFIG), the environment and the flags, and validates it. A
// returned *Error lists every problem found.
func Load(flags *Flags, environ []string) (*Config, error) {
	env := envMap(environ)
	k := koanf.New(".")
	var problems []string

	def := defaults()
	for path, v := range leaves(reflect.ValueOf(def), "") {
		_ = k.Set(path, v)
	}
	paths := leafPaths(reflect.TypeOf(def), "")

	cfgFile := env[EnvConfigFile]
	if flags != nil && flags.configFile != "" {
		cfgFile = flags.configFile
	}
	if cfgFile != "" {
		if err := k.Load(file.Provider(cfgFile), yaml.Parser()); err != nil {
			problems = append(problems, fmt.Sprintf("read %s: %v", cfgFile, err))
		}
	}
	for _, path := range paths {
		if v, ok := env[EnvName(path)]; ok {
			_ = k.Set(path, v)
		}
	}
	if flags != nil {
		for name, path := range flags.keys {
			if fl := flags.fs.Lookup(name); fl != nil && fl.Changed {
				_ = k.Set(path, fl.Value.String())
			}
		}
	}

	var cfg Config
	failed := map[string]bool{} // settings that did not decode
	dec := &mapstructure.DecoderConfig{
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
			mapstructure.TextUnmarshallerHookFunc(),
		),
		WeaklyTypedInput: true,
		ErrorUnused:      true,
		Result:           &cfg,
		TagName:          "koanf",
	}
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{DecoderConfig: dec}); err != nil {
		for _, p := range decodeProblems(err) {
			problems = append(problems, p.text)
			failed[p.path] = true
		}
	}
	if cfg.Database.URL == "" && cfg.Database.URLFile != "" {
		b, err := os.ReadFile(cfg.Database.URLFile)
		if err != nil {
			problems = append(problems, fmt.Sprintf("database.url_file: %v", err))
		} else {
			cfg.Database.URL = strings.TrimSpace(string(b))
		}
	}
	if err := cfg.Validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			for _, p := range ce.Problems {
				path, _, _ := strings.Cut(p, " ")
				if !failed[strings.TrimSuffix(path, ":")] {
					problems = append(problems, p)
				}
			}
		}
	}
	if len(problems) > 0 {
		return nil, &Error{Problems: problems}
	}
	return &cfg, nil
}

// Validate reports every problem of c at once as an *Error, or nil.
func (c *Config) Validate() error {
	var p []string
	if c.Database.URL == "" {
		p = append(p, "database.url is required: set "+EnvName("database.url")+", database.url in the file, or database.url_file")
	} else if _, err := pgxpool.ParseConfig(c.Database.URL); err != nil {
		p = append(p, "database.url: "+Redact(err.Error(), c.Database.URL))
	}
	if err := migrations.ValidateSchema(c.Database.Schema); err != nil {
		p = append(p, "database.schema: "+err.Error())
	}
	if c.Database.MaxConns < 2 {
		p = append(p, fmt.Sprintf("database.max_conns is %d; it must be at least 2 (one listens for wake-ups)", c.Database.MaxConns))
	}
	if c.Database.ConnectTimeout <= 0 {
		p = append(p, fmt.Sprintf("database.connect_timeout is %s; it must be positive", c.Database.ConnectTimeout))
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		p = append(p, "log.level: "+err.Error())
	}
	if !slices.Contains([]string{"text", "json"}, c.Log.Format) {
		p = append(p, fmt.Sprintf("log.format is %q; use text or json", c.Log.Format))
	}
	if len(p) > 0 {
		return &Error{Problems: p}
	}
	return nil
}

// ParseLevel parses a log level name.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("unknown level %q; use debug, info, warn or error", s)
	}
	return l, nil
}

// PoolConfig returns the pgx pool configuration for the database settings.
func (d Database) PoolConfig() (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		return nil, errors.New(Redact(err.Error(), d.URL))
	}
	pc.MaxConns = d.MaxConns
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = d.ConnectTimeout
	}
	return pc, nil
}

// Redact removes the password of dsn from s, and a whole dsn that carries
// a password, so that errors and logs never show it.
func Redact(s, dsn string) string {
	if dsn == "" {
		return s
	}
	for _, secret := range passwords(dsn) {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "xxxxx")
		}
	}
	return s
}

// RedactURL returns dsn with its password replaced, for display.
func RedactURL(dsn string) string { return Redact(dsn, dsn) }

func passwords(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
		if pw := u.Query().Get("password"); pw != "" {
			out = append(out, pw, url.QueryEscape(pw))
		}
	}
	// key=value form: password=secret or password='se cret'.
	for _, f := range strings.Fields(dsn) {
		if v, ok := strings.CutPrefix(f, "password="); ok {
			out = append(out, strings.Trim(v, "'"))
		}
	}
	// Longest first, so a short secret inside a longer one does not leave
	// the rest of the longer one visible.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

type decodeProblem struct{ path, text string }

// decodeProblems turns mapstructure's report into one line per setting.
func decodeProblems(err error) []decodeProblem {
	var out []decodeProblem
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "*"))
		if line == "" || strings.HasSuffix(line, "error(s) decoding:") || strings.HasPrefix(line, "decoding failed due to the following error") {
			continue
		}
		// Lines look like "'database.max_conns' cannot parse ..." or
		// "'database' has invalid keys: a, b".
		path, rest := "", line
		if q, r, ok := strings.Cut(strings.TrimPrefix(line, "'"), "' "); ok && strings.HasPrefix(line, "'") {
			path, rest = q, r
		}
		if keys, ok := strings.CutPrefix(rest, "has invalid keys: "); ok {
			for _, k := range strings.Split(keys, ", ") {
				full := k
				if path != "" {
					full = path + "." + k
				}
				out = append(out, decodeProblem{full, "unknown setting " + full})
			}
			continue
		}
		out = append(out, decodeProblem{path, path + ": " + rest})
	}
	if len(out) == 0 {
		out = append(out, decodeProblem{"", err.Error()})
	}
	return out
}

func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, EnvPrefix) {
			m[k] = v
		}
	}
	return m
}

// leafPaths lists the dotted paths of every setting of type t.
func leafPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("koanf")
		if tag == "" || tag == "-" {
			continue
		}
		path := prefix + tag
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}) {
			out = append(out, leafPaths(f.Type, path+".")...)
			continue
		}
		out = append(out, path)
	}
	return out
}

// leaves maps the dotted path of every setting of v to its value.
func leaves(v reflect.Value, prefix string) map[string]any {
	out := map[string]any{}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("koanf")
		if tag == "" || tag == "-" {
			continue
		}
		path := prefix + tag
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}) {
			for k, x := range leaves(v.Field(i), path+".") {
				out[k] = x
			}
			continue
		}
		out[path] = v.Field(i).Interface()
	}
	return out
}
