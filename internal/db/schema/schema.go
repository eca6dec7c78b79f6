// Package schema names and checks the PostgreSQL schema an outbox lives
// in. It depends on the standard library only, so that the producer API,
// which applications import, does not pull in the migration tooling.
package schema

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
)

// Default is the schema used when none is configured.
const Default = "public"

// maxLen keeps the wake-up channel "<schema>.outbox" within PostgreSQL's
// 63-byte identifier limit.
const maxLen = 56

var pattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports whether name can be used as the outbox schema: a plain
// identifier (letters, digits, underscores) of at most 56 bytes.
func Validate(name string) error {
	switch {
	case name == "":
		return errors.New("schema name is empty")
	case len(name) > maxLen:
		return fmt.Errorf("schema name %q is longer than %d bytes", name, maxLen)
	case !pattern.MatchString(name):
		return fmt.Errorf("schema name %q must start with a letter or underscore and contain only letters, digits and underscores", name)
	}
	return nil
}

// LockID is the advisory lock key that serialises migrations of name.
// Each schema has its own, so independent outboxes migrate independently;
// the relay's maintenance takes the next key.
func LockID(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-relay migrations " + name))
	return int64(h.Sum64())
}

// Publication names the publication through which the relay reads the
// messages an outbox's producers write into the write-ahead log:
// "outbox_" and the schema in lower case, with a hash of the schema where
// lowering changed it, so that two schemas never share one. At most 63
// bytes. (The slot's name, unique in the whole cluster, is the schema's
// outbox_capture_slot(): it names the database too.)
func Publication(name string) string {
	lower := strings.ToLower(name)
	if lower == name {
		return "outbox_" + name
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	if len(lower) > 47 {
		lower = lower[:47]
	}
	return fmt.Sprintf("outbox_%s_%08x", lower, h.Sum32())
}

// MessagePrefix is the prefix of the logical decoding messages that carry
// an outbox's messages: it names the outbox, so that several outboxes can
// share a database, and other writers' messages are told apart.
func MessagePrefix(name string) string { return "outbox-relay:" + name }
