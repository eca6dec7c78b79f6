// Command kafkabroker runs franz-go's in-process Kafka-protocol cluster
// (kfake) as a process of its own: the broker image of the container tests
// (see scripts/build-test-images), built without a registry. It listens on
// 127.0.0.1, so its containers share the host's network, and the address
// it advertises is the one clients on the host dial too.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 0, "TCP port on 127.0.0.1 (default: a free one, printed)")
	partitions := flag.Int("partitions", 3, "partitions of topics created without a count")
	dataDir := flag.String("data-dir", "", "keep the records here across restarts (default: in memory)")
	flag.Parse()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(*partitions)}
	if *port != 0 {
		opts = append(opts, kfake.Ports(*port))
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir), kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafkabroker:", err)
		os.Exit(1)
	}
	// The line the tests wait for, and read the address from.
	fmt.Printf("kafkabroker listening on %s\n", strings.Join(c.ListenAddrs(), ","))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	c.Close()
}
