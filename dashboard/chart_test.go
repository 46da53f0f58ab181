package dashboard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestLayoutChart: bars are stacked (failed on top of done) and scaled to
// an even axis top, one per minute, with the x axis labelled from −60m to
// now; the per-queue rate averages the newest five minutes.
func TestLayoutChart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 15, 0, 51, 0, time.UTC)
	bs := make([]gendurable.ThroughputBucket, 60)
	for i := range bs {
		bs[i].Start = now.Add(-time.Duration(60-i) * time.Minute)
	}
	bs[59] = gendurable.ThroughputBucket{Start: bs[59].Start, Done: 30, Failed: 10}
	bs[58].Done = 10
	bs[0].Failed = 1
	c := layoutChart(bs)
	require.Equal(t, int64(40), c.Max)
	require.Equal(t, [2]int64{40, 11}, [2]int64{c.Done, c.Failed})
	require.Len(t, c.Bars, 60)
	last := c.Bars[59]
	require.Equal(t, chartPlotH*30/40, last.DoneH)
	require.Equal(t, chartPlotH*10/40, last.FailH)
	require.Equal(t, chartTop+chartPlotH-last.DoneH, last.DoneY)
	require.Equal(t, last.DoneY-last.FailH, last.FailY, "failed sits on top of done")
	require.Equal(t, chartTop, last.FailY, "the tallest bar reaches the top")
	require.Equal(t, "14:59:51–15:00:51 UTC: 30 done, 10 failed", last.Title, "the bar's own minute, to the second")
	require.Equal(t, 3, c.Bars[0].FailH)
	require.Zero(t, c.Bars[1].DoneH+c.Bars[1].FailH)
	require.Equal(t, []chartTick{{chartTop + chartPlotH, "0"}, {chartTop + chartPlotH/2, "20"}, {chartTop, "40"}}, c.YTicks)
	require.Equal(t, "−60m", c.XTicks[0].Label)
	require.Equal(t, "now", c.XTicks[len(c.XTicks)-1].Label)
	require.Equal(t, c.PlotX+c.PlotW, c.XTicks[len(c.XTicks)-1].Pos)

	require.Equal(t, rate{DonePerMin: 8, FailPerMin: 2}, rateOf(bs))
	require.Equal(t, rate{}, rateOf(nil))
	require.Equal(t, int64(4), layoutChart(make([]gendurable.ThroughputBucket, 60)).Max, "an empty hour")
	for n, want := range map[int64]int64{0: 4, 5: 6, 7: 8, 9: 10, 11: 20, 21: 40, 41: 60, 99: 100, 101: 200, 12345: 20000} {
		require.Equal(t, want, niceCeil(n), n)
	}
}

// TestThroughputReadHoldsNoLock: while one request reads the throughput
// (held up here by a lock on the instances table), concurrent page loads
// are served the previous value at once, and before any value exists they
// wait for that one read without blocking each other: a request whose
// context ends returns at once. The database sees one read at a time.
func TestThroughputReadHoldsNoLock(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema})
	require.NoError(t, err)
	newDashboard := func() *dashboard {
		h, err := New(eng, Options{AllowedHosts: []string{"example.com"}})
		require.NoError(t, err)
		return h.(*dashboard)
	}
	ctx := context.Background()
	block := func() (release func()) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %q.gendurable_instances IN ACCESS EXCLUSIVE MODE`, schema))
		require.NoError(t, err)
		return func() { require.NoError(t, tx.Rollback(ctx)) }
	}
	// reading waits until a read is under way, blocked on the lock.
	reading := func() {
		require.Eventually(t, func() bool { return blockedReads(t, pool, schema) == 1 }, 5*time.Second, 5*time.Millisecond)
	}
	type result struct {
		tp  *gendurable.Throughput
		err error
	}
	load := func(d *dashboard, ctx context.Context, out chan<- result) {
		tp, err := d.throughput(ctx)
		out <- result{tp, err}
	}

	// A stale value: the reader waits on the lock, ten others get the
	// previous value at once.
	d := newDashboard()
	first, err := d.throughput(ctx)
	require.NoError(t, err)
	d.tp.mu.Lock()
	d.tp.at = time.Time{}
	d.tp.mu.Unlock()
	release := block()
	leader := make(chan result, 1)
	go load(d, ctx, leader)
	reading()
	others := make(chan result, 10)
	for range cap(others) {
		go load(d, ctx, others)
	}
	deadline := time.After(3 * time.Second)
	for range cap(others) {
		select {
		case r := <-others:
			require.NoError(t, r.err)
			require.Same(t, first, r.tp, "the previous value")
		case <-deadline:
			release()
			t.Fatal("page loads queued behind the read")
		}
	}
	require.Equal(t, 1, blockedReads(t, pool, schema), "one read")
	release()
	r := <-leader
	require.NoError(t, r.err)
	require.NotSame(t, first, r.tp, "the reader got a fresh value")
	again, err := d.throughput(ctx)
	require.NoError(t, err)
	require.Same(t, r.tp, again, "and cached it")

	// No value yet: the others wait for the one read; one whose context
	// ends returns at once; all the rest share the read's value.
	d = newDashboard()
	release = block()
	leader = make(chan result, 1)
	go load(d, ctx, leader)
	reading()
	waiters := make(chan result, 5)
	for range cap(waiters) {
		go load(d, ctx, waiters)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	ended := make(chan result, 1)
	go load(d, short, ended)
	select {
	case r := <-ended:
		require.ErrorIs(t, r.err, context.DeadlineExceeded)
	case <-time.After(3 * time.Second):
		release()
		t.Fatal("a request whose context ended waited for the read")
	}
	require.Equal(t, 1, blockedReads(t, pool, schema), "one read")
	release()
	r = <-leader
	require.NoError(t, r.err)
	for range cap(waiters) {
		w := <-waiters
		require.NoError(t, w.err)
		require.Same(t, r.tp, w.tp)
	}
}

// blockedReads counts the statements on schema's tables waiting for a lock.
func blockedReads(t *testing.T, pool *pgxpool.Pool, schema string) int {
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, schema).Scan(&n))
	return n
}
