package sqlq_test

// Plan tests: every hot-path statement keeps a plan whose cost follows its
// input (the batch, the ids it was given), never the size of a status' rows —
// whatever the planner's statistics say. Each statement runs for real through
// pgx (statement cache and all) on a connection where auto_explain reports the
// executed plan with actual row counts, once as a custom plan and once as a
// forced generic plan (what a prepared statement settles on), over three
// tables whose statistics lie in different ways (docs/design.md §5).

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// planNode is the part of an EXPLAIN (FORMAT JSON) plan the tests read.
type planNode struct {
	NodeType        string     `json:"Node Type"`
	Relation        string     `json:"Relation Name"`
	Index           string     `json:"Index Name"`
	ActualRows      float64    `json:"Actual Rows"`
	Loops           float64    `json:"Actual Loops"`
	RemovedByFilter float64    `json:"Rows Removed by Filter"`
	RemovedByJoin   float64    `json:"Rows Removed by Join Filter"`
	RemovedByCheck  float64    `json:"Rows Removed by Index Recheck"`
	HeapFetches     float64    `json:"Heap Fetches"`
	IndexCond       string     `json:"Index Cond"`
	Filter          string     `json:"Filter"`
	Plans           []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// touched is how many rows a node produced or looked at and threw away, over
// all its loops.
func (n planNode) touched() float64 {
	return (n.ActualRows + n.RemovedByFilter + n.RemovedByJoin + n.RemovedByCheck) * n.Loops
}

func (n planNode) String() string {
	var b strings.Builder
	var rec func(planNode, int)
	rec = func(n planNode, depth int) {
		fmt.Fprintf(&b, "%s%s %s %s rows=%v loops=%v removed=%v/%v/%v\n", strings.Repeat("  ", depth),
			n.NodeType, n.Relation, n.Index, n.ActualRows, n.Loops, n.RemovedByFilter, n.RemovedByJoin, n.RemovedByCheck)
		for _, c := range n.Plans {
			rec(c, depth+1)
		}
	}
	rec(n, 0)
	return b.String()
}

// planRecorder collects the plans auto_explain sends as notices.
type planRecorder struct {
	mu    sync.Mutex
	plans []planNode
	err   error
}

func (r *planRecorder) onNotice(_ *pgconn.PgConn, n *pgconn.Notice) {
	i := strings.Index(n.Message, "plan:\n")
	if i < 0 {
		return
	}
	var p struct {
		Plan planNode `json:"Plan"`
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := json.Unmarshal([]byte(n.Message[i+len("plan:\n"):]), &p); err != nil {
		r.err = err
		return
	}
	r.plans = append(r.plans, p.Plan)
}

// all returns the plans of every statement that ran since the last reset
// (a call may run more than one: InsertMany's lookup of duplicates' holders,
// Prune's settings, the statements inside the pick's function), and forgets
// them.
func (r *planRecorder) all(t *testing.T) []planNode {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NoError(t, r.err)
	require.NotEmpty(t, r.plans, "auto_explain reported no plan")
	p := r.plans
	r.plans = nil
	return p
}

// reset forgets every plan seen so far.
func (r *planRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plans = nil
}

// explainConn opens a connection that reports every executed plan.
func explainConn(t *testing.T) (*pgx.Conn, *planRecorder) {
	t.Helper()
	return explainConnTo(t, dbtest.URL())
}

// explainConnTo is explainConn to the database of url.
func explainConnTo(t *testing.T, url string) (*pgx.Conn, *planRecorder) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	rec := &planRecorder{}
	cfg.OnNotice = rec.onNotice
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, s := range []string{
		"LOAD 'auto_explain'",
		"SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_analyze = on",
		"SET auto_explain.log_timing = off",
		"SET auto_explain.log_format = json",
		"SET auto_explain.log_level = notice",
		// Statements run inside functions (the pick) are plans too.
		"SET auto_explain.log_nested_statements = on",
		"SET client_min_messages = notice",
	} {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	return conn, rec
}

// statsMode is how the planner's statistics misdescribe the table.
type statsMode string

const (
	// statsAllDone: ANALYZE ran when every row was done (what autovacuum
	// leaves on a table in use), then the working set arrived.
	statsAllDone statsMode = "analyzed-all-done"
	// statsEmpty: ANALYZE ran on the empty table (a fresh install, or a
	// benchmark's TRUNCATE + VACUUM ANALYZE), then everything arrived.
	statsEmpty statsMode = "analyzed-empty"
	// statsNone: never analyzed.
	statsNone statsMode = "never-analyzed"
)

var statsModes = []statsMode{statsAllDone, statsEmpty, statsNone}

// fixture sizes: the executing and runnable sets are larger than any bound a
// statement is held to, so a plan that reads them whole fails.
const (
	fxDone      = 200_000
	fxRunnable  = 20_000
	fxExecuting = 5_000
	fxExpired   = 40
	fxAwaiting  = 2_000
	fxDue       = 60
	fxSignals   = 50_000
	fxParents   = 100
)

// planFixture is a schema whose tables hold a year-old installation's shape,
// with statistics per mode and autovacuum off so they stay that way.
type planFixture struct {
	pool   *pgxpool.Pool
	schema string
	q      *sqlq.Queries
	mode   statsMode
}

func newPlanFixture(t *testing.T, mode statsMode, tracer pgx.QueryTracer) *planFixture {
	t.Helper()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Tracer: tracer})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	exec(`ALTER TABLE ` + s + `.gendurable_instances SET (autovacuum_enabled = false)`)
	exec(`ALTER TABLE ` + s + `.gendurable_signals SET (autovacuum_enabled = false)`)
	analyze := func() {
		exec(`ANALYZE ` + s + `.gendurable_instances`)
		exec(`ANALYZE ` + s + `.gendurable_signals`)
	}
	if mode == statsEmpty {
		analyze()
	}
	// The finished bulk, a third of it past a 1 h retention; half of it
	// fanned out once (prune probes their children).
	exec(`INSERT INTO `+s+`.gendurable_instances (fsm, step, status, finished_at, inserted_at, fanout)
		SELECT 'm', 'a', 'done', now() - (g % 3) * interval '1 hour' - interval '1 minute', now() - interval '1 day', g % 2
		FROM generate_series(1, $1::int) g`, fxDone)
	if mode == statsAllDone {
		analyze()
	}
	// Parents waiting on children, and the working set.
	exec(`INSERT INTO `+s+`.gendurable_instances (fsm, step, status, children_pending, children_total, fanout)
		SELECT 'm', 'p', 'awaiting_children', 1000, 1000, 1 FROM generate_series(1, $1::int)`, fxParents)
	exec(`INSERT INTO `+s+`.gendurable_instances (fsm, queue, step, priority, eligible_at, partition_key)
		SELECT 'm', 'default', 'a', (g % 3)::smallint, now() - (g % 1000) * interval '1 second',
		       CASE WHEN g % 10 = 0 THEN 'k' || (g % 500) END
		FROM generate_series(1, $1::int) g`, fxRunnable)
	exec(`INSERT INTO `+s+`.gendurable_instances (fsm, queue, step) SELECT 'm', 'other', 'a' FROM generate_series(1, $1::int / 4)`, fxRunnable)
	exec(`INSERT INTO `+s+`.gendurable_instances (fsm, step, status, claim_token, lease_expires_at, partition_key,
		                                            parent_id, parent_fanout)
		SELECT 'm', 'a', 'executing', 1000000000 + g,
		       CASE WHEN g <= $2 THEN now() - interval '1 second' ELSE now() + interval '10 minutes' END,
		       CASE WHEN g % 10 = 0 THEN 'x' || g END,
		       CASE WHEN g % 5 = 0 THEN $3::bigint + g % $4 END, 1
		FROM generate_series(1, $1::int) g`, fxExecuting, fxExpired, fxDone+1, fxParents)
	// The first executing rows each hold an unconsumed signal.
	exec(`WITH t AS (SELECT id FROM ` + s + `.gendurable_instances WHERE status = 'executing' ORDER BY id LIMIT 1000),
		sig AS (INSERT INTO ` + s + `.gendurable_signals (target_id, name) SELECT id, 'go' FROM t)
		UPDATE ` + s + `.gendurable_instances SET inbox = '{"go": 1}' WHERE id IN (SELECT id FROM t)`)
	exec(`INSERT INTO `+s+`.gendurable_instances (fsm, step, status, awaits, await_deadline)
		SELECT 'm', 'w', 'awaiting_signal', '{go}',
		       CASE WHEN g <= $2 THEN now() - interval '1 second' ELSE now() + g * interval '1 second' END
		FROM generate_series(1, $1::int) g`, fxAwaiting, fxDue)
	exec(`INSERT INTO `+s+`.gendurable_signals (target_id, name, consumed_at)
		SELECT (g * 7919) % $2::bigint + 1, 'n' || (g % 7), CASE WHEN g % 2 = 0 THEN now() END
		FROM generate_series(1, $1::int) g`, fxSignals, fxDone+fxRunnable)
	return &planFixture{pool: pool, schema: schema, q: q, mode: mode}
}

