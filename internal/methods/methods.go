// Package methods finds which methods a path takes on a ServeMux whose
// patterns name their methods, for the 405 answer of a catch-all pattern.
package methods

import "net/http"

// Allowed lists the methods (GET, HEAD, POST, PUT, PATCH, DELETE) with
// which a pattern of mux other than fallback takes r's path. A catch-all
// pattern that matches every method and path catches a known path asked
// for with the wrong method too: with Allowed it can answer 405 and Allow
// rather than 404.
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
