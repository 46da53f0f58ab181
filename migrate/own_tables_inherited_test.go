package migrate_test

import (
	"context"
	"testing"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/migrate"
	"github.com/stretchr/testify/require"
)

// TestATableOfYoursNamedLikeGendurablesMayHavePartitions: the version read
// refuses a schema where a table inherits from one of gendurable's, but it
// took every table of the schema named gendurable_… for gendurable's —
// README's scratch section counts "one named gendurable_…" among the
// user's own. A partitioned table of the user's so named (its partitions
// are pg_inherits rows) in gendurable's schema — public by default — made
// Start, every CLI command and migrate refuse the schema (exit 4), telling
// to detach with NO INHERIT, which a partition does not take.
func TestATableOfYoursNamedLikeGendurablesMayHavePartitions(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := pool.Exec(ctx, `CREATE TABLE `+s+`.gendurable_audit (at date NOT NULL, what text) PARTITION BY RANGE (at);
		CREATE TABLE `+s+`.gendurable_audit_2026 PARTITION OF `+s+`.gendurable_audit FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
		CREATE TABLE `+s+`.gendurable_notes (n text);
		CREATE TABLE `+s+`.notes_archive () INHERITS (`+s+`.gendurable_notes)`)
	require.NoError(t, err)
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err, "tables of the user's, named gendurable_…, with children of theirs")
	require.Equal(t, migrate.Latest(), v)

	// gendurable's own tables are still guarded.
	_, err = pool.Exec(ctx, `CREATE TABLE `+s+`.old_signals () INHERITS (`+s+`.gendurable_signals)`)
	require.NoError(t, err)
	_, err = migrate.Installed(ctx, pool, schema)
	require.ErrorIs(t, err, migrate.ErrDependents)
	require.ErrorContains(t, err, "old_signals")
	require.NotContains(t, err.Error(), "gendurable_audit")
}
