package dashboard_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// route is one route of the dashboard. setup prepares what the request
// needs (a fresh fixture for a mutation) and returns the path, the form
// and a check that the database changed exactly when it should have.
type route struct {
	name   string
	post   bool
	static bool
	setup  func(t *testing.T, e *env, n int) (path string, form url.Values, changed func() bool)
}

func routes(shared int64) []route {
	id := strconv.FormatInt(shared, 10)
	getRoute := func(name, path string) route {
		return route{name: name, setup: func(*testing.T, *env, int) (string, url.Values, func() bool) { return path, nil, nil }}
	}
	return []route{
		getRoute("queues", "/"),
		getRoute("instances", "/instances?status=runnable&limit=5"),
		getRoute("instance", "/instances/"+id),
		getRoute("machines", "/machines"),
		getRoute("graph", "/machines/order"),
		{name: "css", static: true, setup: func(*testing.T, *env, int) (string, url.Values, func() bool) {
			return "/static/style.css", nil, nil
		}},
		{name: "js", static: true, setup: func(*testing.T, *env, int) (string, url.Values, func() bool) {
			return "/static/app.js", nil, nil
		}},
		{name: "pause", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			q := fmt.Sprintf("mq-pause-%d", n)
			e.insertOrder(Order{Item: "p"}, gendurable.InsertOpts{Queue: q}) // only a known queue can be paused
			return "/queues/" + q + "/pause", url.Values{}, func() bool { return e.queuePaused(q) }
		}},
		{name: "resume", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			q := fmt.Sprintf("mq-resume-%d", n)
			e.insertOrder(Order{Item: "r"}, gendurable.InsertOpts{Queue: q})
			require.NoError(t, e.eng.Pause(context.Background(), q))
			return "/queues/" + q + "/resume", url.Values{}, func() bool { return !e.queuePaused(q) }
		}},
		{name: "retry", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			id := e.failed()
			return fmt.Sprintf("/instances/%d/retry", id), url.Values{}, func() bool {
				return e.instance(id).Status == gendurable.StatusRunnable
			}
		}},
		{name: "run-now", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			id := e.insertOrder(Order{Item: "n"}, gendurable.InsertOpts{RunIn: time.Hour})
			return fmt.Sprintf("/instances/%d/run-now", id), url.Values{}, func() bool {
				return e.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND eligible_at <= now()`, id) == 1
			}
		}},
		{name: "cancel", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			id := e.insertOrder(Order{Item: "c"})
			return fmt.Sprintf("/instances/%d/cancel", id), url.Values{"reason": {"matrix"}}, func() bool {
				return e.instance(id).Status == gendurable.StatusFailed
			}
		}},
		{name: "bulk-retry", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			a, b := e.failed(), e.failed()
			form := url.Values{"id": {strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)}, "scope": {"selected"}}
			return "/bulk/retry", form, func() bool {
				return e.instance(a).Status == gendurable.StatusRunnable && e.instance(b).Status == gendurable.StatusRunnable
			}
		}},
		{name: "bulk-cancel-match", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			q := fmt.Sprintf("mq-bulk-%d", n)
			a := e.insertOrder(Order{Item: "b"}, gendurable.InsertOpts{Queue: q})
			return "/bulk/cancel", url.Values{"queue": {q}, "scope": {"match"}}, func() bool {
				return e.instance(a).Status == gendurable.StatusFailed
			}
		}},
		{name: "signal", post: true, setup: func(t *testing.T, e *env, n int) (string, url.Values, func() bool) {
			id := e.insertOrder(Order{Item: "s"})
			return fmt.Sprintf("/instances/%d/signal", id), url.Values{"name": {"go"}, "payload": {`{"a":1}`}}, func() bool {
				return e.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1`, id) == 1
			}
		}},
	}
}

type authKind struct {
	name  string
	opts  func(o *dashboard.Options)
	good  map[string]string
	wrong []map[string]string
	realm string
}

func basicHeader(u, p string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":"+p))
}

var authKinds = []authKind{
	{
		name:  "basic",
		opts:  func(o *dashboard.Options) { o.BasicAuth = &dashboard.BasicAuth{User: "ops", Password: "s3cret"} },
		good:  map[string]string{"Authorization": basicHeader("ops", "s3cret")},
		realm: "Basic",
		wrong: []map[string]string{
			{"Authorization": basicHeader("ops", "wrong")},
			{"Authorization": basicHeader("root", "s3cret")},
			{"Authorization": basicHeader("ops", "s3cret ")},
			{"Authorization": "Bearer s3cret"},
		},
	},
	{
		name:  "bearer",
		opts:  func(o *dashboard.Options) { o.BearerToken = "tok-123" },
		good:  map[string]string{"Authorization": "Bearer tok-123"},
		realm: "Bearer",
		wrong: []map[string]string{
			{"Authorization": "Bearer tok-124"},
			{"Authorization": "Bearer tok-12"},
			{"Authorization": "Bearer "},
			{"Authorization": basicHeader("ops", "tok-123")},
		},
	},
}

