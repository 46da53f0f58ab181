package dashboard_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestStandaloneGraph: a dashboard on an engine that registers no machine
// (what `gendurable ui` runs) lists every machine an engine stored at its
// start and draws each whole: every step, the transitions taken (merged on
// the worker's Stop), and no wider than the page.
func TestStandaloneGraph(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bare, err := gendurable.New(e.pool, &gendurable.Config{Schema: e.schema})
	require.NoError(t, err)
	h, err := dashboard.New(bare, dashboard.Options{AllowedHosts: []string{"example.com"}})
	require.NoError(t, err)

	r := get(t, h, "/machines")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "No machine is stored yet")

	e.start()
	a := e.insertOrder(Order{Item: "a"})
	e.waitStatus(a, gendurable.StatusAwaitingSignal, 10*time.Second)
	_, err = e.eng.Signal(context.Background(), a, "go", nil, nil)
	require.NoError(t, err)
	e.waitStatus(a, gendurable.StatusDone, 10*time.Second)
	b := e.insertOrder(Order{Item: "b"})
	e.waitStatus(b, gendurable.StatusAwaitingSignal, 10*time.Second)

	r = get(t, h, "/machines")
	for _, m := range []string{"order", "flaky", "batch"} {
		require.Contains(t, r.body, `href="/machines/`+m+`"`)
	}
	require.Contains(t, r.body, "declared", "the flaky job declares its one step")

	r = get(t, h, "/machines/batch")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `data-step="fan"`, "every step, with no instance anywhere")
	require.Contains(t, r.body, `data-step="join"`)
	require.Contains(t, r.body, "v1")

	require.NoError(t, e.eng.Stop(context.Background()))
	r = get(t, h, "/machines/order")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `class="edge"`, "transitions taken, merged on Stop")
	require.Contains(t, r.body, "await 2")
	require.Contains(t, r.body, "awaiting_signal 1")
	m := regexp.MustCompile(`<svg class="graph"[^>]* width="(\d+)"`).FindStringSubmatch(r.body)
	require.NotNil(t, m)
	w, _ := strconv.Atoi(m[1])
	require.LessOrEqual(t, w, 1190)

	r = get(t, h, "/machines/flaky")
	require.Contains(t, r.body, `class="edge declared-only"`, "perform → done is declared, not taken")
}

// TestMachinesNamedDotsHaveAGraphPage: a machine named "." or ".." is
// linked from the lists like any other, and the link reaches its graph as
// a browser resolves it (a dot segment in a path would be resolved away);
// so does one named "/" (an empty segment, which the router redirects).
func TestMachinesNamedDotsHaveAGraphPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	names := []string{".", "..", "/", "//", "a/", "a/../b", "%2F"}
	_, err := e.pool.Exec(context.Background(), `INSERT INTO "`+e.schema+`".gendurable_instances (fsm, step)
		SELECT n, 'a' FROM unnest($1::text[]) AS n`, names)
	require.NoError(t, err)
	base, err := url.Parse("http://example.com/")
	require.NoError(t, err)
	list := get(t, h, "/instances")
	require.Equal(t, http.StatusOK, list.code)
	for _, name := range names {
		m := regexp.MustCompile(`<a href="([^"]*)">` + regexp.QuoteMeta(name) + `</a>`).FindStringSubmatch(list.body)
		require.NotNil(t, m, "no link to machine %q", name)
		u, err := url.Parse(html.UnescapeString(m[1]))
		require.NoError(t, err)
		target := base.ResolveReference(u)
		r := get(t, h, target.RequestURI())
		require.Equal(t, http.StatusOK, r.code, "machine %q linked as %s", name, target.RequestURI())
		require.Contains(t, r.body, "<title>Machine "+html.EscapeString(name))
	}
}
