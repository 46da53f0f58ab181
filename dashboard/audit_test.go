package dashboard_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/stretchr/testify/require"
)

// captured is a slog handler that keeps records at Warn and above, as the
// logger of `gendurable ui` does.
type captured struct {
	mu   sync.Mutex
	recs []map[string]any
}

func (c *captured) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *captured) WithAttrs([]slog.Attr) slog.Handler           { return c }
func (c *captured) WithGroup(string) slog.Handler                { return c }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	m := map[string]any{"msg": r.Message, "level": r.Level}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Any()
		return true
	})
	c.mu.Lock()
	c.recs = append(c.recs, m)
	c.mu.Unlock()
	return nil
}

// with returns the records whose message is msg.
func (c *captured) with(msg string) []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, r := range c.recs {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// TestAuditTrail: every mutation leaves one line at LevelAudit — on under a
// Warn-level logger — with who, what, which ids, from where and how it
// ended, refused ones included; failed logins are logged, at most a few per
// remote IP.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := &captured{}
	h, _ := e.handler(dashboard.Options{BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "pw"},
		Logger: slog.New(log)})
	const from = "10.1.2.3:5555"
	act := func(path string, form url.Values) resp {
		if form == nil {
			form = url.Values{}
		}
		return do(t, h, req{method: http.MethodPost, path: path, form: form, remote: from,
			header: map[string]string{"Authorization": basicHeader("ops", "pw"), "Sec-Fetch-Site": "same-origin",
				"X-Forwarded-For": "203.0.113.7"}})
	}
	failed := e.failed()
	live := e.insertOrder(Order{Item: "live"})
	waiting := e.insertOrder(Order{Item: "waiting"})
	require.Equal(t, http.StatusSeeOther, act("/queues/default/pause", nil).code)
	require.Equal(t, http.StatusSeeOther, act("/queues/default/resume", nil).code)
	require.Equal(t, http.StatusSeeOther, act(fmt.Sprintf("/instances/%d/retry", failed), nil).code)
	require.Equal(t, http.StatusSeeOther, act(fmt.Sprintf("/instances/%d/cancel", live), url.Values{"reason": {"by hand"}}).code)
	require.Equal(t, http.StatusSeeOther, act(fmt.Sprintf("/instances/%d/signal", waiting), url.Values{"name": {"go"}}).code)
	require.Equal(t, http.StatusConflict, act(fmt.Sprintf("/instances/%d/retry", waiting), nil).code)
	require.Equal(t, http.StatusBadRequest, act("/queues/a%00b/pause", nil).code)

	for _, c := range []struct {
		action  string
		outcome string
		key     string
		value   any
	}{
		{"pause", "ok", "queue", "default"},
		{"resume", "ok", "queue", "default"},
		{"retry", "ok", "id", failed},
		{"cancel", "ok", "id", live},
		{"signal", "ok", "id", waiting},
		{"retry", "refused", "id", waiting},
		{"pause", "refused", "queue", "a\x00b"},
	} {
		var hit map[string]any
		for _, r := range log.with("dashboard audit: " + c.action) {
			if r["outcome"] == c.outcome && r[c.key] == c.value {
				hit = r
			}
		}
		require.NotNil(t, hit, "%s %s %v=%v: %v", c.action, c.outcome, c.key, c.value, log.recs)
		require.Equal(t, dashboard.LevelAudit, hit["level"])
		require.Equal(t, "ops", hit["user"], c.action)
		require.Equal(t, from, hit["remote"], c.action)
		require.Equal(t, "203.0.113.7", hit["forwarded_for"], c.action)
		require.Equal(t, c.action, hit["action"])
	}
	sig := log.with("dashboard audit: signal")[0]
	require.Equal(t, "go", sig["name"])
	require.NotZero(t, sig["signal_id"])
	require.Contains(t, e.logs.String(), fmt.Sprintf("msg=\"gendurable: signal sent\" id=%d name=go", waiting),
		"the engine's Logger has the signal, as it has the other actions")
	require.Equal(t, "by hand", log.with("dashboard audit: cancel")[0]["reason"])
	require.Equal(t, gendurable.StatusFailed, e.instance(live).Status)

	// Failed logins: logged, at most 5 a minute from one address; a request
	// without credentials is a challenge, not a failed login. Requests for
	// a host not served, which need no credentials, come first: their
	// warnings have an allowance of their own and leave the audit trail's
	// whole.
	for range 10 {
		r := do(t, h, req{method: http.MethodGet, path: "/", remote: "10.9.9.9:1000", host: "evil.example"})
		require.Equal(t, http.StatusMisdirectedRequest, r.code)
	}
	require.Len(t, log.with("dashboard: request for a host not served (DNS rebinding?); add it to AllowedHosts if it is yours"), 5)
	for range 12 {
		r := do(t, h, req{method: http.MethodGet, path: "/", remote: "10.9.9.9:1000",
			header: map[string]string{"Authorization": basicHeader("ops", "guess")}})
		require.Equal(t, http.StatusUnauthorized, r.code)
	}
	r := do(t, h, req{method: http.MethodGet, path: "/", remote: "10.9.9.8:1000",
		header: map[string]string{"Authorization": "Bearer nope", "X-Forwarded-For": "198.51.100.9"}})
	require.Equal(t, http.StatusUnauthorized, r.code)
	require.Equal(t, http.StatusUnauthorized, do(t, h, req{method: http.MethodGet, path: "/", remote: "10.9.9.7:1000"}).code)
	// The scheme as sent: a Basic header that does not decode, and another
	// word, were both logged as bearer (a hostile probe).
	for i, a := range []string{"Basic !!!", "Token abc"} {
		r := do(t, h, req{method: http.MethodGet, path: "/", remote: fmt.Sprintf("10.9.8.%d:1000", i),
			header: map[string]string{"Authorization": a}})
		require.Equal(t, http.StatusUnauthorized, r.code)
	}
	logins := log.with("dashboard audit: failed login")
	require.Equal(t, "basic (not decodable)", logins[len(logins)-2]["scheme"])
	require.Equal(t, "other", logins[len(logins)-1]["scheme"])
	logins = logins[:len(logins)-2]
	byIP := map[string]int{}
	for _, l := range logins {
		require.Equal(t, dashboard.LevelAudit, l["level"])
		ip, _, _ := strings.Cut(l["remote"].(string), ":")
		byIP[ip]++
	}
	require.Equal(t, map[string]int{"10.9.9.9": 5, "10.9.9.8": 1}, byIP)
	require.Equal(t, "ops", logins[0]["user"])
	require.Equal(t, "bearer", logins[len(logins)-1]["scheme"])
	require.Equal(t, "198.51.100.9", logins[len(logins)-1]["forwarded_for"], "a failed login names whom a proxy said it came from")
}

