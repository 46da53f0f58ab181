package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/stretchr/testify/require"
)

func TestNewValidatesOptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := dashboard.New(nil, dashboard.Options{})
	require.Error(t, err)
	for name, o := range map[string]dashboard.Options{
		"relative base": {BasePath: "admin"},
		"base with ?":   {BasePath: "/a?b"},
		// Links under these would miss the handler (dot segments resolved
		// away by the browser; a "%" arriving decoded).
		"base with ..":        {BasePath: "/a/../b"},
		"base with .":         {BasePath: "/a/./b"},
		"base of .":           {BasePath: "/."},
		"base of ..":          {BasePath: "/.."},
		"base with //":        {BasePath: "//a"},
		"base with %":         {BasePath: "/a%2Fb"},
		"base with a space %": {BasePath: "/ops%20desk"},
		"base with newline":   {BasePath: "/a\nb"},
		"base with \\":        {BasePath: "/\\evil.example"}, // a browser reads /\ as //: redirects off the site (a probe)
		"empty password":      {BasicAuth: &dashboard.BasicAuth{User: "u"}},
		"colon in user":       {BasicAuth: &dashboard.BasicAuth{User: "a:b", Password: "p"}},
		"neg timeout":         {RequestTimeout: -1},
		"page too big":        {PageSize: dashboard.MaxPageSize + 1},
		"bad origin":          {TrustedOrigins: []string{"not an origin"}},
	} {
		_, err := dashboard.New(e.eng, o)
		require.Error(t, err, name)
	}
}

// TestListFiltersAndPaging: every filter narrows the list, a page never
// holds more than MaxPageSize rows, and keyset paging visits every row once.
func TestListFiltersAndPaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := range 130 {
		ps = append(ps, e.order.New(Order{Item: fmt.Sprint(i)}))
	}
	_, err := e.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	special := e.insertOrder(Order{Item: "special"}, gendurable.InsertOpts{Queue: "vip", PartitionKey: "cust-42"})
	uniq := e.insertOrder(Order{Item: "uniq"}, gendurable.InsertOpts{UniqueKey: "order-77"})
	job, err := e.eng.Insert(ctx, e.flaky.New(flakyArgs{N: 1}))
	require.NoError(t, err)
	failed := e.failed()
	h, _ := e.handler(dashboard.Options{})

	// The page size is the CLI's: up to 500 rows (gendurable list --limit),
	// shown whole; past it, refused with the bound (a probe: ?limit=500
	// showed 100 rows where the CLI shows 500, and ?limit=100000 was
	// silently read as 100).
	require.Equal(t, gendurable.MaxListLimit, dashboard.MaxPageSize)
	r := get(t, h, "/instances?limit=120")
	require.Equal(t, http.StatusOK, r.code)
	require.Len(t, rowIDs(r.body), 120)
	require.NotEmpty(t, nextLink(r.body))
	r = get(t, h, fmt.Sprintf("/instances?limit=%d", dashboard.MaxPageSize))
	require.Equal(t, http.StatusOK, r.code)
	require.Len(t, rowIDs(r.body), 134)
	require.Empty(t, nextLink(r.body))
	for _, q := range []string{fmt.Sprint(dashboard.MaxPageSize + 1), "100000", "99999999999999999999"} {
		r = get(t, h, "/instances?limit="+q)
		require.Equal(t, http.StatusBadRequest, r.code, q)
		require.Contains(t, r.body, "The page size (limit) must be a whole number from 1 to 500.", q)
	}
	// A cursor of 0 is refused, as the CLI refuses --before 0: read as no
	// cursor, it showed the newest page again, and a script paging with an
	// unset variable looped on it.
	r = get(t, h, "/instances?before=0")
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "must be an id above 0")

	// Default page size, then keyset paging through everything.
	seen := map[string]bool{}
	path := "/instances"
	pages := 0
	for path != "" {
		r := get(t, h, path)
		require.Equal(t, http.StatusOK, r.code, path)
		ids := rowIDs(r.body)
		require.LessOrEqual(t, len(ids), dashboard.DefaultPageSize)
		for _, id := range ids {
			require.False(t, seen[id], "id %s twice", id)
			seen[id] = true
		}
		path = strings.TrimPrefix(nextLink(r.body), "")
		pages++
		require.Less(t, pages, 10)
	}
	require.Len(t, seen, 134)
	require.Equal(t, 3, pages)

	// Filters.
	cases := []struct {
		query string
		want  []int64 // exact ids, or nil to check count only
		count int
	}{
		{query: "queue=vip", want: []int64{special}},
		{query: "q=cust-42", want: []int64{special}},
		{query: "q=order-77", want: []int64{uniq}},
		{query: "q=" + strconv.FormatInt(job.ID, 10), want: []int64{job.ID}},
		{query: "machine=flaky", want: []int64{job.ID}},
		{query: "status=failed", want: []int64{failed}},
		{query: "status=failed&machine=flaky", want: nil, count: 0},
		{query: "step=perform", want: []int64{job.ID}},
		{query: "machine=order&step=wait&limit=7", count: 7},
		{query: "from=" + url.QueryEscape(time.Now().Add(time.Hour).UTC().Format("2006-01-02T15:04")), count: 0},
		{query: "to=" + url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)), count: 0},
		{query: "from=2000-01-01&to=" + url.QueryEscape(time.Now().Add(time.Hour).UTC().Format("2006-01-02T15:04:05")) + "&queue=vip", want: []int64{special}},
		{query: "q=nothing-like-this", count: 0},
		{query: "state=" + url.QueryEscape(`{"item": "special"}`), want: []int64{special}},
		{query: "state=" + url.QueryEscape(`{"item": "uniq"}`) + "&q=order-77", want: []int64{uniq}},
		{query: "state=" + url.QueryEscape(`{"item": "uniq"}`) + "&queue=vip", count: 0},
		{query: "state=" + url.QueryEscape(`{"item": "nobody"}`), count: 0},
	}
	for _, c := range cases {
		r := get(t, h, "/instances?"+c.query)
		require.Equal(t, http.StatusOK, r.code, c.query)
		ids := rowIDs(r.body)
		if c.want != nil {
			var want []string
			for _, id := range c.want {
				want = append(want, strconv.FormatInt(id, 10))
			}
			require.Equal(t, want, ids, c.query)
		} else {
			require.Len(t, ids, c.count, c.query)
		}
	}
	// The form keeps what was asked.
	r = get(t, h, "/instances?queue=vip&status=runnable")
	require.Contains(t, r.body, `name="queue" value="vip"`)
	require.Contains(t, r.body, `<option value="runnable" selected>`)
	r = get(t, h, "/instances?state="+url.QueryEscape(`{"item": "<b>"}`))
	require.Contains(t, r.body, `name="state" value="{&#34;item&#34;: &#34;&lt;b&gt;&#34;}"`)

	// Bad input is a 400 with our message.
	for _, q := range []string{"status=bogus", "from=yesterday", "to=13/13/2020", "limit=-1", "limit=x", "limit=-99999999999999999999", "limit=0", "before=-5", "before=abc",
		"q=" + strings.Repeat("x", 1001), "state=7", "state=" + url.QueryEscape(`{"a":`), "state=null",
		"state=" + url.QueryEscape(`{"a": "`+strings.Repeat("x", 1000)+`"}`)} {
		r := get(t, h, "/instances?"+q)
		require.Equal(t, http.StatusBadRequest, r.code, q)
		require.NotContains(t, r.body, "gendurable:", q)
	}
	// A filter given twice is refused, as the CLI refuses a flag given
	// twice: before, the first was read and the second dropped.
	for _, q := range []string{"q=4800&q=4799", "queue=vip&queue=default", "status=done&status=failed", "limit=1&limit=2"} {
		r := get(t, h, "/instances?"+q)
		require.Equal(t, http.StatusBadRequest, r.code, q)
		require.Contains(t, r.body, "given more than once", q)
	}
}

