package benchrun

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
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
