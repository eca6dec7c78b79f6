package api_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/api"
	"github.com/outbox-relay/outbox-relay/internal/dev/pgtest"
)

// Any request to any route, with any path value, query and body: a 4xx
// or a 2xx, never a 500 and never a panic. The seeds are in
// testdata/fuzz/FuzzAPI and below; make fuzz runs it longer.
func FuzzAPI(f *testing.F) {
	s := pgtest.NewSchema(f)
	h := newAPIWithRoles(f, s)
	for _, d := range []dead{{Key: "k1"}, {Key: "k2", Payload: []byte("not json")}, {Key: ""}} {
		addDead(f, s, d)
	}
	addParked(f, s, "parked", base)
	routes := api.Routes()
	for i, rt := range routes {
		body := ""
		if rt.Method == http.MethodPost {
			body = `{"ids":["1"],"reason":"r","dry_run":true}`
		}
		f.Add(uint8(i), "1", "limit=5&since=2h", []byte(body))
	}
	f.Add(uint8(0), "1", "status=dead_lettered&topic=orders&error=%25x&group=zz&cursor=abc", []byte(nil))
	f.Add(uint8(0), "1", "since=2026-11-30T00:00:00Z&until=1h&limit=-1", []byte(nil))
	f.Add(uint8(1), "00000000-0000-0000-0000-000000000000", "", []byte(nil))
	f.Add(uint8(6), "1", "q=k1&kind=key&limit=99999999999", []byte(nil))
	f.Add(uint8(8), "2", "", []byte(`{"payload":{"a":1},"payload_text":"x"}`))
	f.Add(uint8(8), "2", "", []byte(`{"payload_base64":"!!","headers":{"a":1}}`))
	f.Add(uint8(9), "1", "", []byte(`{"filter":{"since":"-1h","group":"\u0000"},"all":true,"dry_run":true,"rate":-1}`))
	f.Add(uint8(10), "1", "", []byte(`{"ids":[1e99,"x",-1],"to":"","dry_run":true}`))
	f.Add(uint8(11), "1", "", []byte(`{"key":null,"discard":"yes"}`))
	f.Add(uint8(2), "1", "%zz=1&a=%", []byte(`{}{}`))
	f.Fuzz(func(t *testing.T, route uint8, ref, rawQuery string, body []byte) {
		rt := routes[int(route)%len(routes)]
		path := "/api/v1" + strings.ReplaceAll(rt.Path, "{ref}", url.PathEscape(ref))
		req := httptest.NewRequest(rt.Method, "/", bytes.NewReader(body))
		req.URL.Path, req.URL.RawQuery = path, rawQuery
		req.Header.Set("Authorization", "Bearer "+roleTokens[access.Operator])
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s?%s %q: %d %s", rt.Method, path, rawQuery, body, rec.Code, rec.Body.String())
		}
	})
}
