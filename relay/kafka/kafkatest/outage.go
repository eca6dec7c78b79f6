package kafkatest

import (
	"errors"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Outage takes c's brokers down and up again: while down, each closes a
// connection the moment a request arrives on it, as a broker that died
// under its clients does, and produced counts the produce requests that
// arrived meanwhile.
type Outage struct {
	down     atomic.Bool
	produces atomic.Int64
}

// NewOutage returns the outage of c, up until Down.
func NewOutage(c *kfake.Cluster) *Outage {
	o := &Outage{}
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !o.down.Load() {
			return nil, nil, false
		}
		if req.Key() == int16(kmsg.Produce) {
			o.produces.Add(1)
		}
		return nil, errors.New("broker down"), true
	})
	return o
}

// Down takes the brokers down.
func (o *Outage) Down() { o.down.Store(true) }

// Up brings them back.
func (o *Outage) Up() { o.down.Store(false) }

// Produces counts the produce requests that arrived while they were down.
func (o *Outage) Produces() int { return int(o.produces.Load()) }
