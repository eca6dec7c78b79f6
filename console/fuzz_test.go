package console_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/console"
)

// Any page with any query, any form posted to any form's path, by an
// operator in a session, with the session's CSRF token: a page, a
// redirect or a 4xx, never a 500 and never a panic. make fuzz runs it
// longer.
func FuzzConsole(f *testing.F) {
	e := newEnv(f)
	id := e.deadLetter("hooks", "k1", `{"n":1}`, "HTTP 422: no amount")
	e.deadLetter("hooks", "", "not json", "HTTP 400")
	b := e.loggedIn()
	var routes []console.Route
	for _, rt := range console.Routes() {
		if !rt.Public && rt.Path != "/logout" { // signing out would end the session
			routes = append(routes, rt)
		}
	}
	ref := strconv.FormatInt(id, 10)
	for i := range routes {
		f.Add(uint8(i), ref, "outbox=main&why=checked")
	}
	f.Add(uint8(0), ref, "outbox=nowhere")
	f.Add(uint8(0), "x", "status=nope&since=-1h&until=1999-01-01&limit=-5&cursor=%zz")
	f.Add(uint8(0), ref, "q=%00&kind=row&key="+strings.Repeat("k", 5000))
	f.Add(uint8(0), ref, "payload=%7B&headers=%5B1%5D&topic=&allow_non_json=1&version=zz&to=&key=")
	f.Fuzz(func(t *testing.T, route uint8, value, form string) {
		// The browser reports to the input's test; inputs run one at a
		// time.
		e.t = t
		defer func() { e.t = f }()
		rt := routes[int(route)%len(routes)]
		path := "/console" + strings.NewReplacer("{ref}", url.PathEscape(value), "{group}", url.PathEscape(value),
			"{action}", "replay", "{name}", url.PathEscape(value), "{$}", "").Replace(rt.Path)
		// As a browser sends it: encoded.
		v, err := url.ParseQuery(form)
		if err != nil {
			return
		}
		var code int
		var body string
		if rt.Method == http.MethodGet {
			code, _, body = b.do("GET", path+"?"+v.Encode(), nil)
		} else {
			code, body = b.post(path, v)
		}
		if code >= 500 {
			t.Fatalf("%s %s %q: %d\n%s", rt.Method, path, form, code, body)
		}
	})
}
