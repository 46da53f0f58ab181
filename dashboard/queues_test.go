package dashboard_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestPauseRefusesUnknownQueue: the dashboard's pause and resume refuse a
// queue with no instance and no row (404, nothing written), as the engine
// does, so a crafted POST cannot leave a phantom queue on the queues page.
func TestPauseRefusesUnknownQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	for _, action := range []string{"pause", "resume"} {
		r := post(t, h, "/queues/nosuchqueue/"+action, nil)
		require.Equal(t, http.StatusNotFound, r.code, action)
		require.Contains(t, r.body, "No such queue")
	}
	require.Equal(t, 0, e.count(`SELECT count(*) FROM {{s}}.gendurable_queues`))
	require.NotContains(t, get(t, h, "/").body, "nosuchqueue")
	r := post(t, h, "/queues/default/pause", nil) // the engine's own queue
	require.Equal(t, http.StatusSeeOther, r.code)
	require.True(t, e.queuePaused("default"))
}

// TestStandaloneKnowsStoredMachines: a dashboard whose engine registers no
// machine (a standalone `gendurable ui`) counts the machines the engines
// stored on the queues page and offers them in the list's machine filter;
// on a schema without the machines table (migrated before version 7) both
// pages fall back to the machines registered in their own engine, with a
// warning, instead of failing.
func TestStandaloneKnowsStoredMachines(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	require.NoError(t, e.eng.Stop(context.Background()))
	bare, err := gendurable.New(e.pool, &gendurable.Config{Schema: e.schema})
	require.NoError(t, err)
	h, err := dashboard.New(bare, dashboard.Options{AllowedHosts: []string{"example.com"}})
	require.NoError(t, err)

	r := get(t, h, "/")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<span id="machine-count">3 machine(s)</span>`)
	r = get(t, h, "/instances")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<datalist id="machines"><option value="batch"><option value="flaky"><option value="order"></datalist>`)

	_, err = e.pool.Exec(context.Background(), `DROP TABLE "`+e.schema+`".gendurable_machines`)
	require.NoError(t, err)
	own, logs := e.handler(dashboard.Options{})
	r = get(t, own, "/")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<span id="machine-count">3 machine(s)</span>`)
	r = get(t, own, "/instances")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<option value="order">`)
	require.Contains(t, logs.String(), "reading the stored machines failed")
	// A new dashboard of the bare engine: h shares the names it read
	// (3) for 2 s.
	h, err = dashboard.New(bare, dashboard.Options{AllowedHosts: []string{"example.com"}})
	require.NoError(t, err)
	r = get(t, h, "/")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<span id="machine-count">0 machine(s)</span>`)
}

// TestQueuesNamedDotsCanBePaused: a queue may be named "." or ".." (any
// name an insert accepts, an operator can act on), but as a path segment a
// browser resolves it away: the form for ".." posted to /pause. A queue
// named "/" made a path the router redirects (an empty segment), which a
// form's POST does not follow: a 404, the queue left as it was. The queues
// page's pause and resume forms must reach the queue they show, as a
// browser resolves their action.
func TestQueuesNamedDotsCanBePaused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	base, err := url.Parse("http://example.com/")
	require.NoError(t, err)
	for _, q := range []string{".", "..", "/", "//", "a/", "/a", "a//b", "a/./b", "a/../b", "%2F", "a?b#c"} {
		e.insertOrder(Order{Item: "dots"}, gendurable.InsertOpts{Queue: q})
		for _, action := range []string{"pause", "resume"} {
			page := get(t, h, "/")
			require.Equal(t, http.StatusOK, page.code)
			var form string
			for _, part := range strings.Split(page.body, `<form method="post" action="`)[1:] {
				href, rest, _ := strings.Cut(part, `"`)
				href = html.UnescapeString(href)
				if strings.Contains(href, action) && (strings.Contains(rest, "Pause queue "+q+"?") || action == "resume") {
					form = href
				}
			}
			require.NotEmpty(t, form, "queue %q: no %s form", q, action)
			u, err := url.Parse(form)
			require.NoError(t, err)
			target := base.ResolveReference(u) // as a browser: dot segments go
			r := post(t, h, target.RequestURI(), nil)
			require.Equal(t, http.StatusSeeOther, r.code, "queue %q: %s posted to %s: %s", q, action, target.RequestURI(), r.body)
			require.Equal(t, action == "pause", e.queuePaused(q), "queue %q after %s", q, action)
		}
	}
}

// TestQueuesPageIsBounded: the queues page lists the first 500 queues by
// name and says how many it left out; its totals count them all. A queue
// per tenant made a probe's page of 50,000 rows (47 MB).
func TestQueuesPageIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	_, err := e.pool.Exec(context.Background(), `INSERT INTO "`+e.schema+`".gendurable_instances (fsm, step, queue)
		SELECT 'order', 'pack', 'tenant-' || lpad(g::text, 4, '0') FROM generate_series(1, 700) AS g`)
	require.NoError(t, err)
	require.NoError(t, e.eng.Pause(context.Background(), "tenant-0650")) // past the bound: still shown, with its state
	r := get(t, h, "/")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `data-queue="tenant-0650"`)
	require.Contains(t, r.body, `data-queue="tenant-0001"`)
	require.Contains(t, r.body, `data-queue="tenant-0499"`)
	require.NotContains(t, r.body, `data-queue="tenant-0600"`)
	require.Regexp(t, `id="more-queues">\d+ more queue\(s\) not shown`, r.body)
	require.Contains(t, r.body, `<th class="num">700</th>`, "the totals count every queue")
}
