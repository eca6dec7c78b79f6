package kafkatest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"

	"github.com/segmentio/kafka-go/compress"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// WatchProduce has the cluster pass each record of each produce request it
// receives to fn, decompressed, as it receives it and before it answers:
// the order in which a producer's records reach the broker, across topics
// and partitions. The cluster then handles the request as usual, so
// controls added before this one (faults) see it first.
func WatchProduce(c *kfake.Cluster, fn func(topic string, partition int32, rec *kmsg.Record)) {
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, t := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				_ = EachRecord(p.Records, func(rec *kmsg.Record) { fn(t.Topic, p.Partition, rec) })
			}
		}
		return nil, nil, false
	})
}

// EachRecord decodes the record batches in b, decompressing them, and
// passes each record to fn.
func EachRecord(b []byte, fn func(*kmsg.Record)) error {
	for len(b) >= 12 {
		n := 12 + int(int32(binary.BigEndian.Uint32(b[8:12])))
		if n > len(b) {
			return errors.New("truncated record batch")
		}
		var batch kmsg.RecordBatch
		if err := batch.ReadFrom(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		recs := batch.Records
		if codec := compress.Compression(batch.Attributes & 7); codec != 0 {
			rd := codec.Codec().NewReader(bytes.NewReader(recs))
			var err error
			recs, err = io.ReadAll(rd)
			rd.Close()
			if err != nil {
				return err
			}
		}
		for range batch.NumRecords {
			l, k := binary.Varint(recs)
			if k <= 0 || int(l)+k > len(recs) {
				return errors.New("truncated record")
			}
			var rec kmsg.Record
			if err := rec.ReadFrom(recs[:k+int(l)]); err != nil {
				return err
			}
			fn(&rec)
			recs = recs[k+int(l):]
		}
	}
	return nil
}
