package sqlq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestListPlansAreIndexDrivenAndBounded: on a 350k-row table, a search by
// id, partition key or unique key is driven by the primary key and the key
// indexes, and a list whose filters match nothing reads at most its scan
// window — no sequential scan, no node that reads the table.
func TestListPlansAreIndexDrivenAndBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 350k rows")
	}
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	seed(t, pool, schema, 200_000)
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := pool.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET unique_key = convert_to('u' || id, 'UTF8') WHERE id % 100 = 0`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+s+`.gendurable_instances`)
	require.NoError(t, err)
	var total int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_instances`).Scan(&total))
	require.GreaterOrEqual(t, total, 200_000)
	q, err := sqlq.New(schema)
	require.NoError(t, err)

	str := func(v string) *string { return &v }
	id := func(v int64) *int64 { return &v }
	const scan, limit = 10_000, 51
	// checkPlan asserts a statement's plans (for these values, and the
	// generic plan a prepared statement may switch to after five runs) use
	// index and read at most maxRead rows of the instances table.
	checkPlan := func(name, index string, maxRead float64, sql string, args []any) {
		t.Helper()
		for mode, plan := range map[string]planNode{
			"custom":  explain(t, pool, sql, args...),
			"generic": explainGeneric(t, pool, sql, args...),
		} {
			sawIndex := false
			var read float64
			plan.walk(func(n planNode) {
				require.NotEqual(t, "Seq Scan", n.NodeType, "%s (%s plan): no sequential scan of %s", name, mode, n.Relation)
				if n.Relation == "gendurable_instances" {
					read += n.ActualRows * n.Loops
				}
				if n.Index == index {
					sawIndex = true
				}
			})
			require.True(t, sawIndex, "%s (%s plan): driven by %s", name, mode, index)
			require.LessOrEqual(t, read, maxRead, "%s (%s plan): rows read from the instances table", name, mode)
		}
	}
	for _, c := range []struct {
		name    string
		f       sqlq.ListFilter
		index   string // an index the plan must use
		maxRead float64
		want    int // rows returned
	}{
		{"first page", sqlq.ListFilter{}, "gendurable_instances_pkey", 2 * limit, limit},
		{"common filter", sqlq.ListFilter{Status: str("executing"), Step: str("a")}, "gendurable_instances_pkey", 2 * limit, limit},
		{"search by id", sqlq.ListFilter{Search: str("123456"), SearchID: id(123456)}, "gendurable_instances_pkey", 20, 1},
		{"search by partition key", sqlq.ListFilter{Search: str("k40")}, "gendurable_instances_partition_key", 200, 41},
		{"search by unique key", sqlq.ListFilter{Search: str("u300")}, "gendurable_instances_unique_key", 20, 1},
		{"search with a filter", sqlq.ListFilter{Search: str("k40"), Status: str("failed")}, "gendurable_instances_partition_key", 200, 0},
		{"filter matching nothing", sqlq.ListFilter{FSM: str("no-such-machine")}, "gendurable_instances_pkey", scan, 0},
		{"rare status, deep page", sqlq.ListFilter{Status: str("failed"), Before: id(150_000)}, "gendurable_instances_pkey", scan, 0},
		{"queue and step", sqlq.ListFilter{Queue: str("other"), Step: str("zz")}, "gendurable_instances_pkey", scan, 0},
	} {
		c.f.Scan, c.f.Limit = scan, limit
		sql, args := q.ListSQL(c.f)
		checkPlan(c.name, c.index, c.maxRead, sql, args)
		rows, err := q.ListInstances(ctx, pool, c.f)
		require.NoError(t, err, c.name)
		require.Len(t, rows, c.want, c.name)
		if len(rows) < limit { // the caller measures the window
			sql, args := q.ListWindowSQL(c.f)
			checkPlan(c.name+": window", c.index, c.maxRead, sql, args)
			win, err := q.ListWindow(ctx, pool, c.f)
			require.NoError(t, err, c.name)
			require.LessOrEqual(t, win.Scanned, scan, c.name)
		}
	}

	// A full window that matched nothing says where it stopped.
	f := sqlq.ListFilter{FSM: str("no-such-machine"), Scan: scan, Limit: limit}
	win, err := q.ListWindow(ctx, pool, f)
	require.NoError(t, err)
	require.Equal(t, scan, win.Scanned)
	var maxID int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) FROM `+s+`.gendurable_instances`).Scan(&maxID))
	require.Equal(t, maxID-scan+1, win.Low)
	f.Search = str("k40")
	win, err = q.ListWindow(ctx, pool, f)
	require.NoError(t, err)
	require.Equal(t, 41, win.Scanned)
}

// explainGeneric is explain with the generic plan: the statement is
// prepared and run with plan_cache_mode = force_generic_plan.
func explainGeneric(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) planNode {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `PREPARE list_generic AS `+sql)
	require.NoError(t, err)
	ps := make([]string, len(args))
	for i := range args {
		ps[i] = fmt.Sprintf("$%d", i+1)
	}
	var out []byte
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE list_generic(`+strings.Join(ps, ", ")+`)`,
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&out)) // values as literals
	_, err = tx.Exec(ctx, `DEALLOCATE list_generic`) // prepared statements outlive the transaction
	require.NoError(t, err)
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(out, &plans))
	return plans[0].Plan
}
