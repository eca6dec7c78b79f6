// Package sqstest runs an SQS and SNS emulator (the npm package fauxqs on
// its own Node.js, installed by scripts/ensure-fauxqs) for the SQS sink's
// tests: on a free port, with its queues, topics and messages kept in a
// throwaway directory, so that it can be killed and started again on
// them. It is an emulator, not AWS: it speaks the services' protocols as
// aws-sdk-go-v2 does, and takes any credentials.
package sqstest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outbox-relay/outbox-relay/internal/dev/freeport"
	"github.com/outbox-relay/outbox-relay/internal/dev/memdir"
	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
)

// Region is the emulator's region.
const Region = "us-east-1"

// Dir is where scripts/ensure-fauxqs installs the emulator.
func Dir() string {
	if d := os.Getenv("OUTBOX_FAUXQS_DIR"); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(cache, "outbox-relay", "fauxqs")
}

// paths returns the emulator's Node.js and its module.
func paths() (node, app string, err error) {
	dir := Dir()
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	node = filepath.Join(dir, "node_modules", "node-linux-"+arch, "bin", "node")
	app = filepath.Join(dir, "node_modules", "fauxqs", "dist", "app.js")
	for _, f := range []string{node, app} {
		if _, err := os.Stat(f); err != nil {
			return "", "", errors.New("sqstest: fauxqs is not installed (" + f + "): run scripts/ensure-fauxqs")
		}
	}
	return node, app, nil
}

// Server is an emulator process.
type Server struct {
	tb        testing.TB // nil outside a test
	dir       string
	node, app string
	port      int
	cmd       *exec.Cmd
	done      chan struct{}
	// Endpoint is the URL the SDK's clients take as their endpoint, the
	// same across restarts.
	Endpoint string
}

// Start starts an emulator, stopped when the test ends. Without fauxqs
// the test is skipped, unless OUTBOX_TEST_SQS is set, as make test sets
// it: then it fails.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if _, _, err := paths(); err != nil {
		if os.Getenv("OUTBOX_TEST_SQS") != "" {
			tb.Fatal(err)
		}
		tb.Skip(err.Error() + " (make test does)")
	}
	s, err := Launch(memdir.Temp(tb))
	if err != nil {
		tb.Fatal(err)
	}
	s.tb = tb
	tb.Cleanup(s.Stop)
	return s
}

// Launch starts an emulator with its data in dir, outside a test (the
// local stack); the caller stops it.
func Launch(dir string) (*Server, error) {
	node, app, err := paths()
	if err != nil {
		return nil, err
	}
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, node: node, app: app, port: port, Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port)}
	return s, s.start()
}

func (s *Server) start() error {
	// The package's own command reads neither its data directory nor its
	// logger from the environment: start it as a program does. SIGTERM
	// stops it as a server stops, answering the requests under way first
	// (SIGKILL is the crash).
	script := fmt.Sprintf(`import { startFauxqs } from %q;
const server = await startFauxqs({ port: %d, host: "localhost", defaultRegion: %q, logger: false, dataDir: %q });
process.on("SIGTERM", async () => { await server.stop(); process.exit(0); });`,
		"file://"+s.app, s.port, Region, filepath.Join(s.dir, "data"))
	s.cmd = exec.Command(s.node, "--no-warnings", "--input-type=module", "-e", script)
	s.cmd.Dir = s.dir
	out, err := os.OpenFile(filepath.Join(s.dir, "fauxqs.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	s.cmd.Stdout, s.cmd.Stderr = out, out
	if err := s.cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("sqstest: %w", err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); _ = out.Close(); close(s.done) }()
	exited := false
	ok, _ := testwait.Poll(time.Minute, func() (bool, string) {
		select {
		case <-s.done:
			exited = true
			return true, ""
		default:
		}
		resp, err := http.Get(s.Endpoint + "/health")
		if err != nil {
			return false, ""
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, ""
	})
	if exited || !ok {
		log, _ := os.ReadFile(filepath.Join(s.dir, "fauxqs.log"))
		s.Stop()
		return fmt.Errorf("sqstest: fauxqs did not start:\n%s", log)
	}
	return nil
}

// Stop stops the emulator; its data stays in its directory.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Kill kills the emulator as a crash does (SIGKILL): what it acknowledged
// was written to its database before the answer.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Crash kills the emulator and starts it again on the same port with the
// same data, and fails the test if it cannot.
func (s *Server) Crash() {
	s.tb.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.tb.Fatal(err)
	}
}

// Restart starts the emulator again after Kill or Stop, on the same port
// with the same data, and fails the test if it cannot.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.Relaunch(); err != nil {
		s.tb.Fatal(err)
	}
}

