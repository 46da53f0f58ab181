package dashboard_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestAutoRefreshLinks: ?refresh=N turns auto-refresh on (clamped to
// 2..300 s, ignored when unreadable), and its links keep the page's
// filters; the error page has none.
func TestAutoRefreshLinks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{BasePath: "/ops"})
	id := e.insertOrder(Order{Item: "r"})

	r := get(t, h, "/ops/instances?queue=default&refresh=15&flash=retried")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `data-refresh="15"`)
	require.Contains(t, r.body, `<a href="/ops/instances?queue=default&amp;refresh=15" class="on" aria-current="true">15s</a>`)
	require.Contains(t, r.body, `<a href="/ops/instances?queue=default&amp;refresh=5">5s</a>`)
	require.Contains(t, r.body, `<a href="/ops/instances?queue=default" class="off">stop</a>`, "stop keeps the filters, drops the flash")
	require.Contains(t, r.body, `<noscript><meta http-equiv="refresh" content="15"></noscript>`)

	for q, want := range map[string]string{"1": `data-refresh="2"`, "99999": `data-refresh="300"`} {
		require.Contains(t, get(t, h, "/ops/?refresh="+q).body, want, q)
	}
	for _, q := range []string{"abc", "-5", "0"} {
		r := get(t, h, "/ops/instances/"+strconv.FormatInt(id, 10)+"?refresh="+q)
		require.Equal(t, http.StatusOK, r.code, q)
		require.NotContains(t, r.body, "data-refresh=", q)
		require.NotContains(t, r.body, "<noscript>", q)
	}
	r = get(t, h, "/ops/instances/"+strconv.FormatInt(id, 10)+"?refresh=5")
	require.Contains(t, r.body, `data-refresh="5"`, "the detail page refreshes too")
	r = get(t, h, "/ops/instances/987654?refresh=5")
	require.Equal(t, http.StatusNotFound, r.code)
	require.NotContains(t, r.body, "data-refresh=")
}
