package sqlq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// TestCancelManyCountsOnlyTheSignalsItConsumed: a CancelMany that waits for
// a row's lock while the lock's holder consumes the row's signal S1 and
// another transaction's signal S2 arrives sees S1 unconsumed in its snapshot
// and S2 not at all. Its sweep must not count S1 (already consumed when the
// sweep reaches it), or the counts it locked (S2) look swept, no second
// sweep runs, and S2 stays unconsumed on a failed row.
func TestCancelManyCountsOnlyTheSignalsItConsumed(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	var id, s1 int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, inbox)
		VALUES ('m', 'a', '{"x": 1}') RETURNING id`).Scan(&id))
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name)
		VALUES ($1, 'x') RETURNING id`, id).Scan(&s1))

	// The holder: a step's outcome consuming S1 and a signal S2 arriving,
	// both under the row's lock, committed only once the cancel waits.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM `+s+`.gendurable_instances WHERE id = $1 FOR NO KEY UPDATE`, id)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `UPDATE `+s+`.gendurable_signals SET consumed_at = now() WHERE id = $1`, s1)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name) VALUES ($1, 'x')`, id)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET inbox = '{"x": 1}' WHERE id = $1`, id)
	require.NoError(t, err)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	done := make(chan error, 1)
	go func() {
		changed, err := q.CancelMany(ctx, conn, []int64{id}, "test")
		if err == nil && len(changed) != 1 {
			err = fmt.Errorf("cancelled %d rows, want 1", len(changed))
		}
		done <- err
	}()
	// The cancel has its snapshot and waits for the row.
	require.Eventually(t, func() bool {
		var waiting bool
		_ = pool.QueryRow(ctx, `SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		return waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, <-done, "CancelMany cancels the row")

	var status string
	var unconsumed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT status::text, (SELECT count(*) FROM `+s+`.gendurable_signals
		WHERE target_id = $1 AND consumed_at IS NULL) FROM `+s+`.gendurable_instances WHERE id = $1`, id).Scan(&status, &unconsumed))
	require.Equal(t, "failed", status)
	require.Zero(t, unconsumed, "a signal that arrived while the cancel waited is left unconsumed on the failed row")
}
