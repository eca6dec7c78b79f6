package config

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
)

// Outbox is one outbox table the relay delivers from, an entry of the
// outboxes list: a schema in a database. Settings left unset take the
// database and relay sections' values, so outboxes in one database need
// only a name and a schema.
type Outbox struct {
	// Name, workers, batch_size and order_scope are the relay's outbox
	// settings (relay.Outbox), which it validates; 0 and "" take the
	// relay section's.
	relay.Outbox `koanf:",squash"`
	// URL and URLFile: the outbox's database, as database.url and
	// database.url_file. Default database.url.
	URL     string `koanf:"url"`
	URLFile string `koanf:"url_file"`
	// Schema holds the outbox table. Default database.schema.
	Schema string `koanf:"schema"`
	// MaxConns bounds the connections to this outbox's database: each
	// outbox has a pool of its own. Default database.max_conns.
	MaxConns int32 `koanf:"max_conns"`
}

// OutboxSettings is an outbox with every setting resolved.
type OutboxSettings struct {
	// Outbox holds the name and the relay's settings of the outbox:
	// workers and batch size its own (0 takes the relay's), order scope
	// its own or the relay's.
	relay.Outbox
	// Database is the outbox's: its URL, schema and pool size, with the
	// database section's timeouts.
	Database Database
}

// Outboxes returns the outboxes to deliver from, in the order of the
// configuration; without an outboxes list, one named relay.DefaultOutbox
// made of the database section.
func (c *Config) Outboxes() []OutboxSettings {
	if len(c.OutboxList) == 0 {
		return []OutboxSettings{{Outbox: relay.Outbox{Name: relay.DefaultOutbox, OrderScope: c.Relay.OrderScope, Capture: c.Relay.Capture},
			Database: c.Database}}
	}
	out := make([]OutboxSettings, 0, len(c.OutboxList))
	for _, o := range c.OutboxList {
		db := c.Database
		if o.URL != "" {
			db.URL, db.URLFile = o.URL, o.URLFile
		}
		if o.Schema != "" {
			db.Schema = o.Schema
		}
		if o.MaxConns != 0 {
			db.MaxConns = o.MaxConns
		}
		ro := o.Outbox
		ro.OrderScope = cmp.Or(ro.OrderScope, c.Relay.OrderScope)
		ro.Capture = cmp.Or(ro.Capture, c.Relay.Capture)
		out = append(out, OutboxSettings{Outbox: ro, Database: db})
	}
	return out
}

// Outbox returns the outbox named name, or the only one when name is
// empty.
func (c *Config) Outbox(name string) (OutboxSettings, error) {
	all := c.Outboxes()
	names := make([]string, 0, len(all))
	for _, o := range all {
		if o.Name == name || (name == "" && len(all) == 1) {
			return o, nil
		}
		names = append(names, o.Name)
	}
	if name == "" {
		return OutboxSettings{}, &Error{Problems: []string{fmt.Sprintf("the configuration lists several outboxes: choose one with --outbox (%s)", strings.Join(names, ", "))}}
	}
	return OutboxSettings{}, &Error{Problems: []string{fmt.Sprintf("--outbox %s: no such outbox; the configuration lists %s", name, strings.Join(names, ", "))}}
}

// RedactURLs replaces in s the password of every database URL of c.
func (c *Config) RedactURLs(s string) string {
	s = Redact(s, c.Database.URL)
	for _, o := range c.OutboxList {
		s = Redact(s, o.URL)
	}
	return s
}

// outboxProblems reports every problem of the outboxes list, on the
// settings as Outboxes resolves them. need says whether each outbox must
// have a database URL.
func (c *Config) outboxProblems(need Need) []string {
	if len(c.OutboxList) == 0 {
		return nil // the database section, checked on its own
	}
	var p []string
	seen := map[string]bool{}
	tables := map[string]string{}
	for i, r := range c.Outboxes() {
		o := c.OutboxList[i]
		at := fmt.Sprintf("outboxes[%d]", i)
		if o.Name != "" {
			at = fmt.Sprintf("outboxes[%d] (%s)", i, o.Name)
		}
		p = append(p, lines(at+": ", o.ValidateSettings())...)
		if o.Name != "" && seen[o.Name] {
			p = append(p, fmt.Sprintf("%s: the name %s is used twice", at, o.Name))
		}
		seen[o.Name] = true
		db := r.Database
		if o.URL != "" {
			if _, err := pgxpool.ParseConfig(o.URL); err != nil {
				p = append(p, at+": url: "+Redact(err.Error(), o.URL))
			}
		} else if db.URL == "" && need&NeedDatabase != 0 {
			p = append(p, at+": url is required: set url or url_file, or database.url for every outbox")
		}
		if o.Schema != "" {
			if err := migrations.ValidateSchema(o.Schema); err != nil {
				p = append(p, at+": schema: "+err.Error())
			}
		}
		table := db.URL + "\x00" + db.Schema
		if other, ok := tables[table]; ok && db.URL != "" {
			p = append(p, fmt.Sprintf("%s: schema %s of the same database as outbox %s: one table, one outbox", at, db.Schema, other))
		}
		tables[table] = o.Name
		if o.MaxConns < 0 {
			p = append(p, fmt.Sprintf("%s: max_conns is %d; it must not be negative", at, o.MaxConns))
		}
		workers := cmp.Or(r.Workers, c.Relay.Workers)
		if tooFewConns(db.MaxConns, workers) {
			p = append(p, fmt.Sprintf("%s: max_conns %d is below its workers + 2 (%d): %s", at, db.MaxConns, workers+2, connsNeeded))
		}
	}
	return p
}