// TestDetailPageLeavesOutLongPayloads: an instance's page shows a signal
// payload of more than 4 KiB as its length, not whole, so a page is
// bounded in bytes as in rows. A hostile probe's 100 signals of 256 KB made
// one page 26 MB, built in memory for each request, HEAD ones too.
func TestDetailPageLeavesOutLongPayloads(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	id := e.insertOrder(Order{Item: "book"}) // not started: it stays runnable
	long := json.RawMessage(`{"x": "` + strings.Repeat("a", 100_000) + `"}`)
	for range 5 {
		_, err := e.eng.Signal(context.Background(), id, "note", long, nil)
		require.NoError(t, err)
	}
	_, err := e.eng.Signal(context.Background(), id, "note", json.RawMessage(`{"small": "visible"}`), nil)
	require.NoError(t, err)
	r := get(t, h, fmt.Sprintf("/instances/%d", id))
	require.Equal(t, http.StatusOK, r.code)
	require.Less(t, len(r.body), 64<<10, "five 100 KB payloads were left out")
	require.Equal(t, 5, strings.Count(r.body, "100009 bytes, not shown"))
	require.Contains(t, html.UnescapeString(r.body), `"small": "visible"`)
}

// TestDetailPageSaysItsPendingCountIsOfTheSignalsShown: with more signals
// than the page shows, the count of pending ones is of those shown, and the
// heading says so — it read "100 pending" for an instance with 101
// (20,000 in a hostile probe's run).
func TestDetailPageSaysItsPendingCountIsOfTheSignalsShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	id := e.insertOrder(Order{Item: "book"})
	for range 101 {
		_, err := e.eng.Signal(context.Background(), id, "note", nil, nil)
		require.NoError(t, err)
	}
	r := get(t, h, fmt.Sprintf("/instances/%d", id))
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "(100 shown, newest first, 100 of them pending; older ones, pending or not, not shown)")
}

// TestDetailPageDoesNotIndentDeepValues: a payload nested 1,000 levels deep
// (2 KB, within the depth limit and the page's 4 KiB bound) is shown
// compact: indented it is 2 MB, and the 20 here made a 40 MB page without
// the fix, built in memory per request. A shallow one is still indented.
func TestDetailPageDoesNotIndentDeepValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	id := e.insertOrder(Order{Item: "book"})
	deep := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	for range 20 {
		_, err := e.eng.Signal(context.Background(), id, "note", json.RawMessage(deep), nil)
		require.NoError(t, err)
	}
	_, err := e.eng.Signal(context.Background(), id, "note", json.RawMessage(`{"small": ["visible"]}`), nil)
	require.NoError(t, err)
	r := get(t, h, fmt.Sprintf("/instances/%d", id))
	require.Equal(t, http.StatusOK, r.code)
	require.Less(t, len(r.body), 256<<10, "20 deep payloads, compact")
	body := html.UnescapeString(r.body)
	require.Equal(t, 20, strings.Count(body, deep))
	require.Contains(t, body, "{\n  \"small\": [\n    \"visible\"\n  ]\n}")
}

