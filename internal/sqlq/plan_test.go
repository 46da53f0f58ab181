package sqlq_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// planNode is the part of EXPLAIN (FORMAT JSON) the tests read.
type planNode struct {
	NodeType   string     `json:"Node Type"`
	Relation   string     `json:"Relation Name"`
	Index      string     `json:"Index Name"`
	ActualRows float64    `json:"Actual Rows"`
	Loops      float64    `json:"Actual Loops"`
	Plans      []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// explain runs EXPLAIN ANALYZE on a statement inside a rolled-back transaction.
func explain(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) planNode {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var out []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&out))
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(out, &plans))
	return plans[0].Plan
}

// seed fills the schema with a realistic table: runnable backlog in the
// worked queue and another, executing rows, and a terminal bulk.
func seed(t *testing.T, pool *pgxpool.Pool, schema string, runnable int) {
	t.Helper()
	ctx := context.Background()
	s := `"` + schema + `"`
	for _, sql := range []string{
		`INSERT INTO ` + s + `.gendurable_instances (fsm, queue, step, priority, eligible_at, partition_key)
		 SELECT 'm', 'default', 'a', (g % 3)::smallint, now() - (g % 1000) * interval '1 second',
		        CASE WHEN g % 10 = 0 THEN 'k' || (g % 5000) END
		 FROM generate_series(1, $1) g`,
		`INSERT INTO ` + s + `.gendurable_instances (fsm, queue, step) SELECT 'm', 'other', 'a' FROM generate_series(1, $1 / 4) g`,
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, status, finished_at) SELECT 'm', 'a', 'done', now() FROM generate_series(1, $1 / 2) g`,
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, status, claim_token, lease_expires_at, partition_key)
		 SELECT 'm', 'a', 'executing', g, now() + interval '1 minute', 'k' || g FROM generate_series(1, least($1, 2000)) g`,
	} {
		_, err := pool.Exec(ctx, sql, runnable)
		require.NoError(t, err)
	}
	for _, sql := range []string{`VACUUM ANALYZE ` + s + `.gendurable_instances`} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
}

func TestPickPlanIsBoundedByTheBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 350k rows")
	}
	t.Parallel()
	counter := &dbtest.Counter{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{Tracer: counter})
	const backlog = 200_000
	seed(t, pool, schema, backlog)
	q, err := sqlq.New(schema)
	require.NoError(t, err)

	const batch = 50
	plan := explain(t, pool, q.PickSQL(), "default", batch, int64(60_000_000))
	sawPickIndex := false
	plan.walk(func(n planNode) {
		require.NotEqual(t, "Seq Scan", n.NodeType, "no sequential scan of %s", n.Relation)
		if n.NodeType == "Sort" {
			require.LessOrEqual(t, n.ActualRows, float64(batch), "a sort sees at most the batch, never the backlog")
		}
		if n.Index == "gendurable_instances_pick" {
			sawPickIndex = true
			require.LessOrEqual(t, n.ActualRows*n.Loops, float64(4*batch),
				"the pick index scan stops near the batch (read %v rows of a %d backlog)", n.ActualRows, backlog)
		}
	})
	require.True(t, sawPickIndex, "the pick is driven by the pick index")
	require.Equal(t, "ModifyTable", plan.NodeType)
	require.Equal(t, float64(batch), plan.ActualRows)

	// The real call: one statement, one round trip, claims exactly the batch.
	counter.Reset()
	rows, err := q.Pick(context.Background(), pool, "default", batch, time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(1), counter.Count(), "pick is one statement")
	require.Len(t, rows, batch)
	keys := map[string]bool{}
	for _, r := range rows {
		require.NotZero(t, r.Token)
		if r.PartitionKey != nil {
			require.False(t, keys[*r.PartitionKey], "at most one row per partition key per pick")
			keys[*r.PartitionKey] = true
		}
	}

	// The reaper and a batch outcome are index-driven too.
	explain(t, pool, q.ReapSQL(), 1000, 20).walk(func(n planNode) {
		require.NotEqual(t, "Seq Scan", n.NodeType, "reap: no sequential scan of %s", n.Relation)
	})

	// The heaviest outcome: a child's Done (sweeps its inbox, decrements its
	// parent), batched with a Next that consumes a signal, with 50k signals
	// in the table.
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name)
		SELECT (g % 100000) + 1, 'n' || (g % 7) FROM generate_series(1, 50000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET parent_id = $1 WHERE id = $2`, rows[1].ID, rows[0].ID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+s+`.gendurable_signals`)
	require.NoError(t, err)
	var sig int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name) VALUES ($1, 'go') RETURNING id`, rows[2].ID).Scan(&sig))
	var b sqlq.OutcomeBatch
	b.Add(&sqlq.Outcome{ID: rows[0].ID, Token: rows[0].Token, Kind: sqlq.KindDone, Result: ptr(`{}`)})
	b.Add(&sqlq.Outcome{ID: rows[2].ID, Token: rows[2].Token, Kind: sqlq.KindNext, Step: ptr("b"), Consume: []int64{sig}, InboxDec: ptr(`{"go":1}`)})
	plan = explain(t, pool, q.ApplyOutcomesSQL(), b.Args()...)
	plan.walk(func(n planNode) {
		require.NotEqual(t, "Seq Scan", n.NodeType, "outcome: no sequential scan of %s", n.Relation)
	})
	counter.Reset()
	applied, err := q.ApplyOutcomes(ctx, pool, &b)
	require.NoError(t, err)
	require.Len(t, applied, 2)
	require.Equal(t, int64(1), counter.Count(), "a batch of outcomes is one statement")
}

func ptr(s string) *string { return &s }
