package outboxdb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// LogMessage is one message an outbox's producer wrote into the
// write-ahead log (outbox_emit), as read from its logical decoding
// message. The format is in migrations/00025_log_capture.sql.
type LogMessage struct {
	EventID   uuid.UUID
	CreatedAt time.Time
	Topic     string
	Key       string
	HasKey    bool
	Headers   []byte // a JSON object
	Payload   []byte
}

// logMessageVersion is the version of the content DecodeLogMessage reads.
const logMessageVersion = 1

// ErrLogMessageVersion is wrapped by DecodeLogMessage for content of a
// version it does not know: written by a newer schema's outbox_emit.
var ErrLogMessageVersion = errors.New("unknown version of an outbox log message")

// DecodeLogMessage reads the content of a logical decoding message written
// by outbox_emit. The message keeps slices of content.
func DecodeLogMessage(content []byte) (LogMessage, error) {
	var m LogMessage
	if len(content) == 0 {
		return m, errors.New("empty outbox log message")
	}
	if content[0] != logMessageVersion {
		return m, fmt.Errorf("%w: %d (this relay reads version %d)", ErrLogMessageVersion, content[0], logMessageVersion)
	}
	b := content[1:]
	short := fmt.Errorf("outbox log message cut short (%d bytes)", len(content))
	if len(b) < 16+8 {
		return m, short
	}
	copy(m.EventID[:], b[:16])
	m.CreatedAt = time.UnixMicro(int64(binary.BigEndian.Uint64(b[16:24]))).UTC()
	b = b[24:]
	field := func() ([]byte, bool, error) {
		if len(b) < 4 {
			return nil, false, short
		}
		n := int32(binary.BigEndian.Uint32(b))
		b = b[4:]
		if n < 0 {
			return nil, false, nil
		}
		if int(n) > len(b) {
			return nil, false, short
		}
		f := b[:n]
		b = b[n:]
		return f, true, nil
	}
	topic, ok, err := field()
	if err != nil {
		return m, err
	}
	if !ok || len(topic) == 0 || !utf8.Valid(topic) {
		return m, errors.New("outbox log message without a valid topic")
	}
	m.Topic = string(topic)
	key, hasKey, err := field()
	if err != nil {
		return m, err
	}
	m.Key, m.HasKey = string(key), hasKey
	if m.Headers, _, err = field(); err != nil {
		return m, err
	}
	m.Payload = b
	return m, nil
}

// DecodeHeaders reads headers written as a JSON object, as a claim does:
// problem says why they cannot be delivered (not an object, a value not a
// string), and is empty when they can.
func DecodeHeaders(text []byte) (headers map[string]string, problem string) {
	if len(text) == 0 {
		return nil, ""
	}
	return decodeHeaders(text)
}
