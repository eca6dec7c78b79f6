package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// admin returns an admin client for brokers; close it with Close.
func admin(brokers []string) (*kadm.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, fmt.Errorf("kafkatest: client for %v: %w", brokers, err)
	}
	return kadm.NewClient(cl), nil
}

// CreateTopics creates topics with the given number of partitions (one
// replica each) on any Kafka-protocol cluster, and returns once the
// cluster's metadata shows every partition with a leader, so that a
// producer's first write does not race the topic's creation. A topic that
// exists already is left alone.
func CreateTopics(ctx context.Context, brokers []string, partitions int32, topics ...string) error {
	adm, err := admin(brokers)
	if err != nil {
		return err
	}
	defer adm.Close()
	created, err := adm.CreateTopics(ctx, partitions, 1, nil, topics...)
	if err != nil {
		return fmt.Errorf("kafkatest: create topics %v: %w", topics, err)
	}
	for _, t := range created {
		if t.Err != nil && !errors.Is(t.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafkatest: create topic %s: %w", t.Topic, t.Err)
		}
	}

	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		details, err := adm.ListTopics(ctx, topics...)
		if err == nil {
			err = details.Error()
		}
		if err == nil && led(details, topics, partitions) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkatest: topics %v not ready (last error %v): %w", topics, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// led reports whether every partition of every topic has a leader.
func led(details kadm.TopicDetails, topics []string, partitions int32) bool {
	for _, name := range topics {
		ps := details[name].Partitions
		if len(ps) != int(partitions) {
			return false
		}
		for _, p := range ps {
			if p.Err != nil || p.Leader < 0 {
				return false
			}
		}
	}
	return true
}

// ConsumeTopic reads every record topic holds now on any Kafka-protocol
// cluster, duplicates included: it asks the brokers for each partition's
// offsets first, so a test sees extra records instead of stopping at the
// number it expects.
func ConsumeTopic(ctx context.Context, tb testing.TB, brokers []string, topic string) []Record {
	tb.Helper()
	adm, err := admin(brokers)
	if err != nil {
		tb.Fatal(err)
	}
	defer adm.Close()
	start, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = start.Error()
	}
	if err != nil {
		tb.Fatalf("kafkatest: start offsets of %s: %v", topic, err)
	}
	end, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = end.Error()
	}
	if err != nil {
		tb.Fatalf("kafkatest: end offsets of %s: %v", topic, err)
	}
	total := int64(0)
	end.Each(func(o kadm.ListedOffset) {
		s, _ := start.Lookup(o.Topic, o.Partition)
		total += o.Offset - s.Offset
	})
	return Consume(ctx, tb, brokers, topic, int(total))
}
