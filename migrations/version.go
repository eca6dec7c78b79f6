package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
)

// Version is the schema version this binary ships and needs: the version of
// its newest migration. A relay runs on a schema at Version, or on a newer
// one whose compatible_from is at most Version (see Check).
var Version = latest()

// CompatibilityTable is the one-row table, inside the configured schema, that
// records the oldest relay version the schema still works with.
const CompatibilityTable = "outbox_relay_schema"

// VersionError reports a schema that this binary cannot run on.
type VersionError struct {
	Schema string
	// Found is the schema's version, 0 when it has none.
	Found int64
	// Need is the version this binary needs (Version).
	Need int64
	// CompatibleFrom is the oldest relay the newer schema works with; 0
	// unless the schema is newer than this binary.
	CompatibleFrom int64
}

func (e *VersionError) Error() string {
	if e.Found > e.Need {
		return fmt.Sprintf("schema %s is at version %d, which needs a relay of version %d or later; this relay is version %d: upgrade the relay",
			e.Schema, e.Found, e.CompatibleFrom, e.Need)
	}
	if e.Found == 0 {
		return fmt.Sprintf("schema %s has no outbox-relay migrations (found version 0, need %d): run 'outbox-relay migrate up'", e.Schema, e.Need)
	}
	return fmt.Sprintf("schema %s is at version %d, need %d: run 'outbox-relay migrate up'", e.Schema, e.Found, e.Need)
}

// Querier runs one query; a pgx connection or pool is one.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SchemaVersion is what Check found.
type SchemaVersion struct {
	// Found is the newest applied migration.
	Found int64
	// CompatibleFrom is the oldest relay version the schema works with.
	CompatibleFrom int64
}

// Check reads the version of the outbox schema and returns a *VersionError
// when this binary cannot run on it: the schema is older than Version, or
// newer with a compatible_from above Version. A newer schema that still
// works with this binary (a rolling upgrade, where the schema is migrated
// before the relays are replaced) passes.
func Check(ctx context.Context, q Querier, schema string) (SchemaVersion, error) {
	var sv SchemaVersion
	var hasVersions, hasCompat bool
	v, err := outboxdb.NewVersions(schema, VersionTable, CompatibilityTable)
	if err != nil {
		return sv, err
	}
	err = q.QueryRow(ctx, v.Tables, v.VersionsTable, v.CompatibilityTable).Scan(&hasVersions, &hasCompat)
	if err != nil {
		return sv, fmt.Errorf("read the schema version of %s: %w", schema, err)
	}
	if hasVersions {
		if err := q.QueryRow(ctx, v.Found).Scan(&sv.Found); err != nil {
			return sv, fmt.Errorf("read the schema version of %s: %w", schema, err)
		}
	}
	if hasCompat {
		err := q.QueryRow(ctx, v.CompatibleFrom).Scan(&sv.CompatibleFrom)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return sv, fmt.Errorf("read the schema compatibility of %s: %w", schema, err)
		}
	}
	switch {
	case sv.Found < Version:
		return sv, &VersionError{Schema: schema, Found: sv.Found, Need: Version}
	case sv.Found > Version && sv.CompatibleFrom > Version:
		return sv, &VersionError{Schema: schema, Found: sv.Found, Need: Version, CompatibleFrom: sv.CompatibleFrom}
	}
	return sv, nil
}

// latest is the version of the newest embedded migration.
func latest() int64 {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		panic(err)
	}
	var v int64
	for _, name := range names {
		prefix, _, _ := strings.Cut(name, "_")
		n, err := strconv.ParseInt(prefix, 10, 64)
		if err != nil {
			panic(fmt.Sprintf("migration %s: file name must start with its version: %v", name, err))
		}
		v = max(v, n)
	}
	return v
}