// executing returns n executing rows with a live lease: ids and tokens.
func (f *planFixture) executing(t *testing.T, n int) (ids, tokens []int64) {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT id, claim_token FROM "`+f.schema+`".gendurable_instances
		WHERE status = 'executing' AND lease_expires_at > now() ORDER BY id LIMIT $1`, n)
	require.NoError(t, err)
	for rows.Next() {
		var id, tok int64
		require.NoError(t, rows.Scan(&id, &tok))
		ids, tokens = append(ids, id), append(tokens, tok)
	}
	require.NoError(t, rows.Err())
	require.Len(t, ids, n)
	return ids, tokens
}

// Sizes of what seedShapes adds for the shapes of claim and outcome the bulk
// of the fixture does not have.
const (
	shInboxRows    = 50  // runnable rows of queue "inbox" with unconsumed signals
	shInboxLive    = 3   // unconsumed signals of each
	shInboxOld     = 30  // consumed signals of each (kept for dedup)
	shChainOld     = 8   // consumed signals of each executing row the outcomes use
	shParents      = 20  // runnable parents of queue "fanin", at their 4th fan-out
	shFanouts      = 4   // fan-outs of each parent
	shKidsOld      = 200 // children of each earlier fan-out
	shKidsLatest   = 5   // children of the latest fan-out
	shUniqueHeld   = 250 // live rows holding a unique key
	shUniqueNew    = 200 // new keys in the unique insert batch
	shUniqueRepeat = 50  // rows of that batch repeating a new key of the same batch
	liveScope      = 15  // unique scope: runnable, executing, awaiting_signal, awaiting_children
)

// seedShapes adds, after the statistics were taken, what the claims and
// outcomes of the other shapes read: the executing rows in ids get a second
// unconsumed signal ("more") and a history of consumed ones; queue "inbox"
// holds runnable rows with unconsumed and consumed signals; queue "fanin"
// holds parents whose earlier fan-outs have many children each and whose
// latest has a few; queue "held" holds rows keeping unique keys "held-N".
// It returns one parent of queue "fanin".
func (f *planFixture) seedShapes(t *testing.T, ids []int64) (parent int64) {
	t.Helper()
	ctx := context.Background()
	s := `"` + f.schema + `"`
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := f.pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	exec(`WITH t AS (SELECT unnest($1::bigint[]) AS id),
		more AS (INSERT INTO `+s+`.gendurable_signals (target_id, name) SELECT id, 'more' FROM t),
		old AS (INSERT INTO `+s+`.gendurable_signals (target_id, name, dedup_key, consumed_at)
		        SELECT id, 'go', 'h' || g, now() - interval '1 minute' FROM t, generate_series(1, $2::int) g)
		UPDATE `+s+`.gendurable_instances SET inbox = inbox || '{"more": 1}' WHERE id IN (SELECT id FROM t)`,
		ids, shChainOld)
	exec(`WITH r AS (
		  INSERT INTO `+s+`.gendurable_instances (fsm, queue, step, inbox)
		  SELECT 'm', 'inbox', 'w', jsonb_build_object('go', $2::int) FROM generate_series(1, $1::int)
		  RETURNING id
		), live AS (
		  INSERT INTO `+s+`.gendurable_signals (target_id, name) SELECT id, 'go' FROM r, generate_series(1, $2::int)
		)
		INSERT INTO `+s+`.gendurable_signals (target_id, name, dedup_key, consumed_at)
		SELECT id, 'go', 'h' || g, now() - interval '1 minute' FROM r, generate_series(1, $3::int) g`,
		shInboxRows, shInboxLive, shInboxOld)
	// Children in the order their fan-outs inserted them: generation by
	// generation, so their ids interleave the parents' as in real use.
	exec(`WITH p AS (
		  INSERT INTO `+s+`.gendurable_instances (fsm, queue, step, fanout, children_total)
		  SELECT 'm', 'fanin', 'join', $2::int, $4::int FROM generate_series(1, $1::int)
		  RETURNING id
		)
		INSERT INTO `+s+`.gendurable_instances (fsm, step, status, result, finished_at, parent_id, parent_fanout)
		SELECT 'c', 'a', 'done', '{"ok": true}', now(), p.id, gen
		FROM p, generate_series(1, $2::int) gen, generate_series(1, CASE WHEN gen = $2 THEN $4::int ELSE $3::int END) k
		ORDER BY gen, k, p.id`, shParents, shFanouts, shKidsOld, shKidsLatest)
	held := make([]sqlq.NewInstance, shUniqueHeld)
	for i := range held {
		held[i] = uniqueRow("held", fmt.Sprintf("held-%d", i))
	}
	got, err := f.q.InsertMany(ctx, f.pool, held)
	require.NoError(t, err)
	for _, r := range got {
		require.False(t, r.Duplicate)
	}
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT id FROM `+s+`.gendurable_instances
		WHERE queue = 'fanin' ORDER BY id DESC LIMIT 1`).Scan(&parent))
	return parent
}

// uniqueRow is a row to insert into queue with a unique key live while the
// row is.
func uniqueRow(queue, key string) sqlq.NewInstance {
	return sqlq.NewInstance{FSM: "u", Version: 1, Queue: queue, Step: "a", State: `{}`, MaxAttempts: 3,
		UniqueKey: []byte(key), ScopeMask: liveScope}
}

// planCase is one statement run under one plan mode.
type planCase struct {
	name  string
	bound float64 // most rows any scan of our tables may touch
	run   func(t *testing.T, tx pgx.Tx)
}

// checkPlan fails on a sequential scan of our tables, or on a scan or join
// that touches more rows than the statement's input justifies.
func checkPlan(t *testing.T, plan planNode, bound float64) {
	t.Helper()
	most := 0.0
	defer func() { t.Logf("most rows one node touched: %v (bound %v)", most, bound) }()
	plan.walk(func(n planNode) {
		most = max(most, n.touched(), n.RemovedByJoin*n.Loops)
		ours := strings.HasPrefix(n.Relation, "gendurable_") || strings.HasPrefix(n.Index, "gendurable_")
		if ours {
			require.NotEqual(t, "Seq Scan", n.NodeType, "sequential scan of %s:\n%s", n.Relation, plan)
			require.LessOrEqual(t, n.touched(), bound, "%s %s%s touched %v rows (bound %v):\n%s",
				n.NodeType, n.Relation, n.Index, n.touched(), bound, plan)
		}
		if n.RemovedByJoin > 0 {
			require.LessOrEqual(t, n.RemovedByJoin*n.Loops, bound, "join filter discarded %v rows:\n%s",
				n.RemovedByJoin*n.Loops, plan)
		}
	})
}

