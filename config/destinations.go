package config

import (
	"cmp"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/go-viper/mapstructure/v2"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// DefaultKafkaDestination names the destination the kafka section
// defines.
const DefaultKafkaDestination = "kafka"

// Destination is a named destination: the relay's settings for it (the
// relay's own type, which validates them), and the settings of exactly one
// sink under the sink's kind (kafka, http), which the sink owns (see
// relay/sink). MaxInFlight defaults to the sink's: 0, unlimited, for
// Kafka; 64 for HTTP.
type Destination struct {
	relay.Destination `koanf:",squash"`
	// Format is how the destination's messages are written: format
	// (raw or cloudevents) and cloudevents (see relay/cloudevents).
	Format cloudevents.Settings `koanf:",squash"`
	// Sinks holds every other key: the sink's settings under its kind,
	// decoded onto the sink's own type after the rest.
	Sinks map[string]any `koanf:",remain"`

	kind     string
	settings sink.Config
}

// Sink returns the kind of d's sink and its settings.
func (d Destination) Sink() (kind string, settings sink.Config) { return d.kind, d.settings }

// Route maps topics to a destination.
type Route struct {
	// Topics are names or globs (*, ?, [a-z]).
	Topics []string `koanf:"topics"`
	// Destination is kafka (the kafka section) or a destinations entry.
	Destination string `koanf:"destination"`
	// Topic replaces the row's topic, on destinations whose sink names
	// topics (Kafka).
	Topic string `koanf:"topic"`
}

var destinationName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// routesTo reports whether a route names dest.
func (c *Config) routesTo(dest string) bool {
	for _, r := range c.Routes {
		if r.Destination == dest {
			return true
		}
	}
	return false
}

// decodeSinks decodes each destination's sink settings onto the type its
// sink registered, with the decoder settings of the rest (dec), and gives
// a destination that sets no bulkhead its sink's.
func (c *Config) decodeSinks(dec *mapstructure.DecoderConfig) []decodeProblem {
	var out []decodeProblem
	for name, d := range c.Destinations {
		at := "destinations." + name
		for key, raw := range d.Sinks {
			s, ok := sink.Lookup(key)
			if !ok {
				out = append(out, decodeProblem{at + "." + key, "unknown setting " + at + "." + key})
				continue
			}
			if d.settings != nil {
				continue // reported by destinationProblems
			}
			settings := s.New()
			if problems := decodeOnto(settings, raw, at+"."+key, dec); len(problems) > 0 {
				out = append(out, problems...)
				continue
			}
			if in, ok := settings.(sink.Inheritor); ok && s.Section != nil && c.sections[s.Section.Name] != nil {
				in.Inherit(c.sections[s.Section.Name])
			}
			d.kind, d.settings = key, settings
			if d.MaxInFlight == 0 {
				d.MaxInFlight = s.MaxInFlight
			}
		}
		c.Destinations[name] = d
	}
	return out
}

// resolveSinks reads the secrets the sinks' settings name.
func (c *Config) resolveSinks(lookupEnv func(string) (string, bool)) []string {
	var p []string
	for name, d := range c.Destinations {
		if d.settings != nil {
			p = append(p, sinkProblems("destinations."+name+"."+d.kind, d.settings, d.settings.Resolve(lookupEnv))...)
		}
	}
	return p
}

// Deprecations lists the settings given in a form that still works but
// will be removed, each with its path and what to use instead.
func (c *Config) Deprecations() []string {
	var out []string
	add := func(at string, settings sink.Config) {
		if d, ok := settings.(sink.Deprecator); ok {
			for _, line := range d.Deprecated() {
				out = append(out, at+"."+line)
			}
		}
	}
	for _, s := range sections() {
		if settings := c.sections[s.Section.Name]; settings != nil {
			add(s.Section.Name, settings)
		}
	}
	for name, d := range c.Destinations {
		if d.settings != nil {
			add("destinations."+name+"."+d.kind, d.settings)
		}
	}
	slices.Sort(out)
	return out
}

// sinkProblems turns a sink's error into problems under at, one per line:
// a line about one setting of the sink's settings joins its path to at
// (destinations.x.http.url is required); another follows at and a colon.
func sinkProblems(at string, settings any, err error) []string {
	if err == nil {
		return nil
	}
	paths := leafPaths(reflect.TypeOf(settings).Elem(), "")
	var p []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line == "" {
			continue
		}
		head := line[:strings.IndexAny(line+" ", " :")]
		if slices.ContainsFunc(paths, func(s string) bool { return s == head || strings.HasPrefix(s, head+".") }) {
			p = append(p, at+"."+line)
		} else {
			p = append(p, at+": "+line)
		}
	}
	return p
}

