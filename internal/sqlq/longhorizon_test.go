package sqlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestQueueDepthIsBoundedByItsLimit: the long-horizon adapter's depth poll
// counts through the pick indexes and stops at its limit — on the plan
// fixture (20,000 runnable rows in queue default, 2,000 of them keyed, among
// 232k), a count capped at 500 touches about 2 × 500 rows, custom and generic
// plan; uncapped, it counts them all.
func TestQueueDepthIsBoundedByItsLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 280k rows")
	}
	t.Parallel()
	f := newPlanFixture(t, statsAllDone, nil)
	ctx := context.Background()
	runPlanCases(t, []planCase{
		{"capped", 2*500 + 100, func(t *testing.T, tx pgx.Tx) {
			n, err := f.q.QueueDepth(ctx, tx, "default", 500)
			require.NoError(t, err)
			require.Equal(t, int64(1000), n, "500 plain + 500 keyed")
		}},
	})
	n, err := f.q.QueueDepth(ctx, f.pool, "default", 1_000_000)
	require.NoError(t, err)
	require.Equal(t, int64(20_000), n)
	n, err = f.q.QueueDepth(ctx, f.pool, "no-such-queue", 1_000_000)
	require.NoError(t, err)
	require.Zero(t, n)
	at, err := sqlq.DBNow(ctx, f.pool)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), at, time.Minute)
}
