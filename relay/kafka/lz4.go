package kafka

import (
	"io"
	"sync"

	"github.com/pierrec/lz4/v4"
	"github.com/segmentio/kafka-go/compress"
	kafkalz4 "github.com/segmentio/kafka-go/compress/lz4"
)

// lz4Codec is kafka-go's lz4 codec writing frames of 64 KiB blocks, as
// Kafka's own producer does. Whoever reads a batch (the broker validating
// it, each consumer) allocates a buffer of the frame's block size; the
// library's default of 4 MiB made every batch, however small, cost 4 MiB
// to read.
type lz4Codec struct{ *kafkalz4.Codec }

var lz4Writers sync.Pool

// NewWriter implements compress.Codec.
func (lz4Codec) NewWriter(w io.Writer) io.WriteCloser {
	z, _ := lz4Writers.Get().(*lz4.Writer)
	if z == nil {
		z = lz4.NewWriter(w)
		// Block64Kb is a valid option: Apply fails only on a bad one.
		_ = z.Apply(lz4.BlockSizeOption(lz4.Block64Kb))
	} else {
		z.Reset(w)
	}
	return &lz4Writer{z}
}

type lz4Writer struct{ *lz4.Writer }

func (w *lz4Writer) Close() error {
	z := w.Writer
	if z == nil {
		return nil
	}
	w.Writer = nil
	err := z.Close()
	z.Reset(nil)
	lz4Writers.Put(z)
	return err
}

// codecOf is the codec of compression c, nil for none or an unknown one.
func codecOf(c compress.Compression) compress.Codec {
	if c == compress.Lz4 {
		return lz4Codec{new(kafkalz4.Codec)}
	}
	return c.Codec()
}
