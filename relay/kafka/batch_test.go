package kafka

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The encoded batch reads back, with franz-go's decoder, as the records
// in the delivery format, and its framing, size and checksum hold.
func TestBatchEncoderWritesFormatV2(t *testing.T) {
	t.Parallel()
	recs := []sink.Record{
		{ID: 7, EventID: uuid.New(), Key: "order-1", HasKey: true, Payload: []byte(`{"n":1}`),
			Headers: map[string]string{"traceparent": "00-abc-01", "b": "", "a": "é"}},
		{ID: 8, EventID: uuid.New(), Payload: []byte("no key")},
		{ID: 9, EventID: uuid.New(), HasKey: true, Payload: []byte{}},
		{ID: 1234567890123, EventID: uuid.New(), Key: "gone", HasKey: true},
		{ID: 11, EventID: uuid.New(), Key: "big", HasKey: true, Payload: make([]byte, 70_000)},
	}
	idx := []int{0, 1, 2, 3, 4}
	now := time.UnixMilli(1_790_000_000_123)
	var e batchEncoder
	prefix := []byte("kept")
	// Twice through one encoder: its buffers must not leak between calls.
	for round := range 2 {
		out := e.encode(prefix, recs, idx, now)
		if string(out[:4]) != "kept" {
			t.Fatalf("round %d: encode overwrote what dst held", round)
		}
		out = out[4:]
		if size := binary.BigEndian.Uint32(out); int(size) != len(out)-4 {
			t.Fatalf("round %d: records field size %d, want %d", round, size, len(out)-4)
		}
		raw := out[4:]
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw); err != nil {
			t.Fatal(err)
		}
		if int(b.Length) != len(raw)-12 || b.Magic != 2 || b.Attributes != 0 || b.PartitionLeaderEpoch != -1 ||
			b.ProducerID != -1 || b.ProducerEpoch != -1 || b.FirstSequence != -1 || b.FirstOffset != 0 ||
			b.NumRecords != int32(len(recs)) || b.LastOffsetDelta != int32(len(recs)-1) ||
			b.FirstTimestamp != now.UnixMilli() || b.MaxTimestamp != now.UnixMilli() {
			t.Fatalf("round %d: batch header %+v", round, b)
		}
		if crc := crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)); uint32(b.CRC) != crc {
			t.Fatalf("round %d: CRC %x, want %x", round, uint32(b.CRC), crc)
		}
		rest := b.Records
		for i, want := range recs {
			var r kmsg.Record
			if err := r.ReadFrom(rest); err != nil {
				t.Fatalf("record %d: %v", i, err)
			}
			n := int(r.Length) + varintLen(int64(r.Length))
			rest = rest[n:]
			if r.OffsetDelta != int32(i) || r.TimestampDelta64 != 0 || r.Attributes != 0 {
				t.Errorf("record %d: offset delta %d, timestamp delta %d, attributes %d", i, r.OffsetDelta, r.TimestampDelta64, r.Attributes)
			}
			if (r.Key == nil) == want.HasKey || string(r.Key) != want.Key {
				t.Errorf("record %d: key %q (null %v), want %q (null %v)", i, r.Key, r.Key == nil, want.Key, !want.HasKey)
			}
			if (r.Value == nil) != (want.Payload == nil) || string(r.Value) != string(want.Payload) {
				t.Errorf("record %d: value of %d bytes (null %v), want %d (null %v)", i, len(r.Value), r.Value == nil, len(want.Payload), want.Payload == nil)
			}
			var got []string
			for _, h := range r.Headers {
				got = append(got, h.Key+"="+string(h.Value))
			}
			wantHeaders := []string{HeaderEventID + "=" + want.EventID.String(), HeaderID + "=" + strconv.FormatInt(want.ID, 10)}
			if i == 0 {
				wantHeaders = append([]string{"a=é", "b=", "traceparent=00-abc-01"}, wantHeaders...)
			}
			if fmt.Sprint(got) != fmt.Sprint(wantHeaders) {
				t.Errorf("record %d: headers %v, want %v", i, got, wantHeaders)
			}
		}
		if len(rest) != 0 {
			t.Fatalf("round %d: %d bytes after the last record", round, len(rest))
		}
	}
}

func varintLen(v int64) int {
	return len(binary.AppendVarint(nil, v))
}