// runPlanCases runs each case in a rolled-back transaction on a plan-reporting
// connection, as a custom and as a generic plan, and checks the plan of every
// statement the case ran. The plans are read after the rollback: the executor
// of a plain SELECT's unnamed portal ends (and auto_explain reports it) only
// when the portal is dropped.
func runPlanCases(t *testing.T, cases []planCase) {
	t.Helper()
	runPlanCasesOn(t, dbtest.URL(), cases)
}

// runPlanCasesOn is runPlanCases on the database of url.
func runPlanCasesOn(t *testing.T, url string, cases []planCase) {
	t.Helper()
	ctx := context.Background()
	conn, rec := explainConnTo(t, url)
	for _, cacheMode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err := conn.Exec(ctx, "SET plan_cache_mode = "+cacheMode)
		require.NoError(t, err)
		for _, c := range cases {
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			rec.reset()
			c.run(t, tx)
			require.NoError(t, tx.Rollback(ctx))
			plans := rec.all(t)
			t.Run(c.name+"/"+cacheMode, func(t *testing.T) {
				for _, plan := range plans {
					checkPlan(t, plan, c.bound)
				}
			})
		}
	}
}

// TestHotPathPlansUnderAdversarialStatistics is the plan-stability contract
// of docs/design.md §5: each hot-path statement, under each kind of lying
// statistics, as custom and generic plan, touches rows in proportion to its
// input only.
func TestHotPathPlansUnderAdversarialStatistics(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 280k rows per statistics mode")
	}
	t.Parallel()
	for _, mode := range statsModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			f := newPlanFixture(t, mode, nil)
			ctx := context.Background()
			const batch = 500
			ids, tokens := f.executing(t, batch)
			parent := f.seedShapes(t, ids)
			res := `{"ok":true}`
			outcomes := func(kind sqlq.Kind) *sqlq.OutcomeBatch {
				b := &sqlq.OutcomeBatch{Lease: time.Minute, LockWait: time.Second}
				for i := range ids {
					b.Add(&sqlq.Outcome{ID: ids[i], Token: tokens[i], Kind: kind, Result: &res, Step: ptr("b")})
				}
				return b
			}
			signalOf := map[int64]int64{}
			rows, err := f.pool.Query(ctx, `SELECT target_id, id FROM "`+f.schema+`".gendurable_signals
				WHERE target_id = ANY ($1) AND consumed_at IS NULL AND name = 'go'`, ids)
			require.NoError(t, err)
			for rows.Next() {
				var target, id int64
				require.NoError(t, rows.Scan(&target, &id))
				signalOf[target] = id
			}
			require.NoError(t, rows.Err())
			require.Len(t, signalOf, batch)
			consuming := &sqlq.OutcomeBatch{Lease: time.Minute, LockWait: time.Second}
			fanning := &sqlq.OutcomeBatch{Lease: time.Minute, LockWait: time.Second}
			for i := range ids {
				consuming.Add(&sqlq.Outcome{ID: ids[i], Token: tokens[i], Kind: sqlq.KindNext, Step: ptr("b"),
					Consume: []int64{signalOf[ids[i]]}, InboxDec: ptr(`{"go":1}`)})
				kid := sqlq.NewInstance{FSM: "c", Version: 1, Queue: "default", Step: "a", State: `{}`, MaxAttempts: 3}
				fanning.Add(&sqlq.Outcome{ID: ids[i], Token: tokens[i], Kind: sqlq.KindChildren, Step: ptr("join"),
					Children: []sqlq.NewInstance{kid, kid}})
			}
			// A batch of one shape per outcome, cycling through shapes.
			mixed := func(shapes ...func(i int) sqlq.Outcome) *sqlq.OutcomeBatch {
				b := &sqlq.OutcomeBatch{Lease: time.Minute, LockWait: time.Second}
				for i := range ids {
					o := shapes[i%len(shapes)](i)
					o.ID, o.Token = ids[i], tokens[i]
					b.Add(&o)
				}
				return b
			}
			errKind, errText := "error", "it broke"
			minute := time.Minute
			kid := sqlq.NewInstance{FSM: "c", Version: 1, Queue: "default", Step: "a", State: `{}`, MaxAttempts: 3}
			chain := func(int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindNext, Step: ptr("b"), Continue: true}
			}
			chainConsuming := func(i int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindNext, Step: ptr("b"), Continue: true,
					Consume: []int64{signalOf[ids[i]]}, InboxDec: ptr(`{"go":1}`)}
			}
			// Awaits: "go" is in the inbox, so an await of it without
			// InboxDec wakes at once; one that has seen it parks.
			awaitNow := func(int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindAwait, Step: ptr("w"), Awaits: ptr(`["go"]`)}
			}
			awaitSeen := func(int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindAwait, Step: ptr("w"), Awaits: ptr(`["go"]`), Timeout: &minute,
					InboxDec: ptr(`{"go":1}`)}
			}
			awaitOther := func(int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindAwait, Step: ptr("w"), Awaits: ptr(`["other"]`), Timeout: &minute}
			}
			replay := func(int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindReplay, Delay: time.Second, AttemptInc: 1, ErrKind: &errKind, Err: &errText}
			}
			stop := func(int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindStop, ErrKind: &errKind, Err: &errText}
			}
			done := func(int) sqlq.Outcome { return sqlq.Outcome{Kind: sqlq.KindDone, Result: &res} }
			fanOutConsuming := func(i int) sqlq.Outcome {
				return sqlq.Outcome{Kind: sqlq.KindChildren, Step: ptr("join"), Children: []sqlq.NewInstance{kid, kid},
					Consume: []int64{signalOf[ids[i]]}, InboxDec: ptr(`{"go":1}`)}
			}
			// statuses runs a batch and returns how many outcomes left each status.
			statuses := func(t *testing.T, tx pgx.Tx, b *sqlq.OutcomeBatch) map[string]int {
				t.Helper()
				got, err := f.q.ApplyOutcomes(ctx, tx, b)
				require.NoError(t, err)
				require.Len(t, got, batch)
				n := map[string]int{}
				for _, a := range got {
					n[a.Status]++
				}
				return n
			}
			var sigTarget, child int64
			require.NoError(t, f.pool.QueryRow(ctx, `SELECT id FROM "`+f.schema+`".gendurable_instances
				WHERE status = 'awaiting_signal' ORDER BY id DESC LIMIT 1`).Scan(&sigTarget))
			require.NoError(t, f.pool.QueryRow(ctx, `SELECT id FROM "`+f.schema+`".gendurable_instances
				WHERE status = 'executing' AND parent_id IS NOT NULL ORDER BY id DESC LIMIT 1`).Scan(&child))
			var runnableID int64
			require.NoError(t, f.pool.QueryRow(ctx, `SELECT id FROM "`+f.schema+`".gendurable_instances
				WHERE status = 'runnable' AND queue = 'default' ORDER BY id DESC LIMIT 1`).Scan(&runnableID))
			plainRows := make([]sqlq.NewInstance, batch)
			uniqueRows := make([]sqlq.NewInstance, batch)
			for i := range plainRows {
				plainRows[i] = sqlq.NewInstance{FSM: "m", Version: 1, Queue: "ins", Step: "a", State: `{"i":1}`, MaxAttempts: 3}
				switch {
				case i < shUniqueHeld: // held by a live row
					uniqueRows[i] = uniqueRow("ins", fmt.Sprintf("held-%d", i))
				case i < shUniqueHeld+shUniqueNew: // new
					uniqueRows[i] = uniqueRow("ins", fmt.Sprintf("new-%d", i))
				default: // a new key of this batch again
					uniqueRows[i] = uniqueRow("ins", fmt.Sprintf("new-%d", i-shUniqueRepeat))
				}
			}
			require.Equal(t, batch, shUniqueHeld+shUniqueNew+shUniqueRepeat)
			// A floor with 100 runnable plain rows of queue default below it.
			var floor time.Time
			require.NoError(t, f.pool.QueryRow(ctx, `SELECT eligible_at FROM "`+f.schema+`".gendurable_instances
				WHERE status = 'runnable' AND queue = 'default' AND partition_key IS NULL
				ORDER BY eligible_at LIMIT 1 OFFSET 100`).Scan(&floor))
			cases := []planCase{
				{"pick", 4 * 50, func(t *testing.T, tx pgx.Tx) {
					picked, err := f.q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: 50, Lease: time.Minute})
					got := picked.Claimed
					require.NoError(t, err)
					require.Len(t, got, 50)
				}},
				// The pick under a floor (migration 011): ranges of
				// priorities, each from the floor or with it as an index
				// condition.
				{"pick-floor", 4 * 50, func(t *testing.T, tx pgx.Tx) {
					picked, err := f.q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: 50, Lease: time.Minute,
						Floor: &floor, Prios: []int16{0, 2}})
					require.NoError(t, err)
					require.Len(t, picked.Claimed, 50)
				}},
				{"pick-floor-unlisted", 4 * 50, func(t *testing.T, tx pgx.Tx) {
					picked, err := f.q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: 50, Lease: time.Minute,
						Floor: &floor, Prios: []int16{7}})
					require.NoError(t, err)
					require.Len(t, picked.Claimed, 50)
				}},
				// The floor check reads the rows below the floor: here 100.
				{"pick-floor-check", 4 * 50, func(t *testing.T, tx pgx.Tx) {
					at, err := f.q.PickFloorCheck(ctx, tx, "default", floor)
					require.NoError(t, err)
					require.NotNil(t, at)
				}},
				{"heartbeat", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					held, err := f.q.Heartbeat(ctx, tx, ids, tokens, make([]sqlq.ClaimState, len(ids)), time.Minute, false)
					require.NoError(t, err)
					require.Len(t, held, batch)
				}},
				{"release", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.Release(ctx, tx, ids, tokens, 0)
					require.NoError(t, err)
					require.Len(t, got, batch)
				}},
				{"outcome-done", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.ApplyOutcomes(ctx, tx, outcomes(sqlq.KindDone))
					require.NoError(t, err)
					require.Len(t, got, batch)
				}},
				{"outcome-next", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.ApplyOutcomes(ctx, tx, outcomes(sqlq.KindNext))
					require.NoError(t, err)
					require.Len(t, got, batch)
				}},
				{"outcome-next-consuming", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.ApplyOutcomes(ctx, tx, consuming)
					require.NoError(t, err)
					require.Len(t, got, batch)
				}},
				{"outcome-children", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.ApplyOutcomes(ctx, tx, fanning)
					require.NoError(t, err)
					require.Len(t, got, batch)
					for _, a := range got {
						require.Equal(t, "awaiting_children", a.Status)
					}
				}},
				// A claim of rows with unconsumed signals returns them
				// (and only them: the consumed ones are kept for dedup).
				{"pick-inbox", 4 * shInboxRows * (1 + shInboxLive), func(t *testing.T, tx pgx.Tx) {
					picked, err := f.q.Pick(ctx, tx, "inbox", sqlq.PickOpts{Limit: shInboxRows, Lease: time.Minute})
					got := picked.Claimed
					require.NoError(t, err)
					require.Len(t, got, shInboxRows)
					for _, c := range got {
						require.Len(t, c.Inbox, shInboxLive)
					}
				}},
				// A claim after a fan-out returns the latest fan-out's
				// children and reads none of the earlier ones.
				{"pick-after-fanouts", 4 * shParents * (1 + shKidsLatest), func(t *testing.T, tx pgx.Tx) {
					picked, err := f.q.Pick(ctx, tx, "fanin", sqlq.PickOpts{Limit: shParents, Lease: time.Minute})
					got := picked.Claimed
					require.NoError(t, err)
					require.Len(t, got, shParents)
					for _, c := range got {
						require.Len(t, c.ChildRows, shKidsLatest)
					}
				}},
				// A claim that waited for a slot reads its inbox and its
				// latest fan-out's children again (ClaimInput), by its id.
				{"claim-input-after-fanouts", 2 * 4 * shParents * (1 + shKidsLatest), func(t *testing.T, tx pgx.Tx) {
					picked, err := f.q.Pick(ctx, tx, "fanin", sqlq.PickOpts{Limit: shParents, Lease: time.Minute})
					require.NoError(t, err)
					require.Len(t, picked.Claimed, shParents)
					for _, c := range picked.Claimed {
						_, kids, held, err := f.q.ClaimInput(ctx, tx, c.ID, c.Token, true, true)
						require.NoError(t, err)
						require.True(t, held)
						require.Len(t, kids, shKidsLatest)
					}
				}},
				// A claimed parent that finds a child live gives its claim up
				// (Reawait); a claim of an unknown machine version goes back
				// (ReleaseUnknown): each by the row's id.
				{"reawait", 2 * 4 * shParents * (1 + shKidsLatest), func(t *testing.T, tx pgx.Tx) {
					picked, err := f.q.Pick(ctx, tx, "fanin", sqlq.PickOpts{Limit: shParents, Lease: time.Minute})
					require.NoError(t, err)
					require.Len(t, picked.Claimed, shParents)
					for _, c := range picked.Claimed {
						status, err := f.q.Reawait(ctx, tx, c.ID, c.Token)
						require.NoError(t, err)
						require.NotEmpty(t, status)
					}
				}},
				{"release-unknown", 4 * 50, func(t *testing.T, tx pgx.Tx) {
					for i := range 20 {
						require.NoError(t, f.q.ReleaseUnknown(ctx, tx, ids[i], tokens[i], time.Second, "unknown"))
					}
				}},
				{"outcome-chain", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.ApplyOutcomes(ctx, tx, mixed(chain))
					require.NoError(t, err)
					require.Len(t, got, batch)
					for _, a := range got {
						require.Equal(t, "executing", a.Status)
						require.NotNil(t, a.Token)
						require.Len(t, a.Inbox, 2, "go and more")
					}
				}},
				{"outcome-chain-consuming", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.ApplyOutcomes(ctx, tx, mixed(chainConsuming))
					require.NoError(t, err)
					require.Len(t, got, batch)
					for _, a := range got {
						require.Equal(t, "executing", a.Status)
						require.Len(t, a.Inbox, 1, "more")
						require.Equal(t, "more", a.Inbox[0].Name)
					}
				}},
				{"outcome-await", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					n := statuses(t, tx, mixed(awaitNow, awaitSeen, awaitOther, awaitSeen))
					require.Equal(t, map[string]int{"runnable": batch / 4, "awaiting_signal": 3 * batch / 4}, n)
				}},
				{"outcome-replay", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					require.Equal(t, map[string]int{"runnable": batch}, statuses(t, tx, mixed(replay)))
				}},
				{"outcome-stop", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					require.Equal(t, map[string]int{"failed": batch}, statuses(t, tx, mixed(stop)))
				}},
				// Keyed Dones that hand their slots on (docs/design.md §6):
				// 50 keys of 10 freed rows each, limit 10, each key with 20
				// runnable rows: 500 successors, each found by its key's
				// pick-index range and claimed by primary key. (Queue and
				// keys of their own: the versions this leaves behind must
				// not lie in the way of the other cases' keys.)
				{"outcome-handoff", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					_, err := tx.Exec(ctx, `INSERT INTO "`+f.schema+`".gendurable_instances (fsm, queue, step, partition_key)
						SELECT 'm', 'handoff', 'a', 'h' || (g % 50) FROM generate_series(1, 1000) g`)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, `SET LOCAL enable_bitmapscan = off`)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, `UPDATE "`+f.schema+`".gendurable_instances
						SET queue = 'handoff', partition_key = 'h' || ((array_position($1::bigint[], id) - 1) % 50)
						WHERE id = ANY ($1)`, ids)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, `SET LOCAL enable_bitmapscan = on`)
					require.NoError(t, err)
					b := &sqlq.OutcomeBatch{Lease: time.Minute, LockWait: time.Second}
					for i := range ids {
						b.Add(&sqlq.Outcome{ID: ids[i], Token: tokens[i], Kind: sqlq.KindDone, Result: &res, Handoff: 10})
					}
					got, err := f.q.ApplyOutcomes(ctx, tx, b)
					require.NoError(t, err)
					require.Len(t, got, batch)
					succ := map[int64]bool{}
					for _, a := range got {
						require.Equal(t, "done", a.Status)
						require.NotNil(t, a.Successor)
						require.False(t, succ[a.Successor.ID])
						succ[a.Successor.ID] = true
					}
				}},
				{"outcome-mixed", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					n := statuses(t, tx, mixed(fanOutConsuming, done, chainConsuming, stop, awaitSeen, replay))
					require.Equal(t, map[string]int{"awaiting_children": 84, "done": 84, "executing": 83,
						"failed": 83, "awaiting_signal": 83, "runnable": 83}, n)
				}},
				{"insert-plain", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.InsertMany(ctx, tx, plainRows)
					require.NoError(t, err)
					require.Len(t, got, batch)
					for _, r := range got {
						require.False(t, r.Duplicate)
					}
				}},
				// Keys held by live rows and keys repeated in the batch are
				// skipped by ON CONFLICT, then their holders looked up.
				{"insert-unique", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.InsertMany(ctx, tx, uniqueRows)
					require.NoError(t, err)
					require.Len(t, got, batch)
					dups := 0
					for _, r := range got {
						require.NotZero(t, r.ID)
						if r.Duplicate {
							dups++
						}
					}
					require.Equal(t, shUniqueHeld+shUniqueRepeat, dups)
				}},
				// Describe lists the children of every fan-out, by id, up to
				// its limit: a parent_id-only lookup of the parent index.
				{"describe-children", 4 * 500, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.ListAllChildren(ctx, tx, parent, 500, 4096)
					require.NoError(t, err)
					require.Len(t, got, 500)
				}},
				// CancelTree reads a level's children: a parent_id-only
				// lookup of the parent index per parent, every fan-out's.
				{"tree-children", 4 * 500, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.TreeChildren(ctx, tx, []int64{parent})
					require.NoError(t, err)
					require.Len(t, got, (shFanouts-1)*shKidsOld+shKidsLatest)
					for _, c := range got {
						require.False(t, c.Live)
					}
				}},
				// Cancel of a child joins its parent (by primary key).
				{"cancel-child", 100, func(t *testing.T, tx pgx.Tx) {
					_, ok, err := f.q.Cancel(ctx, tx, child, "test")
					require.NoError(t, err)
					require.True(t, ok)
				}},
				// Bulk retry and cancel of a batch by id: index lookups of
				// the batch and of its rows' parents (docs/design.md §5).
				{"retry-many", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					// The setup's own plan is checked too: keep it to the
					// primary key.
					_, err := tx.Exec(ctx, `SET LOCAL enable_bitmapscan = off`)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, `UPDATE "`+f.schema+`".gendurable_instances
						SET status = 'failed', claim_token = NULL, lease_expires_at = NULL, finished_at = now() WHERE id = ANY ($1)`, ids)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, `SET LOCAL enable_bitmapscan = on`)
					require.NoError(t, err)
					got, err := f.q.RetryMany(ctx, tx, ids)
					require.NoError(t, err)
					require.Len(t, got, batch)
				}},
				{"cancel-many", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.CancelMany(ctx, tx, ids, "test")
					require.NoError(t, err)
					require.Len(t, got, batch)
				}},
				// The committer's look for rows locked elsewhere: a
				// primary-key probe per outcome and per parent.
				{"locked-outcomes", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					terminal := make([]bool, len(ids))
					for i := range terminal {
						terminal[i] = true
					}
					got, err := f.q.LockedOutcomes(ctx, tx, ids, tokens, terminal)
					require.NoError(t, err)
					require.Empty(t, got)
				}},
				{"existing", 4*batch + 100, func(t *testing.T, tx pgx.Tx) {
					got, err := f.q.Existing(ctx, tx, ids)
					require.NoError(t, err)
					require.Len(t, got, batch)
				}},
				{"run-now", 100, func(t *testing.T, tx pgx.Tx) {
					_, err := tx.Exec(ctx, `UPDATE "`+f.schema+`".gendurable_instances
						SET eligible_at = now() + interval '1 hour' WHERE id = $1`, runnableID)
					require.NoError(t, err)
					_, queue, _, err := f.q.RunNow(ctx, tx, runnableID)
					require.NoError(t, err)
					require.NotNil(t, queue)
				}},
				{"reap", 4*fxExpired + 100, func(t *testing.T, tx pgx.Tx) {
					res, err := f.q.Reap(ctx, tx, 1000, nil, time.Hour) // bounded, as the reaper calls it
					require.NoError(t, err)
					require.Len(t, res.Reaped, fxExpired)
					// The next expiry: the first entry of the lease index
					// past the fixture's expired ones.
					require.NotNil(t, res.Next)
					require.Positive(t, *res.Next)
				}},
				{"signal", 100, func(t *testing.T, tx pgx.Tx) {
					r, err := f.q.Signal(ctx, tx, sigTarget, "go", nil, nil)
					require.NoError(t, err)
					require.True(t, r.Woke)
				}},
				{"wake-timed-out", 4*fxDue + 100, func(t *testing.T, tx pgx.Tx) {
					res, err := f.q.WakeTimedOut(ctx, tx, 1000, nil, 0, time.Hour) // bounded, as the sweeper calls it; a full sweep
					require.NoError(t, err)
					require.Equal(t, fxDue, res.N)
					require.NotNil(t, res.Next)
				}},
				{"prune", 4*1000 + 100, func(t *testing.T, tx pgx.Tx) {
					// Two batches of a sweep: from the oldest, then from where the first ended.
					n, next, err := f.q.Prune(ctx, tx, time.Hour, 500, nil)
					require.NoError(t, err)
					require.Equal(t, int64(500), n)
					require.NotNil(t, next, "a full batch says where the next starts")
					n, _, err = f.q.Prune(ctx, tx, time.Hour, 500, next)
					require.NoError(t, err)
					require.Equal(t, int64(500), n)
				}},
			}
			runPlanCases(t, cases)
		})
	}
}

