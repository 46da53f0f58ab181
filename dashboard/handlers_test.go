package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestRetryAndRunNowOfARowWaitingForItsCancelledStepsLease: a row cancelled
// mid-step keeps its lease; retried (or run now) while that lease lives it
// becomes eligible only when the lease ends. The page must not say "Eligible
// now", nor say a retried parent awaiting its live children is runnable.
func TestRetryAndRunNowOfARowWaitingForItsCancelledStepsLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // not started: nothing picks the instances up
	h, _ := e.handler(dashboard.Options{})

	// Retried while its cancelled step's lease lives.
	waiting := e.insertOrder(Order{Item: "retried"}, gendurable.InsertOpts{})
	_, err := e.pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.gendurable_instances SET eligible_at = now() + interval '1 hour',
		lease_expires_at = now() + interval '1 hour' WHERE id = $1`, e.schema), waiting)
	require.NoError(t, err)
	r := post(t, h, fmt.Sprintf("/instances/%d/run-now", waiting), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	loc := r.header.Get("Location")
	r = get(t, h, loc)
	require.NotContains(t, r.body, "Eligible now")
	require.Contains(t, r.body, "when the lease of its cancelled step ends")
	require.NotContains(t, r.body, `id="run-now"`, "run now cannot make it eligible before the lease ends")

	// Cancelled mid-step: failed, its lease live.
	cancelled := e.insertOrder(Order{Item: "cancelled"}, gendurable.InsertOpts{})
	_, err = e.pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.gendurable_instances SET status = 'failed', finished_at = now(),
		lease_expires_at = now() + interval '1 hour' WHERE id = $1`, e.schema), cancelled)
	require.NoError(t, err)
	r = post(t, h, fmt.Sprintf("/instances/%d/retry", cancelled), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	r = get(t, h, r.header.Get("Location"))
	require.Contains(t, r.body, "when the lease of its cancelled step ends")

	// A parent cancelled while a child of its fan-out runs.
	parent := e.insertOrder(Order{Item: "parent"}, gendurable.InsertOpts{})
	child := e.insertOrder(Order{Item: "child"}, gendurable.InsertOpts{})
	_, err = e.pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %[1]s.gendurable_instances SET status = 'failed', finished_at = now(),
		fanout = 1, children_total = 1, children_pending = 1 WHERE id = $1;`, e.schema), parent)
	require.NoError(t, err)
	_, err = e.pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.gendurable_instances SET status = 'executing', parent_id = $2,
		parent_fanout = 1, lease_expires_at = now() + interval '1 hour' WHERE id = $1`, e.schema), child, parent)
	require.NoError(t, err)
	r = post(t, h, fmt.Sprintf("/instances/%d/retry", parent), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	r = get(t, h, r.header.Get("Location"))
	require.Contains(t, r.body, "Retried: the instance awaits its live children again")

	// Cancelled while it awaited a signal: parked again.
	parked := e.insertOrder(Order{Item: "parked"}, gendurable.InsertOpts{})
	_, err = e.pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.gendurable_instances SET status = 'awaiting_signal', awaits = '{payment}'
		WHERE id = $1`, e.schema), parked)
	require.NoError(t, err)
	require.NoError(t, e.eng.Cancel(context.Background(), parked, "operator"))
	r = post(t, h, fmt.Sprintf("/instances/%d/retry", parked), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	r = get(t, h, r.header.Get("Location"))
	require.Contains(t, r.body, "Retried: the instance was cancelled while it awaited signals, and awaits them again")
}

// TestCancelTreeFromTheInstancePage: an instance with children, live or
// with a live child, offers "Cancel with descendants" (one without children
// does not, nor a read-only dashboard, nor a tree with nothing live left);
// posted, it cancels the live members, says how many, and leaves an audit
// line with the reason and the counts. A cross-origin post, an id that is
// not a positive int64 or names no instance, and an oversized reason are
// refused (403, 404, 400) and audited, changing nothing; a GET is not
// routed (405); a second post skips them all.
func TestCancelTreeFromTheInstancePage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	audit := &captured{}
	h, _ := e.handler(dashboard.Options{AuditLogger: slog.New(audit)})
	ctx := context.Background()
	res, err := e.eng.Insert(ctx, e.batch.New(Batch{Items: []string{"x", "y"}}))
	require.NoError(t, err)
	parent := e.waitStatus(res.ID, gendurable.StatusAwaitingChildren, 10*time.Second)
	det, err := e.eng.Describe(ctx, parent.ID)
	require.NoError(t, err)
	require.Len(t, det.Children, 2)
	for _, c := range det.Children {
		e.waitStatus(c.ID, gendurable.StatusAwaitingSignal, 10*time.Second)
	}
	lone := e.insertOrder(Order{Item: "lone"})
	path := fmt.Sprintf("/instances/%d/cancel-tree", parent.ID)

	require.Contains(t, get(t, h, fmt.Sprintf("/instances/%d", parent.ID)).body, `id="cancel-tree"`)
	require.NotContains(t, get(t, h, fmt.Sprintf("/instances/%d", lone)).body, `id="cancel-tree"`, "no children")
	ro, _ := e.handler(dashboard.Options{ReadOnly: true})
	require.NotContains(t, get(t, ro, fmt.Sprintf("/instances/%d", parent.ID)).body, `id="cancel-tree"`)
	require.Equal(t, http.StatusForbidden, post(t, ro, path, nil).code)
	r := do(t, h, req{method: http.MethodPost, path: path, form: url.Values{}, remote: "10.1.2.3:5555",
		header: map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}})
	require.Equal(t, http.StatusForbidden, r.code)
	require.Equal(t, "refused", audit.with("dashboard audit: cancel-tree")[0]["outcome"])
	// Each refused post from a client of its own: refused ones are at
	// most five a minute per client on the trail.
	same := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}
	for i, bad := range []string{"abc", "0", "-1", "1e3", "99999999999999999999", "987654321"} {
		r := do(t, h, req{method: http.MethodPost, path: "/instances/" + bad + "/cancel-tree", form: url.Values{},
			remote: fmt.Sprintf("10.2.%d.1:1", i), header: same})
		require.Equal(t, http.StatusNotFound, r.code, "id %q", bad)
	}
	require.Equal(t, http.StatusBadRequest, do(t, h, req{method: http.MethodPost, path: path, remote: "10.3.0.1:1", header: same,
		form: url.Values{"reason": {strings.Repeat("x", 10000)}}}).code, "an oversized reason")
	require.Equal(t, http.StatusMethodNotAllowed, do(t, h, req{method: http.MethodGet, path: path}).code)
	require.Len(t, audit.with("dashboard audit: cancel-tree"), 9, "every refused request is audited: the cross-origin one, the bad ids, the oversized reason, the GET")
	require.Equal(t, gendurable.StatusAwaitingChildren, e.instance(parent.ID).Status, "the refused posts changed nothing")

	// Cancelled alone, the parent leaves its children running: still offered.
	require.NoError(t, e.eng.Cancel(ctx, parent.ID, "alone"))
	require.Contains(t, get(t, h, fmt.Sprintf("/instances/%d", parent.ID)).body, `id="cancel-tree"`)
	r = post(t, h, path, url.Values{"reason": {"tree <test>"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Contains(t, get(t, h, r.header.Get("Location")).body, "Cancelled 2 instance(s); 1 skipped (already finished, or changed meanwhile).")
	for _, c := range det.Children {
		in := e.instance(c.ID)
		require.Equal(t, gendurable.StatusFailed, in.Status)
		require.Equal(t, "tree <test>", in.Errors[len(in.Errors)-1].Error)
	}
	// Still offered with nothing live among the children shown: the page
	// cannot see their children, which a child cancelled alone leaves
	// running; a tree with nothing live cancels nothing.
	require.Contains(t, get(t, h, fmt.Sprintf("/instances/%d", parent.ID)).body, `id="cancel-tree"`)
	require.False(t, e.instance(lone).Status.Terminal(), "outside the tree")
	var ok map[string]any
	for _, l := range audit.with("dashboard audit: cancel-tree") {
		if l["outcome"] == "ok" {
			ok = l
		}
	}
	require.NotNil(t, ok, "%v", audit.recs)
	require.Equal(t, parent.ID, ok["id"])
	require.Equal(t, "tree <test>", ok["reason"])
	require.EqualValues(t, 2, ok["changed"])

	r = post(t, h, path, nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Contains(t, get(t, h, r.header.Get("Location")).body, "Cancelled 0 instance(s); 3 skipped (already finished, or changed meanwhile).")
}

// TestSignalNameIsTakenAsTyped: the dashboard trimmed a signal's name while
// the API and the CLI took it as given, so " go" from the page woke an
// instance awaiting "go" while the same name through the API did not, and
// an instance awaiting "go " (which Await accepted) could not be woken from
// the page at all. Now a name that starts or ends with white space is
// refused everywhere (ErrInvalidSignal: 400 here), with nothing sent and
// the refusal on the audit trail.
func TestSignalNameIsTakenAsTyped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	audit := &syncbuf.Buffer{}
	h, _ := e.handler(dashboard.Options{AuditLogger: slog.New(slog.NewTextHandler(audit, nil))})
	id := e.insertOrder(Order{Item: "x"})
	for _, name := range []string{" go", "go ", "go\u00a0", "\u2003go"} {
		_, err := e.eng.Signal(context.Background(), id, name, nil, nil)
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "API %q", name)
		r := post(t, h, fmt.Sprintf("/instances/%d/signal", id), url.Values{"name": {name}})
		require.Equal(t, http.StatusBadRequest, r.code, "dashboard %q: %s", name, r.body)
		require.Contains(t, r.body, "Invalid signal")
	}
	require.Zero(t, e.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "nothing was sent")
	require.Equal(t, 4, strings.Count(audit.String(), "outcome=refused"), audit.String())
	r := post(t, h, fmt.Sprintf("/instances/%d/signal", id), url.Values{"name": {"go"}})
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
}

// TestStateFilterCannotProbeRedactedData: Options.Redact hides a state's
// secrets on every page, but the list's "State contains" filter matched the
// stored state: /instances?q=ID&state={"secret":"guess"} listed the
// instance exactly when the guess was right — an oracle, one request per
// guess (a 4-digit PIN in at most 10,000), and a bulk action by that filter
// counted (and changed) the instances whose secret matched. A filter that
// Redact would change is now refused (400), in the list and in bulk
// actions; one on data Redact leaves alone still works.
func TestStateFilterCannotProbeRedactedData(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	redact := func(_ string, data json.RawMessage) json.RawMessage { return redactSecrets(data) }
	h, _ := e.handler(dashboard.Options{Redact: redact})
	id := e.insertOrder(Order{Item: "book", Secret: "4711"})
	for _, p := range []string{
		fmt.Sprintf("/instances?q=%d&state=%s", id, url.QueryEscape(`{"secret":"4711"}`)),
		fmt.Sprintf("/instances?q=%d&state=%s", id, url.QueryEscape(`{"secret":"0000"}`)),
		"/instances?machine=order&state=" + url.QueryEscape(`{"item":"book","secret":"4711"}`),
	} {
		r := get(t, h, p)
		require.Equal(t, http.StatusBadRequest, r.code, "%s: %s", p, r.body)
		require.Contains(t, r.body, "hides")
		require.NotContains(t, r.body, fmt.Sprintf(`data-instance-id="%d"`, id))
	}
	r := post(t, h, "/bulk/cancel", url.Values{"scope": {"match"}, "state": {`{"secret":"4711"}`}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Equal(t, gendurable.StatusRunnable, e.instance(id).Status, "nothing was cancelled")

	// Fields Redact leaves alone can still be searched, within a machine.
	r = get(t, h, "/instances?machine=order&state="+url.QueryEscape(`{"item":"book"}`))
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Contains(t, r.body, fmt.Sprintf(`data-instance-id="%d"`, id))
	// Without a machine Redact cannot be asked about every instance's
	// machine: one no engine started with (a producer that only inserts)
	// was never checked, and its hidden field could be guessed.
	r = get(t, h, fmt.Sprintf("/instances?q=%d&state=%s", id, url.QueryEscape(`{"item":"book"}`)))
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Contains(t, r.body, "needs a machine")
	r = post(t, h, "/bulk/cancel", url.Values{"scope": {"match"}, "state": {`{"item":"book"}`}})
	require.Equal(t, http.StatusBadRequest, r.code, r.body)
	require.Equal(t, gendurable.StatusRunnable, e.instance(id).Status, "nothing was cancelled")
}

// TestAnUnreachableDatabaseIsA503: a page whose database cannot be reached
// (down, restarting, out of connections) says so with a 503, logged as a
// warning — not "500 Internal error", which an outage probe got for it.
func TestAnUnreachableDatabaseIsA503(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: "nowhere"})
	require.NoError(t, err)
	logs := &syncbuf.Buffer{}
	h, err := dashboard.New(eng, dashboard.Options{AllowedHosts: []string{"example.com"},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	for _, path := range []string{"/", "/instances", "/instances/7"} {
		r := do(t, h, req{method: http.MethodGet, path: path})
		require.Equal(t, http.StatusServiceUnavailable, r.code, "%s: %s", path, r.body)
		require.Contains(t, r.body, "The database cannot be reached", path)
	}
	require.NotContains(t, logs.String(), "internal error")
	require.Contains(t, logs.String(), "dashboard: request failed")
}

// TestRetryOfACancelledWaitSaysItKeepsTheWait: an instance cancelled while
// it waited for a time (here a delayed insert) keeps that time when
// retried; the flash must not read as "runs now", and the page offers Run
// now.
func TestRetryOfACancelledWaitSaysItKeepsTheWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // not started: nothing picks the instance up
	h, _ := e.handler(dashboard.Options{})
	ctx := context.Background()
	id := e.insertOrder(Order{Item: "later"}, gendurable.InsertOpts{RunIn: time.Hour})
	require.NoError(t, e.eng.Cancel(ctx, id, "by mistake"))
	r := post(t, h, fmt.Sprintf("/instances/%d/retry", id), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	r = get(t, h, r.header.Get("Location"))
	require.Contains(t, r.body, "but keeps the wait it was cancelled in")
	require.Contains(t, r.body, "sleeping until")
	require.Contains(t, r.body, `id="run-now"`)

	// Retried after a failure with nothing to wait for: the plain flash.
	now := e.insertOrder(Order{Item: "now"}, gendurable.InsertOpts{})
	require.NoError(t, e.eng.Cancel(ctx, now, "by mistake"))
	r = post(t, h, fmt.Sprintf("/instances/%d/retry", now), nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	r = get(t, h, r.header.Get("Location"))
	require.Contains(t, r.body, "Retried: the instance is runnable again at the step it failed in.")
	require.NotContains(t, r.body, "keeps the wait")
}