// TestDetailRedactionAndSignalWake: the detail page shows state, signals
// (consumed ones marked), result and errors, all state-like JSON through
// Redact; a signal sent from the page wakes an awaiting instance.
func TestDetailRedactionAndSignalWake(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	var redacted []string
	redact := func(machine string, data json.RawMessage) json.RawMessage {
		redacted = append(redacted, machine) // handlers run on this goroutine here (httptest recorder)
		return redactSecrets(data)
	}
	h, _ := e.handler(dashboard.Options{Redact: redact})
	id := e.insertOrder(Order{Item: "book", Secret: "hunter2"})
	e.waitStatus(id, gendurable.StatusAwaitingSignal, 10*time.Second)

	r := get(t, h, fmt.Sprintf("/instances/%d", id))
	require.Equal(t, http.StatusOK, r.code)
	body := html.UnescapeString(r.body)
	require.NotContains(t, body, "hunter2")
	require.Contains(t, body, `"secret": "[redacted]"`)
	require.Contains(t, body, `"item": "book"`)
	require.Contains(t, body, "awaiting signal go")
	require.Contains(t, r.body, `id="send-signal"`)
	require.Contains(t, r.body, `id="cancel"`)
	require.NotContains(t, r.body, `id="retry"`)

	// A signal that does not wake it (another name) first, then the awaited one.
	r = post(t, h, fmt.Sprintf("/instances/%d/signal", id), url.Values{"name": {"note"}, "payload": {`{"secret_pin":"9999","x":1}`}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	flashLocation(t, r, fmt.Sprintf("/instances/%d", id), "signalled")
	r = post(t, h, fmt.Sprintf("/instances/%d/signal", id), url.Values{"name": {"go"}, "payload": {`{"secret_code":"abc123"}`}, "dedup_key": {"k1"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	woke := flashLocation(t, r, fmt.Sprintf("/instances/%d", id), "signal-woke")
	e.waitStatus(id, gendurable.StatusDone, 10*time.Second)
	require.Equal(t, 2, e.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1`, id))

	r = get(t, h, woke)
	require.Equal(t, http.StatusOK, r.code)
	body = html.UnescapeString(r.body)
	require.Contains(t, body, "Signal sent; it woke the instance.")
	for _, secret := range []string{"hunter2", "9999", "abc123"} {
		require.NotContains(t, body, secret)
	}
	require.Contains(t, body, `id="result"`)
	require.Contains(t, body, `"shipped": "book"`)
	require.Equal(t, 2, strings.Count(r.body, `class="consumed"`), "both signals consumed by Done")
	require.NotContains(t, r.body, `id="send-signal"`, "no signal form on a finished instance")
	require.Contains(t, redacted, "order")

	// Unknown flash keys show nothing; known ones are fixed text.
	r = get(t, h, fmt.Sprintf("/instances/%d?flash=%s", id, url.QueryEscape("<script>alert(1)</script>")))
	require.NotContains(t, r.body, "alert(1)")
	require.NotContains(t, r.body, `class="flash"`)
	// A known key without the redirect's signature shows nothing either:
	// a crafted link cannot claim an action (a hostile-operator probe's
	// ?flash=cancelled said "Cancelled" on a done instance), nor carry a
	// real one to another instance.
	for _, link := range []string{fmt.Sprintf("/instances/%d?flash=cancelled", id),
		strings.Replace(woke, fmt.Sprintf("/instances/%d?", id), fmt.Sprintf("/instances/%d?", id+1), 1)} {
		r = get(t, h, link)
		require.NotContains(t, r.body, `class="flash"`, link)
	}
}

// TestActionsChangeDatabase: retry, cancel, signal, pause and resume through
// the dashboard do what they say in the database, and the refused ones
// change nothing.
func TestActionsChangeDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	h, logs := e.handler(dashboard.Options{BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "pw"}})
	auth := map[string]string{"Authorization": basicHeader("ops", "pw"), "Sec-Fetch-Site": "same-origin"}
	postAuth := func(path string, form url.Values) resp {
		return do(t, h, req{method: http.MethodPost, path: path, form: form, header: auth})
	}
	getAuth := func(path string) resp {
		return do(t, h, req{method: http.MethodGet, path: path, header: auth})
	}

	// A job that fails (MaxAttempts 1), retried: it runs (and fails) again.
	res, err := e.eng.Insert(context.Background(), e.flaky.New(flakyArgs{N: 7}))
	require.NoError(t, err)
	in := e.waitStatus(res.ID, gendurable.StatusFailed, 10*time.Second)
	require.Len(t, in.Errors, 1)
	page := getAuth(fmt.Sprintf("/instances/%d", res.ID))
	require.Contains(t, page.body, `id="retry"`)
	require.Contains(t, page.body, "boom 7")
	r := postAuth(fmt.Sprintf("/instances/%d/retry", res.ID), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	flashLocation(t, r, fmt.Sprintf("/instances/%d", res.ID), "retried")
	require.Eventually(t, func() bool {
		in := e.instance(res.ID)
		return in.Status == gendurable.StatusFailed && len(in.Errors) == 2
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, logs.String(), "dashboard audit: retry")
	require.Contains(t, logs.String(), "user=ops")

	// Retrying a live instance is a conflict; nothing changes.
	live := e.insertOrder(Order{Item: "live"})
	e.waitStatus(live, gendurable.StatusAwaitingSignal, 10*time.Second)
	r = postAuth(fmt.Sprintf("/instances/%d/retry", live), nil)
	require.Equal(t, http.StatusConflict, r.code)
	require.Contains(t, r.body, "Only a failed instance can be retried.")
	require.Equal(t, gendurable.StatusAwaitingSignal, e.instance(live).Status)

	// Cancel with a reason.
	r = postAuth(fmt.Sprintf("/instances/%d/cancel", live), url.Values{"reason": {"customer gave up"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	in = e.instance(live)
	require.Equal(t, gendurable.StatusFailed, in.Status)
	require.Equal(t, "customer gave up", in.Errors[len(in.Errors)-1].Error)
	// Again: 409, and signalling it too.
	r = postAuth(fmt.Sprintf("/instances/%d/cancel", live), nil)
	require.Equal(t, http.StatusConflict, r.code)
	require.Contains(t, r.body, "only a live instance can be cancelled")
	r = postAuth(fmt.Sprintf("/instances/%d/signal", live), url.Values{"name": {"go"}})
	require.Equal(t, http.StatusConflict, r.code)
	require.Contains(t, r.body, "accepts no more signals")

	// Signal: bad JSON and a bad name are 400 and write nothing; a good one
	// wakes; a dedup key repeated is reported.
	other := e.insertOrder(Order{Item: "other"})
	e.waitStatus(other, gendurable.StatusAwaitingSignal, 10*time.Second)
	sigs := func() int {
		return e.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1`, other)
	}
	r = postAuth(fmt.Sprintf("/instances/%d/signal", other), url.Values{"name": {"go"}, "payload": {"{not json"}})
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "not valid JSON")
	r = postAuth(fmt.Sprintf("/instances/%d/signal", other), url.Values{"name": {""}, "payload": {"1"}})
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "Invalid signal")
	// Valid JSON past the engine's depth limit: the page names the limit
	// (it said the payload was valid within 10,000 levels).
	deep := strings.Repeat("[", 1500) + strings.Repeat("]", 1500)
	r = postAuth(fmt.Sprintf("/instances/%d/signal", other), url.Values{"name": {"go"}, "payload": {deep}})
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "Config.MaxJSONDepth, 1,000 levels of arrays and objects by default")
	require.Zero(t, sigs())
	r = postAuth(fmt.Sprintf("/instances/%d/signal", other), url.Values{"name": {"later"}, "dedup_key": {"d1"}})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Contains(t, r.header.Get("Location"), "flash=signalled")
	r = postAuth(fmt.Sprintf("/instances/%d/signal", other), url.Values{"name": {"later"}, "dedup_key": {"d1"}})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Contains(t, r.header.Get("Location"), "flash=signal-duplicate")
	require.Equal(t, 1, sigs())
	require.Equal(t, gendurable.StatusAwaitingSignal, e.instance(other).Status)
	r = postAuth(fmt.Sprintf("/instances/%d/signal", other), url.Values{"name": {"go"}, "payload": {`[1,2,3]`}})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Contains(t, r.header.Get("Location"), "flash=signal-woke")
	e.waitStatus(other, gendurable.StatusDone, 10*time.Second)
	var payload string
	require.NoError(t, e.pool.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT payload::text FROM %s.gendurable_signals WHERE target_id = $1 AND name = 'go'`, e.schema), other).Scan(&payload))
	require.JSONEq(t, `[1,2,3]`, payload)

	// A body over the bound is refused.
	r = postAuth(fmt.Sprintf("/instances/%d/signal", other), url.Values{"name": {"go"}, "payload": {strings.Repeat("1", dashboard.MaxFormBytes)}})
	require.Equal(t, http.StatusRequestEntityTooLarge, r.code)

	// Pause and resume, as the queues page shows them.
	r = postAuth("/queues/default/pause", nil)
	require.Equal(t, http.StatusSeeOther, r.code)
	paused := flashLocation(t, r, "/", "paused")
	require.True(t, e.queuePaused("default"))
	page = getAuth(paused)
	require.Contains(t, page.body, "Queue paused")
	require.Contains(t, page.body, `action="/queues/default/resume"`)
	r = postAuth("/queues/default/resume", nil)
	require.Equal(t, http.StatusSeeOther, r.code)
	require.False(t, e.queuePaused("default"))
	// A queue name with a slash and a space survives the path.
	e.insertOrder(Order{Item: "w"}, gendurable.InsertOpts{Queue: "we ird/q"}) // only a known queue can be paused
	r = postAuth("/queues/"+url.PathEscape("we ird/q")+"/pause", nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.True(t, e.queuePaused("we ird/q"))
	page = getAuth("/")
	require.Contains(t, page.body, `action="/queues/we%20ird%2Fq/resume"`)
	r = postAuth("/queues/we%20ird%2Fq/resume", nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.False(t, e.queuePaused("we ird/q"))
	// Too long a name is bad input.
	r = postAuth("/queues/"+strings.Repeat("q", 300)+"/pause", nil)
	require.Equal(t, http.StatusBadRequest, r.code)
}

// TestErrorsAreMappedAndNotLeaked: known errors get their status and a
// fixed message; anything else is "internal error" on the page and the
// real error in the log.
func TestErrorsAreMappedAndNotLeaked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	for path, code := range map[string]int{
		"/instances/999999999":            http.StatusNotFound,
		"/instances/abc":                  http.StatusNotFound,
		"/instances/-1":                   http.StatusNotFound,
		"/instances/99999999999999999999": http.StatusNotFound,
		"/machines/no-such-machine":       http.StatusNotFound,
		"/static/nope.css":                http.StatusNotFound,
		"/nowhere":                        http.StatusNotFound,
	} {
		r := get(t, h, path)
		require.Equal(t, code, r.code, path)
		require.NotContains(t, r.body, "gendurable:", path)
	}
	r := post(t, h, "/instances/999999999/retry", nil)
	require.Equal(t, http.StatusNotFound, r.code)
	r = post(t, h, "/instances/999999999/signal", url.Values{"name": {"go"}})
	require.Equal(t, http.StatusNotFound, r.code)

	// An engine on a schema that was never migrated: every read fails
	// inside the database, and the page says what to run (503), naming
	// nothing of the database's.
	pool, missing := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, NoMigrate: true})
	broken, err := gendurable.New(pool, &gendurable.Config{Schema: missing, Machines: []gendurable.Definition{orderMachine()}})
	require.NoError(t, err)
	logs := &syncbuf.Buffer{}
	bh, err := dashboard.New(broken, dashboard.Options{AllowedHosts: []string{"example.com"}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	for _, p := range []string{"/", "/instances", "/instances/1", "/machines/order"} {
		r := get(t, bh, p)
		require.Equal(t, http.StatusServiceUnavailable, r.code, p)
		require.Contains(t, r.body, "run gendurable migrate up", p)
		for _, leak := range []string{missing, "does not exist", "relation", "SQLSTATE", "gendurable:"} {
			require.NotContains(t, r.body, leak, p)
		}
	}
	for _, p := range []string{"/instances/1/retry", "/instances/1/cancel", "/instances/1/run-now", "/queues/default/pause"} {
		r := post(t, bh, p, url.Values{})
		require.Equal(t, http.StatusServiceUnavailable, r.code, p)
		require.NotContains(t, r.body, missing, p)
	}
	require.Contains(t, logs.String(), "schema not migrated")
	require.Contains(t, logs.String(), "dashboard: request failed")

	// A request that runs out of time is a 503 with a fixed message.
	slow, _ := e.handler(dashboard.Options{RequestTimeout: time.Nanosecond})
	r = get(t, slow, "/instances")
	require.Equal(t, http.StatusServiceUnavailable, r.code)
	require.Contains(t, r.body, "timed out")
	require.NotContains(t, r.body, "deadline")
}

// TestBasePath: links carry the base path, and requests work with or
// without the prefix still on them.
func TestBasePath(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.insertOrder(Order{Item: "b"})
	h, _ := e.handler(dashboard.Options{BasePath: "/admin/gd/"})
	mux := http.NewServeMux()
	mux.Handle("/admin/gd/", h)
	mux.Handle("/stripped/", http.StripPrefix("/stripped", h))

	for _, p := range []string{"/admin/gd", "/admin/gd/", "/admin/gd/instances", fmt.Sprintf("/admin/gd/instances/%d", id), "/stripped/instances"} {
		var r resp
		if p == "/admin/gd" { // the outer mux would redirect to the slash; the handler itself takes it
			r = get(t, h, p)
		} else {
			r = get(t, mux, p)
		}
		require.Equal(t, http.StatusOK, r.code, p)
		require.Contains(t, r.body, `href="/admin/gd/instances"`, p)
		require.Contains(t, r.body, `href="/admin/gd/static/style.css?v=`, p)
	}
	r := get(t, mux, "/admin/gd/instances")
	require.Contains(t, r.body, fmt.Sprintf(`href="/admin/gd/instances/%d"`, id))
	r = post(t, mux, fmt.Sprintf("/admin/gd/instances/%d/cancel", id), nil)
	require.Equal(t, http.StatusSeeOther, r.code)
	cancelled := flashLocation(t, r, fmt.Sprintf("/admin/gd/instances/%d", id), "cancelled")
	require.Equal(t, gendurable.StatusFailed, e.instance(id).Status)
	require.Contains(t, get(t, mux, cancelled).body, "Cancelled: the instance is failed.", "the signed flash under the base path")
	r = get(t, mux, "/admin/gd/static/app.js")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.header.Get("Content-Type"), "javascript")

	// A path the mux cleans is redirected under the base: the handler
	// served as the server's root handler (no outer mux to clean it first)
	// sent "/admin/gd/instances/./10" to "/instances/10", off the dashboard
	// (a hostile probe).
	for p, want := range map[string]string{
		fmt.Sprintf("/admin/gd/instances/./%d", id):    fmt.Sprintf("/admin/gd/instances/%d", id),
		"/admin/gd//instances":                         "/admin/gd/instances",
		fmt.Sprintf("/admin/gd/instances/1/../%d", id): fmt.Sprintf("/admin/gd/instances/%d", id),
	} {
		r := get(t, h, p)
		require.True(t, r.code >= 300 && r.code < 400, "%s: %d", p, r.code)
		require.Equal(t, want, r.header.Get("Location"), p)
	}
	// No such page: the dashboard's own 404, not the mux's plain text; a
	// wrong method on an action's path is still 405.
	// An asset it does not have too (a probe: /static/APP.JS and
	// /static/embed.go answered the mux's plain text).
	for _, p := range []string{"/admin/gd/foo", "/admin/gd/instances/", "/admin/gd/static/", "/admin/gd/static/APP.JS", "/admin/gd/static/embed.go"} {
		r := get(t, mux, p)
		require.Equal(t, http.StatusNotFound, r.code, p)
		require.Contains(t, r.header.Get("Content-Type"), "text/html", p)
		require.Equal(t, "no-store", r.header.Get("Cache-Control"), p)
		require.Contains(t, r.body, "No such page.", p)
	}
	require.Equal(t, http.StatusMethodNotAllowed, get(t, mux, fmt.Sprintf("/admin/gd/instances/%d/cancel", id)).code)
}

