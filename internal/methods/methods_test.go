package methods_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/methods"
)

func TestAllowed(t *testing.T) {
	mux := http.NewServeMux()
	nothing := func(http.ResponseWriter, *http.Request) {}
	mux.HandleFunc("GET /rows", nothing)
	mux.HandleFunc("POST /rows", nothing)
	mux.HandleFunc("GET /rows/{id}", nothing)
	mux.HandleFunc("DELETE /rows/{id}", nothing)
	mux.HandleFunc("POST /rows/{id}/replay", nothing)
	mux.HandleFunc("GET /{$}", nothing)
	mux.HandleFunc("/", nothing)
	for path, want := range map[string][]string{
		"/rows":          {"GET", "HEAD", "POST"},
		"/rows/7":        {"GET", "HEAD", "DELETE"},
		"/rows/7/replay": {"POST"},
		"/":              {"GET", "HEAD"},
		"/elsewhere":     nil,
	} {
		got := methods.Allowed(mux, httptest.NewRequest("PATCH", path, nil), "/")
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
}

func TestList(t *testing.T) {
	for want, in := range map[string][]string{"": nil, "GET": {"GET"}, "GET or HEAD": {"GET", "HEAD"}, "GET, HEAD or POST": {"GET", "HEAD", "POST"}} {
		if got := methods.List(in); got != want {
			t.Errorf("List(%v) = %q, want %q", in, got, want)
		}
	}
}
