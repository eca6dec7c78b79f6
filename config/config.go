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
	"maps"
	"reflect"
	"regexp"
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
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/retry"
	"github.com/outbox-relay/outbox-relay/relay/sink"
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
	DefaultQueryTimeout   = relay.DefaultQueryTimeout
	DefaultLogLevel       = "info"
	DefaultLogFormat      = "text"
)

// Config is the whole configuration.
type Config struct {
	Database Database `koanf:"database"`
	Log      Log      `koanf:"log"`
	Admin    Admin    `koanf:"admin"`
	Relay    Relay    `koanf:"relay"`
	Retry    Retry    `koanf:"retry"`
	// Extra holds every other top-level key: a sink's section, such as
	// kafka (the destination named kafka, when its brokers are set),
	// decoded onto the sink's type after the rest (see Section).
	Extra map[string]any `koanf:",remain"`
	// Destinations are further Kafka clusters, HTTP endpoints and other
	// sinks, by name.
	Destinations map[string]Destination `koanf:"destinations"`
	// Routes map topics to destinations, first match first. Without
	// routes every topic goes to the kafka destination.
	Routes []Route `koanf:"routes"`
	// OutboxList lists the outbox tables to deliver from (outboxes in the
	// file); without it, the one of the database section. See Outboxes.
	OutboxList []Outbox `koanf:"outboxes"`
	// Coordination shares flow control among the relay's replicas.
	Coordination Coordination `koanf:"coordination"`

	sections map[string]sink.Config // decoded from Extra, by name
}

// Need says what a command requires of the configuration beyond what is
// always checked.
type Need int

const (
	// NeedDatabase: the database URL (migrate, run, dlq).
	NeedDatabase Need = 1 << iota
	// NeedDestinations: somewhere to deliver (run).
	NeedDestinations
)

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
	// MaxConns bounds the relay's connections to the database: at least
	// workers + 2, and 2 × workers + 2 for workers to claim ahead (see
	// relay.Config.Workers). Default 10.
	MaxConns int32 `koanf:"max_conns"`
	// ConnectTimeout bounds each connection attempt, unless the URL sets
	// connect_timeout itself. Default 10s.
	ConnectTimeout time.Duration `koanf:"connect_timeout"`
	// QueryTimeout bounds each claim, write-back and cleanup batch of the
	// relay: a database that does not answer in time (a crash, a network
	// black hole) is given up on and the connection dropped; the batch's
	// rows stay pending until the server ends its transaction. Default
	// 30s.
	QueryTimeout time.Duration `koanf:"query_timeout"`
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
			QueryTimeout:   DefaultQueryTimeout,
		},
		Log: Log{Level: DefaultLogLevel, Format: DefaultLogFormat},
		Admin: Admin{Listen: DefaultAdminListen, HistoryInterval: time.Minute, TrustedProxies: []string{}, ConsoleTokenLogin: true,
			OIDC: AdminOIDC{Scopes: []string{"openid", "profile", "email"}, GroupsClaim: "groups", GroupRoles: []string{}, Name: "single sign-on"}},
		Relay: defaultRelay(),
		Retry: Retry{
			PolicyConfig: retry.PolicyConfig{}.WithDefaults(),
			Pause:        relay.PauseConfig{}.WithDefaults(),
		},
		Coordination: defaultCoordination(),
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

// SecretFlag reports whether an unknown command-line flag looks like an
// attempt to pass a secret, and if so returns how to give it instead.
// Command lines are visible to every user of the machine (ps, /proc), so
// secrets have no flags.
func SecretFlag(name string) (hint string, ok bool) {
	norm := strings.NewReplacer("_", "-", ".", "-").Replace(strings.ToLower(strings.TrimLeft(name, "-")))
	for path, file := range secretPaths() {
		if norm == strings.NewReplacer(".", "-", "_", "-").Replace(path) || norm == strings.NewReplacer(".", "-", "_", "-").Replace(file) {
			return fmt.Sprintf("set %s, or %s in the configuration file", EnvName(path), file), true
		}
	}
	for _, word := range []string{"password", "passwd", "token", "secret", "dsn", "database-url", "db-url"} {
		if strings.Contains(norm, word) {
			return "secrets come from OUTBOX_* environment variables or *_file settings (see the configuration reference)", true
		}
	}
	return "", false
}

