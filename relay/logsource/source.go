// Package logsource reads an outbox's messages from the write-ahead log:
// producers write them with outbox_emit (pg_logical_emit_message), and
// one replica streams them in commit order from the outbox's replication
// slot, through pgoutput. It is a source of rows beside the table's (see
// ARCHITECTURE.md, "A second source of rows"): its batches go through the
// same routing, flow control and sinks, a message that must wait is
// written into the outbox table, and a position is confirmed to the slot
// only once every message up to it is settled.
//
// The slot is its own lease: PostgreSQL lets one connection stream from
// a slot at a time, so the replicas of a fleet try it in turn, one
// streams, and the others stand by until its connection ends.
package logsource

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/internal/db/outboxdb"
	"github.com/outbox-relay/outbox-relay/internal/db/schema"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/store"
)

// Config configures a Source.
type Config struct {
	// Conn connects to the outbox's database, as its pool does (a copy
	// is taken); the stream's connection adds replication=database.
	// Required.
	Conn *pgconn.Config
	// Schema holds the outbox. Default "public".
	Schema string
	// Store is the outbox table's: messages that must wait are written
	// into it. Required.
	Store *store.Store
	// Buffer is the most messages read and not yet settled. Default
	// 20000.
	Buffer int
	// Standby is how long a replica that does not stream waits before it
	// tries the slot again, and the first wait after the stream fails.
	// Default 2s.
	Standby time.Duration
	// Status is how often the stream tells the server its position
	// without a change. Default 1s.
	Status time.Duration
	// Log receives the stream's events. Default slog.Default().
	Log *slog.Logger
}

// Source is an outbox's messages in the write-ahead log.
type Source struct {
	cfg    Config
	store  *store.Store
	prefix string
	q      *queue
	sql    outboxdb.Capture
	// slot is the slot's name, once read from the database.
	slot atomic.Value
	// streaming says this replica holds the slot.
	streaming atomic.Bool
	// problem is why it cannot stream: a slot missing or lost.
	problem atomic.Value
}

// New returns the Source of cfg; Run streams.
func New(cfg Config) (*Source, error) {
	if cfg.Conn == nil || cfg.Store == nil {
		return nil, errors.New("logsource: Conn and Store are required")
	}
	cfg.Conn = cfg.Conn.Copy()
	if cfg.Schema == "" {
		cfg.Schema = schema.Default
	}
	if err := schema.Validate(cfg.Schema); err != nil {
		return nil, fmt.Errorf("logsource: %w", err)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 20000
	}
	if cfg.Standby <= 0 {
		cfg.Standby = 2 * time.Second
	}
	if cfg.Status <= 0 {
		cfg.Status = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	sql, err := outboxdb.NewCapture(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("logsource: %w", err)
	}
	return &Source{cfg: cfg, store: cfg.Store, prefix: schema.MessagePrefix(cfg.Schema), q: newQueue(), sql: sql}, nil
}

// Slot names the replication slot it streams from, once it has read the
// name (the schema's outbox_capture_slot()).
func (s *Source) Slot() string {
	n, _ := s.slot.Load().(string)
	return n
}

// Streaming says whether this replica holds the slot now.
func (s *Source) Streaming() bool { return s.streaming.Load() }

// Confirmed is the position up to which every message is settled.
func (s *Source) Confirmed() pglogrepl.LSN { return s.q.position() }

// slotError is a slot that cannot be streamed from until an operator
// acts: missing or lost.
type slotError struct{ msg string }

func (e *slotError) Error() string { return e.msg }

// errStandby is a slot another replica streams from.
var errStandby = errors.New("another replica streams from the slot")

// Run streams messages from the slot until ctx ends, calling wake when
// there are some to take. Where another replica holds the slot, it stands
// by and tries again; a failed stream starts again from the confirmed
// position. It returns nil when ctx ends.
func (s *Source) Run(ctx context.Context, wake func()) error {
	backoff := s.cfg.Standby
	standing := false
	for {
		err := s.stream(ctx, wake)
		streamed := s.streaming.Swap(false)
		wait := s.cfg.Standby
		var slotErr *slotError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &slotErr):
			if s.Problem() != slotErr.Error() {
				s.cfg.Log.Error("cannot capture from the write-ahead log", slog.String("slot", s.Slot()), slog.Any("error", err))
			}
			s.problem.Store(slotErr.Error())
			standing = false
		case errors.Is(err, errStandby):
			s.problem.Store("")
			if !standing {
				s.cfg.Log.Info("standing by: another replica captures from the slot", slog.String("slot", s.Slot()))
			}
			standing = true
		default:
			standing = false
			if streamed {
				backoff = s.cfg.Standby
			}
			wait, backoff = backoff, min(2*backoff, 30*time.Second)
			s.cfg.Log.Warn("capture from the write-ahead log failed; starting again from the confirmed position",
				slog.String("slot", s.Slot()), slog.Any("error", err), slog.Duration("retry_in", wait))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// stream connects, takes the slot and reads from it until ctx ends or
// the connection fails.
func (s *Source) stream(ctx context.Context, wake func()) error {
	cfg := s.cfg.Conn.Copy()
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "outbox-relay capture"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	slot, start, err := s.slotStart(ctx, conn)
	if err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", fmt.Sprintf("publication_names '%s'", s.sql.Publication), "messages 'true'",
	}})
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55006" { // object_in_use
			return errStandby
		}
		return fmt.Errorf("start replication from slot %s: %w", slot, err)
	}
	s.problem.Store("")
	// Messages of an earlier stream are read again from here.
	s.q.start(start)
	defer s.q.stop()
	s.streaming.Store(true)
	s.cfg.Log.Info("capturing from the write-ahead log", slog.String("slot", s.Slot()), slog.String("from", start.String()))
	r := reader{src: s, conn: conn, wake: wake}
	err = r.run(ctx)
	// Tell the server what was settled, as a clean stop; not on a
	// connection that failed, which pgconn closes in the background.
	if !conn.IsClosed() {
		_ = r.status(context.WithoutCancel(ctx))
	}
	return err
}