// TestRefusedActionsKeepToTheAllowance: refused actions (anyone who can
// reach the dashboard can send them) wrote a line each, uncut — 50 refused
// pauses of a 15,000-byte queue name in a second wrote 1.5 MB — though the
// docs give them the failed logins' allowance, five a minute per client.
// Only the first X-Forwarded-For header line was logged: a proxy's, after
// the client's own, was dropped.
func TestRefusedActionsKeepToTheAllowance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := &captured{}
	h, _ := e.handler(dashboard.Options{Logger: slog.New(log)})
	long := strings.Repeat("q", 15000)
	for range 20 {
		r := do(t, h, req{method: http.MethodPost, path: "/queues/" + long + "/pause", form: url.Values{}, remote: "10.5.0.1:1",
			header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
		require.Equal(t, http.StatusBadRequest, r.code)
	}
	lines := log.with("dashboard audit: pause")
	require.Len(t, lines, 5, "refused, from one client")
	for _, l := range lines {
		require.LessOrEqual(t, len(l["path"].(string)), 1000)
		require.LessOrEqual(t, len(l["queue"].(string)), 1000)
	}
	// A change is never left out: it is not a refusal.
	hr := req{method: http.MethodPost, path: "/queues/default/pause", form: url.Values{}, remote: "10.5.0.1:1",
		header: map[string]string{"Sec-Fetch-Site": "same-origin"}}
	require.Equal(t, http.StatusSeeOther, do(t, h, hr).code)
	ok := log.with("dashboard audit: pause")
	require.Len(t, ok, 6)
	require.Equal(t, "ok", ok[5]["outcome"])

	// Failed logins from an address the operators share (a proxy's) do
	// not use up the allowance of their refused actions: each kind has its
	// own, and refusals are counted per user too.
	authLog := &captured{}
	ha, _ := e.handler(dashboard.Options{BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "pw"}, Logger: slog.New(authLog)})
	for range 6 {
		r := do(t, ha, req{method: http.MethodGet, path: "/", remote: "10.6.0.1:1",
			header: map[string]string{"Authorization": basicHeader("ops", "guess")}})
		require.Equal(t, http.StatusUnauthorized, r.code)
	}
	r := do(t, ha, req{method: http.MethodPost, path: "/queues/a%00b/pause", form: url.Values{}, remote: "10.6.0.1:1",
		header: map[string]string{"Authorization": basicHeader("ops", "pw"), "Sec-Fetch-Site": "same-origin"}})
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Len(t, authLog.with("dashboard audit: failed login"), 5)
	require.Len(t, authLog.with("dashboard audit: pause"), 1, "the operator's refusal was silenced by others' failed logins")
	// A failed login's path and a refused host's are cut as every other
	// line's (a probe: 15 KB lines).
	r = do(t, ha, req{method: http.MethodGet, path: "/" + long, remote: "10.6.0.2:1",
		header: map[string]string{"Authorization": basicHeader("ops", "guess")}})
	require.Equal(t, http.StatusUnauthorized, r.code)
	r = do(t, ha, req{method: http.MethodGet, path: "/" + long, host: "evil.example", remote: "10.6.0.3:1"})
	require.Equal(t, http.StatusMisdirectedRequest, r.code)
	failed := authLog.with("dashboard audit: failed login")
	require.Len(t, failed, 6)
	require.LessOrEqual(t, len(failed[5]["path"].(string)), 1000)
	misdirected := authLog.with("dashboard: request for a host not served (DNS rebinding?); add it to AllowedHosts if it is yours")
	require.Len(t, misdirected, 1)
	require.LessOrEqual(t, len(misdirected[0]["path"].(string)), 1000)

	// Every X-Forwarded-For line, in order.
	hreq := httptest.NewRequest(http.MethodPost, "http://example.com/queues/default/resume", strings.NewReader(""))
	hreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	hreq.Header.Set("Sec-Fetch-Site", "same-origin")
	hreq.Header.Add("X-Forwarded-For", "10.9.9.9")
	hreq.Header.Add("X-Forwarded-For", "203.0.113.7")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, hreq)
	require.Equal(t, http.StatusSeeOther, rec.Code)
	require.Equal(t, "10.9.9.9, 203.0.113.7", log.with("dashboard audit: resume")[0]["forwarded_for"])
}

