// Package methods finds which methods a path takes on a ServeMux whose
// patterns name their methods, for the 405 answer of a catch-all pattern.
package methods

import (
	"net/http"
	"strings"
)

// Allowed lists the methods (GET, HEAD, POST, PUT, PATCH, DELETE) with
// which a pattern of mux other than fallback takes r's path. A catch-all
// pattern that matches every method and path catches a known path asked
// for with the wrong method too: with Allowed it can answer 405 and Allow
// rather than 404. A method counts when any pattern takes the path with
// it, though that pattern's handler may still refuse the request (a
// wildcard that matches, a redirect to the path with a slash).
func Allowed(mux *http.ServeMux, r *http.Request, fallback string) []string {
	var methods []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		other := r.Clone(r.Context())
		other.Method = m
		if _, pattern := mux.Handler(other); pattern != fallback {
			methods = append(methods, m)
		}
	}
	return methods
}

// List joins methods for a message: "GET, HEAD or POST".
func List(methods []string) string {
	if len(methods) < 2 {
		return strings.Join(methods, "")
	}
	return strings.Join(methods[:len(methods)-1], ", ") + " or " + methods[len(methods)-1]
}
