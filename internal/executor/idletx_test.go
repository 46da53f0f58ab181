package executor

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func (c *idleClock) busyNow() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busy
}

// TestClockedTx: what a callback does with its pgx.Tx works through the
// clock (pgx helpers, savepoints, batches, COPY, result-set accessors), and
// the clock counts the callback's own work between two reads of an open
// result set, or before a QueryRow's Scan, as idle: the server sent a
// small result at once and waits on the client. No call leaves the clock
// busy once it returned.
func TestClockedTx(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	inner, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = inner.Rollback(ctx) }()
	clock := newIdleClock()
	var tx pgx.Tx = &clockedTx{Tx: inner, c: clock}
	idle := func(d time.Duration) {
		t.Helper()
		require.Equal(t, 0, clock.busyNow())
		before := clock.longestIdle()
		time.Sleep(d)
		require.GreaterOrEqual(t, clock.longestIdle(), d)
		clock.mu.Lock()
		clock.longest, clock.lastEnd = before, time.Now()
		clock.mu.Unlock()
	}

	// Slow work between the rows of an open result set.
	rows, err := tx.Query(ctx, "SELECT generate_series(1, 3)")
	require.NoError(t, err)
	require.True(t, rows.Next())
	idle(50 * time.Millisecond)
	require.True(t, rows.Next())
	require.True(t, rows.Next())
	require.False(t, rows.Next())
	rows.Close() // after Next returned false: nothing counted twice
	require.Equal(t, "SELECT 3", rows.CommandTag().String())
	require.NotNil(t, rows.Conn())
	idle(10 * time.Millisecond)

	// pgx helpers.
	rows, err = tx.Query(ctx, "SELECT generate_series(1, 3)")
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{1, 2, 3}, got)
	require.NoError(t, pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		_, err := sp.Exec(ctx, "CREATE TEMP TABLE t (n int) ON COMMIT DROP")
		return err
	}))
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"n"}, pgx.CopyFromRows([][]any{{1}, {2}}))
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	idle(10 * time.Millisecond)

	// A batch read partly, slowly, then closed.
	b := &pgx.Batch{}
	b.Queue("SELECT 1")
	b.Queue("SELECT count(*) FROM t")
	br := tx.SendBatch(ctx, b)
	var one int
	require.NoError(t, br.QueryRow().Scan(&one))
	idle(50 * time.Millisecond)
	require.NoError(t, br.Close())
	idle(10 * time.Millisecond)

	// A QueryRow scanned late.
	row := tx.QueryRow(ctx, "SELECT 2")
	idle(50 * time.Millisecond)
	var two int
	require.NoError(t, row.Scan(&two))
	require.Equal(t, 2, two)
	require.Equal(t, 0, clock.busyNow())
}
