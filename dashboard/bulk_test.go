package dashboard_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestBulkRetryAndCancel: ticked rows are retried (failed ones) or
// cancelled (live ones), the others counted as skipped; a filter acts on
// every match, not only one page; the redirect keeps the list's filters and
// says what happened; each action leaves one audit line with the ids or
// the filter and the counts.
func TestBulkRetryAndCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := &captured{}
	h, _ := e.handler(dashboard.Options{Logger: slog.New(log)})
	ids := func(vs ...int64) []string {
		var out []string
		for _, v := range vs {
			out = append(out, strconv.FormatInt(v, 10))
		}
		return out
	}

	f1, f2, live := e.failed(), e.failed(), e.insertOrder(Order{Item: "live"})
	r := post(t, h, "/bulk/retry", url.Values{"id": ids(f1, f2, live, 987654), "scope": {"selected"}, "status": {"failed"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	loc := r.header.Get("Location")
	require.True(t, strings.HasPrefix(loc, "/instances?status=failed&"), loc)
	for _, id := range []int64{f1, f2} {
		require.Equal(t, gendurable.StatusRunnable, e.instance(id).Status)
	}
	require.Equal(t, gendurable.StatusRunnable, e.instance(live).Status, "a live one is left as it was")
	page := get(t, h, loc)
	require.Contains(t, page.body, "Retried 2 instance(s); 1 skipped (not failed, or changed meanwhile); 1 not found.")
	line := log.with("dashboard audit: bulk-retry")
	require.Len(t, line, 1)
	require.Equal(t, "ok", line[0]["outcome"])
	require.Equal(t, []int64{f1, f2, live, 987654}, line[0]["ids"])
	require.Equal(t, int64(2), line[0]["changed"])
	require.Equal(t, []int64{f1, f2}, line[0]["changed_ids"])

	// By filter: every live instance of the queue, past one page.
	var queued []int64
	for i := range dashboard.MaxPageSize + 20 {
		queued = append(queued, e.insertOrder(Order{Item: fmt.Sprint(i)}, gendurable.InsertOpts{Queue: "bulkq"}))
	}
	other := e.insertOrder(Order{Item: "elsewhere"})
	r = post(t, h, "/bulk/cancel", url.Values{"queue": {"bulkq"}, "scope": {"match"}, "reason": {"bulk <test>"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Contains(t, get(t, h, r.header.Get("Location")).body, fmt.Sprintf("Cancelled %d instance(s).", len(queued)))
	for _, id := range queued {
		in := e.instance(id)
		require.Equal(t, gendurable.StatusFailed, in.Status)
		require.Equal(t, "bulk <test>", in.Errors[len(in.Errors)-1].Error)
	}
	require.Equal(t, gendurable.StatusRunnable, e.instance(other).Status, "outside the filter")
	line = log.with("dashboard audit: bulk-cancel")
	require.Len(t, line, 1)
	require.Equal(t, "match", line[0]["scope"])
	require.Equal(t, `queue="bulkq"`, line[0]["filter"])
	require.Equal(t, "bulk <test>", line[0]["reason"])

	// Cancelling ticked rows; a finished one is skipped.
	a := e.insertOrder(Order{Item: "a"})
	r = post(t, h, "/bulk/cancel", url.Values{"id": ids(a, f1), "scope": {"selected"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Equal(t, gendurable.StatusFailed, e.instance(a).Status)
	require.Equal(t, gendurable.StatusFailed, e.instance(f1).Status, "f1 was runnable again: cancelled too")
	r = post(t, h, "/bulk/cancel", url.Values{"id": ids(a), "scope": {"selected"}})
	require.Contains(t, get(t, h, r.header.Get("Location")).body, "Cancelled 0 instance(s); 1 skipped (already finished, or changed meanwhile).")
}

// TestBulkInputIsValidated: bulk forms are bounded and checked before
// anything changes, with our own messages.
func TestBulkInputIsValidated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	live := e.insertOrder(Order{Item: "x"})
	many := make([]string, dashboard.MaxPageSize+1)
	for i := range many {
		many[i] = strconv.FormatInt(live, 10)
	}
	for name, c := range map[string]struct {
		path string
		form url.Values
		msg  string
	}{
		"nothing ticked":       {"/bulk/cancel", url.Values{"scope": {"selected"}}, "Tick at least one instance."},
		"too many":             {"/bulk/cancel", url.Values{"id": many}, "At most 500 instances at once"},
		"bad id":               {"/bulk/cancel", url.Values{"id": {"1", "x"}}, "Bad instance id."},
		"negative id":          {"/bulk/cancel", url.Values{"id": {"-1"}}, "Bad instance id."},
		"zero id":              {"/bulk/retry", url.Values{"id": {"0"}}, "Bad instance id."},
		"no filter":            {"/bulk/cancel", url.Values{"scope": {"match"}}, "Filter the list first"},
		"both":                 {"/bulk/cancel", url.Values{"scope": {"match"}, "queue": {"default"}, "id": {"1"}}, "not both"},
		"unknown scope":        {"/bulk/retry", url.Values{"scope": {"everything"}, "id": {"1"}}, "Unknown scope."},
		"bad filter":           {"/bulk/retry", url.Values{"scope": {"match"}, "status": {"bogus"}}, "Unknown status."},
		"bad state filter":     {"/bulk/retry", url.Values{"scope": {"match"}, "state": {"7"}}, "must be a JSON object or array"},
		"empty state filter":   {"/bulk/cancel", url.Values{"scope": {"match"}, "state": {" { } "}}, "Filter the list first"},
		"empty state array":    {"/bulk/retry", url.Values{"scope": {"match"}, "state": {"[]"}}, "Filter the list first"},
		"state not UTF-8":      {"/bulk/cancel", url.Values{"scope": {"match"}, "state": {"{\"k\": \"\xff\"}"}}, "Invalid input"},
		"state lone surrogate": {"/bulk/cancel", url.Values{"scope": {"match"}, "state": {`{"k": "\udc00"}`}}, "Invalid input"},
		"long reason":          {"/bulk/cancel", url.Values{"id": {"1"}, "reason": {strings.Repeat("r", gendurable.MaxReasonBytes+1)}}, "The reason is longer than 4000 bytes."},
		// The zero time is the engine's "no bound": a filter of instances
		// inserted before year 1 acted on every match.
		"zero time":          {"/bulk/cancel", url.Values{"scope": {"match"}, "status": {"runnable"}, "to": {"0001-01-01"}}, "is not a bound the list can use"},
		"zero time, RFC3339": {"/bulk/cancel", url.Values{"scope": {"match"}, "status": {"runnable"}, "from": {"0001-01-01T01:00:00+01:00"}}, "is not a bound the list can use"},
		// A time range alone that takes in every instance is refused by
		// the engine (ErrInvalidInput): the page says why, not the
		// catch-all text about names and filters.
		"range of everything": {"/bulk/cancel", url.Values{"scope": {"match"}, "from": {"0001-01-02"}}, "leaves out no instance"},
		"range to the end":    {"/bulk/retry", url.Values{"scope": {"match"}, "to": {"9999-12-31"}}, "leaves out no instance"},
		"range, state {}":     {"/bulk/cancel", url.Values{"scope": {"match"}, "from": {"0001-01-02"}, "state": {" { } "}}, "leaves out no instance"},
		// A page's bounds are not a filter: they were read and ignored.
		"page bound":   {"/bulk/retry", url.Values{"scope": {"match"}, "status": {"runnable"}, "before": {"6"}}, "bounds a page of the list"},
		"page size":    {"/bulk/cancel", url.Values{"scope": {"match"}, "status": {"runnable"}, "limit": {"1"}}, "bounds a page of the list"},
		"page, ticked": {"/bulk/cancel", url.Values{"id": {"1"}, "limit": {"1"}}, "bounds a page of the list"},
		// The single cancel and the tree cancel read their reason alike.
		"long reason, one":  {fmt.Sprintf("/instances/%d/cancel", live), url.Values{"reason": {strings.Repeat("r", gendurable.MaxReasonBytes+1)}}, "The reason is longer than 4000 bytes."},
		"long reason, tree": {fmt.Sprintf("/instances/%d/cancel-tree", live), url.Values{"reason": {strings.Repeat("r", gendurable.MaxReasonBytes+1)}}, "The reason is longer than 4000 bytes."},
		"NUL in reason":     {"/bulk/cancel", url.Values{"id": {"1"}, "reason": {"a\x00b"}}, "The reason holds a NUL byte or invalid UTF-8."},
		"NUL reason, one":   {fmt.Sprintf("/instances/%d/cancel", live), url.Values{"reason": {"\x00"}}, "The reason holds a NUL byte or invalid UTF-8."},
		"bad UTF-8 reason":  {fmt.Sprintf("/instances/%d/cancel-tree", live), url.Values{"reason": {"\xff"}}, "The reason holds a NUL byte or invalid UTF-8."},
	} {
		r := post(t, h, c.path, c.form)
		require.Equal(t, http.StatusBadRequest, r.code, name)
		require.Contains(t, r.body, c.msg, name)
	}
	require.Equal(t, gendurable.StatusRunnable, e.instance(live).Status, "nothing changed")
	// The longest reason the library and the CLI take is taken here too.
	long := strings.Repeat("r", gendurable.MaxReasonBytes)
	other := e.insertOrder(Order{Item: "y"})
	r := post(t, h, fmt.Sprintf("/instances/%d/cancel", other), url.Values{"reason": {"  " + long + "\n"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	cancelled := e.instance(other)
	require.Equal(t, gendurable.StatusFailed, cancelled.Status)
	require.NotEmpty(t, cancelled.Errors)
	require.Equal(t, long, cancelled.Errors[len(cancelled.Errors)-1].Error)

	// A crafted flash link shows nothing: not its counts, nor that an
	// action stopped part way and should be submitted again — only the
	// dashboard's own redirect, signed, does.
	r = get(t, h, "/instances?flash=bulk-retried&changed=%3Cscript%3E&skipped=2")
	require.NotContains(t, r.body, `class="flash"`)
	require.NotContains(t, r.body, "<script>")
	require.NotContains(t, get(t, h, "/instances/1?flash=tree-cancelled&changed=3&partial=1").body, "submit again")
	signed := post(t, h, "/bulk/cancel", url.Values{"id": {"999999"}, "reason": {"x"}})
	require.Equal(t, http.StatusSeeOther, signed.code, signed.body)
	loc, err := url.Parse(signed.header.Get("Location"))
	require.NoError(t, err)
	require.Contains(t, get(t, h, loc.String()).body, "Cancelled 0 instance(s); 1 not found.")
	forged := loc.Query()
	forged.Set("changed", "3")
	require.NotContains(t, get(t, h, loc.Path+"?"+forged.Encode()).body, `class="flash"`, "counts changed, signature kept")
	require.NotContains(t, get(t, h, "/instances/1?"+loc.RawQuery).body, `class="flash"`, "a real flash carried to another page")

	// The list offers the bulk form, the "all matching" buttons only when
	// filtered; read-only, neither form nor boxes.
	require.Contains(t, r.body, `id="bulk-form"`)
	require.Contains(t, r.body, `data-bulk aria-label="tick`)
	require.NotContains(t, r.body, `id="bulk-retry-match"`)
	r = get(t, h, "/instances?queue=default")
	require.Contains(t, r.body, `<input type="hidden" name="queue" value="default">`)
	require.Contains(t, r.body, `id="bulk-retry-match"`)
	ro, _ := e.handler(dashboard.Options{ReadOnly: true})
	r = get(t, ro, "/instances?queue=default")
	require.NotContains(t, r.body, "bulk-form")
	require.NotContains(t, r.body, "data-bulk")
	require.Equal(t, http.StatusForbidden, post(t, ro, "/bulk/cancel", url.Values{"id": {strconv.FormatInt(live, 10)}}).code)
	require.Equal(t, gendurable.StatusRunnable, e.instance(live).Status)
}

// TestBulkAuditLineSaysItsIDListIsCut: a bulk action that changed more than
// gendurable.MaxBulkIDs instances lists the first MaxBulkIDs ids on its
// audit line and says the list is cut (changed_ids_truncated). Before, the
// line held 1000 ids and nothing said there were more.
func TestBulkAuditLineSaysItsIDListIsCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := &captured{}
	h, _ := e.handler(dashboard.Options{Logger: slog.New(log)})
	n := gendurable.MaxBulkIDs + 1
	_, err := e.pool.Exec(context.Background(), `INSERT INTO "`+e.schema+`".gendurable_instances (fsm, step, queue)
		SELECT 'order', 'a', 'many' FROM generate_series(1, $1::int)`, n)
	require.NoError(t, err)
	r := post(t, h, "/bulk/cancel", url.Values{"queue": {"many"}, "scope": {"match"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	line := log.with("dashboard audit: bulk-cancel")
	require.Len(t, line, 1)
	require.Equal(t, int64(n), line[0]["changed"])
	require.Len(t, line[0]["changed_ids"], gendurable.MaxBulkIDs)
	require.Equal(t, true, line[0]["changed_ids_truncated"])

	// A short list says nothing of the kind.
	id := e.insertOrder(Order{Item: "one"}, gendurable.InsertOpts{Queue: "few"})
	r = post(t, h, "/bulk/cancel", url.Values{"queue": {"few"}, "scope": {"match"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	line = log.with("dashboard audit: bulk-cancel")
	require.Len(t, line, 2)
	require.Equal(t, []int64{id}, line[1]["changed_ids"])
	require.NotContains(t, line[1], "changed_ids_truncated")
}

// TestAMutationActsOnTheFormAsSent (a hostile-input probe): the dashboard
// trimmed white space off a filter's names and then acted on the trimmed
// filter (a bulk cancel of queue " q1 " cancelled q1's instances, while the
// CLI and the API refuse such a name); it read a JSON or multipart body as
// an empty form (a cancel went ahead, its reason dropped); and it took the
// first of a field given twice. Each is refused now, and changes nothing;
// a refused request's audit line says what it asked for.
func TestAMutationActsOnTheFormAsSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := &captured{}
	h, _ := e.handler(dashboard.Options{Logger: slog.New(log)})
	id := e.insertOrder(Order{Item: "a"}, gendurable.InsertOpts{Queue: "q1"})
	other := e.insertOrder(Order{Item: "b"}, gendurable.InsertOpts{Queue: "q2"})
	live := func() {
		t.Helper()
		require.NotEqual(t, gendurable.StatusFailed, e.instance(id).Status, "instance %d was cancelled", id)
		require.NotEqual(t, gendurable.StatusFailed, e.instance(other).Status, "instance %d was cancelled", other)
	}

	for _, q := range []string{" q1 ", "q1\t", " q1"} {
		r := post(t, h, "/bulk/cancel", url.Values{"queue": {q}, "scope": {"match"}, "reason": {"trim"}})
		require.Equal(t, http.StatusBadRequest, r.code, "queue %q: %s", q, r.body)
		live()
	}
	r := get(t, h, "/instances?queue=%20q1%09")
	require.Equal(t, http.StatusBadRequest, r.code, "a list filter's name is not trimmed either")
	r = get(t, h, "/instances?q=%20"+strconv.FormatInt(id, 10))
	require.Equal(t, http.StatusBadRequest, r.code, "nor the search text")
	require.Contains(t, r.body, "white space")

	path := fmt.Sprintf("/instances/%d/cancel", id)
	same := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}
	for ct, body := range map[string]string{
		"application/json":                 `{"reason":"only if stuck"}`,
		"multipart/form-data; boundary=XX": "--XX\r\nContent-Disposition: form-data; name=\"reason\"\r\n\r\nmultipart\r\n--XX--\r\n",
		"text/plain":                       "reason=plain",
	} {
		hdr := map[string]string{"Content-Type": ct}
		for k, v := range same {
			hdr[k] = v
		}
		r := do(t, h, req{method: http.MethodPost, path: path, raw: body, header: hdr})
		require.Equal(t, http.StatusUnsupportedMediaType, r.code, "%s: %s", ct, r.body)
		live()
	}

	// A field in the URL's query was dropped unread: a bulk cancel's
	// queue and limit there cancelled every match in every queue; a
	// cancel's reason there gave way to the default one.
	for _, q := range []string{"?queue=q1&limit=1", "?queue=q1"} {
		r = post(t, h, "/bulk/cancel"+q, url.Values{"scope": {"match"}, "status": {"runnable"}})
		require.Equal(t, http.StatusBadRequest, r.code, "%s: %s", q, r.body)
		require.Contains(t, r.body, "in the URL")
		live()
	}
	r = post(t, h, path+"?reason=INC-4711", nil)
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	live()
	r = post(t, h, "/queues/q1/pause?queue=q2", nil)
	require.Equal(t, http.StatusBadRequest, r.code, "a queue in the path and another in the query: %s", r.body)
	// No field to send in the body: the queue is the path's (the advice
	// to send it there led a probe to another 400).
	require.Contains(t, r.body, "named in the path already")
	require.False(t, e.queuePaused("q1"))

	// The queue in the query and another in the body: the body's was
	// read by nobody, and q1 was paused.
	r = post(t, h, "/queues/pause?queue=q1", url.Values{"queue": {"q2"}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Contains(t, r.body, "given more than once")
	require.False(t, e.queuePaused("q1"))
	require.False(t, e.queuePaused("q2"))
	// The queue in the body only: named where the name goes (a probe got
	// the generic "Invalid input" page).
	r = post(t, h, "/queues/pause", url.Values{"queue": {"q1"}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Contains(t, r.body, "No queue named")
	require.False(t, e.queuePaused("q1"))
	// The queue in the path and another in the body: the body's was read
	// by nobody, and q1 was paused (a hostile probe). So is any field an
	// action does not take.
	for _, c := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/queues/q1/pause", url.Values{"queue": {"q2"}}, "named in the path already"},
		{"/queues/q1/pause", url.Values{"confirm": {"yes"}}, "it takes no fields"},
		{path, url.Values{"reason": {"INC-4711"}, "note": {"x"}}, "not one this action takes (reason)"},
	} {
		r = post(t, h, c.path, c.form)
		require.Equal(t, http.StatusBadRequest, r.code, r.body)
		require.Contains(t, r.body, c.want)
		require.False(t, e.queuePaused("q1"))
		live()
	}
	// A machine's graph named twice drew the first (a hostile probe).
	r = get(t, h, "/machines?name=a&name=b")
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Contains(t, r.body, "given more than once")
	// A list's query that does not parse (a pair holding a ';') was read
	// without that pair: every failed instance listed, and "Cancel all"
	// offered on that wider filter.
	r = get(t, h, "/instances?status=failed&queue=a;b")
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Contains(t, r.body, "query could not be read")
	require.Contains(t, r.body, "no separator")
	r = get(t, h, "/instances?status=failed&queue=a%ZZ") // the message names what it is
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Contains(t, r.body, "bad %-escape")

	r = post(t, h, "/queues/pause?queue=q1&queue=nosuch", nil)
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.False(t, e.queuePaused("q1"), "neither queue is paused")
	r = post(t, h, "/bulk/cancel", url.Values{"queue": {"q1", "q2"}, "scope": {"match"}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	live()

	// Refused requests' audit lines say what was asked (each from a client
	// of its own: refused ones are at most five a minute per client).
	clients := 0
	fresh := func(path string, form url.Values) resp {
		clients++
		return do(t, h, req{method: http.MethodPost, path: path, form: form, remote: fmt.Sprintf("10.4.%d.1:1", clients),
			header: map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}})
	}
	r = fresh(path, url.Values{"reason": {strings.Repeat("x", 5000)}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	line := log.with("dashboard audit: cancel")
	require.NotEmpty(t, line)
	last := line[len(line)-1]
	require.Equal(t, "refused", last["outcome"])
	require.EqualValues(t, id, last["id"])
	require.EqualValues(t, 5000, last["reason_bytes"])
	r = fresh("/bulk/cancel", url.Values{"id": {"7", "x"}, "scope": {"selected"}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	line = log.with("dashboard audit: bulk-cancel")
	require.NotEmpty(t, line)
	last = line[len(line)-1]
	require.Equal(t, "refused", last["outcome"])
	require.Equal(t, "7,x", last["sent_ids"])
	r = fresh("/bulk/cancel", url.Values{"queue": {"q1"}, "scope": {"match"}, "reason": {strings.Repeat("x", 5000)}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	line = log.with("dashboard audit: bulk-cancel")
	last = line[len(line)-1]
	require.Equal(t, "q1", last["sent_queue"])
	require.EqualValues(t, 5000, last["reason_bytes"])
	// Refused before its handler ran (a field given twice): the line
	// still says what the bulk request asked for.
	r = fresh("/bulk/cancel", url.Values{"queue": {"q2"}, "scope": {"match"}, "status": {"runnable", "failed"}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	line = log.with("dashboard audit: bulk-cancel")
	last = line[len(line)-1]
	require.Equal(t, "q2", last["sent_queue"])
	require.Equal(t, "match", last["scope"])
	// A refused pause's line says which queue: it travels in the query.
	ro, _ := e.handler(dashboard.Options{Logger: slog.New(log), ReadOnly: true})
	r = do(t, ro, req{method: http.MethodPost, path: "/queues/pause?queue=q1", remote: "10.5.0.1:1",
		header: map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}})
	require.Equal(t, http.StatusForbidden, r.code, r.body)
	line = log.with("dashboard audit: pause")
	require.NotEmpty(t, line)
	require.Equal(t, "queue=q1", line[len(line)-1]["query"])
	// A refused retry's line names the instance its path does.
	r = do(t, ro, req{method: http.MethodPost, path: fmt.Sprintf("/instances/%d/retry", id), remote: "10.5.0.1:1",
		header: map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}})
	require.Equal(t, http.StatusForbidden, r.code, r.body)
	line = log.with("dashboard audit: retry")
	require.NotEmpty(t, line)
	require.Equal(t, id, line[len(line)-1]["id"])
	r = fresh(fmt.Sprintf("/instances/%d/signal", id), url.Values{"name": {"go"}, "dedup_key": {strings.Repeat("k", 1<<20)}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	line = log.with("dashboard audit: signal")
	require.LessOrEqual(t, len(line[len(line)-1]["dedup_key"].(string)), 1000, "what was sent, cut")
	live()

	// The dashboard's own form still works.
	r = post(t, h, path, url.Values{"reason": {"meant"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Equal(t, gendurable.StatusFailed, e.instance(id).Status)
}