// TestMachinesAndGraph: the machine list and the graph with counts and
// observed transitions.
func TestMachinesAndGraph(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	h, _ := e.handler(dashboard.Options{})
	r := get(t, h, "/machines")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `href="/machines/order"`)
	require.Contains(t, r.body, `href="/machines/flaky"`)

	a := e.insertOrder(Order{Item: "a"})
	b := e.insertOrder(Order{Item: "b"})
	e.waitStatus(a, gendurable.StatusAwaitingSignal, 10*time.Second)
	e.waitStatus(b, gendurable.StatusAwaitingSignal, 10*time.Second)
	_, err := e.eng.Signal(context.Background(), a, "go", nil, nil)
	require.NoError(t, err)
	e.waitStatus(a, gendurable.StatusDone, 10*time.Second)

	r = get(t, h, "/machines/order")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "<svg")
	require.Contains(t, r.body, `data-step="wait"`)
	require.Contains(t, r.body, `data-step="ship"`)
	require.Contains(t, r.body, `data-step="done"`)
	require.Contains(t, r.body, "awaiting_signal 1")
	require.Contains(t, r.body, `class="edge"`)
	require.Contains(t, r.body, "await 2") // wait → ship, observed twice
	// Edge labels come after every step's box, so a label wider than the
	// gap between two steps is painted over them, not under them (a
	// newcomer's probe read "· children 1" for "20 · children 180").
	require.Greater(t, strings.Index(r.body, `class="edge-label"`), strings.LastIndex(r.body, `<g class="node`))
	require.Contains(t, r.body, `href="/instances?machine=order&amp;status=awaiting_signal&amp;step=ship"`)

	// A machine neither registered nor in the table is not found.
	r = get(t, h, "/machines/"+url.PathEscape("gone machine"))
	require.Equal(t, http.StatusNotFound, r.code)
	// A name no machine can have is invalid input, whatever its length
	// (it was 400 from 201 bytes to 1,000, 404 on either side).
	for n, code := range map[int]int{200: http.StatusNotFound, 201: http.StatusBadRequest, 1000: http.StatusBadRequest,
		1001: http.StatusBadRequest, 5000: http.StatusBadRequest} {
		r = get(t, h, "/machines/"+strings.Repeat("m", n))
		require.Equal(t, code, r.code, "a name of %d bytes", n)
	}
}