// slotStart reads where the slot's stream starts: the position it has
// confirmed. A missing slot, or one whose messages are gone, is an error
// that says so.
func (s *Source) slotStart(ctx context.Context, conn *pgconn.PgConn) (string, pglogrepl.LSN, error) {
	res, err := conn.Exec(ctx, s.sql.Slot).ReadAll()
	if err != nil {
		return "", 0, fmt.Errorf("read the slot: %w", err)
	}
	if len(res) == 0 || len(res[0].Rows) == 0 {
		return "", 0, errors.New("read the slot: no row")
	}
	row := res[0].Rows[0]
	slot, confirmed, status := string(row[0]), string(row[1]), string(row[2])
	s.slot.Store(slot)
	if confirmed == "" {
		return "", 0, &slotError{fmt.Sprintf("replication slot %s does not exist: run 'outbox-relay capture setup'", slot)}
	}
	if status == "lost" {
		return "", 0, &slotError{fmt.Sprintf("replication slot %s is lost: the server removed write-ahead log it had not confirmed, "+
			"so the messages written from %s on until it was lost are gone; see docs/capture.md, then 'outbox-relay capture setup --recreate'", slot, confirmed)}
	}
	lsn, err := pglogrepl.ParseLSN(confirmed)
	return slot, lsn, err
}

// reader reads one stream.
type reader struct {
	src  *Source
	conn *pgconn.PgConn
	wake func()
	sent pglogrepl.LSN // the position last told the server
	next time.Time     // when to tell it again without a change
	// The transaction being read.
	inTxn bool
	msgs  []*message
}

func (r *reader) run(ctx context.Context) error {
	r.next = time.Now().Add(r.src.cfg.Status)
	for ctx.Err() == nil {
		if r.src.q.position() != r.sent || time.Now().After(r.next) {
			if err := r.status(ctx); err != nil {
				return err
			}
		}
		if r.src.q.backlog() >= r.src.cfg.Buffer {
			// Full: read on once batches settle some.
			select {
			case <-ctx.Done():
			case <-r.src.q.room:
			case <-r.src.q.moved:
			case <-time.After(time.Until(r.next)):
			}
			continue
		}
		// While messages read are not yet settled, the stream is waited on
		// briefly: a position their settling moves is told within half a
		// millisecond rather than a tenth of a second. The next batch waits
		// for it before it is published (Batch.WaitTold), so that what is
		// delivered again after a crash is the batch in flight. (Shorter
		// waits cost the relay's CPU; longer ones, that batch's latency.)
		wait := 100 * time.Millisecond
		if r.src.q.unsettled() {
			wait = 500 * time.Microsecond
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		raw, err := r.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("read the stream: %w", err)
		}
		if err := r.handle(ctx, raw); err != nil {
			return err
		}
	}
	return nil
}

