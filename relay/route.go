package relay

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"strconv"
	"sync"

	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Route sends the rows of matching topics to a destination. Routes are
// tried in order; the first match wins.
type Route struct {
	// Topics are exact topic names or glob patterns (*, ?, [a-z]).
	Topics []string
	// Destination names the destination.
	Destination string
	// Topic, when set, replaces the row's topic as the Kafka topic.
	Topic string
}

// ValidateRoutes checks routes against the destinations' names: every
// route names a known destination and has valid patterns.
func ValidateRoutes(routes []Route, destinations []string) error {
	var errs []error
	known := map[string]bool{}
	for _, d := range destinations {
		known[d] = true
	}
	for i, rt := range routes {
		if len(rt.Topics) == 0 {
			errs = append(errs, fmt.Errorf("route %d has no topics", i+1))
		}
		for _, t := range rt.Topics {
			if _, err := path.Match(t, ""); err != nil || t == "" {
				errs = append(errs, fmt.Errorf("route %d: topic pattern %q is not a valid glob", i+1, t))
			}
		}
		if !known[rt.Destination] {
			errs = append(errs, fmt.Errorf("route %d: destination %q is not defined", i+1, rt.Destination))
		}
	}
	return errors.Join(errs...)
}

// router maps topics to destinations, first matching route first, and
// remembers the answers: topics are few, rows are many.
type router struct {
	routes []compiledRoute
	mu     sync.RWMutex
	cache  map[string]routing
}

type compiledRoute struct {
	patterns []string
	dest     int
	topic    string
}

// routing is where a topic goes; dest is -1 when no route matches.
type routing struct {
	dest  int
	topic string
}

// maxCachedTopics bounds the router's memory whatever the producers write.
const maxCachedTopics = 10000

func newRouter(routes []Route, index map[string]int) *router {
	rt := &router{cache: map[string]routing{}}
	for _, r := range routes {
		rt.routes = append(rt.routes, compiledRoute{patterns: r.Topics, dest: index[r.Destination], topic: r.Topic})
	}
	return rt
}

func (rt *router) route(topic string) routing {
	rt.mu.RLock()
	got, ok := rt.cache[topic]
	rt.mu.RUnlock()
	if ok {
		return got
	}
	got = routing{dest: -1}
	for _, r := range rt.routes {
		if matchAny(r.patterns, topic) {
			got = routing{dest: r.dest, topic: r.topic}
			break
		}
	}
	if got.topic == "" {
		got.topic = topic
	}
	rt.mu.Lock()
	if len(rt.cache) < maxCachedTopics {
		rt.cache[topic] = got
	}
	rt.mu.Unlock()
	return got
}

// scope returns the function that names a topic's order scope, for an
// OrderScope: the destination it is routed to, or that and the topic the
// destination receives; nil for global order. A topic without a route
// has every scope (store.EveryScope): where its rows were meant to go is
// unknown, so one that parks its key parks it everywhere.
func (rt *router) scope(scope string) func(topic string) string {
	switch scope {
	case OrderScopeDestination:
		return func(topic string) string {
			r := rt.route(topic)
			if r.dest < 0 {
				return store.EveryScope
			}
			return strconv.Itoa(r.dest)
		}
	case OrderScopeTopic:
		return func(topic string) string {
			r := rt.route(topic)
			if r.dest < 0 {
				return store.EveryScope
			}
			return strconv.Itoa(r.dest) + "\x00" + r.topic
		}
	}
	return nil
}

// OrderScopeOf returns the function that names a topic's order scope
// under routes, as the relay keeps it (see Config.OrderScope): the
// destination's name, or that and the topic it is published as;
// store.EveryScope for a topic without a route; nil for global order.
// Tools that explain what holds a row back use it.
func OrderScopeOf(routes []Route, scope string) func(topic string) string {
	if scope != OrderScopeDestination && scope != OrderScopeTopic {
		return nil
	}
	return func(topic string) string {
		r, ok := MatchRoute(routes, topic)
		switch {
		case !ok:
			return store.EveryScope
		case scope == OrderScopeTopic:
			return r.Destination + "\x00" + cmp.Or(r.Topic, topic)
		}
		return r.Destination
	}
}

// scopedKey is a record's key in its order scope: the rows that keep their
// order among themselves.
func scopedKey(scope func(topic string) string, rec *sink.Record) string {
	if scope == nil {
		return rec.Key
	}
	return rec.Key + "\x00" + scope(rec.Topic)
}

// topicsOf returns the known topics whose routing matches.
func (rt *router) topicsOf(match func(routing) bool) []string {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	var out []string
	for topic, r := range rt.cache {
		if match(r) {
			out = append(out, topic)
		}
	}
	return out
}

// MatchRoute returns the first of routes that matches topic, as the relay
// routes it.
func MatchRoute(routes []Route, topic string) (Route, bool) {
	for _, r := range routes {
		if matchAny(r.Topics, topic) {
			return r, true
		}
	}
	return Route{}, false
}

func matchAny(patterns []string, topic string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, topic); ok {
			return true
		}
	}
	return false
}
