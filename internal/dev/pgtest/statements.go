package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// StatementStats is a Setup that creates the pg_stat_statements extension in
// the server's database, where the server loads it (the package's own
// cluster does). Tests read it through StatementCost, which skips them where
// it is missing.
func StatementStats(serverURL string) (func(), error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	var loaded bool
	if err := conn.QueryRow(ctx, "SELECT current_setting('shared_preload_libraries') LIKE '%pg_stat_statements%'").Scan(&loaded); err != nil {
		return nil, err
	}
	if loaded {
		if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return nil, fmt.Errorf("create extension pg_stat_statements: %w", err)
		}
	}
	return nil, nil
}

// Cost is what the statements of one schema have cost the server so far.
type Cost struct {
	Calls  int64 // statements run
	Blocks int64 // shared buffers they hit or read
	Rows   int64 // rows they returned or changed
}

// Sub returns the cost from earlier to c.
func (c Cost) Sub(earlier Cost) Cost {
	return Cost{Calls: c.Calls - earlier.Calls, Blocks: c.Blocks - earlier.Blocks, Rows: c.Rows - earlier.Rows}
}

// StatementCost returns what the statements that name the schema s's tables
// (quoted, as the relay's statements do) and contain part have cost so far,
// from pg_stat_statements (which keeps a statement's text, but for its
// constants). It skips the test where the server does not count
// statements (a server given by EnvURL without the extension); StatementStats
// must have run in the package's Main.
func (s *Schema) StatementCost(tb testing.TB, part string) Cost {
	tb.Helper()
	ctx := context.Background()
	var ok bool
	if err := s.Pool.QueryRow(ctx, "SELECT to_regclass('public.pg_stat_statements') IS NOT NULL").Scan(&ok); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if !ok {
		tb.Skip("pgtest: the server does not load pg_stat_statements (shared_preload_libraries), which this test reads")
	}
	var c Cost
	err := s.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(calls), 0), coalesce(sum(shared_blks_hit + shared_blks_read), 0), coalesce(sum(rows), 0)
FROM public.pg_stat_statements WHERE strpos(query, $1) > 0 AND strpos(query, $2) > 0`, pgx.Identifier{s.Name}.Sanitize()+".", part).Scan(new(int64), &c.Calls, &c.Blocks, &c.Rows)
	if err != nil {
		tb.Fatalf("pgtest: read pg_stat_statements: %v", err)
	}
	return c
}