// Config is an SDK configuration for the emulator, with credentials it
// takes.
func (s *Server) Config() aws.Config {
	return aws.Config{Region: Region, Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(s.Endpoint), RetryMaxAttempts: 1}
}

// SQS is a client of the emulator's SQS.
func (s *Server) SQS() *sqs.Client { return sqs.NewFromConfig(s.Config()) }

// SNS is a client of the emulator's SNS.
func (s *Server) SNS() *sns.Client { return sns.NewFromConfig(s.Config()) }

// CreateQueue creates a queue (FIFO when its name ends in .fifo) with
// attrs, and returns its URL. Unless attrs say otherwise, a message
// received stays visible (VisibilityTimeout 0): a Reader deletes what it
// read, and a receive tried again finds what a lost answer held.
func (s *Server) CreateQueue(tb testing.TB, name string, attrs map[string]string) string {
	tb.Helper()
	attrs = maps.Clone(attrs)
	if attrs == nil {
		attrs = map[string]string{}
	}
	if strings.HasSuffix(name, ".fifo") {
		attrs["FifoQueue"] = "true"
	}
	if _, ok := attrs["VisibilityTimeout"]; !ok {
		attrs["VisibilityTimeout"] = "0"
	}
	out, err := s.SQS().CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		tb.Fatalf("sqstest: create queue %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

// DeleteQueue deletes the queue at url.
func (s *Server) DeleteQueue(tb testing.TB, url string) {
	tb.Helper()
	if _, err := s.SQS().DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
		tb.Fatalf("sqstest: delete queue %s: %v", url, err)
	}
}

// CreateTopic creates a topic (FIFO when its name ends in .fifo) whose
// messages reach the queue at queueURL as they were published (raw
// delivery), and returns its ARN.
func (s *Server) CreateTopic(tb testing.TB, name, queueURL string) string {
	tb.Helper()
	ctx := context.Background()
	in := &sns.CreateTopicInput{Name: aws.String(name)}
	if strings.HasSuffix(name, ".fifo") {
		in.Attributes = map[string]string{"FifoTopic": "true"}
	}
	t, err := s.SNS().CreateTopic(ctx, in)
	if err != nil {
		tb.Fatalf("sqstest: create topic %s: %v", name, err)
	}
	q, err := s.SQS().GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		tb.Fatalf("sqstest: queue %s: %v", queueURL, err)
	}
	_, err = s.SNS().Subscribe(ctx, &sns.SubscribeInput{TopicArn: t.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: aws.String(q.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]), Attributes: map[string]string{"RawMessageDelivery": "true"}})
	if err != nil {
		tb.Fatalf("sqstest: subscribe %s to %s: %v", queueURL, name, err)
	}
	return aws.ToString(t.TopicArn)
}

// Reader reads a queue's messages as a consumer does, deleting each it
// read, and keeps all it has read.
type Reader struct {
	s   *Server
	url string
	all []sqstypes.Message
}

// Reader returns a reader of the queue at url.
func (s *Server) Reader(url string) *Reader { return &Reader{s: s, url: url} }

// Read receives every message now visible, deletes them, and returns all
// messages read so far, oldest first (a FIFO queue's in each group's
// order).
func (r *Reader) Read(tb testing.TB) []sqstypes.Message {
	tb.Helper()
	ctx := context.Background()
	// A receive whose answer is lost (a connection closed as it answers,
	// on a loaded machine) is tried again, and finds the same messages:
	// the test queues keep them visible until deleted (see CreateQueue).
	c := sqs.NewFromConfig(r.s.Config(), func(o *sqs.Options) { o.RetryMaxAttempts = 3 })
	for {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(r.url), MaxNumberOfMessages: 10,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{"All"}})
		if err != nil {
			tb.Fatalf("sqstest: receive from %s: %v", r.url, err)
		}
		if len(out.Messages) == 0 {
			return r.all
		}
		r.all = append(r.all, out.Messages...)
		for _, m := range out.Messages {
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(r.url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				tb.Fatalf("sqstest: delete from %s: %v", r.url, err)
			}
		}
	}
}

// Relaunch stops the emulator and starts it again, on the same port with
// the same data.
func (s *Server) Relaunch() error {
	s.Stop()
	return s.start()
}
