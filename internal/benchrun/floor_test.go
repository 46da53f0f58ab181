package benchrun

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/scratch"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestFloorDropsItsSchema: the floor's rows (machine "floor", not one a
// bench runs) made its own drop refuse the schema, unsaid; every later
// bench then refused the schema as holding someone else's rows. Its rows
// are a bench machine's now, and the schema is gone when it ends.
func TestFloorDropsItsSchema(t *testing.T) {
	t.Parallel()
	o := benchSchema(t)
	var progress bytes.Buffer
	o.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Floor(ctx, o, 2, 200*time.Millisecond)
	require.NoError(t, err)
	require.Positive(t, r.RowsPerSec)
	require.NotContains(t, progress.String(), "was not dropped")
	conn, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, o.Schema).Scan(&exists))
	require.False(t, exists, "the floor's schema was left behind")
}

// TestARunningBenchKeepsItsSchema: a demo (or another bench) started while
// a bench runs in the same schema is refused (scratch.ErrBusy), and the
// bench ends as it would have. Without a hold the demo dropped the schema
// under the running bench, whose own drop at its end then took the demo's
// (a hostile operator's probe).
func TestARunningBenchKeepsItsSchema(t *testing.T) {
	t.Parallel()
	o := benchSchema(t)
	var progress bytes.Buffer
	o.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Floor(ctx, o, 2, 3*time.Second)
		done <- err
	}()
	pool, err := pgxpool.New(ctx, dbtest.URL())
	require.NoError(t, err)
	defer pool.Close()
	require.Eventually(t, func() bool {
		info, err := sqlq.InspectSchema(ctx, pool, o.Schema)
		return err == nil && info.Scratch() && info.Gendurable
	}, 30*time.Second, 20*time.Millisecond, "the bench made its schema")
	err = scratch.Prepare(ctx, pool, o.Schema, scratch.Options{Owner: "demo"})
	require.ErrorIs(t, err, scratch.ErrBusy)
	require.NoError(t, <-done)
	require.NotContains(t, progress.String(), "was not dropped")
}
