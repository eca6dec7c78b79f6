package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsStack is a NATS server with JetStream in this process, its streams
// in a temporary directory, with a stream ORDERS that takes the orders
// topic's subject. It takes messages up to maxOrderSize, so the demo's
// poison orders are too large for it as they are for the broker.
type natsStack struct {
	opts server.Options
	srv  *server.Server
	url  string
	nc   *natsgo.Conn
	js   jetstream.JetStream
}

func startNATS() (*natsStack, error) {
	dir, err := os.MkdirTemp("", "outbox-localstack-nats-")
	if err != nil {
		return nil, err
	}
	n := &natsStack{opts: server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: dir, MaxPayload: maxOrderSize}}
	if err := n.start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	n.opts.Port = n.srv.Addr().(*net.TCPAddr).Port
	n.url = n.srv.ClientURL()
	if n.nc, err = natsgo.Connect(n.url, natsgo.MaxReconnects(-1)); err != nil {
		n.close()
		return nil, err
	}
	if n.js, err = jetstream.New(n.nc); err != nil {
		n.close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := n.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{topic}, Storage: jetstream.FileStorage}); err != nil {
		n.close()
		return nil, fmt.Errorf("nats: add the ORDERS stream: %w", err)
	}
	return n, nil
}

func (n *natsStack) start() error {
	opts := n.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats: the server did not start")
	}
	n.srv = srv
	return nil
}

func (n *natsStack) stop() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}

func (n *natsStack) close() {
	if n.nc != nil {
		n.nc.Close()
	}
	n.stop()
	os.RemoveAll(n.opts.StoreDir)
}

// stored is the number of messages the ORDERS stream holds, or the last
// known number while the server is down.
func (n *natsStack) stored(ctx context.Context, last int64) int64 {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := n.js.Stream(ctx, "ORDERS")
	if err != nil {
		return last
	}
	info, err := st.Info(ctx)
	if err != nil {
		return last
	}
	return int64(info.State.Msgs)
}