// destinationProblems checks the named destinations and the routes.
func (c *Config) destinationProblems() []string {
	var p []string
	names := []string{}
	for _, s := range sections() {
		if c.sectionDefined(s.Section.Name) {
			names = append(names, s.Section.Name)
		}
	}
	for name, d := range c.Destinations {
		at := "destinations." + name
		var kinds int
		for key := range d.Sinks {
			if _, ok := sink.Lookup(key); ok {
				kinds++
			}
		}
		switch {
		case c.sections[name] != nil:
			// A sink section's destination: its relay settings only.
			if kinds > 0 {
				p = append(p, at+" holds the relay settings of the "+name+" section's destination (max_in_flight, breaker, rate_limit, …), not a sink; name another destination to add one")
			}
			for _, re := range missing(c.sections[name].Validate()) {
				p = append(p, at+" sets the "+name+" section's destination, which needs "+name+"."+re.Setting)
			}
		case !destinationName.MatchString(name):
			p = append(p, at+": a destination name is lowercase letters, digits, - and _")
			fallthrough
		default:
			names = append(names, name)
			if kinds != 1 {
				p = append(p, at+" needs exactly one of "+orList(sink.Kinds()))
			}
		}
		if d.settings != nil {
			p = append(p, sinkProblems(at+"."+d.kind, d.settings, d.settings.Validate())...)
			p = append(p, foreverProblems(at+"."+d.kind+".", reflect.ValueOf(d.settings).Elem())...)
		}
		p = append(p, foreverProblems(at+".", reflect.ValueOf(d))...)
		settings := d.relayDestination(name)
		p = append(p, lines(at+".", settings.ValidateSettings())...)
		if s, ok := c.sinkOf(name); ok {
			p = append(p, lines(at+".", d.Format.Validate(s.CloudEventsPrefix))...)
		}
		if len(c.Routes) > 0 && !c.routesTo(name) {
			p = append(p, at+" is not used by any route")
		}
	}
	if len(c.Routes) == 0 {
		if len(c.named()) > 0 {
			p = append(p, "routes are required with destinations: say which topics go where")
		}
	} else if err := relay.ValidateRoutes(c.relayRoutes(), names); err != nil {
		p = append(p, lines("routes: ", err)...)
	}
	for i, r := range c.Routes {
		if r.Topic == "" {
			continue
		}
		s, ok := c.sinkOf(r.Destination)
		switch {
		case !ok:
		case s.ValidateTopic == nil:
			p = append(p, fmt.Sprintf("routes: route %d: topic is only for %s destinations", i+1, orList(topicKinds())))
		default:
			if err := s.ValidateTopic(r.Topic); err != nil {
				p = append(p, fmt.Sprintf("routes: route %d: %v", i+1, err))
			}
		}
	}
	sort.Strings(p)
	return p
}

// named lists the destinations other than the sections', sorted.
func (c *Config) named() []string {
	names := make([]string, 0, len(c.Destinations))
	for name := range c.Destinations {
		if c.sections[name] == nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// sinkOf returns the sink of the destination named name.
func (c *Config) sinkOf(name string) (sink.Sink, bool) {
	if s, ok := sectionSink(name); ok && c.sections[name] != nil {
		return s, true
	}
	if d, ok := c.Destinations[name]; ok {
		return sink.Lookup(d.kind)
	}
	return sink.Sink{}, false
}

// topicKinds lists the sinks whose destinations take a route's topic.
func topicKinds() []string {
	var out []string
	for _, k := range sink.Kinds() {
		if s, _ := sink.Lookup(k); s.ValidateTopic != nil {
			out = append(out, k)
		}
	}
	return out
}

// orList writes a, b or c.
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

func (c *Config) relayRoutes() []relay.Route {
	out := make([]relay.Route, 0, len(c.Routes))
	for _, r := range c.Routes {
		out = append(out, relay.Route{Topics: r.Topics, Destination: r.Destination, Topic: r.Topic})
	}
	return out
}

// DestinationSettings are what the relay needs of a destination: its
// sink, the sink's settings, and the relay's settings.
type DestinationSettings struct {
	Name     string
	Sink     sink.Sink
	Settings sink.Config
	Relay    relay.Destination // without a Publisher
	// Format is how messages are written (raw or CloudEvents).
	Format cloudevents.Settings
}

// DestinationList lists the destinations and the routes for the relay:
// the sections' (kafka) that are defined and routed to, then the named
// ones, sorted by name. Without routes, every topic goes to kafka.
func (c *Config) DestinationList() ([]DestinationSettings, []relay.Route) {
	var out []DestinationSettings
	for _, s := range sections() {
		name := s.Section.Name
		if c.sectionDefined(name) && (c.routesTo(name) || (len(c.Routes) == 0 && name == DefaultKafkaDestination)) {
			rd := c.Destinations[name].relayDestination(name)
			rd.MaxInFlight = cmp.Or(rd.MaxInFlight, s.MaxInFlight)
			out = append(out, DestinationSettings{Name: name, Sink: s, Settings: c.sections[name], Relay: rd,
				Format: c.Destinations[name].Format})
		}
	}
	for _, name := range c.named() {
		d := c.Destinations[name]
		s, _ := sink.Lookup(d.kind)
		out = append(out, DestinationSettings{Name: name, Sink: s, Settings: d.settings, Relay: d.relayDestination(name), Format: d.Format})
	}
	routes := c.relayRoutes()
	if len(routes) == 0 {
		routes = []relay.Route{{Topics: []string{"*"}, Destination: DefaultKafkaDestination}}
	}
	return out, routes
}

// relayDestination is d's relay settings under its name.
func (d Destination) relayDestination(name string) relay.Destination {
	rd := d.Destination
	rd.Name = name
	return rd
}

// lookupEnv looks variables up in environ, for settings that name one.
func lookupEnv(environ []string) func(string) (string, bool) {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}