// TestPickPlanIsBoundedByTheBatch: one pick over a 200k backlog is one
// statement that claims exactly the batch, at most one row per partition key.
func TestPickPlanIsBoundedByTheBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 280k rows")
	}
	t.Parallel()
	counter := &dbtest.Counter{}
	f := newPlanFixture(t, statsNone, counter)
	ctx := context.Background()
	const batch = 50
	counter.Reset()
	picked, err := f.q.Pick(ctx, f.pool, "default", sqlq.PickOpts{Limit: batch, Lease: time.Minute})
	rows := picked.Claimed
	require.Equal(t, int64(1), counter.Count(), "pick is one statement")
	require.NoError(t, err)
	require.Len(t, rows, batch)
	keys := map[string]bool{}
	for _, r := range rows {
		require.NotZero(t, r.Token)
		if r.PartitionKey != nil {
			require.False(t, keys[*r.PartitionKey], "at most one row per partition key per pick")
			keys[*r.PartitionKey] = true
		}
	}
}

func ptr(s string) *string { return &s }

// TestKeyedPickIsBoundedByTheBatch (docs/design.md §6): with one hot key
// holding 200k runnable rows and its slot taken, and 10k other keys with a
// row each, a pick claims a batch of other keys' rows without reading the
// hot key's backlog — every plan of the pick, the statements inside its
// function included, touches O(batch) rows — and the next pick, from the
// returned cursor, goes on with the keys below them (round robin, down the
// keys since version 21). A key's policy limit lets that many of its rows
// run, counting the live holder. The hot key is "zhot": above the others,
// the first walk begins at its tail.
func TestKeyedPickIsBoundedByTheBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 210k rows")
	}
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	for _, sql := range []string{
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, partition_key, eligible_at)
		 SELECT 'm', 'a', 'zhot', now() - interval '1 hour' + g * interval '1 millisecond' FROM generate_series(1, 200000) g`,
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, partition_key)
		 SELECT 'm', 'a', 'key-' || lpad(g::text, 5, '0') FROM generate_series(1, 10000) g`,
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, partition_key, status, claim_token, lease_expires_at)
		 VALUES ('m', 'a', 'zhot', 'executing', 1, now() + interval '1 hour')`,
		`ANALYZE ` + s + `.gendurable_instances`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	conn, rec := explainConn(t)
	_, err = conn.Exec(ctx, "SET search_path = "+s)
	require.NoError(t, err)
	const batch = 50
	var last sqlq.PickResult
	pick := func(o sqlq.PickOpts) ([]sqlq.Claimed, string) {
		t.Helper()
		rec.reset()
		res, err := q.Pick(ctx, conn, "default", o)
		require.NoError(t, err)
		for _, plan := range rec.all(t) {
			checkPlan(t, plan, 4*batch+16)
		}
		last = res
		return res.Claimed, res.Cursor
	}
	keys := func(got []sqlq.Claimed) []string {
		var ks []string
		for _, c := range got {
			ks = append(ks, *c.PartitionKey)
		}
		sort.Strings(ks)
		return ks
	}
	walked := func(from, to int) []string { // key-<from> … key-<to>, ascending
		var ks []string
		for i := from; i <= to; i++ {
			ks = append(ks, fmt.Sprintf("key-%05d", i))
		}
		return ks
	}
	// The walk goes down the keys from the top (version 21).
	got, cursor := pick(sqlq.PickOpts{Limit: batch, Lease: time.Minute})
	require.Equal(t, walked(10000-batch+1, 10000), keys(got), "the top keys, one row each, none of the full hot key")
	require.Equal(t, "key-09951", cursor)
	got, cursor = pick(sqlq.PickOpts{Limit: batch, Lease: time.Minute, Cursor: cursor})
	require.Equal(t, walked(10000-2*batch+1, 10000-batch), keys(got), "the next pick goes on below the cursor")
	require.Equal(t, "key-09901", cursor)

	// A policy of 3 for "zhot": two more of its rows may run beside the
	// holder — but by fair share, not while the keys walked with it hold
	// nothing: they get the batch. Hot, holding more than any of them, has
	// had its turn: the cursor moves past it (version 12 kept it before
	// hot, so the same keys after hot got every batch). The walk from "zhou"
	// meets zhot first, then the keys below it.
	policies := []sqlq.KeyPolicy{{Prefix: "z", Limit: 2}, {Prefix: "zh", Limit: 3}}
	got, cursor = pick(sqlq.PickOpts{Limit: batch, Lease: time.Minute, Cursor: "zhou", Policies: policies})
	require.Len(t, got, batch)
	for _, c := range got {
		require.NotEqual(t, "zhot", *c.PartitionKey, "hot holds a slot, the keys after it none")
	}
	require.True(t, strings.HasPrefix(cursor, "key-"),
		"hot, holding more than the keys served, does not hold the cursor: %q", cursor)
	// Walked alone, hot gets its room.
	got, _ = pick(sqlq.PickOpts{Limit: batch, Lease: time.Minute, Cursor: "zhou", MaxKeys: 1, Policies: policies})
	hot := 0
	for _, c := range got {
		if *c.PartitionKey == "zhot" {
			hot++
		}
	}
	require.Equal(t, 2, hot, "the longest prefix's limit, minus the live holder")
	// hot is full now: a pick counts its visit under its policy, "zh".
	_, _ = pick(sqlq.PickOpts{Limit: batch, Lease: time.Minute, Cursor: "zhou", Policies: policies})
	require.Len(t, last.KeysFull, 3)
	require.Zero(t, last.KeysFull[0]+last.KeysFull[1], "no full key under the other policies")
	require.Positive(t, last.KeysFull[2], "hot counted full under \"zh\"")
	require.Equal(t, []int32{0, 0, 0}, last.KeysRated)
}

// TestTheKeyWalkSeeksEachKeysTail (docs/design.md §6, "Taking slots"): the
// pick's walk over the keys lands on each key's tail, its latest runnable
// rows, not on its head, where the entries of the rows claimed since the
// last vacuum lie. 40 keys of 60 rows, each key's rows inserted by one
// statement (one now(): their entries share a posting list, which is marked
// dead only when every row in it is), the first 40 of each finished, every
// key full: version 20's walk, seeking each key's head, fetched the heap
// tuples of those 40 for every key it visited (1,640 for this walk); version
// 21's fetches one per key.
func TestTheKeyWalkSeeksEachKeysTail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	const keys, rows, claimed = 40, 60, 40
	stmts := []string{`ALTER TABLE ` + s + `.gendurable_instances SET (autovacuum_enabled = off)`}
	for k := 1; k <= keys; k++ {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO %s.gendurable_instances (fsm, step, partition_key)
			SELECT 'm', 'a', 'k%02d' FROM generate_series(1, %d)`, s, k, rows))
	}
	stmts = append(stmts,
		fmt.Sprintf(`UPDATE %s.gendurable_instances SET status = 'done', finished_at = now()
		 WHERE id IN (SELECT x.id FROM (SELECT id, row_number() OVER (PARTITION BY partition_key ORDER BY id) AS rn
		                                FROM %s.gendurable_instances) AS x WHERE x.rn <= %d)`, s, s, claimed),
		fmt.Sprintf(`INSERT INTO %s.gendurable_instances (fsm, step, partition_key, status, claim_token, lease_expires_at)
		 SELECT 'm', 'a', 'k' || lpad(g::text, 2, '0'), 'executing', g, now() + interval '1 hour' FROM generate_series(1, %d) g`, s, keys))
	for _, sql := range stmts {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	fetches := walkOverFullKeys(t, q, s, keys)
	require.LessOrEqual(t, fetches, float64(2*keys), "the walk read the entries of claimed rows")
}