// status tells the server the position up to which every message is
// settled: it may drop the log before it.
func (r *reader) status(ctx context.Context) error {
	at := r.src.q.position()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: at, WALFlushPosition: at, WALApplyPosition: at})
	if err != nil {
		return fmt.Errorf("confirm %s: %w", at, err)
	}
	r.sent, r.next = at, time.Now().Add(r.src.cfg.Status)
	r.src.q.tell(at)
	return nil
}

// handle reads one message of the stream.
func (r *reader) handle(ctx context.Context, raw pgproto3.BackendMessage) error {
	switch m := raw.(type) {
	case *pgproto3.ErrorResponse:
		return pgconn.ErrorResponseToPgError(m)
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return nil
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return fmt.Errorf("read a keepalive: %w", err)
			}
			if !r.inTxn {
				// Everything before it was sent: what was read is all.
				r.src.q.keepalive(ka.ServerWALEnd)
			}
			if ka.ReplyRequested {
				return r.status(ctx)
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return fmt.Errorf("read the stream's data: %w", err)
			}
			return r.decoded(xld.WALData)
		}
	}
	return nil
}

// decoded reads one message of pgoutput.
func (r *reader) decoded(data []byte) error {
	lm, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("decode the stream: %w", err)
	}
	switch v := lm.(type) {
	case *pglogrepl.BeginMessage:
		r.inTxn, r.msgs = true, nil
	case *pglogrepl.LogicalDecodingMessage:
		if v.Prefix != r.src.prefix {
			return nil
		}
		if !v.Transactional {
			r.src.cfg.Log.Warn("a message outside a transaction with the outbox's prefix is ignored: outbox_emit writes them in the transaction",
				slog.String("lsn", v.LSN.String()))
			return nil
		}
		m, err := r.src.message(v)
		if err != nil {
			return err
		}
		r.msgs = append(r.msgs, m)
	case *pglogrepl.CommitMessage:
		r.src.q.push(v.TransactionEndLSN, r.msgs)
		if len(r.msgs) > 0 {
			r.wake()
		}
		r.inTxn, r.msgs = false, nil
	}
	return nil
}

// message makes a logical decoding message of the outbox a message to
// deliver. One that cannot be read is delivered as a dead letter that
// keeps its content whole; one of a newer version stops the stream, for
// a relay that reads it.
func (s *Source) message(v *pglogrepl.LogicalDecodingMessage) (*message, error) {
	content := bytes.Clone(v.Content)
	lm, err := outboxdb.DecodeLogMessage(content)
	if errors.Is(err, outboxdb.ErrLogMessageVersion) {
		return nil, fmt.Errorf("message at %s: %w: upgrade the relay", v.LSN, err)
	}
	m := &message{}
	if err != nil {
		m.Record = sink.Record{
			// The same for the message read again.
			EventID: uuid.NewSHA1(uuid.NameSpaceOID, []byte(s.prefix+"@"+v.LSN.String())), Topic: unreadableTopic,
			CreatedAt: time.Now().UTC(), PayloadSize: len(content),
			Undeliverable:       fmt.Sprintf("the message at %s in the write-ahead log cannot be read: %v", v.LSN, err),
			UndeliverableReason: sink.ReasonInvalidMessage,
		}
		m.Payload = content
		return m, nil
	}
	headers, problem := outboxdb.DecodeHeaders(lm.Headers)
	m.Record = sink.Record{EventID: lm.EventID, Topic: lm.Topic, Key: lm.Key, HasKey: lm.HasKey, Headers: headers,
		CreatedAt: lm.CreatedAt, PayloadSize: len(lm.Payload)}
	m.Payload, m.Headers = lm.Payload, lm.Headers
	if problem != "" {
		m.Record.Undeliverable, m.Record.UndeliverableReason = problem, sink.ReasonInvalidMessage
		if !json.Valid(lm.Headers) || !bytes.HasPrefix(bytes.TrimSpace(lm.Headers), []byte("{")) {
			m.Headers = nil // the table keeps only objects
		}
	}
	return m, nil
}

// unreadableTopic is the topic of a dead letter made of a message that
// could not be read.
const unreadableTopic = "outbox-relay.unreadable"
