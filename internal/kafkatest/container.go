package kafkatest

import (
	"context"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/kafka"
)

// ContainerImage is the broker image for container tests: Apache Kafka in
// KRaft mode, as packaged by Confluent. It is the image family the
// testcontainers-go Kafka module starts at the version this module pins.
const ContainerImage = "confluentinc/confluent-local:7.5.0"

// RunContainer starts a single-broker Kafka (ContainerImage) in a container
// and returns its bootstrap address and a function that removes it. It
// needs a Docker engine. Create topics with CreateTopics.
func RunContainer(ctx context.Context) (brokers []string, stop func() error, err error) {
	c, err := kafka.Run(ctx, ContainerImage, kafka.WithClusterID("outbox-relay-test"))
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return nil, nil, fmt.Errorf("start Kafka container %s: %w", ContainerImage, err)
	}
	brokers, err = c.Brokers(ctx)
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return nil, nil, fmt.Errorf("brokers of Kafka container %s: %w", ContainerImage, err)
	}
	return brokers, func() error { return testcontainers.TerminateContainer(c) }, nil
}