// walkOverFullKeys runs one pick of the default queue of schema s (quoted),
// whose keys — keys of them — are all full, on a plan-reporting connection,
// and returns the heap tuples its walk (the loose scan over the keys: the
// statements with a recursive union) fetched from the keyed pick index.
func walkOverFullKeys(t *testing.T, q *sqlq.Queries, s string, keys int) (fetches float64) {
	t.Helper()
	ctx := context.Background()
	conn, rec := explainConn(t)
	_, err := conn.Exec(ctx, "SET search_path = "+s)
	require.NoError(t, err)
	rec.reset()
	res, err := q.Pick(ctx, conn, "default", sqlq.PickOpts{Limit: keys, Lease: time.Minute})
	require.NoError(t, err)
	require.Empty(t, res.Claimed)
	require.Equal(t, []int32{int32(keys)}, res.KeysFull, "the walk visited every key of its queue, each full")
	walks := 0
	for _, plan := range rec.all(t) {
		walk := false
		plan.walk(func(n planNode) { walk = walk || n.NodeType == "Recursive Union" })
		if !walk {
			continue
		}
		walks++
		plan.walk(func(n planNode) {
			if n.Index == "gendurable_instances_pick_keyed" {
				fetches += n.HeapFetches
			}
		})
	}
	require.Positive(t, walks)
	t.Logf("%d walk statements fetched %v heap tuples for %d keys", walks, fetches, keys)
	return fetches
}