// TestAClientThatHangsUpIsNoWarning: a request whose client went away
// (its context cancelled) ends without a warning: one line per hang-up let
// any client that could reach the dashboard flood the log (a probe: 40
// aborted requests, 23 warnings).
func TestAClientThatHangsUpIsNoWarning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := &captured{}
	h, _ := e.handler(dashboard.Options{Logger: slog.New(log)})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for _, path := range []string{"/", "/instances?status=runnable", "/queues"} {
		hreq := httptest.NewRequestWithContext(ctx, http.MethodGet, "http://example.com"+path, nil)
		h.ServeHTTP(httptest.NewRecorder(), hreq)
	}
	require.Empty(t, log.with("dashboard: request failed"))
}

// TestWrongMethodOnAnActionIsAudited: a request for an action's path with
// another method than POST (a GET of /instances/N/retry) is 405 and leaves
// a refused line on the audit logger, naming the action and the method (a
// probe: it left none). A 405 of a page's path is not an action's: no line.
func TestWrongMethodOnAnActionIsAudited(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	audit := &captured{}
	h, _ := e.handler(dashboard.Options{AuditLogger: slog.New(audit)})
	live := e.insertOrder(Order{Item: "live"})
	for _, c := range []struct{ method, path, action string }{
		{http.MethodGet, fmt.Sprintf("/instances/%d/retry", live), "retry"},
		{http.MethodPut, fmt.Sprintf("/instances/%d/cancel", live), "cancel"},
		{http.MethodDelete, "/queues/default/pause", "pause"},
	} {
		r := do(t, h, req{method: c.method, path: c.path, remote: "10.1.2.5:5555"})
		require.Equal(t, http.StatusMethodNotAllowed, r.code, c.path)
		recs := audit.with("dashboard audit: " + c.action)
		require.Len(t, recs, 1, "%s %s: %v", c.method, c.path, audit.recs)
		require.Equal(t, "refused", recs[0]["outcome"])
		require.Equal(t, c.method, recs[0]["method"])
		require.Equal(t, c.path, recs[0]["path"])
		require.EqualValues(t, http.StatusMethodNotAllowed, recs[0]["status"])
	}
	// A body the form parser cannot read: its line says why (a probe's
	// body that timed out said nothing).
	r := do(t, h, req{method: http.MethodPost, path: fmt.Sprintf("/instances/%d/cancel", live), raw: "reason=%zz",
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, remote: "10.1.2.6:5555"})
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "The form could not be read.")
	recs := audit.with("dashboard audit: cancel")
	require.Equal(t, "the body could not be read", recs[len(recs)-1]["refused_form"], "%v", recs[len(recs)-1])
	require.Contains(t, recs[len(recs)-1]["err"], "invalid URL escape")

	// A refused signal's line says which rule its input broke (the page
	// lists them all).
	r = do(t, h, req{method: http.MethodPost, path: fmt.Sprintf("/instances/%d/signal", live), form: url.Values{"name": {" pay"}},
		remote: "10.1.2.8:5555", header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
	require.Equal(t, http.StatusBadRequest, r.code)
	recs = audit.with("dashboard audit: signal")
	require.NotEmpty(t, recs)
	require.Contains(t, recs[len(recs)-1]["error"], "starts with white space", "%v", recs[len(recs)-1])

	before := len(audit.recs)
	r = do(t, h, req{method: http.MethodPost, path: "/machines", remote: "10.1.2.5:5555"})
	require.Equal(t, http.StatusMethodNotAllowed, r.code)
	require.Len(t, audit.recs, before, "a page's path is no action")
	require.False(t, e.instance(live).Status.Terminal())
}

// TestUnauthenticatedActionIsAudited: a POST to an action's route without
// credentials, or with ones that do not match, is 401 and leaves a refused
// line naming the action and why (a probe: none without credentials; a
// wrong token left only a failed login naming no action). A page's GET
// without credentials is no action: no line. A read-only refusal's line
// says why.
func TestUnauthenticatedActionIsAudited(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	audit := &captured{}
	const token = "a-token-of-at-least-16-bytes"
	h, _ := e.handler(dashboard.Options{AuditLogger: slog.New(audit), BearerToken: token})
	live := e.insertOrder(Order{Item: "live"})
	path := fmt.Sprintf("/instances/%d/cancel", live)
	for _, c := range []struct{ auth, reason string }{{"", "no credentials"}, {"Bearer not-the-token-at-all", "credentials did not match"}} {
		hdr := map[string]string{}
		if c.auth != "" {
			hdr["Authorization"] = c.auth
		}
		r := do(t, h, req{method: http.MethodPost, path: path, form: url.Values{"reason": {"x"}}, header: hdr, remote: "10.1.2.7:5555"})
		require.Equal(t, http.StatusUnauthorized, r.code)
		var found bool
		for _, rec := range audit.with("dashboard audit: cancel") {
			found = found || rec["reason"] == c.reason
			if rec["reason"] == c.reason {
				require.Equal(t, "refused", rec["outcome"])
				require.EqualValues(t, http.StatusUnauthorized, rec["status"])
				require.Equal(t, path, rec["path"])
			}
		}
		require.True(t, found, "%q: %v", c.auth, audit.recs)
	}
	before := len(audit.with("dashboard audit: cancel"))
	require.Equal(t, http.StatusUnauthorized, do(t, h, req{method: http.MethodGet, path: "/instances", remote: "10.1.2.7:5555"}).code)
	require.Len(t, audit.with("dashboard audit: cancel"), before)
	require.False(t, e.instance(live).Status.Terminal(), "the refused cancels changed nothing")

	ro, _ := e.handler(dashboard.Options{AuditLogger: slog.New(audit), ReadOnly: true})
	require.Equal(t, http.StatusForbidden, post(t, ro, fmt.Sprintf("/instances/%d/retry", live), nil).code)
	recs := audit.with("dashboard audit: retry")
	require.NotEmpty(t, recs)
	require.Equal(t, "read-only", recs[len(recs)-1]["refused"], "%v", recs[len(recs)-1])
}

// TestCrossOriginRefusalIsAudited: a cross-origin POST to an action (a
// forged form on another site, riding the operator's session) is refused
// with 403 before any handler runs — and, as a refused action, leaves its
// line on the audit logger, not only on the general one.
func TestCrossOriginRefusalIsAudited(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	general, audit := &captured{}, &captured{}
	h, _ := e.handler(dashboard.Options{Logger: slog.New(general), AuditLogger: slog.New(audit)})
	live := e.insertOrder(Order{Item: "live"})
	for _, c := range []struct{ path, action string }{
		{fmt.Sprintf("/instances/%d/cancel", live), "cancel"},
		{"/bulk/retry", "bulk-retry"},
		{"/queues/default/pause", "pause"},
	} {
		r := do(t, h, req{method: http.MethodPost, path: c.path, form: url.Values{"scope": {"match"}, "queue": {"default"}},
			remote: "10.1.2.3:5555", header: map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site",
				"X-Forwarded-For": "198.51.100.4"}})
		require.Equal(t, http.StatusForbidden, r.code, c.path)
		recs := audit.with("dashboard audit: " + c.action)
		require.Len(t, recs, 1, "%s: %v", c.path, audit.recs)
		require.Equal(t, "refused", recs[0]["outcome"])
		require.Equal(t, dashboard.LevelAudit, recs[0]["level"])
		require.Equal(t, "https://evil.example", recs[0]["origin"])
		require.Equal(t, "10.1.2.3:5555", recs[0]["remote"])
		// Behind a proxy the remote is the proxy's: the line says whom
		// the proxy named, as every other audit line does.
		require.Equal(t, "198.51.100.4", recs[0]["forwarded_for"])
	}
	require.False(t, e.instance(live).Status.Terminal(), "the forged cancel changed nothing")
	require.False(t, e.queuePaused("default"))

	// A hostile page's forged actions (sent from the operator's browser,
	// as the operator's client) have an allowance of their own: the
	// operator's own refused action is still on the trail after them (a
	// probe: it had been left out, counted only).
	for range 8 {
		r := do(t, h, req{method: http.MethodPost, path: "/queues/default/pause", form: url.Values{},
			remote: "10.1.2.4:5555", header: map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}})
		require.Equal(t, http.StatusForbidden, r.code)
	}
	r := do(t, h, req{method: http.MethodPost, path: "/queues/a%00b/pause", form: url.Values{},
		remote: "10.1.2.4:5555", header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
	require.Equal(t, http.StatusBadRequest, r.code)
	var own int
	for _, rec := range audit.with("dashboard audit: pause") {
		if rec["remote"] == "10.1.2.4:5555" && rec["origin"] == nil {
			own++
		}
	}
	require.Equal(t, 1, own, "%v", audit.recs)
}

// TestLogLinesCarryNoRawC1OrBidiControls: a log line carries what a
// client sent — the user name of a failed login and the path of a refused
// request before any authentication, a cancel's reason after it — and
// slog's JSON handler writes DEL, C1 controls (U+009B is an 8-bit CSI) and
// bidirectional controls as they are: a client without credentials wrote
// them into the operator's log, to act on the terminal that reads it or
// reorder the line. They are now written as \u escapes (C0 controls and
// invalid UTF-8 the handlers escaped already).
func TestLogLinesCarryNoRawC1OrBidiControls(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var buf syncbuf.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := dashboard.New(e.eng, dashboard.Options{Logger: logger, AllowedHosts: []string{"example.com"},
		BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "pw-0123456789abcdef"}})
	require.NoError(t, err)
	const evil = "\u009b2J\u202eevil\x7f"
	hr := httptest.NewRequest(http.MethodGet, "http://example.com/%C2%9B%E2%80%AE", nil)
	hr.SetBasicAuth(evil, "x")
	h.ServeHTTP(httptest.NewRecorder(), hr) // failed login
	hr = httptest.NewRequest(http.MethodGet, "http://example.com/%C2%9B%E2%80%AE", nil)
	hr.Host = "rebound.example"
	h.ServeHTTP(httptest.NewRecorder(), hr) // host not served
	id := e.insertOrder(Order{Item: "x"})
	hr = httptest.NewRequest(http.MethodPost, fmt.Sprintf("http://example.com/instances/%d/cancel", id),
		strings.NewReader(url.Values{"reason": {"refund " + evil}}.Encode()))
	hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	hr.SetBasicAuth("ops", "pw-0123456789abcdef")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, hr) // an action, audit-logged with its reason
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())

	out := buf.String()
	for _, msg := range []string{"failed login", "host not served", "dashboard audit: cancel"} {
		require.Contains(t, out, msg)
	}
	for _, r := range out {
		require.False(t, r == 0x7f || (r >= 0x80 && r < 0xa0) || unicode.Is(unicode.Bidi_Control, r), "%U in the log:\n%s", r, out)
	}
	require.Contains(t, out, `\\u009b2J\\u202eevil\\u007f`, "shown as escapes")
}

