package store_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.StatementStats, pgtest.WaitingTests) }
