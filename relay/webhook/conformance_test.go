package webhook_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/relay/publishertest"
	"github.com/outbox-relay/outbox-relay/relay/sink"
	"github.com/outbox-relay/outbox-relay/relay/webhook"
)

// The receiver of the conformance suite accepts bodies up to this size.
const receiverLimit = 64 << 10

func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Sink{
		New: func(t *testing.T) publishertest.Destination {
			var mu sync.Mutex
			var got []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.ContentLength > receiverLimit {
					http.Error(w, "too large", http.StatusRequestEntityTooLarge)
					return
				}
				body, _ := io.ReadAll(r.Body)
				if r.Header.Get("X-Conformance") == "reject" {
					http.Error(w, "malformed", http.StatusBadRequest)
					return
				}
				mu.Lock()
				got = append(got, string(body))
				mu.Unlock()
			}))
			t.Cleanup(srv.Close)
			return publishertest.Destination{
				Publisher: conformancePublisher(t, srv.URL),
				Accepted: func(*testing.T) []string {
					mu.Lock()
					defer mu.Unlock()
					return append([]string(nil), got...)
				},
			}
		},
		Reject:   func(rec *sink.Record) { rec.Headers = map[string]string{"X-Conformance": "reject"} },
		TooLarge: func(rec *sink.Record) { rec.Payload = []byte(strings.Repeat("x", 2*receiverLimit)) },
		Unreachable: func(t *testing.T) sink.Publisher {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			url := "http://" + ln.Addr().String()
			_ = ln.Close()
			return conformancePublisher(t, url)
		},
	})
}

func conformancePublisher(t *testing.T, url string) *webhook.Publisher {
	t.Helper()
	p, err := webhook.New(webhook.Config{Name: "conformance", URL: url, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
