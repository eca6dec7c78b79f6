// Package outboxdb owns the SQL of the outbox table and its audit table:
// every statement that reads or changes a row's delivery state (claim,
// key check, write-back, lease, retention, and the operators' replay,
// edit, reroute, discard and release) lives in the embedded sql/*.sql files, one
// template per statement, and is run through a typed method here. The
// claim engine (package relay/store) and the dead-letter operations (package
// deadletter) both go through it, so a rule about a row's state is written
// once. Every other statement of the relay's packages is here too, in the
// same form: the coordination tables' (package fleet runs them in its own
// batches), the producer's insert, the reads of the server's catalogs the
// claim engine batches with its claims, and the schema's migration state.
// Statements that a caller batches are handed out rendered; the rest run
// through typed methods. No Go file holds SQL text
// (TestNoSQLOutsideTheSQLFiles), and tables are named only quoted.
//
// The statements are written by hand rather than generated (sqlc): most
// are fixed at start for the configured schema, but a few take conditions
// built from a dead-letter filter at run time, and the claim scans into
// buffers of its own. Method parameters and results are typed; each
// method names the statement it runs.
package outboxdb

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/db/schema"
)

//go:embed sql/*.sql
var files embed.FS

// templates holds every statement; parsed once.
var templates = template.Must(template.New("").Option("missingkey=error").Funcs(template.FuncMap{
	// dict passes several named values to a shared fragment.
	"dict": func(kv ...string) map[string]string {
		m := make(map[string]string, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	},
}).ParseFS(files, "sql/*.sql"))

// DB runs statements: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Options configure Queries.
type Options struct {
	// KeepSent marks delivered rows sent instead of deleting them.
	KeepSent bool
}

// Queries are the statements on one schema's outbox table, rendered.
type Queries struct {
	names names
	// Fixed statements, rendered once.
	claim, holdingBySpan, holdingByKey          string
	holdingInSpan, holdingInRange               string
	minPending, stranded                        string
	claimerJoin, claimersExpire, claimers       string
	partitionsLock, partitions, partitionsWrite string
	claimerLeave                                string
	deferRows, deferParked                      string
	stillLeased, leaseOver                      string
	sent, fail, leasedFail, lease               string
	leasedSent, unlease, pullForward            string
	releaseHeld                                 string
	tryLock, deleteSent, deleteExpired          string
	deleteDiscarded, deleteAudit                string
	backlog                                     string
	getRow, parkedKeys, counts, parkedCount     string
	lockRefs, replay, reroute, discard          string
	lockForEdit, edit, releaseKey               string
	lockBehindKeys, unpark                      string
	insertAudit, auditedRows                    string
	groupRows                                   string
	findRow, keyRows, keyHolders                string
	logReserveIDs, logKeysInTable, logAdopt     string
	server                                      Server
}

// Versions are the statements on a schema's migration state
// (sql/versions.sql), rendered for one schema.
type Versions struct {
	// Tables says whether the two tables exist, given their quoted
	// names (VersionsTable and CompatibilityTable) as arguments.
	Tables                              string
	VersionsTable, CompatibilityTable   string
	Found, CompatibleFrom, Lock, Create string
}

// NewVersions renders the statements of Versions for schemaName, whose
// tables are versions (goose's) and compatibility.
func NewVersions(schemaName, versions, compatibility string) (Versions, error) {
	if err := schema.Validate(schemaName); err != nil {
		return Versions{}, err
	}
	n := struct{ Schema, Versions, Compatibility string }{
		pgx.Identifier{schemaName}.Sanitize(),
		pgx.Identifier{schemaName, versions}.Sanitize(),
		pgx.Identifier{schemaName, compatibility}.Sanitize(),
	}
	v := Versions{VersionsTable: n.Versions, CompatibilityTable: n.Compatibility}
	for name, dst := range map[string]*string{
		"versions_tables": &v.Tables, "versions_found": &v.Found, "versions_compatible_from": &v.CompatibleFrom,
		"versions_lock": &v.Lock, "versions_create_schema": &v.Create,
	} {
		var err error
		if *dst, err = render(name, n); err != nil {
			return Versions{}, err
		}
	}
	return v, nil
}

// Server are the statements the claim engine queues in batches of its own
// (sql/server.sql, and free_rows of sql/claim.sql): reads of the server's
// catalogs and functions, and the free rows' lock.
type Server struct {
	StrictCheck, ObserveLast, ObserveXids, OrderHolder, LockHolders string
	ServerStart, HorizonHolders, PendingIndexStats, FreeRows        string
}

// Statements that name no table, rendered once (sql/server.sql).
var (
	// Now reads the database's clock.
	Now = mustRender("now")
	// Notify sends a notification: $1 the channel, $2 the payload.
	Notify = mustRender("notify")
	// FreeRowsSavepoint and FreeRowsRollback surround Server.FreeRows.
	FreeRowsSavepoint = mustRender("free_rows_savepoint")
	FreeRowsRollback  = mustRender("free_rows_rollback")
	// asyncCommit is the statement of QueueAsyncCommit.
	asyncCommit = mustRender("async_commit")
)

// mustRender renders a statement that names no table; it fails only for a
// broken template, which every test would see.
func mustRender(name string) string {
	s, err := render(name, nil)
	if err != nil {
		panic(err)
	}
	return s
}

// Listen renders the listener's LISTEN on channel, quoted.
func Listen(channel string) (string, error) {
	return render("listen", struct{ Channel string }{pgx.Identifier{channel}.Sanitize()})
}

// Server returns the rendered statements of Server.
func (q *Queries) Server() *Server { return &q.server }

// names are the quoted tables a statement is rendered with.
type names struct {
	Outbox, Audit string
	// IDs is the sequence of the outbox's id column, as PostgreSQL names
	// an identity's.
	IDs string
	// Fingerprint and Group are the functions that mask an error, and
	// name a dead letter's failure group; Partition the one that gives a
	// row's partition.
	Fingerprint, Group, Partition string
	// Claimers and Partitions are the tables through which the relay's
	// processes share the partitions.
	Claimers, Partitions string
	// Replicas, Breakers and Shares are the fleet's.
	Replicas, Breakers, Shares string
	// History is the per-minute history; HistoryAdd adds its
	// histograms.
	History, HistoryAdd string
	// Changes are the breakers' changes.
	Changes string
	// Emit writes a message into the write-ahead log.
	Emit string
	// Sessions are the console's sign-ins through an identity provider.
	Sessions string
}

// quoted returns the names of schemaName's tables and functions, quoted.
func quoted(schemaName string) (names, error) {
	if schemaName == "" {
		schemaName = schema.Default
	}
	if err := schema.Validate(schemaName); err != nil {
		return names{}, err
	}
	id := func(name string) string { return pgx.Identifier{schemaName, name}.Sanitize() }
	return names{
		Outbox: id("outbox"), Audit: id("outbox_audit"), IDs: id("outbox_id_seq"),
		Fingerprint: id("outbox_error_fingerprint"), Group: id("outbox_error_group"), Partition: id("outbox_partition"),
		Claimers: id("outbox_claimers"), Partitions: id("outbox_claim_partitions"),
		Replicas: id("outbox_fleet_replicas"), Breakers: id("outbox_fleet_breakers"), Shares: id("outbox_fleet_shares"),
		History: id("outbox_history"), HistoryAdd: id("outbox_history_add"),
		Changes: id("outbox_breaker_changes"), Emit: id("outbox_emit"),
		Sessions: id("outbox_console_sessions"),
	}, nil
}

// Fleet are the statements on the fleet's coordination tables (sql/fleet.sql),
// rendered for one schema. Package fleet runs them, in batches of its own.
type Fleet struct {
	Heartbeat, Forget, Members, Ensure, Breakers string
	Update, Shares, Share, Leave, Release        string
	DestinationShares                            string
}

// NewFleet renders the fleet's statements for schemaName (default
// "public").
func NewFleet(schemaName string) (Fleet, error) {
	n, err := quoted(schemaName)
	if err != nil {
		return Fleet{}, err
	}
	var f Fleet
	for name, dst := range map[string]*string{
		"fleet_heartbeat": &f.Heartbeat, "fleet_forget": &f.Forget, "fleet_members": &f.Members,
		"fleet_ensure": &f.Ensure, "fleet_breakers": &f.Breakers, "fleet_update": &f.Update,
		"fleet_shares": &f.Shares, "fleet_share": &f.Share, "fleet_leave": &f.Leave, "fleet_release": &f.Release,
		"fleet_destination_shares": &f.DestinationShares,
	} {
		if *dst, err = render(name, n); err != nil {
			return Fleet{}, err
		}
	}
	return f, nil
}

// History are the statements on the per-minute history (sql/history.sql),
// rendered for one schema. Package history runs them.
type History struct {
	Add, BacklogDue, Backlog, Trim, Series, Now string
	ChangeAdd, ChangesTrim, Changes             string
}

// NewHistory renders the history's statements for schemaName (default
// "public"), whose lag histograms have buckets buckets.
func NewHistory(schemaName string, buckets int) (History, error) {
	n, err := quoted(schemaName)
	if err != nil {
		return History{}, err
	}
	data := struct {
		names
		Buckets []int
	}{names: n}
	for i := range buckets {
		data.Buckets = append(data.Buckets, i+1)
	}
	var h History
	for name, dst := range map[string]*string{
		"history_add": &h.Add, "history_backlog_due": &h.BacklogDue, "history_backlog": &h.Backlog,
		"history_trim": &h.Trim, "history_series": &h.Series, "history_now": &h.Now,
		"change_add": &h.ChangeAdd, "changes_trim": &h.ChangesTrim, "changes": &h.Changes,
	} {
		if *dst, err = render(name, data); err != nil {
			return History{}, err
		}
	}
	return h, nil
}

// New renders the statements for the outbox in schema (default "public").
func New(schemaName string, opts Options) (*Queries, error) {
	n, err := quoted(schemaName)
	if err != nil {
		return nil, err
	}
	q := &Queries{names: n}
	sent, leasedSent := "sent_delete", "leased_sent_delete"
	if opts.KeepSent {
		sent, leasedSent = "sent_mark", "leased_sent_mark"
	}
	for name, dst := range map[string]*string{
		"claim": &q.claim, "holding_by_span": &q.holdingBySpan, "holding_by_key": &q.holdingByKey,
		"holding_in_span": &q.holdingInSpan, "holding_in_range": &q.holdingInRange,
		"min_pending": &q.minPending, "stranded": &q.stranded,
		"claimer_join": &q.claimerJoin, "claimers_expire": &q.claimersExpire, "claimers": &q.claimers,
		"partitions_lock": &q.partitionsLock, "partitions": &q.partitions, "partitions_write": &q.partitionsWrite, "claimer_leave": &q.claimerLeave,
		"defer": &q.deferRows, "defer_parked": &q.deferParked,
		"still_leased": &q.stillLeased, "lease_over": &q.leaseOver,
		sent: &q.sent, "fail": &q.fail, "leased_fail": &q.leasedFail, "lease": &q.lease,
		leasedSent: &q.leasedSent, "unlease": &q.unlease, "pull_forward": &q.pullForward, "release_held": &q.releaseHeld,
		"try_maintenance_lock": &q.tryLock, "delete_sent": &q.deleteSent, "delete_expired_dead": &q.deleteExpired,
		"delete_discarded": &q.deleteDiscarded, "delete_audit": &q.deleteAudit,
		"backlog": &q.backlog,
		"get_row": &q.getRow, "parked_keys": &q.parkedKeys, "dead_letter_counts": &q.counts,
		"parked_key_count": &q.parkedCount,
		"lock_refs":        &q.lockRefs, "replay": &q.replay, "reroute": &q.reroute, "discard": &q.discard,
		"lock_for_edit": &q.lockForEdit, "edit": &q.edit, "release_key": &q.releaseKey,
		"lock_behind_keys": &q.lockBehindKeys, "unpark": &q.unpark,
		"insert_audit": &q.insertAudit, "audited_rows": &q.auditedRows,
		"log_reserve_ids": &q.logReserveIDs, "log_keys_in_table": &q.logKeysInTable, "log_adopt": &q.logAdopt,
		"group_rows": &q.groupRows, "find_row": &q.findRow, "key_rows": &q.keyRows, "key_holders": &q.keyHolders,
		"strict_check": &q.server.StrictCheck, "observe_last": &q.server.ObserveLast,
		"observe_xids": &q.server.ObserveXids, "order_holder": &q.server.OrderHolder,
		"lock_holders": &q.server.LockHolders, "server_start": &q.server.ServerStart,
		"horizon_holders": &q.server.HorizonHolders, "pending_index_stats": &q.server.PendingIndexStats,
		"free_rows": &q.server.FreeRows,
	} {
		s, err := render(name, q.names)
		if err != nil {
			return nil, err
		}
		if s == "" {
			return nil, fmt.Errorf("render statement %s: it is empty", name)
		}
		*dst = s
	}
	return q, nil
}

// render executes the named statement's template with data.
func render(name string, data any) (string, error) {
	var b bytes.Buffer
	if err := templates.ExecuteTemplate(&b, name, data); err != nil {
		return "", fmt.Errorf("render statement %s: %w", name, err)
	}
	return strings.TrimSpace(b.String()), nil
}

// dynamic renders a statement whose conditions are built per call: w's
// conditions, then LIMIT as the next parameter, whose value is appended
// to w's arguments.
func (q *Queries) dynamic(name string, w *where, limit int, lock string) (string, []any, error) {
	args := append(w.args[:len(w.args):len(w.args)], limit)
	s, err := render(name, struct {
		names
		Where, Limit, Lock string
	}{q.names, w.sql(), "$" + strconv.Itoa(len(args)), lock})
	return s, args, err
}

// where is a conjunction of conditions with numbered parameters, built
// from typed filters by this package's methods.
type where struct {
	conds []string
	args  []any
}

// add appends cond, where each ? stands for the next of args.
func (w *where) add(cond string, args ...any) {
	var b strings.Builder
	for _, r := range cond {
		if r == '?' {
			w.args = append(w.args, args[0])
			args = args[1:]
			b.WriteString("$" + strconv.Itoa(len(w.args)))
			continue
		}
		b.WriteRune(r)
	}
	w.conds = append(w.conds, b.String())
}

func (w *where) sql() string {
	if len(w.conds) == 0 {
		return "true"
	}
	return strings.Join(w.conds, " AND ")
}

// Statement renders a fixed statement by name, for tests that look at
// its plan.
func (q *Queries) Statement(name string) (string, error) { return render(name, q.names) }