type methodCase struct {
	name   string
	method string
	header map[string]string
	cross  bool
}

var methodCases = []methodCase{
	{name: "GET", method: http.MethodGet},
	{name: "POST", method: http.MethodPost, header: map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}},
	{name: "POST-cross-site", method: http.MethodPost, header: map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}, cross: true},
	{name: "POST-origin-mismatch", method: http.MethodPost, header: map[string]string{"Origin": "http://evil.example"}, cross: true},
}

// expected is the status a request must get.
func expected(rt route, creds string, readOnly bool, m methodCase) int {
	switch {
	case creds != "good":
		return http.StatusUnauthorized
	case m.method == http.MethodGet && rt.post:
		return http.StatusMethodNotAllowed
	case m.method == http.MethodGet:
		return http.StatusOK
	case m.cross:
		return http.StatusForbidden // cross-origin protection, before routing
	case !rt.post:
		return http.StatusMethodNotAllowed
	case readOnly:
		return http.StatusForbidden
	}
	return http.StatusSeeOther
}

// TestRouteMatrix: every route × credentials × mode × method gets the right
// status, and a mutation changes the database exactly when it succeeds.
func TestRouteMatrix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	shared := e.insertOrder(Order{Item: "shared"})
	n := 0
	total := 0
	for _, ak := range authKinds {
		for _, readOnly := range []bool{false, true} {
			opts := dashboard.Options{ReadOnly: readOnly}
			ak.opts(&opts)
			h, _ := e.handler(opts)
			for _, rt := range routes(shared) {
				for _, creds := range []string{"none", "wrong", "good"} {
					for _, m := range methodCases {
						name := fmt.Sprintf("%s/ro=%v/%s/%s/%s", ak.name, readOnly, rt.name, creds, m.name)
						headerSets := []map[string]string{nil}
						switch creds {
						case "good":
							headerSets = []map[string]string{ak.good}
						case "wrong":
							headerSets = ak.wrong
						}
						for _, hs := range headerSets {
							n++
							total++
							path, form, changed := rt.setup(t, e, n)
							r := req{method: m.method, path: path, header: map[string]string{}}
							if m.method == http.MethodPost {
								r.form = form
								if r.form == nil {
									r.form = url.Values{}
								}
							}
							for k, v := range m.header {
								r.header[k] = v
							}
							for k, v := range hs {
								r.header[k] = v
							}
							got := do(t, h, r)
							want := expected(rt, creds, readOnly, m)
							require.Equal(t, want, got.code, "%s: body %s", name, got.body)
							if want == http.StatusUnauthorized {
								require.Contains(t, got.header.Get("WWW-Authenticate"), ak.realm, name)
								require.NotContains(t, got.body, "<html", name)
							}
							require.Equal(t, "nosniff", got.header.Get("X-Content-Type-Options"), name)
							require.Equal(t, "DENY", got.header.Get("X-Frame-Options"), name)
							require.Contains(t, got.header.Get("Content-Security-Policy"), "default-src 'self'", name)
							if changed != nil {
								require.Equal(t, want == http.StatusSeeOther, changed(), "%s: database changed", name)
							}
							if want == http.StatusSeeOther {
								require.Contains(t, got.header.Get("Location"), "flash=", name)
							}
							if readOnly && want == http.StatusOK && !rt.static {
								require.NotContains(t, got.body, `method="post"`, "%s: read-only page shows a form", name)
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d requests checked", total)
}

// TestNoAuthConfigured: without credentials configured, the handler serves
// anyone (it is meant for loopback or behind the user's own auth).
func TestNoAuthConfigured(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	for _, p := range []string{"/", "/instances", "/machines", "/machines/order"} {
		r := get(t, h, p)
		require.Equal(t, http.StatusOK, r.code, p)
		require.Empty(t, r.header.Get("WWW-Authenticate"))
	}
	// HEAD works like GET, without a body.
	r := do(t, h, req{method: http.MethodHead, path: "/instances"})
	require.Equal(t, http.StatusOK, r.code)
	require.Empty(t, r.body)
	// Other methods on a mutation are refused.
	for _, m := range []string{http.MethodPut, http.MethodDelete, http.MethodPatch} {
		r := do(t, h, req{method: m, path: "/queues/default/pause", header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
		require.Equal(t, http.StatusMethodNotAllowed, r.code, m)
	}
	require.False(t, e.queuePaused("default"))
}