// TestTheKeyWalkStopsAtItsQueue (docs/design.md §6, "The walk lands on a
// key's tail"): a walk that reaches the lowest key of its queue does not
// read on into the queues whose names sort below it. Queue "bulk" has 2,000
// keyed rows that have just finished (their entries not vacuumed yet);
// queue "default" has 20 full keys. A pick of "default" walks its 20 keys:
// the first form of version 21, whose probe was bounded by the row
// comparison alone, went on below "default" through every one of bulk's
// entries (2,000 heap fetches).
func TestTheKeyWalkStopsAtItsQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	const keys = 20
	for _, sql := range []string{
		`ALTER TABLE ` + s + `.gendurable_instances SET (autovacuum_enabled = off)`,
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, queue, partition_key)
		 SELECT 'm', 'a', 'bulk', 'b' || lpad(k::text, 3, '0') FROM generate_series(1, 200) k, generate_series(1, 10)`,
		`UPDATE ` + s + `.gendurable_instances SET status = 'done', finished_at = now() WHERE queue = 'bulk'`,
		fmt.Sprintf(`INSERT INTO %s.gendurable_instances (fsm, step, partition_key)
		 SELECT 'm', 'a', 'd' || lpad(g::text, 2, '0') FROM generate_series(1, %d) g`, s, keys),
		fmt.Sprintf(`INSERT INTO %s.gendurable_instances (fsm, step, partition_key, status, claim_token, lease_expires_at)
		 SELECT 'm', 'a', 'd' || lpad(g::text, 2, '0'), 'executing', g, now() + interval '1 hour' FROM generate_series(1, %d) g`, s, keys),
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	fetches := walkOverFullKeys(t, q, s, keys)
	require.LessOrEqual(t, fetches, float64(2*keys), "the walk read another queue's entries")
}

// TestKeyedPickClaimsByPrimaryKey (docs/design.md §5, §6): on a small,
// freshly analyzed table whose runnable rows are all keyed (100 keys of 200
// rows, the bench's partition workload), a pick of 1,000 claims one row per
// key through the primary key. Version 6's claim joined its candidates to the
// table, and the planner hashed the whole table for it: a sequential scan of
// every row per pick.
func TestKeyedPickClaimsByPrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	for _, sql := range []string{
		`INSERT INTO ` + s + `.gendurable_instances (fsm, step, partition_key)
		 SELECT 'm', 'a', 'key-' || (g % 100) FROM generate_series(1, 20000) g`,
		`ANALYZE ` + s + `.gendurable_instances`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	conn, rec := explainConn(t)
	_, err = conn.Exec(ctx, "SET search_path = "+s)
	require.NoError(t, err)
	const batch = 1000
	for _, cacheMode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err := conn.Exec(ctx, "SET plan_cache_mode = "+cacheMode)
		require.NoError(t, err)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		rec.reset()
		res, err := q.Pick(ctx, tx, "default", sqlq.PickOpts{Limit: batch, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 100, "one row per key")
		require.NoError(t, tx.Rollback(ctx))
		t.Run(cacheMode, func(t *testing.T) {
			for _, plan := range rec.all(t) {
				checkPlan(t, plan, 4*batch+16)
			}
		})
	}
}

// TestHandOffIsBoundedByTheBatch (docs/design.md §5, §6): the outcome
// statement's key hand-off, with one hot key holding 200k runnable rows and
// 10k other keys with a row each, under each kind of lying statistics, as a
// custom and a generic plan: the Dones of the hot key's holder and of 50
// other keys' holders each hand their slot to their key's next row, and no
// plan of the statement — the statements inside gendurable_handoff included
// — touches more than O(batch) rows: none reads the hot key's backlog.
func TestHandOffIsBoundedByTheBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 210k rows per statistics mode")
	}
	t.Parallel()
	for _, mode := range statsModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
			q, err := sqlq.New(schema)
			require.NoError(t, err)
			s := `"` + schema + `"`
			exec := func(sql string) {
				t.Helper()
				_, err := pool.Exec(ctx, sql)
				require.NoError(t, err, sql)
			}
			exec(`ALTER TABLE ` + s + `.gendurable_instances SET (autovacuum_enabled = false)`)
			if mode == statsEmpty {
				exec(`ANALYZE ` + s + `.gendurable_instances`)
			}
			exec(`INSERT INTO ` + s + `.gendurable_instances (fsm, step, status, finished_at)
				SELECT 'm', 'a', 'done', now() FROM generate_series(1, 20000)`)
			if mode == statsAllDone {
				exec(`ANALYZE ` + s + `.gendurable_instances`)
			}
			exec(`INSERT INTO ` + s + `.gendurable_instances (fsm, step, partition_key, eligible_at)
				SELECT 'm', 'a', 'hot', now() - interval '1 hour' + g * interval '1 millisecond' FROM generate_series(1, 200000) g`)
			exec(`INSERT INTO ` + s + `.gendurable_instances (fsm, step, partition_key)
				SELECT 'm', 'a', 'key-' || lpad(g::text, 5, '0') FROM generate_series(1, 10000) g`)
			// The holders: hot's, and one of each of the first 50 keys.
			exec(`INSERT INTO ` + s + `.gendurable_instances (fsm, step, partition_key, status, claim_token, lease_expires_at)
				SELECT 'm', 'a', CASE WHEN g = 0 THEN 'hot' ELSE 'key-' || lpad(g::text, 5, '0') END,
				       'executing', 1000000 + g, now() + interval '1 hour'
				FROM generate_series(0, 50) g`)
			var ids, tokens []int64
			rows, err := pool.Query(ctx, `SELECT id, claim_token FROM `+s+`.gendurable_instances
				WHERE status = 'executing' ORDER BY id`)
			require.NoError(t, err)
			for rows.Next() {
				var id, tok int64
				require.NoError(t, rows.Scan(&id, &tok))
				ids, tokens = append(ids, id), append(tokens, tok)
			}
			require.NoError(t, rows.Err())
			require.Len(t, ids, 51)
			var hotHead int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT min(id) FROM `+s+`.gendurable_instances
				WHERE partition_key = 'hot' AND status = 'runnable'`).Scan(&hotHead))
			res := `{}`
			conn, rec := explainConn(t)
			_, err = conn.Exec(ctx, "SET search_path = "+s)
			require.NoError(t, err)
			const bound = 4*51 + 16
			for _, cacheMode := range []string{"force_custom_plan", "force_generic_plan"} {
				_, err := conn.Exec(ctx, "SET plan_cache_mode = "+cacheMode)
				require.NoError(t, err)
				tx, err := conn.Begin(ctx)
				require.NoError(t, err)
				rec.reset()
				b := &sqlq.OutcomeBatch{Lease: time.Minute, LockWait: time.Second}
				for i := range ids {
					b.Add(&sqlq.Outcome{ID: ids[i], Token: tokens[i], Kind: sqlq.KindDone, Result: &res, Handoff: 1})
				}
				got, err := q.ApplyOutcomes(ctx, tx, b)
				require.NoError(t, err)
				require.Len(t, got, 51)
				for _, a := range got {
					require.NotNil(t, a.Successor, "row %d", a.ID)
					if *a.Successor.PartitionKey == "hot" {
						require.Equal(t, hotHead, a.Successor.ID, "hot's head row")
					}
				}
				require.NoError(t, tx.Rollback(ctx))
				plans := rec.all(t)
				t.Run(cacheMode, func(t *testing.T) {
					for _, plan := range plans {
						checkPlan(t, plan, bound)
					}
				})
			}
		})
	}
}

