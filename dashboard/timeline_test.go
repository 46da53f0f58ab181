package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestDetailTimelineAndUniqueKey: the detail page draws the instance's
// life (inserted, the signal sent and consumed, done) on one axis, lists
// the same events, and shows the unique key and whether it is held.
func TestDetailTimelineAndUniqueKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	h, _ := e.handler(dashboard.Options{})
	ctx := context.Background()
	id := e.insertOrder(Order{Item: "tl"}, gendurable.InsertOpts{UniqueKey: "order-<tl>"})
	e.waitStatus(id, gendurable.StatusAwaitingSignal, 10*time.Second)

	r := get(t, h, fmt.Sprintf("/instances/%d", id))
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<span id="unique-key">order-&lt;tl&gt;</span>`)
	require.Contains(t, r.body, "held: no other instance with it can be inserted now")
	require.Contains(t, r.body, `<svg class="timeline" id="timeline"`)
	require.Contains(t, r.body, `data-kind="inserted"`)
	require.Contains(t, r.body, `data-kind="updated"`)
	require.Contains(t, r.body, `<line class="now"`, "a live instance's axis runs to now")

	_, err := e.eng.Signal(ctx, id, "go", json.RawMessage(`{}`), nil)
	require.NoError(t, err)
	e.waitStatus(id, gendurable.StatusDone, 10*time.Second)
	r = get(t, h, fmt.Sprintf("/instances/%d", id))
	for _, kind := range []string{"inserted", "signal", "consumed", "done"} {
		require.Contains(t, r.body, `data-kind="`+kind+`"`, kind)
	}
	require.NotContains(t, r.body, `data-kind="updated"`)
	require.NotContains(t, r.body, `<line class="now"`)
	require.Contains(t, r.body, `<line class="span inbox"`)
	require.Contains(t, r.body, "signal &#34;go&#34; consumed")
	require.Contains(t, r.body, "not held in this status", "done is outside the default unique scope")
	lanes := strings.Count(r.body, `class="lane-label"`)
	require.Equal(t, 2, lanes, "instance and signals: no errors, no children")
}

// TestDetailTimelineShowsChildren: a fan-out's children are scheduled and
// finish on the parent's timeline, each linked.
func TestDetailTimelineShowsChildren(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start()
	h, _ := e.handler(dashboard.Options{})
	res, err := e.eng.Insert(context.Background(), e.batch.New(Batch{Items: []string{"a", "b"}}))
	require.NoError(t, err)
	det := func() *gendurable.InstanceDetail {
		d, err := e.eng.Describe(context.Background(), res.ID)
		require.NoError(t, err)
		return d
	}
	require.Eventually(t, func() bool { return len(det().Children) == 2 }, 10*time.Second, 20*time.Millisecond)
	for _, c := range det().Children {
		require.False(t, c.InsertedAt.IsZero(), "Describe reads when each child was scheduled")
	}
	r := get(t, h, fmt.Sprintf("/instances/%d", res.ID))
	require.Equal(t, 2, strings.Count(r.body, `data-kind="child"`))
	require.Equal(t, 2, strings.Count(r.body, `<line class="span child-run"`))
	require.Contains(t, r.body, fmt.Sprintf(`<a href="/instances/%d">child #%d (order) scheduled</a>`, det().Children[0].ID, det().Children[0].ID))
}

// TestDetailShowsPanicStackEscaped: a panic's stack trace in the error
// history is shown collapsed, under the error, escaped like every text.
func TestDetailShowsPanicStackEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	id := e.failed()
	hist, err := json.Marshal([]gendurable.StepError{
		{Step: "wait", Attempt: 0, At: time.Now().Add(-time.Minute), Kind: "panic", Error: "panic: <img src=x onerror=alert(1)>",
			Stack: "goroutine 7 [running]:\nmain.step(<script>alert(2)</script>)\n\t/app/main.go:12 +0x1d"},
		{Step: "wait", Attempt: 1, At: time.Now(), Kind: "error", Error: "plain error"},
	})
	require.NoError(t, err)
	_, err = e.pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.gendurable_instances SET errors = $2 WHERE id = $1`, e.schema), id, hist)
	require.NoError(t, err)

	r := get(t, h, fmt.Sprintf("/instances/%d", id))
	require.Equal(t, http.StatusOK, r.code)
	require.Equal(t, 1, strings.Count(r.body, `<details class="stack"`), "only the panic has a stack")
	require.Contains(t, r.body, "<summary>stack trace</summary><pre>goroutine 7 [running]:\nmain.step(&lt;script&gt;alert(2)&lt;/script&gt;)\n\t/app/main.go:12 &#43;0x1d</pre></details>")
	require.NotContains(t, r.body, "<script>alert")
	require.NotContains(t, r.body, "<img src=x")
	require.Contains(t, r.body, `data-kind="panic"`, "on the timeline too")
	require.Equal(t, 2, strings.Count(r.body, `class="lane-label"`), "instance and errors")
}

// TestFreshKeyedRowHasNoEligibleEvent: a keyed row's eligible time is its
// insert statement's clock, past its updated_at (its transaction's now()) —
// by a microsecond per row of its key in one insert: no "eligible to run
// again (backoff or delay)" event for that (a review found one on every
// fresh keyed row), and one for a real delay.
func TestFreshKeyedRowHasNoEligibleEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // not started: the rows stay runnable
	h, _ := e.handler(dashboard.Options{})
	ctx := context.Background()
	ps := []gendurable.InsertParams{}
	for range 3 {
		ps = append(ps, e.order.New(Order{Item: "k"}).With(gendurable.InsertOpts{PartitionKey: "tenant-1"}))
	}
	ps = append(ps, e.order.New(Order{Item: "later"}).With(gendurable.InsertOpts{PartitionKey: "tenant-1", RunIn: time.Hour}))
	res, err := e.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	for _, r := range res[:3] {
		body := get(t, h, fmt.Sprintf("/instances/%d", r.ID)).body
		require.Contains(t, body, `data-kind="inserted"`)
		require.NotContains(t, body, `data-kind="eligible"`, "instance %d", r.ID)
	}
	require.Contains(t, get(t, h, fmt.Sprintf("/instances/%d", res[3].ID)).body, `data-kind="eligible"`, "a delay is shown")
}
