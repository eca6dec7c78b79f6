package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CreateTopics creates topics with the given number of partitions (one
// replica each) on any Kafka-protocol cluster, and returns once the
// cluster's metadata shows every partition with a leader, so that a
// producer's first write does not race the topic's creation. A topic that
// exists already is left alone.
func CreateTopics(ctx context.Context, brokers []string, partitions int32, topics ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("kafkatest: client for %v: %w", brokers, err)
	}
	defer cl.Close()

	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30_000
	for _, name := range topics {
		t := kmsg.NewCreateTopicsRequestTopic()
		t.Topic, t.NumPartitions, t.ReplicationFactor = name, partitions, 1
		req.Topics = append(req.Topics, t)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafkatest: create topics %v: %w", topics, err)
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafkatest: create topic %s: %w", t.Topic, err)
		}
	}

	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		parts, err := partitionsOf(ctx, cl, topics...)
		if err == nil {
			ready := true
			for _, name := range topics {
				ready = ready && len(parts[name]) == int(partitions)
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkatest: topics %v not ready (last error %v): %w", topics, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// partitionsOf returns, per topic, the partitions that have a leader.
func partitionsOf(ctx context.Context, cl *kgo.Client, topics ...string) (map[string][]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, name := range topics {
		t := kmsg.NewMetadataRequestTopic()
		t.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, t)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("metadata of %v: %w", topics, err)
	}
	out := make(map[string][]int32, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic == nil {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", *t.Topic, err)
		}
		for _, p := range t.Partitions {
			if p.ErrorCode == 0 && p.Leader >= 0 {
				out[*t.Topic] = append(out[*t.Topic], p.Partition)
			}
		}
	}
	return out, nil
}

// ConsumeTopic reads every record topic holds now on any Kafka-protocol
// cluster, duplicates included: it asks the brokers for each partition's
// offsets first, so a test sees extra records instead of stopping at the
// number it expects.
func ConsumeTopic(ctx context.Context, tb testing.TB, brokers []string, topic string) []Record {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		tb.Fatalf("kafkatest: client for %v: %v", brokers, err)
	}
	defer cl.Close()
	parts, err := partitionsOf(ctx, cl, topic)
	if err != nil {
		tb.Fatalf("kafkatest: %v", err)
	}
	start, err := offsets(ctx, cl, topic, parts[topic], -2)
	if err != nil {
		tb.Fatalf("kafkatest: %v", err)
	}
	end, err := offsets(ctx, cl, topic, parts[topic], -1)
	if err != nil {
		tb.Fatalf("kafkatest: %v", err)
	}
	total := int64(0)
	for p, e := range end {
		total += e - start[p]
	}
	return Consume(ctx, tb, brokers, topic, int(total))
}

// offsets lists the partitions' earliest (timestamp -2) or next (-1)
// offsets.
func offsets(ctx context.Context, cl *kgo.Client, topic string, partitions []int32, timestamp int64) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	t := kmsg.NewListOffsetsRequestTopic()
	t.Topic = topic
	for _, p := range partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, timestamp
		t.Partitions = append(t.Partitions, rp)
	}
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	out := make(map[int32]int64, len(partitions))
	for _, rt := range resp.Topics {
		for _, p := range rt.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, p.Partition, err)
			}
			out[p.Partition] = p.Offset
		}
	}
	if len(out) != len(partitions) {
		return nil, fmt.Errorf("list offsets of %s: %d of %d partitions answered", topic, len(out), len(partitions))
	}
	return out, nil
}
