// Package builtin registers the sinks the relay's binary ships: import it
// for its side effect. The binary and the tests that check the documented
// configuration of every sink import the same list.
package builtin

import (
	_ "github.com/outbox-relay/outbox-relay/relay/kafka"    // kafka
	_ "github.com/outbox-relay/outbox-relay/relay/nats"     // nats (JetStream)
	_ "github.com/outbox-relay/outbox-relay/relay/pubsub"   // pubsub (Google Cloud)
	_ "github.com/outbox-relay/outbox-relay/relay/rabbitmq" // rabbitmq
	_ "github.com/outbox-relay/outbox-relay/relay/redis"    // redis (Streams)
	_ "github.com/outbox-relay/outbox-relay/relay/sqs"      // sqs, sns (Amazon)
	_ "github.com/outbox-relay/outbox-relay/relay/webhook"  // http
)
