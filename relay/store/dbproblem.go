package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrPoolExhausted is the cause of a claim that could not start because
// every connection of the store's pool stayed in use.
var ErrPoolExhausted = errors.New("every connection of the pool (database.max_conns) stayed in use")

// DBProblem is a database failure that the relay waits out, explained for
// the person reading its log.
type DBProblem struct {
	// Kind names the problem: too_many_connections, pool_exhausted,
	// statement_timeout, query_timeout, read_only, server_unavailable or
	// prepared_statements.
	Kind string
	// Hint says what happened and what to do, in one line.
	Hint string
	// Reconnect is set when the pool's connections lead to a server that
	// cannot serve the relay: they are to be replaced.
	Reconnect bool
}

// ExplainDBError explains err when it is one of the database failures an
// operator meets at the edges: the server out of connection slots, the
// pool out of connections, a statement timeout, a read-only server after a
// failover, a server shutting down or starting up, prepared statements
// lost behind a transaction-mode pooler. It reports false for
// any other error.
func ExplainDBError(err error) (DBProblem, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "53300": // too_many_connections
			return DBProblem{Kind: "too_many_connections", Hint: "the database server has no connection slot left for the relay " +
				"(its max_connections, or the connection limit of the role or database): lower database.max_conns or the number of replicas, " +
				"or raise the limit; retrying"}, true
		case "57014": // query_canceled: a statement timeout
			return DBProblem{Kind: "statement_timeout", Hint: "a statement ran past the server's statement_timeout (or was cancelled): " +
				"look for locks on the outbox table and for bloat (VACUUM); retrying"}, true
		case "25006": // read_only_sql_transaction
			return DBProblem{Kind: "read_only", Hint: "the database server is read-only (a standby, or the old primary after a failover): " +
				"reconnecting; point database.url at the primary, or list every host with target_session_attrs=read-write", Reconnect: true}, true
		case "26000", "42P05": // invalid_sql_statement_name, duplicate_prepared_statement
			return DBProblem{Kind: "prepared_statements", Hint: "the connection's prepared statements went missing or collide: " +
				"a transaction-mode pooler (PgBouncer pool_mode=transaction) moves them between server connections; " +
				"add default_query_exec_mode=exec to database.url (or set PgBouncer's max_prepared_statements, 1.21 or later), " +
				"or use session mode; retrying"}, true
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return DBProblem{Kind: "server_unavailable", Hint: "the database server is shutting down, starting up or failing over: reconnecting",
				Reconnect: true}, true
		}
	}
	switch {
	case errors.Is(err, ErrPoolExhausted):
		return DBProblem{Kind: "pool_exhausted", Hint: "no connection of the pool came free within database.query_timeout: " +
			"raise database.max_conns, or look for slow statements holding them; retrying"}, true
	case errors.Is(err, context.DeadlineExceeded):
		return DBProblem{Kind: "query_timeout", Hint: "the database did not answer within database.query_timeout: " +
			"look for locks on the outbox table, bloat, or an overloaded server; retrying"}, true
	}
	return DBProblem{}, false
}

// Reconnect closes the store's connections; new ones are opened as they
// are needed. It is the way out of a server that became read-only: a
// failover moves the primary, and a pool keeps its idle connections to
// the old one.
func (s *Store) Reconnect() { s.pool.Reset() }
