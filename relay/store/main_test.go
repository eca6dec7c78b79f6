package store_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
