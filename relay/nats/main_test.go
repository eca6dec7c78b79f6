package nats_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/nats/natstest"
)

// The crash test kills a NATS server in a process of its own: this test
// binary, run again as the server.
func TestMain(m *testing.M) { natstest.Main(m) }