// TestQueuesPage: counts per status, pause flag, the throughput chart and
// columns, auto-refresh.
func TestQueuesPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{ReadOnly: true})
	e.insertOrder(Order{Item: "1"})
	e.insertOrder(Order{Item: "2"}, gendurable.InsertOpts{Queue: "vip"})
	e.failed()
	require.NoError(t, e.eng.Pause(context.Background(), "vip"))
	r := get(t, h, "/?refresh=1")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `data-queue="default"`)
	require.Contains(t, r.body, `data-queue="vip"`)
	require.Contains(t, r.body, `href="/instances?queue=default&amp;status=failed"`)
	require.Contains(t, r.body, "badge paused")
	require.Contains(t, r.body, `data-refresh="2"`)
	require.Contains(t, r.body, "read-only")
	require.NotContains(t, r.body, "<form")
	// Throughput from the database on the first load: the failed instance
	// finished in the newest minute (1 in 5 minutes: 0.2/min).
	require.Contains(t, r.body, `<svg class="chart" id="throughput"`)
	require.Contains(t, r.body, "(0 done, 1 failed)")
	require.Regexp(t, `<rect class="failed" x="753" y="\d+" width="10" height="\d+">`, r.body, "the last minute's bar")
	require.Contains(t, r.body, `<td class="num">0.2</td>`)
	require.Contains(t, r.body, `<noscript><meta http-equiv="refresh" content="2"></noscript>`, "reloads without JavaScript")

	// Read-only: the mutation is refused and nothing changes.
	r = post(t, h, "/queues/vip/resume", nil)
	require.Equal(t, http.StatusForbidden, r.code)
	require.True(t, e.queuePaused("vip"))

}

