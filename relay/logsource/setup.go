package logsource

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Check is one thing capture from the log needs, and whether it holds.
type Check struct {
	What  string // wal_level, replication, function, publication, identity, slot
	OK    bool
	Found string
}

// Conn runs the set-up's statements: a connection or a pool.
type Conn interface {
	outboxdb.DB
}

// SetupOptions say what Setup may change.
type SetupOptions struct {
	// Create makes the publication and the slot where they are missing.
	Create bool
	// Recreate drops a lost slot first (its messages are gone; see
	// docs/operations.md) and makes a new one.
	Recreate bool
}

// Setup checks what capture from the log needs for the outbox in
// schemaName, and with opts.Create makes what is missing and can be made
// here: the publication and the slot. It returns each check as it stands
// at the end; an error only for a statement that failed.
func Setup(ctx context.Context, db Conn, schemaName string, opts SetupOptions) ([]Check, error) {
	sql, err := outboxdb.NewCapture(schemaName)
	if err != nil {
		return nil, err
	}
	checks, err := readChecks(ctx, db, sql)
	if err != nil || !opts.Create {
		return checks, err
	}
	ok := map[string]bool{}
	for _, c := range checks {
		ok[c.What] = c.OK
	}
	if !ok["wal_level"] || !ok["replication"] || !ok["function"] {
		return checks, nil // nothing to make until these hold
	}
	if !ok["publication"] {
		if _, err := db.Exec(ctx, sql.CreatePublication); err != nil {
			return checks, fmt.Errorf("create the publication: %w", err)
		}
	}
	if !ok["slot"] {
		var slot, confirmed, state string
		if err := db.QueryRow(ctx, sql.Slot).Scan(&slot, &confirmed, &state); err != nil {
			return checks, fmt.Errorf("read the slot: %w", err)
		}
		switch {
		case state == "lost" && !opts.Recreate:
			return checks, fmt.Errorf("slot %s is lost: the messages it had not confirmed, from %s on, are gone from the log; "+
				"recreate it with --recreate once the loss is accounted for (docs/capture.md)", slot, confirmed)
		case state == "lost":
			if _, err := db.Exec(ctx, sql.DropSlot); err != nil {
				return checks, fmt.Errorf("drop the lost slot: %w", err)
			}
		}
		if _, err := db.Exec(ctx, sql.CreateSlot); err != nil {
			return checks, fmt.Errorf("create the slot: %w", err)
		}
	}
	return readChecks(ctx, db, sql)
}

func readChecks(ctx context.Context, db Conn, sql outboxdb.Capture) ([]Check, error) {
	read := func(statement string) ([]Check, error) {
		rows, err := db.Query(ctx, statement)
		if err != nil {
			return nil, fmt.Errorf("check capture's set-up: %w", err)
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Check, error) {
			var c Check
			err := r.Scan(&c.What, &c.OK, &c.Found)
			return c, err
		})
	}
	checks, err := read(sql.Check)
	if err != nil {
		return nil, err
	}
	for _, c := range checks {
		if c.What == "function" && !c.OK {
			// The slot is named by the function: without it, no slot.
			return append(checks, Check{What: "slot", Found: "slot (named by outbox_capture_slot)"}), nil
		}
	}
	slot, err := read(sql.SlotCheck)
	return append(checks, slot...), err
}

// Missing describes the checks that fail, with what to do about each; ""
// when none does.
func Missing(checks []Check) string {
	fix := map[string]string{
		"wal_level":   "set wal_level = logical in postgresql.conf and restart the server",
		"replication": "give the role the replication privilege (as a superuser), or connect as a role that has it",
		"function":    "run 'outbox-relay migrate up'",
		"publication": "run 'outbox-relay capture setup'",
		"identity":    "messages are delivered under ids from the sequence outbox_id_seq of the outbox's schema: rename the id column's sequence to it",
		"slot":        "run 'outbox-relay capture setup'",
	}
	var out []string
	for _, c := range checks {
		if !c.OK {
			out = append(out, fmt.Sprintf("%s (%s): %s", c.What, c.Found, fix[c.What]))
		}
	}
	return strings.Join(out, "\n")
}
