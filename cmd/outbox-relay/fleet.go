package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/outbox-relay/outbox-relay/fleet"
	"github.com/outbox-relay/outbox-relay/relay"
)

// coordinationConns is the pool of the fleet's syncs: one short
// transaction every interval, kept apart from the outbox's pool so that
// busy claims never hold a sync back.
const coordinationConns = 2

// openFleet sets up the replica's share of the fleet's flow control, or
// returns nil when coordination is off. Nothing connects yet: a
// coordination database that is down leaves flow control per process
// until it answers.
func (a *app) openFleet(ctx context.Context, replica string) (*relay.FleetConfig, func(), error) {
	k := a.cfg.Coordination
	if !k.Enabled {
		return nil, func() {}, nil
	}
	o, err := a.cfg.CoordinationOutbox()
	if err != nil {
		return nil, nil, err
	}
	db := o.Database
	db.MaxConns = coordinationConns
	pool, err := newPool(ctx, db)
	if err != nil {
		return nil, nil, fmt.Errorf("coordination: %w", err)
	}
	store, err := fleet.New(pool, db.Schema)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return &relay.FleetConfig{Fleet: store, Replica: replica, Interval: k.Interval, Lease: k.Lease}, pool.Close, nil
}

// replicaName names this process in the fleet: its host name (a pod's
// name in Kubernetes) and a random suffix, unique across restarts.
func replicaName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "relay"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// fleetStore is the coordination tables' store of cfg, nil outside a
// fleet.
func fleetStore(cfg *relay.FleetConfig) *fleet.Store {
	if cfg == nil {
		return nil
	}
	st, _ := cfg.Fleet.(*fleet.Store)
	return st
}