// TestChildrenAndParentLinks: a fan-out shows its children with links, and
// each child links back to its parent.
func TestChildrenAndParentLinks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	h, _ := e.handler(dashboard.Options{})
	res, err := e.eng.Insert(context.Background(), e.batch.New(Batch{Items: []string{"x", "y"}}))
	require.NoError(t, err)
	parent := e.waitStatus(res.ID, gendurable.StatusAwaitingChildren, 10*time.Second)
	det, err := e.eng.Describe(context.Background(), parent.ID)
	require.NoError(t, err)
	require.Len(t, det.Children, 2)

	r := get(t, h, fmt.Sprintf("/instances/%d", parent.ID))
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "awaiting children: 0 of 2 finished")
	for _, c := range det.Children {
		require.Contains(t, r.body, fmt.Sprintf(`data-child-id="%d"`, c.ID))
		require.Contains(t, r.body, fmt.Sprintf(`href="/instances/%d"`, c.ID))
		kid := get(t, h, fmt.Sprintf("/instances/%d", c.ID))
		require.Equal(t, http.StatusOK, kid.code)
		require.Contains(t, kid.body, fmt.Sprintf(`<a href="/instances/%d">#%d</a>`, parent.ID, parent.ID))
	}

	// Wake both children; the parent finishes and shows their results.
	for _, c := range det.Children {
		e.waitStatus(c.ID, gendurable.StatusAwaitingSignal, 10*time.Second)
		r := post(t, h, fmt.Sprintf("/instances/%d/signal", c.ID), url.Values{"name": {"go"}})
		require.Equal(t, http.StatusSeeOther, r.code)
	}
	e.waitStatus(parent.ID, gendurable.StatusDone, 10*time.Second)
	r = get(t, h, fmt.Sprintf("/instances/%d", parent.ID))
	require.Equal(t, 2, strings.Count(r.body, `<span class="st st-done">done</span>`), "both children shown done")
	require.Contains(t, html.UnescapeString(r.body), `"shipped": "x"`)
}

