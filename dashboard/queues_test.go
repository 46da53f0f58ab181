package dashboard_test

import (
	"net/http"
	"testing"

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
