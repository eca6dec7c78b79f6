package kafka

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/segmentio/kafka-go/compress"
)

// castagnoli is the checksum of a record batch (CRC-32C).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// batchEncoder writes a produce request's records as one Kafka record batch:
// message format v2 (Kafka 0.11 and later), compressed with codec when it
// is set, outside any transaction and without idempotence. Each record
// carries the delivery format: the key (absent for a null key, empty for
// an empty one), the payload as value (absent for a null payload or a
// tombstone), the row's headers sorted by name (without the tombstone
// header), then the event id and the row id. Records are stamped with the
// time of the publish, or with their rows' created_at when createdAt is
// set.
//
// kafka-go would encode the same batch from Record values through its
// reflection-driven encoder, which took more of a drain's CPU than the
// rest of the publish; a v2 batch is a fixed header and a run of
// length-prefixed records, and is written here in one pass.
type batchEncoder struct {
	codec     compress.Codec // nil: uncompressed
	createdAt bool

	rec   []byte   // one record's body, before its length
	raw   []byte   // the records before compression
	names []string // one record's header names, sorted
}

// Offsets into a record batch of the fields written after its records.
const (
	batchLengthAt = 8  // after the base offset
	batchCRCAt    = 17 // after the length, the leader epoch and the magic byte
)

// encode appends records[idx], in that order, to dst as one record batch,
// framed as a produce request's records field: the batch's size, then the
// batch.
func (e *batchEncoder) encode(dst []byte, records []sink.Record, idx []int, now time.Time) []byte {
	first, last := now.UnixMilli(), now.UnixMilli()
	if e.createdAt {
		first, last = math.MaxInt64, math.MinInt64
		for _, j := range idx {
			ts := records[j].CreatedAt.UnixMilli()
			first, last = min(first, ts), max(last, ts)
		}
	}
	var attributes uint16 // bits 0-2: the codec; bit 3 unset: create time
	if e.codec != nil {
		attributes = uint16(e.codec.Code())
	}
	dst = binary.BigEndian.AppendUint32(dst, 0) // size, set below
	start := len(dst)
	dst = binary.BigEndian.AppendUint64(dst, 0)              // base offset: the broker assigns offsets
	dst = binary.BigEndian.AppendUint32(dst, 0)              // batch length, set below
	dst = binary.BigEndian.AppendUint32(dst, math.MaxUint32) // partition leader epoch: -1, none
	dst = append(dst, 2)                                     // magic: format v2
	dst = binary.BigEndian.AppendUint32(dst, 0)              // CRC, set below
	dst = binary.BigEndian.AppendUint16(dst, attributes)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(idx)-1))
	dst = binary.BigEndian.AppendUint64(dst, uint64(first))
	dst = binary.BigEndian.AppendUint64(dst, uint64(last))
	dst = binary.BigEndian.AppendUint64(dst, math.MaxUint64) // producer id: -1, none
	dst = binary.BigEndian.AppendUint16(dst, math.MaxUint16) // producer epoch: -1
	dst = binary.BigEndian.AppendUint32(dst, math.MaxUint32) // base sequence: -1
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(idx)))
	if e.codec == nil {
		for i, j := range idx {
			dst = e.appendRecord(dst, &records[j], i, first)
		}
	} else {
		// The records, and only they, are compressed as one block.
		raw := e.raw[:0]
		for i, j := range idx {
			raw = e.appendRecord(raw, &records[j], i, first)
		}
		e.raw = raw
		out := bytes.NewBuffer(dst)
		w := e.codec.NewWriter(out)
		_, _ = w.Write(raw) // writes to a bytes.Buffer do not fail
		_ = w.Close()
		dst = out.Bytes()
	}
	// The size and the length count what follows them; the CRC covers
	// what follows it.
	binary.BigEndian.PutUint32(dst[start-4:], uint32(len(dst)-start))
	binary.BigEndian.PutUint32(dst[start+batchLengthAt:], uint32(len(dst)-start-batchLengthAt-4))
	binary.BigEndian.PutUint32(dst[start+batchCRCAt:], crc32.Checksum(dst[start+batchCRCAt+4:], castagnoli))
	return dst
}

// appendRecord appends r as the record at offsetDelta in a batch whose
// first timestamp is first.
func (e *batchEncoder) appendRecord(dst []byte, r *sink.Record, offsetDelta int, first int64) []byte {
	var tsDelta int64
	if e.createdAt {
		tsDelta = r.CreatedAt.UnixMilli() - first
	}
	b := e.rec[:0]
	b = append(b, 0) // attributes: none
	b = binary.AppendVarint(b, tsDelta)
	b = binary.AppendVarint(b, int64(offsetDelta))
	if r.HasKey {
		b = appendBytes(b, r.Key)
	} else {
		b = binary.AppendVarint(b, -1)
	}
	_, tombstone := r.Headers[HeaderTombstone]
	if r.Payload != nil && !tombstone {
		b = appendBytes(b, r.Payload)
	} else {
		b = binary.AppendVarint(b, -1)
	}
	e.names = e.names[:0]
	for k := range r.Headers {
		if k != HeaderTombstone {
			e.names = append(e.names, k)
		}
	}
	sort.Strings(e.names)
	b = binary.AppendVarint(b, int64(len(e.names)+2))
	for _, k := range e.names {
		b = appendBytes(b, k)
		b = appendBytes(b, r.Headers[k])
	}
	b = appendBytes(b, HeaderEventID)
	b = appendUUID(b, r.EventID)
	b = appendBytes(b, HeaderID)
	var id [20]byte
	b = appendBytes(b, strconv.AppendInt(id[:0], r.ID, 10))
	e.rec = b
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}

// appendBytes appends s with its length, as a record's fields are framed.
func appendBytes[T string | []byte](b []byte, s T) []byte {
	b = binary.AppendVarint(b, int64(len(s)))
	return append(b, s...)
}

// appendUUID appends u in its 36-character text form, with its length.
func appendUUID(b []byte, u uuid.UUID) []byte {
	b = binary.AppendVarint(b, 36)
	n := len(b)
	b = append(b, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"...)
	hex.Encode(b[n:], u[:4])
	hex.Encode(b[n+9:], u[4:6])
	hex.Encode(b[n+14:], u[6:8])
	hex.Encode(b[n+19:], u[8:10])
	hex.Encode(b[n+24:], u[10:])
	return b
}
