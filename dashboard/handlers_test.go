package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
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
}