// EnvName is the environment variable for the setting at path.
func EnvName(path string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// File is the configuration file Load reads: --config, else OUTBOX_CONFIG;
// "" for none.
func File(flags *Flags, environ []string) string {
	if flags != nil && flags.configFile != "" {
		return flags.configFile
	}
	return envMap(environ)[EnvConfigFile]
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
// OUTBOX_CONFIG), the environment and the flags, and validates it for what
// the command needs. A returned *Error lists every problem found.
func Load(flags *Flags, environ []string, need Need) (*Config, error) {
	env := envMap(environ)
	k := koanf.New(".")
	var problems []string

	for path, v := range defaultSettings() {
		_ = k.Set(path, v)
	}
	paths := settingPaths()

	cfgFile := File(flags, environ)
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
			foreverHook,
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
	readSecret := func(path, file string, into *string) {
		if *into != "" || file == "" {
			return
		}
		v, err := sink.ReadSecretFile(path, file)
		if err != nil {
			problems = append(problems, err.Error())
		}
		*into = v
	}
	readSecret("database.url_file", cfg.Database.URLFile, &cfg.Database.URL)
	for i := range cfg.OutboxList {
		o := &cfg.OutboxList[i]
		readSecret(fmt.Sprintf("outboxes[%d].url_file", i), o.URLFile, &o.URL)
	}
	if cfg.Admin.OIDC.ClientSecret == "" && cfg.Admin.OIDC.ClientSecretFile != "" {
		cfg.Admin.OIDC.secretFromFile = true
		readSecret("admin.oidc.client_secret_file", cfg.Admin.OIDC.ClientSecretFile, &cfg.Admin.OIDC.ClientSecret)
	}
	if cfg.Admin.Token == "" && cfg.Admin.TokenFile != "" {
		cfg.Admin.tokenFromFile = true
		readSecret("admin.token_file", cfg.Admin.TokenFile, &cfg.Admin.Token)
	}
	// The sections first: named destinations inherit from them.
	undecoded := cfg.decodeSections(dec)
	for _, p := range append(undecoded, cfg.decodeSinks(dec)...) {
		problems = append(problems, p.text)
		failed[p.path] = true
	}
	problems = append(problems, cfg.resolveSections(lookupEnv(environ))...)
	problems = append(problems, cfg.resolveSinks(lookupEnv(environ))...)
	if err := cfg.Validate(need); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			for _, p := range ce.Problems {
				path, _, _ := strings.Cut(p, " ")
				if !failed[strings.TrimSuffix(path, ":")] && !undecodedDestination(p, failed) {
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

// Validate reports every problem of c, for what a command needs, at once
// as an *Error, or nil.
func (c *Config) Validate(need Need) error {
	var p []string
	if c.Database.URL == "" {
		if need&NeedDatabase != 0 && len(c.OutboxList) == 0 {
			p = append(p, "database.url is required: set "+EnvName("database.url")+", database.url in the file, or database.url_file")
		}
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
	if c.Database.QueryTimeout <= 0 {
		p = append(p, fmt.Sprintf("database.query_timeout is %s; it must be positive", c.Database.QueryTimeout))
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		p = append(p, "log.level: "+err.Error())
	}
	if !slices.Contains([]string{"text", "json"}, c.Log.Format) {
		p = append(p, fmt.Sprintf("log.format is %q; use text or json", c.Log.Format))
	}
	p = append(p, c.outboxProblems(need)...)
	p = append(p, c.coordinationProblems()...)
	p = append(p, c.Admin.problems()...)
	p = append(p, foreverProblems("", reflect.ValueOf(*c))...)
	p = append(p, c.Relay.problems(c.Database.MaxConns)...)
	p = append(p, c.Retry.problems()...)
	p = append(p, c.sectionProblems(need)...)
	p = append(p, c.destinationProblems()...)
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

// undecodedDestination reports whether problem is a route naming a
// destination whose settings did not decode: the destination is missing
// only because of the problem already reported.
func undecodedDestination(problem string, failed map[string]bool) bool {
	m := undefinedDestination.FindStringSubmatch(problem)
	if m == nil {
		return false
	}
	for path := range failed {
		if strings.HasPrefix(path, "destinations["+m[1]+"]") || strings.HasPrefix(path, "destinations."+m[1]+".") {
			return true
		}
	}
	return false
}

var undefinedDestination = regexp.MustCompile(`^routes: route \d+: destination "([^"]+)" is not defined`)

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
		tag, squash := settingTag(f)
		if tag == "" && !squash {
			continue
		}
		path := prefix + tag
		switch {
		case squash:
			out = append(out, leafPaths(f.Type, prefix)...)
		case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}):
			out = append(out, leafPaths(f.Type, path+".")...)
		case !nested(f.Type): // named entries come from the file only
			out = append(out, path)
		}
	}
	return out
}

// settingTag is the setting a field holds: its koanf name, or squash for
// a struct whose settings are its parent's (koanf:",squash"); "" and
// false for a field that holds none.
func settingTag(f reflect.StructField) (name string, squash bool) {
	tag := f.Tag.Get("koanf")
	if tag == "-" {
		return "", false
	}
	name, opts, _ := strings.Cut(tag, ",")
	return name, name == "" && opts == "squash"
}

// leaves maps the dotted path of every setting of v to its value.
func leaves(v reflect.Value, prefix string) map[string]any {
	out := map[string]any{}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag, squash := settingTag(f)
		if tag == "" && !squash {
			continue
		}
		path := prefix + tag
		switch {
		case squash:
			maps.Copy(out, leaves(v.Field(i), prefix))
		case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}):
			maps.Copy(out, leaves(v.Field(i), path+"."))
		case !nested(f.Type):
			out[path] = v.Field(i).Interface()
		}
	}
	return out
}

// nested reports whether t holds settings of its own (destinations,
// routes): such settings have no environment variables or defaults by
// path.
func nested(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Map, reflect.Slice:
		e := t.Elem()
		return e.Kind() == reflect.Struct || (t.Kind() == reflect.Map && e.Kind() != reflect.String)
	}
	return false
}