// TestAuditLineSaysALongReasonWasCut: a cancel's reason may be 4,000 bytes
// (gendurable.MaxReasonBytes), an audit line repeats 1,000 of it. The line
// cut it within a character (2,000 "é": half of one, invalid UTF-8) and
// read as the whole reason; it now cuts before a character and says how
// long the reason was (reason_bytes).
func TestAuditLineSaysALongReasonWasCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := &captured{}
	h, _ := e.handler(dashboard.Options{Logger: slog.New(log)})
	id := e.insertOrder(Order{Item: "x"})
	reason := "x" + strings.Repeat("é", (gendurable.MaxReasonBytes-1)/2)
	r := post(t, h, fmt.Sprintf("/instances/%d/cancel", id), url.Values{"reason": {reason}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	in := e.instance(id)
	require.Equal(t, reason, in.Errors[len(in.Errors)-1].Error, "stored whole")

	lines := log.with("dashboard audit: cancel")
	require.Len(t, lines, 1)
	got, _ := lines[0]["reason"].(string)
	require.True(t, utf8.ValidString(got), "cut within a character: %q", got[len(got)-4:])
	require.True(t, strings.HasPrefix(reason, got))
	require.Greater(t, len(got), 1000-utf8.UTFMax)
	require.LessOrEqual(t, len(got), 1000)
	require.Equal(t, int64(len(reason)), lines[0]["reason_bytes"], "the line says the reason was cut")

	// A reason that fits is whole, with no length beside it.
	id = e.insertOrder(Order{Item: "y"})
	require.Equal(t, http.StatusSeeOther, post(t, h, fmt.Sprintf("/instances/%d/cancel", id), url.Values{"reason": {"short"}}).code)
	lines = log.with("dashboard audit: cancel")
	require.Equal(t, "short", lines[1]["reason"])
	require.NotContains(t, lines[1], "reason_bytes")
}
