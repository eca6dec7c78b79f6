// Package filesink is a sink that appends records to files, one JSON line
// per record and one file per topic (<dir>/<topic>.jsonl). It is used by
// tests only: it shows the whole of what a sink is (settings, validation,
// a Publisher that passes relay/publishertest, and its registration as
// destinations.<name>.file), with no change anywhere else.
package filesink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/outbox-relay/outbox-relay/relay/sink"
)

func init() {
	sink.Register(sink.Sink{Kind: "file", New: func() sink.Config { return new(Settings) }})
}

// DefaultMaxRecordBytes is the largest record written unless set.
const DefaultMaxRecordBytes = 1 << 20

// Settings are a file destination's settings, destinations.<name>.file.
type Settings struct {
	// Dir is the directory the topics' files are written in. It must
	// exist.
	Dir string `koanf:"dir"`
	// MaxRecordBytes is the largest line written; a larger record is
	// dead-lettered too_large. Default 1 MiB.
	MaxRecordBytes int `koanf:"max_record_bytes"`
}

// Resolve does nothing: the sink has no secrets.
func (s *Settings) Resolve(func(string) (string, bool)) error { return nil }

// Validate reports every problem of s at once.
func (s *Settings) Validate() error {
	var errs []error
	if s.Dir == "" {
		errs = append(errs, errors.New("dir is required"))
	} else if fi, err := os.Stat(s.Dir); err != nil || !fi.IsDir() {
		errs = append(errs, fmt.Errorf("dir %s is not a directory", s.Dir))
	}
	if s.MaxRecordBytes < 0 {
		errs = append(errs, fmt.Errorf("max_record_bytes is %d; it must not be negative", s.MaxRecordBytes))
	}
	return errors.Join(errs...)
}

// Open returns a Publisher writing to s.Dir.
func (s *Settings) Open(sink.Options) (sink.Publisher, error) {
	return New(s.Dir, s.MaxRecordBytes), nil
}

// Line is what a record becomes in its topic's file.
type Line struct {
	ID      int64             `json:"id"`
	Key     string            `json:"key,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Payload []byte            `json:"payload"`
}

// Publisher appends records to their topics' files.
type Publisher struct {
	dir      string
	maxBytes int
	mu       sync.Mutex // one publish at a time: appends stay in id order
}

// New returns a Publisher writing to dir; maxBytes 0 is the default.
func New(dir string, maxBytes int) *Publisher {
	if maxBytes == 0 {
		maxBytes = DefaultMaxRecordBytes
	}
	return &Publisher{dir: dir, maxBytes: maxBytes}
}

// topicName is a topic that can name a file of its own.
var topicName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*$`)

// Publish appends each record to its topic's file, then syncs the files.
// A record whose topic cannot name a file, or one too large, fails alone
// and permanently; a file that cannot be opened or written fails its
// records as the destination's failure. After a key's record fails, the
// key's later records are not written (sink.ErrNotSent).
func (p *Publisher) Publish(ctx context.Context, records []sink.Record) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := make([]error, len(records))
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	failedKeys := map[string]bool{}
	for i, r := range records {
		if r.HasKey && failedKeys[r.Key] {
			errs[i] = sink.ErrNotSent
			continue
		}
		errs[i] = p.write(ctx, files, r)
		if errs[i] != nil && r.HasKey {
			failedKeys[r.Key] = true
		}
	}
	var syncErr error
	for _, f := range files {
		if err := f.Sync(); err != nil {
			syncErr = sink.DestinationFailure(sink.ClassTransient, fmt.Errorf("file: sync %s: %w", f.Name(), err))
		}
	}
	if syncErr != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = syncErr
			}
		}
	}
	return errs
}

// write appends r to its topic's file, opened once per publish.
func (p *Publisher) write(ctx context.Context, files map[string]*os.File, r sink.Record) error {
	if err := ctx.Err(); err != nil {
		return sink.Transient(fmt.Errorf("file: %w", err), 0)
	}
	if !topicName.MatchString(r.Topic) || r.Topic == "." || r.Topic == ".." {
		return sink.Permanent(fmt.Errorf("file: topic %q cannot name a file", r.Topic), sink.ReasonPermanent)
	}
	line, err := json.Marshal(Line{ID: r.ID, Key: r.Key, Headers: r.Headers, Payload: r.Payload})
	if err != nil {
		return sink.Permanent(fmt.Errorf("file: encode record %d: %w", r.ID, err), sink.ReasonInvalidMessage)
	}
	if len(line) > p.maxBytes {
		return sink.Permanent(fmt.Errorf("file: record %d is %d bytes; the most is %d", r.ID, len(line), p.maxBytes), sink.ReasonTooLarge)
	}
	f, ok := files[r.Topic]
	if !ok {
		f, err = os.OpenFile(filepath.Join(p.dir, r.Topic+".jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return sink.DestinationFailure(sink.ClassSystemic, fmt.Errorf("file: %w", err))
		}
		files[r.Topic] = f
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		return sink.DestinationFailure(sink.ClassTransient, fmt.Errorf("file: %w", err))
	}
	return nil
}

// Read returns the lines of topic's file in dir, in the order written.
func Read(dir, topic string) ([]Line, error) {
	b, err := os.ReadFile(filepath.Join(dir, topic+".jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Line
	dec := json.NewDecoder(bytes.NewReader(b))
	for dec.More() {
		var l Line
		if err := dec.Decode(&l); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}
