package sqlq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestListPlansAreIndexDrivenAndBounded: on the plan fixture (232k rows,
// under each kind of lying statistics, as custom and generic plan), a list
// page reads about its page size when matches are dense, never more than its
// scan window when they are not, and a search by id, partition key or unique
// key is an index lookup: no sequential scan, no scan that grows with the
// table.
func TestListPlansAreIndexDrivenAndBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 280k rows per statistics mode")
	}
	t.Parallel()
	for _, mode := range statsModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			f := newPlanFixture(t, mode, nil)
			ctx := context.Background()
			_, err := f.pool.Exec(ctx, `UPDATE "`+f.schema+`".gendurable_instances
				SET unique_key = convert_to('u' || id, 'UTF8') WHERE id % 100 = 0`)
			require.NoError(t, err)
			var total, maxID int64
			require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*), max(id) FROM "`+f.schema+`".gendurable_instances`).Scan(&total, &maxID))
			require.GreaterOrEqual(t, total, int64(200_000))
			const scan, limit = 10_000, 51
			// The window's last row matches a filter: it is both a match and
			// where the window ends.
			const lastStep = "edge"
			_, err = f.pool.Exec(ctx, `UPDATE "`+f.schema+`".gendurable_instances SET step = $1 WHERE id = $2`, lastStep, maxID-scan+1)
			require.NoError(t, err)

			str := func(v string) *string { return &v }
			id := func(v int64) *int64 { return &v }
			// page checks a list page's rows, and where its window ended:
			// low > 0 if the page must report a full window ending there.
			page := func(name string, bound float64, want int, low int64, lf sqlq.ListFilter) planCase {
				lf.Scan, lf.Limit = scan, limit
				return planCase{name, bound, func(t *testing.T, tx pgx.Tx) {
					rows, win, err := f.q.ListInstances(ctx, tx, lf)
					require.NoError(t, err)
					require.Len(t, rows, want)
					require.Equal(t, low > 0, win.Full)
					require.Equal(t, low, win.Low)
				}}
			}
			runPlanCases(t, []planCase{
				page("first-page", 4*limit, limit, 0, sqlq.ListFilter{}),
				page("dense-filter", 4*limit, limit, 0, sqlq.ListFilter{Status: str("awaiting_signal"), Step: str("w")}),
				page("search-id", 100, 1, 0, sqlq.ListFilter{Search: str("123456"), SearchID: id(123456)}),
				page("search-partition-key", 200, 40, 0, sqlq.ListFilter{Search: str("k40")}),
				page("search-unique-key", 100, 1, 0, sqlq.ListFilter{Search: str("u300")}),
				page("search-nothing", 100, 0, 0, sqlq.ListFilter{Search: str("no-such-key")}),
				page("search-and-filter", 200, 0, 0, sqlq.ListFilter{Search: str("k40"), Status: str("failed")}),
				page("filter-matching-nothing", scan+100, 0, maxID-scan+1, sqlq.ListFilter{FSM: str("no-such-machine")}),
				page("rare-status-deep-page", scan+100, 0, 150_000-scan, sqlq.ListFilter{Status: str("failed"), Before: id(150_000)}),
				page("window-end-matches", scan+100, 1, maxID-scan+1, sqlq.ListFilter{Before: id(maxID + 1), Step: str(lastStep)}),
			})
		})
	}
}

// TestThroughputPlanIsIndexDrivenAndBounded: on the plan fixture (66,666 of
// its 232k rows finished a minute ago, the rest one or two hours ago), the
// throughput count walks the finished index backwards and reads no more
// than its row bound, whatever the statistics say: with a bound under the
// hour's finishes it stops there (the caller sees the total reach it).
func TestThroughputPlanIsIndexDrivenAndBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 280k rows per statistics mode")
	}
	t.Parallel()
	for _, mode := range statsModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			f := newPlanFixture(t, mode, nil)
			ctx := context.Background()
			count := func(name string, limit int, want int64) planCase {
				return planCase{name, float64(limit) + 100, func(t *testing.T, tx pgx.Tx) {
					start := time.Now()
					_, rows, err := f.q.Throughput(ctx, tx, time.Hour, limit)
					require.NoError(t, err)
					t.Logf("%s: %s", name, time.Since(start).Round(time.Millisecond))
					var total int64
					for _, r := range rows {
						require.Equal(t, 1, r.Ago, "%+v", r)
						total += r.Count
					}
					require.Equal(t, want, total)
				}}
			}
			runPlanCases(t, []planCase{
				count("bounded-below-the-hour", 10_000, 10_000),
				count("whole-hour", 100_000, 66_666),
			})
		})
	}
}

// TestListSearchOfALargeKeyProbesByPrimaryKey: a search for a partition key
// whose rows are many and lie below most of the table (a tenant busy a
// month ago), with statistics that know it, reads the page's rows by
// primary key. Before, the join of the search's candidates to the table was
// planned as a merge join walking the primary key down from the newest row
// to the key's rows (the CLI's custom plan) or as a hash join over a
// sequential scan of the table (the dashboard's first five loads): every row
// of the table above the key's newest, for a page of 50.
func TestListSearchOfALargeKeyProbesByPrimaryKey(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 280k rows")
	}
	f := newPlanFixture(t, statsAllDone, nil)
	ctx := context.Background()
	s := `"` + f.schema + `".gendurable_instances`
	const keyRows = 25_000
	_, err := f.pool.Exec(ctx, `UPDATE `+s+` SET partition_key = 'busy'
		WHERE id IN (SELECT id FROM `+s+` WHERE status = 'done' ORDER BY id LIMIT $1)`, keyRows)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `VACUUM ANALYZE `+s)
	require.NoError(t, err)
	const scan, limit = 10_000, 51
	str := func(v string) *string { return &v }
	id := func(v int64) *int64 { return &v }
	page := func(name string, want int, lf sqlq.ListFilter) planCase {
		lf.Scan, lf.Limit = scan, limit
		return planCase{name, scan + 100, func(t *testing.T, tx pgx.Tx) {
			rows, _, err := f.q.ListInstances(ctx, tx, lf)
			require.NoError(t, err)
			require.Len(t, rows, want)
			for _, r := range rows {
				require.Equal(t, "busy", *r.PartitionKey)
			}
		}}
	}
	runPlanCases(t, []planCase{
		page("search-large-key", limit, sqlq.ListFilter{Search: str("busy")}),
		page("search-large-key-before", limit, sqlq.ListFilter{Search: str("busy"), Before: id(keyRows / 2)}),
		page("search-large-key-filtered", limit, sqlq.ListFilter{Search: str("busy"), Status: str("done")}),
	})
}

// TestPauseOfAQueueWithRunnableRowsProbesThePickIndexes: pausing a queue
// that has no row of its own yet but runnable instances finds one through
// a pick index. Before, the runnable check named no partition-key
// condition, which neither pick index (partial on plain and on keyed rows)
// serves: a sequential scan of the table, past the 200k finished rows
// inserted before the queue's. (The last check, of any instance in the
// queue, scans the table; it runs only for a queue with no runnable row,
// so only executed nodes are held to the bound here.)
func TestPauseOfAQueueWithRunnableRowsProbesThePickIndexes(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 280k rows")
	}
	f := newPlanFixture(t, statsAllDone, nil)
	ctx := context.Background()
	_, err := f.pool.Exec(ctx, `INSERT INTO "`+f.schema+`".gendurable_instances (fsm, queue, step, partition_key)
		SELECT 'm', 'keyed-only', 'a', 'q' || g FROM generate_series(1, 10) g`)
	require.NoError(t, err)
	conn, rec := explainConn(t)
	for _, cacheMode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err := conn.Exec(ctx, "SET plan_cache_mode = "+cacheMode)
		require.NoError(t, err)
		for _, queue := range []string{"other", "keyed-only"} {
			t.Run(queue+"/"+cacheMode, func(t *testing.T) {
				tx, err := conn.Begin(ctx)
				require.NoError(t, err)
				rec.reset()
				known, err := f.q.SetPaused(ctx, tx, queue, true, false)
				require.NoError(t, err)
				require.True(t, known)
				require.NoError(t, tx.Rollback(ctx))
				for _, plan := range rec.all(t) {
					plan.walk(func(n planNode) {
						if n.Loops == 0 || !strings.HasPrefix(n.Relation, "gendurable_") {
							return
						}
						require.NotEqual(t, "Seq Scan", n.NodeType, "sequential scan of %s:\n%s", n.Relation, plan)
						require.LessOrEqual(t, n.touched(), 100.0, "%s touched %v rows:\n%s", n.NodeType, n.touched(), plan)
					})
				}
			})
		}
	}
}

// TestListSignalsReadsTheInstancesSignalsOnly: under statistics that say
// an instance has many signals (200,000 spread over five instances), the
// generic plan of an instance's signal list walked the primary key
// backwards from the newest signal of the table, filtering on the target:
// 200,000 rows read for an instance with three. It reads the instance's
// own now, and returns them newest first, payloads over the limit left
// out.
func TestListSignalsReadsTheInstancesSignalsOnly(t *testing.T) {
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `".gendurable_signals`
	_, err = pool.Exec(ctx, `INSERT INTO `+s+` (target_id, name, payload, consumed_at) VALUES
		(7, 'a', '1', now()), (7, 'b', '"a long one"', NULL), (7, 'c', NULL, now())`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+` (target_id, name, consumed_at)
		SELECT 100 + g % 5, 'x', now() FROM generate_series(1, 200000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+s)
	require.NoError(t, err)
	runPlanCases(t, []planCase{
		{"list-signals", 100, func(t *testing.T, tx pgx.Tx) {
			rows, err := q.ListSignals(ctx, tx, 7, 2, 5)
			require.NoError(t, err)
			require.Len(t, rows, 2)
			require.Equal(t, "c", rows[0].Name)
			require.Equal(t, "b", rows[1].Name)
			require.Nil(t, rows[1].Payload)
			require.Equal(t, int32(len(`"a long one"`)), rows[1].LeftOut)
		}},
	})
}
