package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/go-viper/mapstructure/v2"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// A sink's section is a top-level section of the file (kafka) that
// defines a destination of the sink named as the section (see
// sink.Section). The configuration knows sections only through the sink
// registry: their settings, defaults, environment variables and secrets
// are the sink's.

// sections lists the registered sinks that have a section, by name.
func sections() []sink.Sink {
	var out []sink.Sink
	for _, kind := range sink.Kinds() {
		if s, _ := sink.Lookup(kind); s.Section != nil {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b sink.Sink) int { return strings.Compare(a.Section.Name, b.Section.Name) })
	return out
}

// sectionSink returns the sink whose section is named name.
func sectionSink(name string) (sink.Sink, bool) {
	for _, s := range sections() {
		if s.Section.Name == name {
			return s, true
		}
	}
	return sink.Sink{}, false
}

// settingPaths lists the dotted path of every setting that has an
// environment variable: the sections' of the Config type and of each
// sink's section.
func settingPaths() []string {
	paths := leafPaths(reflect.TypeOf(Config{}), "")
	for _, s := range sections() {
		paths = append(paths, leafPaths(reflect.TypeOf(s.Section.Defaults()).Elem(), s.Section.Name+".")...)
	}
	return paths
}

// defaultSettings maps the path of every setting to its value before the
// file.
func defaultSettings() map[string]any {
	def := leaves(reflect.ValueOf(defaults()), "")
	for _, s := range sections() {
		for path, v := range leaves(reflect.ValueOf(s.Section.Defaults()).Elem(), s.Section.Name+".") {
			def[path] = v
		}
	}
	return def
}

// secretPaths maps each setting that holds a secret to the setting that
// names a file holding it: a secret is a setting beside one of its name
// and _file (database.url and database.url_file).
func secretPaths() map[string]string {
	paths := settingPaths()
	out := map[string]string{}
	for _, p := range paths {
		if secret, ok := strings.CutSuffix(p, "_file"); ok && slices.Contains(paths, secret) {
			out[secret] = p
		}
	}
	return out
}

// Section returns the settings of the sink section named name (kafka),
// or nil.
func (c *Config) Section(name string) sink.Config { return c.sections[name] }

// decodeSections decodes each sink section of the file onto the sink's
// type, and reports every other top-level key as unknown.
func (c *Config) decodeSections(dec *mapstructure.DecoderConfig) []decodeProblem {
	var out []decodeProblem
	c.sections = map[string]sink.Config{}
	for key, raw := range c.Extra {
		s, ok := sectionSink(key)
		if !ok {
			out = append(out, decodeProblem{key, "unknown setting " + key})
			continue
		}
		settings := s.New()
		out = append(out, decodeOnto(settings, raw, key, dec)...)
		c.sections[key] = settings
	}
	return out
}

// decodeOnto decodes raw onto settings with the decoder settings of the
// rest (dec), reporting problems under at.
func decodeOnto(settings any, raw any, at string, dec *mapstructure.DecoderConfig) []decodeProblem {
	conf := *dec
	conf.Result = settings
	decoder, err := mapstructure.NewDecoder(&conf)
	if err == nil {
		err = decoder.Decode(raw)
	}
	if err == nil {
		return nil
	}
	var out []decodeProblem
	for _, p := range decodeProblems(err) {
		path, text := at, at+": "+p.text
		if p.path != "" {
			path += "." + p.path
			text = strings.Replace(p.text, p.path, path, 1)
		}
		out = append(out, decodeProblem{path, text})
	}
	return out
}

// sectionDefined reports whether the section named name defines its
// destination: its settings are valid but for missing required ones.
func (c *Config) sectionDefined(name string) bool {
	settings := c.sections[name]
	return settings != nil && len(missing(settings.Validate())) == 0
}

// missing returns the required settings err reports missing.
func missing(err error) []*sink.RequiredError {
	var out []*sink.RequiredError
	for _, e := range splitErrors(err) {
		var re *sink.RequiredError
		if errors.As(e, &re) {
			out = append(out, re)
		}
	}
	return out
}

// splitErrors returns the errors joined in err.
func splitErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// sectionProblems checks the sink sections. A section that misses a
// required setting defines no destination; that is a problem only when
// routes send to it (need: every route, without routes, goes to
// DefaultKafkaDestination).
func (c *Config) sectionProblems(need Need) []string {
	var p []string
	for _, s := range sections() {
		name := s.Section.Name
		settings := c.sections[name]
		if settings == nil {
			continue
		}
		needed := need&NeedDestinations != 0 && (c.routesTo(name) || (len(c.Routes) == 0 && name == DefaultKafkaDestination))
		for _, e := range splitErrors(settings.Validate()) {
			var re *sink.RequiredError
			if !errors.As(e, &re) {
				p = append(p, sinkProblems(name, settings, e)...)
				continue
			}
			if needed {
				path := name + "." + re.Setting
				format := ""
				if re.Format != "" {
					format = " (" + re.Format + ")"
				}
				p = append(p, fmt.Sprintf("%s is required: set %s%s or %s in the file", path, EnvName(path), format, path))
			}
		}
		p = append(p, foreverProblems(name+".", reflect.ValueOf(settings).Elem())...)
	}
	return p
}

// resolveSections reads the secrets the sections' settings name.
func (c *Config) resolveSections(lookupEnv func(string) (string, bool)) []string {
	var p []string
	for _, s := range sections() {
		if settings := c.sections[s.Section.Name]; settings != nil {
			p = append(p, sinkProblems(s.Section.Name, settings, settings.Resolve(lookupEnv))...)
		}
	}
	return p
}

// values maps the path of every setting of c to its value.
func (c *Config) values() map[string]any {
	out := leaves(reflect.ValueOf(*c), "")
	for name, settings := range c.sections {
		for path, v := range leaves(reflect.ValueOf(settings).Elem(), name+".") {
			out[path] = v
		}
	}
	return out
}