// TestAttemptsShownFromOne: every page counts attempts from 1, as the CLI
// does (the API and JSON count from 0): the list, the overview, the error
// history and the timeline. An instance the reaper failed after its last
// lease (attempt = max attempts in the row) shows "3 of 3", not "4 of 3";
// one whose step replayed past its budget (attempt 5) shows the run it is
// on, "6 of 3", where it showed "3 of 3" before.
func TestAttemptsShownFromOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	ctx := context.Background()
	hist, err := json.Marshal([]gendurable.StepError{
		{Step: "wait", Attempt: 0, At: time.Now().Add(-2 * time.Minute), Kind: "error", Error: "first failure"},
		{Step: "wait", Attempt: 1, At: time.Now().Add(-time.Minute), Kind: "error", Error: "second failure"},
	})
	require.NoError(t, err)
	backingOff := e.insertOrder(Order{Item: "b"}, gendurable.InsertOpts{MaxAttempts: 3})
	reaped := e.insertOrder(Order{Item: "r"}, gendurable.InsertOpts{MaxAttempts: 3})
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.gendurable_instances SET attempt = 2, errors = $2 WHERE id = $1`, e.schema), backingOff, hist)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.gendurable_instances SET attempt = 3, status = 'failed', finished_at = now() WHERE id = $1`, e.schema), reaped)
	require.NoError(t, err)
	replayed := e.insertOrder(Order{Item: "p"}, gendurable.InsertOpts{MaxAttempts: 3})
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.gendurable_instances SET attempt = 5 WHERE id = $1`, e.schema), replayed)
	require.NoError(t, err)
	require.Equal(t, 2, e.instance(backingOff).Attempt, "the API counts from 0")

	r := get(t, h, "/instances")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, rowOf(t, r.body, backingOff), `<td class="num">3/3</td>`)
	require.Contains(t, rowOf(t, r.body, reaped), `<td class="num">3/3</td>`)
	require.Contains(t, rowOf(t, r.body, replayed), `<td class="num">6/3</td>`)

	r = get(t, h, fmt.Sprintf("/instances/%d", backingOff))
	require.Contains(t, r.body, `<dd id="attempt">3 of 3</dd>`)
	require.Contains(t, r.body, `<td>wait</td><td class="num">1</td><td>error</td><td class="err"><pre>first failure</pre>`)
	require.Contains(t, r.body, `<td>wait</td><td class="num">2</td><td>error</td><td class="err"><pre>second failure</pre>`)
	require.Contains(t, r.body, "step wait, attempt 1 (error): first failure")
	require.Contains(t, r.body, "step wait, attempt 2 (error): second failure")
	require.Contains(t, r.body, "last update: runnable at step wait, attempt 3 of 3")
	require.NotContains(t, r.body, "attempt 0")

	r = get(t, h, fmt.Sprintf("/instances/%d", reaped))
	require.Contains(t, r.body, `<dd id="attempt">3 of 3</dd>`)
	require.NotContains(t, r.body, "4 of 3")

	r = get(t, h, fmt.Sprintf("/instances/%d", replayed))
	require.Contains(t, r.body, `<dd id="attempt">6 of 3</dd>`)
	require.Contains(t, r.body, "attempt 6 of 3")
}

// rowOf is the list page's row of instance id.
func rowOf(t *testing.T, body string, id int64) string {
	t.Helper()
	_, rest, ok := strings.Cut(body, fmt.Sprintf(`<tr data-instance-id="%d">`, id))
	require.True(t, ok, "no row for %d", id)
	row, _, _ := strings.Cut(rest, "</tr>")
	return row
}

// TestRunNowAction: a scheduled or backing-off instance's page offers "Run
// now" (confirmed first); the POST makes it eligible now with its attempt
// count kept, is audit-logged, and is refused with a clear 409 for an
// instance not waiting to run and a 404 for a missing one. Read-only
// dashboards offer no such form (the route matrix checks the POST).
func TestRunNowAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // not started: nothing picks the instances up
	h, logs := e.handler(dashboard.Options{})
	ctx := context.Background()
	eligibleNow := func(id int64) bool {
		return e.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND eligible_at <= now()`, id) == 1
	}

	scheduled := e.insertOrder(Order{Item: "later"}, gendurable.InsertOpts{RunIn: time.Hour})
	r := get(t, h, fmt.Sprintf("/instances/%d", scheduled))
	require.Contains(t, r.body, fmt.Sprintf(`action="/instances/%d/run-now" class="action" data-confirm="Run instance %d now rather than at `, scheduled, scheduled))
	require.Contains(t, r.body, `id="run-now"`)
	require.NotContains(t, r.body, "backing off before")
	r = post(t, h, fmt.Sprintf("/instances/%d/run-now", scheduled), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	ranNow := flashLocation(t, r, fmt.Sprintf("/instances/%d", scheduled), "ran-now")
	require.True(t, eligibleNow(scheduled))
	require.Contains(t, logs.String(), `msg="dashboard audit: run-now" action=run-now outcome=ok status=303`)
	require.Contains(t, logs.String(), fmt.Sprintf(`path=/instances/%d/run-now id=%d`, scheduled, scheduled))
	r = get(t, h, ranNow)
	require.Contains(t, r.body, "Eligible now: the next worker that polls its queue runs it")
	require.NotContains(t, r.body, `id="run-now"`, "eligible already: nothing to offer")
	r = post(t, h, fmt.Sprintf("/instances/%d/run-now", scheduled), nil)
	require.Equal(t, http.StatusSeeOther, r.code, "already eligible: left as it is")

	// Backing off before its third attempt: the attempt count is kept.
	backingOff := e.insertOrder(Order{Item: "retrying"}, gendurable.InsertOpts{MaxAttempts: 5})
	_, err := e.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.gendurable_instances SET attempt = 2, eligible_at = now() + interval '10 minutes' WHERE id = $1`, e.schema), backingOff)
	require.NoError(t, err)
	r = get(t, h, fmt.Sprintf("/instances/%d", backingOff))
	require.Contains(t, r.body, "backing off before attempt 3.")
	r = post(t, h, fmt.Sprintf("/instances/%d/run-now", backingOff), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.True(t, eligibleNow(backingOff))
	require.Equal(t, 2, e.instance(backingOff).Attempt)

	// Not waiting to run: 409 with what the action is for; nothing changes.
	failed := e.failed()
	r = get(t, h, fmt.Sprintf("/instances/%d", failed))
	require.NotContains(t, r.body, `id="run-now"`)
	r = post(t, h, fmt.Sprintf("/instances/%d/run-now", failed), nil)
	require.Equal(t, http.StatusConflict, r.code)
	require.Contains(t, r.body, "Only a runnable instance waiting for a later time (scheduled, or backing off before its next attempt) can be run now")
	require.NotContains(t, r.body, "gendurable:")
	require.Equal(t, gendurable.StatusFailed, e.instance(failed).Status)
	require.Contains(t, logs.String(), `action=run-now outcome=refused status=409`)

	r = post(t, h, "/instances/999999999/run-now", nil)
	require.Equal(t, http.StatusNotFound, r.code)
	r = post(t, h, "/instances/abc/run-now", nil)
	require.Equal(t, http.StatusNotFound, r.code)

	ro, _ := e.handler(dashboard.Options{ReadOnly: true})
	later := e.insertOrder(Order{Item: "ro"}, gendurable.InsertOpts{RunIn: time.Hour})
	r = get(t, ro, fmt.Sprintf("/instances/%d", later))
	require.NotContains(t, r.body, "run-now")
	r = post(t, ro, fmt.Sprintf("/instances/%d/run-now", later), nil)
	require.Equal(t, http.StatusForbidden, r.code)
	require.False(t, eligibleNow(later))
}

// redactSecrets is a Redact that hides the value of every top-level field
// whose name holds "secret".
func redactSecrets(data json.RawMessage) json.RawMessage {
	var m map[string]any
	if json.Unmarshal(data, &m) != nil {
		return data
	}
	for k := range m {
		if strings.Contains(k, "secret") {
			m[k] = "[redacted]"
		}
	}
	b, _ := json.Marshal(m)
	return b
}
