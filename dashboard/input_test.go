package dashboard_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestBadInputIs400: NUL, invalid UTF-8 and control characters in filters,
// queue names and machine names get 400 with our own message, never a 500
// with the database's text (SQLSTATE 22021), and change nothing.
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
	require.NotContains(t, logs.String(), "internal error")
	require.NotContains(t, logs.String(), "22021")
}
