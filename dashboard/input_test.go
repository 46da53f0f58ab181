package dashboard_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestBadInputIs400: NUL, invalid UTF-8 and control characters in filters,
// queue names, machine names, signal names and dedup keys get 400 with our
// own message, never a 500 with the database's text (SQLSTATE 22021), and
// change nothing.
func TestBadInputIs400(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, logs := e.handler(dashboard.Options{})
	for _, p := range []string{
		"/instances?q=%00", "/instances?q=a%00b", "/instances?step=%ff%fe", "/instances?queue=%1b%5b2J",
		"/instances?machine=order%00", "/instances?q=caf%c3", "/machines/a%00b", "/machines/%ff",
	} {
		r := get(t, h, p)
		require.Equal(t, http.StatusBadRequest, r.code, "%s: %s", p, r.body)
		require.Contains(t, r.body, "Invalid input", p)
		require.NotContains(t, r.body, "SQLSTATE", p)
	}
	for _, p := range []string{"/queues/a%00b/pause", "/queues/%ff%fe/pause", "/queues/%09/resume", "/queues/a%1bb/resume"} {
		r := post(t, h, p, url.Values{})
		require.Equal(t, http.StatusBadRequest, r.code, "%s: %s", p, r.body)
		require.Contains(t, r.body, "Invalid input", p)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM {{s}}.gendurable_queues`), "no queue row was written")
	id := e.insertOrder(Order{Item: "x"})
	for _, v := range []url.Values{
		{"name": {"a\x01b"}}, {"name": {"go\x1b[2J"}}, {"name": {"c1\u009b"}}, {"name": {"go"}, "dedup_key": {"k\x7f"}},
		{"name": {"go"}, "dedup_key": {"k\tk"}},
	} {
		r := post(t, h, fmt.Sprintf("/instances/%d/signal", id), v)
		require.Equal(t, http.StatusBadRequest, r.code, "%q: %s", v, r.body)
		require.Contains(t, r.body, "Invalid signal", "%q", v)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "no signal was sent")
	require.NotContains(t, logs.String(), "internal error")
	require.NotContains(t, logs.String(), "22021")
}
