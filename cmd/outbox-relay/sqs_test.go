package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outbox-relay/outbox-relay/internal/dev/testwait"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/sqs/sqstest"
)

// sqsConfig routes payment.* to the FIFO queue payments.fifo and
// notification.* to the FIFO topic notifications.fifo (found by name) of
// the emulator at endpoint, with pauses of 50 to 200ms. The credentials
// and region come from the environment, as the SDK's default chain reads
// them (sqsEnv).
func sqsConfig(t *testing.T, endpoint string) string {
	return writeConfig(t, `
retry:
  pause_base: 50ms
  pause_max: 200ms
destinations:
  queue:
    sqs:
      endpoint: `+endpoint+`
      max_message_bytes: 65536
  notify:
    sns:
      endpoint: `+endpoint+`
      max_message_bytes: 65536
routes:
  - topics: ["payment.*"]
    destination: queue
    topic: payments.fifo
  - topics: ["notification.*"]
    destination: notify
    topic: notifications.fifo
`)
}

func sqsEnv(dsn, cfg string) []string {
	return natsEnv(dsn, cfg, "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION="+sqstest.Region,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
}

// byKeyOf reads messages' payloads (row numbers) by their outbox-key
// attribute, and fails t on one whose key is not k<n%20>.
func byKeyOf(t *testing.T, msgs []sqstypes.Message) map[string][]int {
	t.Helper()
	byKey := map[string][]int{}
	for _, m := range msgs {
		n, err := strconv.Atoi(*m.Body)
		key := m.MessageAttributes[sink.HeaderKey].StringValue
		if err != nil || key == nil || *key != "k"+strconv.Itoa(n%20) || m.MessageAttributes[sink.HeaderEventID].StringValue == nil {
			t.Fatalf("message %q with attributes %v", *m.Body, m.MessageAttributes)
		}
		byKey[*key] = append(byKey[*key], n)
	}
	return byKey
}

// The binary sends to an SQS queue and an SNS topic from its
// configuration, with credentials from the environment: 1,000 rows to
// each, every key's in order (FIFO groups), and beside them a row too
// large and one whose header no message attribute can carry, each
// dead-lettered alone with its reason.
func TestRunDeliversToSQSAndSNS(t *testing.T) {
	t.Parallel()
	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "payments.fifo", nil)
	notified := srv.CreateQueue(t, "notified.fifo", nil)
	srv.CreateTopic(t, "notifications.fifo", notified)
	dsn, pool := migrated(t)
	for _, topic := range []string{"payment.taken", "notification.sent"} {
		if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload, headers)
SELECT $1, 'k' || (g % 20), CASE WHEN g = 500 THEN repeat('x', 100000)::bytea ELSE g::text::bytea END,
  CASE WHEN g = 700 THEN '{"not an attribute": "x"}'::jsonb ELSE '{}'::jsonb END
FROM generate_series(1, 1002) g`, topic); err != nil {
			t.Fatal(err)
		}
	}
	p := startRelay(t, sqsEnv(dsn, sqsConfig(t, srv.Endpoint)))
	testwait.Within(t, 90*time.Second, "every row settled", func() bool { return countRows(t, pool, "status = 'pending'") == 0 })
	for reason, where := range map[string]string{"too_large": "length(payload) = 100000", "invalid_message": "headers ? 'not an attribute'"} {
		if n := countRows(t, pool, "status = 'dead_lettered' AND dead_letter_reason = '"+reason+"' AND "+where); n != 2 {
			t.Fatalf("%d rows dead-lettered %s, want one of each topic; output:\n%s", n, reason, p.output)
		}
	}
	if n := countRows(t, pool, "true"); n != 4 {
		t.Fatalf("%d rows left, want only the four dead letters", n)
	}
	for name, url := range map[string]string{"the queue": queue, "the topic's queue": notified} {
		msgs := srv.Reader(url).Read(t)
		if len(msgs) != 1000 {
			t.Fatalf("%s holds %d messages, want 1000", name, len(msgs))
		}
		inOrder(t, name, byKeyOf(t, msgs))
	}
	if out := p.output.String(); !strings.Contains(out, "message attribute") {
		t.Errorf("the dead-lettered row's reason is not logged:\n%s", out)
	}
}

// The emulator stops while rows arrive, for many failed probes of the
// breaker, then comes back on its data: every row is sent, in order per
// key, none is dead-lettered, and no attempt is counted for the refused
// connections.
func TestRunRidesOutAnSQSOutage(t *testing.T) {
	testwait.SkipShort(t)
	t.Parallel()
	srv := sqstest.Start(t)
	queue := srv.CreateQueue(t, "payments.fifo", nil)
	dsn, pool := migrated(t)
	rows := rideOutOutage(t, pool, sqsEnv(dsn, sqsConfig(t, srv.Endpoint)),
		serverOutage{dest: "queue", topic: "payment.taken", stop: srv.Stop, start: srv.Restart})
	msgs := srv.Reader(queue).Read(t)
	if len(msgs) < rows {
		t.Fatalf("the queue holds %d messages, want %d", len(msgs), rows)
	}
	inOrder(t, "the queue", byKeyOf(t, msgs))
}
