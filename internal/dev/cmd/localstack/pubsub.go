package main

import (
	"context"
	"fmt"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
)

// pubsubProject is the emulator's project.
const pubsubProject = "outbox-demo"

// startPubSub starts Pub/Sub's in-process fake with the orders topic.
// It keeps messages in memory and has no size limit of its own: the
// destination's max_message_bytes makes the demo's poison orders too
// large.
func startPubSub() (*pstest.Server, error) {
	srv := pstest.NewServer()
	if _, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + pubsubProject + "/topics/" + topic}); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("pubsub: create the orders topic: %w", err)
	}
	return srv, nil
}

func ordersToPubSub(addr string) orders {
	return orders{name: "orders", entry: fmt.Sprintf(`
  orders:
    pubsub:
      project: %s
      emulator: %s
      max_message_bytes: %d`, pubsubProject, addr, maxOrderSize)}
}