// TestRetryManyLocksItsRowsOnce: RetryMany locks its rows (and their
// parents) in its first statement; the retry statement, run on a snapshot
// taken after those locks, reads the rows as they are and locks none
// again. Before, the retry statement locked every row a second time: two
// of its statements' plans held a LockRows node.
func TestRetryManyLocksItsRowsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step, status, finished_at)
		SELECT 'm', 'a', 'failed', now() FROM generate_series(1, 5) RETURNING id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)

	conn, rec := explainConn(t)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rec.reset()
	got, err := q.RetryMany(ctx, tx, ids)
	require.NoError(t, err)
	require.Len(t, got, len(ids))
	require.NoError(t, tx.Rollback(ctx))
	locking := 0
	for _, plan := range rec.all(t) {
		found := false
		plan.walk(func(n planNode) { found = found || n.NodeType == "LockRows" })
		if found {
			locking++
		}
	}
	require.Equal(t, 1, locking, "statements of RetryMany that lock rows")
}

// TestThePickAndTheHandOffPlanGenerically (docs/design.md §5, schema
// version 22): the statements inside the pick's and the hand-off's
// functions run on generic plans from their first call on a connection,
// whatever the session's plan_cache_mode. The plan cache's default tries
// plans made for each call's values first, and kept making them for five
// statements of these functions (4.7 ms of planning in a 10.6 ms pick of
// the keys workload). A custom plan shows the call's values as constants
// ('gq'::text, '{}'::bigint[]); a generic one, parameters.
func TestThePickAndTheHandOffPlanGenerically(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, queue, partition_key)
		SELECT 'm', 'a', 'gq', CASE WHEN g > 9 THEN NULL ELSE 'k' || (g % 3) END FROM generate_series(1, 12) AS g`)
	require.NoError(t, err)
	conn, rec := explainConn(t)
	_, err = conn.Exec(ctx, "SET plan_cache_mode = auto")
	require.NoError(t, err)
	check := func(what string) {
		t.Helper()
		var custom, generic []string
		for _, p := range rec.all(t) {
			p.walk(func(n planNode) {
				cond := n.IndexCond + " " + n.Filter
				switch {
				case strings.Contains(cond, "'gq'::text") || strings.Contains(cond, "'{}'::bigint[]"):
					custom = append(custom, cond)
				case strings.Contains(cond, "$"):
					generic = append(generic, cond)
				}
			})
		}
		require.Empty(t, custom, "%s: conditions planned with the call's values", what)
		require.NotEmpty(t, generic, "%s: no condition on a parameter seen", what)
	}
	res, err := q.Pick(ctx, conn, "gq", sqlq.PickOpts{Limit: 5, Lease: time.Minute})
	require.NoError(t, err)
	require.NotEmpty(t, res.Claimed)
	check("the pick")
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_handoff(ARRAY['k0'], ARRAY['gq'], ARRAY[1],
		'{}'::bigint[], '{}'::bigint[], 60000000)`).Scan(&n))
	check("the hand-off")
}

// TestASmallOutcomeBatchKeepsAGenericPlan (docs/design.md §5): the outcome
// statement of a batch of one outcome settles on a generic plan after the
// plan cache's five custom ones, with or without a lock wait. Its arrays were
// constants to a custom plan, estimated at their length (1), and parameters
// to the generic plan, estimated at 10 rows: every custom plan looked
// cheaper, and the statement was planned again on every run (2.1 ms for
// one outcome against 0.7 ms: BenchmarkApplyOutcomes/done-1).
func TestASmallOutcomeBatchKeepsAGenericPlan(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	const runs = 12
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step)
		SELECT 'm', 'a' FROM generate_series(1, $1::int)`, 10000)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE "`+schema+`".gendurable_instances`)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = auto")
	require.NoError(t, err)
	res := `{"ok":true}`
	for _, wait := range []time.Duration{0, time.Second} {
		for range runs {
			picked, err := q.Pick(ctx, conn, "default", sqlq.PickOpts{Limit: 1, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, picked.Claimed, 1)
			batch := sqlq.OutcomeBatch{Lease: time.Minute, LockWait: wait}
			batch.Add(&sqlq.Outcome{ID: picked.Claimed[0].ID, Token: picked.Claimed[0].Token, Kind: sqlq.KindDone, Result: &res})
			applied, err := q.ApplyOutcomes(ctx, conn, &batch)
			require.NoError(t, err)
			require.Len(t, applied, 1)
		}
		// One statement for both: the lock wait is one of its parameters.
		// (This query is a prepared statement too, and holds the text it
		// looks for: it leaves itself out.)
		var n, custom, generic int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), max(custom_plans), max(generic_plans) FROM pg_prepared_statements
			WHERE statement LIKE '%WITH locked AS MATERIALIZED%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&n, &custom, &generic))
		require.Equal(t, int64(1), n, "the outcome statement, prepared once")
		require.LessOrEqual(t, custom, int64(5), "lock wait %v: the statement was planned for its values on every run", wait)
		require.Positive(t, generic, "lock wait %v", wait)
	}
}

// TestAPruneBatchIsNotJITCompiled (a review): with the prune's plans
// ruled out (pruneSettings) the planner's cost of a batch of 1,000 over
// 100k finished rows — no periodic slot among them — passed jit_above_cost
// once the newest-slot check was added (its subplan is priced for every
// row), and PostgreSQL's JIT compiled each batch, for far longer than the
// batch ran, until the generic plan took over. The prune runs without JIT.
func TestAPruneBatchIsNotJITCompiled(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, finished_at, unique_key)
		SELECT 'm', 'a', 'done', now() - interval '10 days' + g * interval '1 second',
		       CASE WHEN g % 2 = 0 THEN convert_to('order:' || g, 'UTF8') END
		FROM generate_series(1, 100000) AS g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+s+`.gendurable_instances`)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, sqlq.IdleLimitSettings["prune"])
	require.NoError(t, err)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE) "+q.PruneLockSQL(), int64(3600_000_000), 1000, nil)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, l := range lines {
		require.NotContains(t, l, "JIT", "the prune batch was JIT-compiled:\n%s", strings.Join(lines, "\n"))
	}
}

// TestABucketPruneBatchIsBoundedByTheBatch: a batch of the rate buckets'
// prune reads one range of the primary key, whatever the table holds —
// here 100k buckets, half of them full, and statistics that say so.
func TestABucketPruneBatchIsBoundedByTheBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 100k buckets")
	}
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	for _, stmt := range []string{
		`INSERT INTO ` + s + `.gendurable_key_buckets (key, tokens, refilled_at)
		 SELECT 'k:' || lpad(g::text, 6, '0'), 0, CASE WHEN g % 2 = 0 THEN now() - interval '1 hour' ELSE now() END
		 FROM generate_series(1, 100000) AS g`,
		`ANALYZE ` + s + `.gendurable_key_buckets`,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	policies := []sqlq.KeyPolicy{{Prefix: "k:", Limit: 1, Rate: 1, Burst: 10}}
	runPlanCases(t, []planCase{{"prune-buckets", 4*500 + 100, func(t *testing.T, tx pgx.Tx) {
		n, next, err := q.PruneBuckets(ctx, tx, policies, time.Minute, 500, nil)
		require.NoError(t, err)
		require.Equal(t, int64(250), n)
		require.NotNil(t, next)
		n, _, err = q.PruneBuckets(ctx, tx, policies, time.Minute, 500, next)
		require.NoError(t, err)
		require.Equal(t, int64(250), n)
	}}})
}
