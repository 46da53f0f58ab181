package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// seedRow inserts one instance row directly and returns its id.
func (b *testBundle) seedRow(cols, vals string, args ...any) int64 {
	b.t.Helper()
	var id int64
	require.NoError(b.t, b.pool.QueryRow(context.Background(), replaceSchema(
		`INSERT INTO {{s}}.gendurable_instances (fsm, step, `+cols+`) VALUES ('m', 'a', `+vals+`) RETURNING id`, b.schema),
		args...).Scan(&id))
	return id
}

const liveScope = `'{runnable,executing,awaiting_signal,awaiting_children}'`

func TestRetryManyAndCancelManyByID(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	for _, ids := range [][]int64{nil, {}, {0}, {-3, 5}, make([]int64, gendurable.MaxBulkIDs+1)} {
		if len(ids) > gendurable.MaxBulkIDs {
			for i := range ids {
				ids[i] = int64(i + 1)
			}
		}
		_, err := b.eng.RetryMany(ctx, ids)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%d ids", len(ids))
		_, err = b.eng.CancelMany(ctx, ids, "")
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%d ids", len(ids))
	}

	// A parent waiting on two failed children of its current fan-out, and
	// a finished parent with one.
	parent := b.seedRow(`status, fanout, children_total, children_pending`, `'awaiting_children', 2, 3, 0`)
	kid1 := b.seedRow(`status, parent_id, parent_fanout, finished_at`, `'failed', $1, 2, now()`, parent)
	kid2 := b.seedRow(`status, parent_id, parent_fanout, finished_at`, `'failed', $1, 2, now()`, parent)
	old := b.seedRow(`status, parent_id, parent_fanout, finished_at`, `'failed', $1, 1, now()`, parent)
	live := b.seedRow(`status`, `'runnable'`)
	// A failed row whose key a live row holds, and two failed rows sharing
	// a key no one holds: one of them can be retried.
	held := b.seedRow(`status, unique_key, unique_scope`, `'failed', 'k1', `+liveScope)
	b.seedRow(`status, unique_key, unique_scope`, `'runnable', 'k1', `+liveScope)
	twin1 := b.seedRow(`status, unique_key, unique_scope`, `'failed', 'k2', `+liveScope)
	twin2 := b.seedRow(`status, unique_key, unique_scope`, `'failed', 'k2', `+liveScope)
	// A leftover unconsumed signal on a failed row is consumed by the retry.
	b.exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES ($1, 'late')`, kid1)

	res, err := b.eng.RetryMany(ctx, []int64{kid1, kid2, kid2, old, live, held, 987654})
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 5, Changed: 3, Skipped: 2, NotFound: 1,
		ChangedIDs: []int64{kid1, kid2, old}}, res, "kid2 counts once; live and held are skipped")
	for _, id := range []int64{kid1, kid2, old} {
		r := b.row(id)
		require.Equal(t, "runnable", r.Status)
		require.Nil(t, r.FinishedAt)
	}
	require.Equal(t, "failed", b.row(held).Status)
	require.Equal(t, 2, b.count(`SELECT children_pending FROM {{s}}.gendurable_instances WHERE id = $1`, parent),
		"the parent waits for its two retried children again, not for the earlier fan-out's")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE consumed_at IS NULL`))

	// The twins collide on the unique index: one at a time, one is retried.
	res, err = b.eng.RetryMany(ctx, []int64{twin1, twin2, held})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Changed, "%+v", res)
	require.Equal(t, int64(2), res.Skipped)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id IN ($1, $2) AND status = 'runnable'`, twin1, twin2))

	// Cancel: the children join their parent, which wakes; a running row
	// is fenced out; finished rows are skipped.
	running := b.seedRow(`status, claim_token, lease_expires_at, inbox`, `'executing', 42, now() + interval '1 minute', '{"go": 1}'`)
	b.exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES ($1, 'go')`, running)
	res, err = b.eng.CancelMany(ctx, []int64{kid1, kid2, running, held, 123456789}, "bulk test")
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 4, Changed: 3, Skipped: 1, NotFound: 1,
		ChangedIDs: []int64{kid1, kid2, running}}, res)
	p := b.row(parent)
	require.Equal(t, "runnable", p.Status, "both children finished: the parent runs its join")
	require.Zero(t, b.count(`SELECT children_pending FROM {{s}}.gendurable_instances WHERE id = $1`, parent))
	r := b.row(running)
	require.Equal(t, "failed", r.Status)
	require.Nil(t, r.Token, "the running step is fenced out")
	require.Equal(t, "cancelled", r.Errors[len(r.Errors)-1]["kind"])
	require.Equal(t, "bulk test", r.Errors[len(r.Errors)-1]["error"])
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE consumed_at IS NULL`), "its inbox is consumed")

	res, err = b.eng.CancelMany(ctx, []int64{999999999}, "")
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{NotFound: 1, ChangedIDs: []int64{}}, res)
}

// TestATimeRangeThatLeavesOutNothingIsNoCriterion: a filter whose only
// criterion is a time range acts on every instance when the range leaves
// none out ("to 9999", "from 1970"), as surely as an empty filter does, and
// is refused like one (a hostile probe cancelled every live instance through
// the dashboard with to=9999-12-30); a range that leaves one out is a
// criterion, and All still acts on everything.
func TestATimeRangeThatLeavesOutNothingIsNoCriterion(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, inserted_at) VALUES ('m', 'a', now() - interval '3 hours')`)
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, inserted_at) SELECT 'm', 'a', now() - interval '2 hours' FROM generate_series(1, 3)`)
	live := func() int {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'runnable'`)
	}
	now := time.Now()
	longAgo := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, f := range []gendurable.ListFilter{
		{To: time.Date(9999, 12, 30, 0, 0, 0, 0, time.UTC)},
		{To: now.Add(24 * time.Hour)},
		{To: now.Add(-time.Hour)}, // after the last insert: in the past, and still everything
		{From: longAgo},
		{From: now.Add(-4 * time.Hour), To: now},
		{From: now.Add(-4 * time.Hour), State: json.RawMessage(`{}`)},
	} {
		_, err := b.eng.CancelMatching(ctx, f, "")
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%v", f)
		require.ErrorContains(t, err, "leaves out no instance")
		_, err = b.eng.RetryMatching(ctx, f)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%v", f)
		require.Equal(t, 4, live(), "nothing was cancelled")
	}
	// From 150 minutes ago leaves the first out: a criterion.
	res, err := b.eng.CancelMatching(ctx, gendurable.ListFilter{From: now.Add(-150 * time.Minute)}, "")
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Changed)
	require.Equal(t, 1, live())
	// So does a To before the last insert, with a vacuous From beside it.
	res, err = b.eng.CancelMatching(ctx, gendurable.ListFilter{From: longAgo, To: now.Add(-150 * time.Minute)}, "")
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Changed)
	require.Zero(t, live())
	// Another criterion beside a vacuous range is a criterion; All acts on every instance.
	_, err = b.eng.RetryMatching(ctx, gendurable.ListFilter{Status: "failed", To: now.Add(time.Hour)})
	require.NoError(t, err)
	_, err = b.eng.CancelMatching(ctx, gendurable.ListFilter{All: true, To: now.Add(time.Hour)}, "")
	require.NoError(t, err)
}

func TestBulkByFilterWorksInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	_, err := b.eng.RetryMatching(ctx, gendurable.ListFilter{})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput, "no criteria")
	_, err = b.eng.CancelMatching(ctx, gendurable.ListFilter{Before: 10, Limit: 3}, "")
	require.ErrorIs(t, err, gendurable.ErrInvalidInput, "paging is not a criterion")
	_, err = b.eng.RetryMatching(ctx, gendurable.ListFilter{Status: "bogus"})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)

	// More than two batches of failed rows in queue q, others elsewhere.
	const n = 2*gendurable.BulkBatch + 37
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, queue, step, status, finished_at)
		SELECT 'm', 'q', 'a', 'failed', now() FROM generate_series(1, $1::int)`, n)
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, queue, step, status)
		SELECT 'm', 'q', 'a', 'runnable' FROM generate_series(1, 10)`)
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, queue, step, status, finished_at)
		SELECT 'm', 'other', 'a', 'failed', now() FROM generate_series(1, 5)`)

	// A small scan window makes many partial pages: every match is still found.
	res, err := b.eng.RetryMatching(ctx, gendurable.ListFilter{Queue: "q", MaxScan: 300})
	require.NoError(t, err)
	require.Equal(t, int64(n+10), res.Matched)
	require.Equal(t, int64(n), res.Changed)
	require.Equal(t, int64(10), res.Skipped, "the runnable rows")
	require.Len(t, res.ChangedIDs, gendurable.MaxBulkIDs)
	require.True(t, res.Truncated)
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE queue = 'q' AND status = 'failed'`))
	require.Equal(t, 5, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE queue = 'other' AND status = 'failed'`))

	res, err = b.eng.CancelMatching(ctx, gendurable.ListFilter{Queue: "q", Status: gendurable.StatusRunnable}, "drain q")
	require.NoError(t, err)
	require.Equal(t, int64(n+10), res.Changed)
	require.Zero(t, res.Skipped)

	// All: every instance; the finished ones are skipped.
	res, err = b.eng.CancelMatching(ctx, gendurable.ListFilter{All: true}, "")
	require.NoError(t, err)
	require.Equal(t, int64(n+15), res.Matched)
	require.Zero(t, res.Changed)
	res, err = b.eng.RetryMatching(ctx, gendurable.ListFilter{All: true, Status: gendurable.StatusFailed})
	require.NoError(t, err)
	require.Equal(t, int64(n+15), res.Changed)

	// A cancelled context stops between batches.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.eng.CancelMatching(cctx, gendurable.ListFilter{Queue: "q"}, "")
	require.ErrorIs(t, err, context.Canceled)
	// Cancelled after the first batch: that batch stays done and is counted.
	res, err = b.eng.CancelMatching(&cancelAfter{Context: ctx, checks: 1}, gendurable.ListFilter{Queue: "q"}, "")
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(gendurable.BulkBatch), res.Changed)
	require.Equal(t, gendurable.BulkBatch, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE queue = 'q' AND status = 'failed'`))
}

// TestBulkErrorKeepsWhatWasChanged: a bulk call that fails part way
// returns, with its error, exactly the instances it changed before — in a
// batch retried one instance at a time after a unique-key collision, and in
// a later batch of a filter walk. A statement trigger makes any statement
// that changes the poisoned row fail, so every earlier statement commits.
func TestBulkErrorKeepsWhatWasChanged(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	b.exec(`CREATE TABLE {{s}}.poison (id bigint PRIMARY KEY)`)
	b.exec(`CREATE FUNCTION {{s}}.poison_check() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT 1 FROM changed JOIN {{s}}.poison USING (id)) THEN
				RAISE EXCEPTION 'poisoned row';
			END IF;
			RETURN NULL;
		END $$`)
	b.exec(`CREATE TRIGGER poison AFTER UPDATE ON {{s}}.gendurable_instances
		REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION {{s}}.poison_check()`)
	inTable := func(status string, ids ...int64) []int64 {
		t.Helper()
		rows, err := b.pool.Query(ctx, replaceSchema(
			`SELECT id FROM {{s}}.gendurable_instances WHERE id = ANY ($1) AND status = $2 ORDER BY id`, b.schema), ids, status)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		if got == nil {
			got = []int64{}
		}
		return got
	}

	// By id: two failed rows share a key, so the batch collides and goes
	// one at a time; the first twin is retried, the second skipped, and the
	// poisoned row after them fails the call.
	twin1 := b.seedRow(`status, unique_key, unique_scope`, `'failed', 'k', `+liveScope)
	twin2 := b.seedRow(`status, unique_key, unique_scope`, `'failed', 'k', `+liveScope)
	bad := b.seedRow(`status`, `'failed'`)
	after := b.seedRow(`status`, `'failed'`)
	b.exec(`INSERT INTO {{s}}.poison VALUES ($1)`, bad)
	ids := []int64{twin1, twin2, bad, after}
	res, err := b.eng.RetryMany(ctx, ids)
	require.ErrorContains(t, err, "poisoned row")
	require.Equal(t, gendurable.BulkResult{Matched: 2, Changed: 1, Skipped: 1, ChangedIDs: []int64{twin1}}, res)
	require.Equal(t, inTable("runnable", ids...), res.ChangedIDs, "the result lists what the table holds")

	// By filter: the walk goes newest first; the first batch commits, the
	// second falls back to one at a time (a collision) and fails part way.
	b.exec(`DELETE FROM {{s}}.poison`)
	b.exec(`DELETE FROM {{s}}.gendurable_instances`)
	old1 := b.seedRow(`queue, status, unique_key, unique_scope`, `'f', 'failed', 'k', `+liveScope)
	b.seedRow(`queue, status, unique_key, unique_scope`, `'f', 'failed', 'k', `+liveScope)
	oldBad := b.seedRow(`queue, status`, `'f', 'failed'`)
	b.exec(`INSERT INTO {{s}}.poison VALUES ($1)`, oldBad)
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, queue, step, status, finished_at)
		SELECT 'm', 'f', 'a', 'failed', now() FROM generate_series(1, $1::int)`, gendurable.BulkBatch-3)
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, queue, step, status, finished_at)
		SELECT 'm', 'f', 'a', 'failed', now() FROM generate_series(1, $1::int)`, gendurable.BulkBatch)
	all := make([]int64, 0, 2*gendurable.BulkBatch)
	rows, err := b.pool.Query(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances`, b.schema))
	require.NoError(t, err)
	all, err = pgx.AppendRows(all, rows, pgx.RowTo[int64])
	require.NoError(t, err)
	res, err = b.eng.RetryMatching(ctx, gendurable.ListFilter{Queue: "f"})
	require.ErrorContains(t, err, "poisoned row")
	require.Equal(t, int64(gendurable.BulkBatch+1), res.Changed, "the first batch and the first of the twins")
	require.Equal(t, int64(gendurable.BulkBatch+2), res.Matched)
	require.Equal(t, int64(1), res.Skipped)
	changed := inTable("runnable", all...)
	require.Len(t, changed, gendurable.BulkBatch+1)
	require.Contains(t, changed, old1)
	require.ElementsMatch(t, changed, res.ChangedIDs)

	// Cancel by filter: a later batch's statement (the one with old1, live
	// again) fails whole; the earlier batch's cancels are returned.
	b.exec(`UPDATE {{s}}.poison SET id = $1`, old1)
	res, err = b.eng.CancelMatching(ctx, gendurable.ListFilter{Queue: "f"}, "")
	require.ErrorContains(t, err, "poisoned row")
	require.Equal(t, int64(gendurable.BulkBatch), res.Changed)
	cancelled := b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'failed' AND errors @> '[{"kind": "cancelled"}]'`)
	require.Equal(t, int(res.Changed), cancelled)
	require.Len(t, res.ChangedIDs, cancelled)
}

// TestBulkFinishesTheBatchItStartedWhenTheContextEnds: a bulk call stops
// at its context's end between batches, as documented, never inside a
// batch statement. Cancelling a statement in flight left the call unsure of
// what it did: a statement that committed on the server as the cancel went
// out was not counted, so the dashboard's partial result and its audit line
// said fewer instances than were retried (seen in a sweep of request
// timeouts: 9,500 reported, 10,000 retried). Here the first batch waits on
// a row lock past the deadline; it still completes, and the result counts
// exactly what the table holds.
func TestBulkFinishesTheBatchItStartedWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, queue, step, status, finished_at)
		SELECT 'm', 'slow', 'a', 'failed', now() FROM generate_series(1, $1::int)`, 3*gendurable.BulkBatch)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances ORDER BY id DESC LIMIT 1 FOR UPDATE`, b.schema))
	if err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	// The newest row, in the first batch of the walk, is locked: the
	// call's context ends once the batch statement waits for that lock
	// (seen in pg_stat_activity: a fixed deadline of 200 ms could pass
	// before the batch began on a loaded machine), and the lock goes 400 ms
	// later.
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	released := make(chan error, 1)
	go func() {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var waiting bool
			if err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0)`,
				b.schema).Scan(&waiting); err != nil || waiting {
				break
			}
		}
		cancel()
		time.Sleep(400 * time.Millisecond)
		released <- tx.Commit(ctx)
	}()
	defer func() { require.NoError(t, <-released) }()
	res, err := b.eng.RetryMatching(dctx, gendurable.ListFilter{Queue: "slow"})
	require.ErrorIs(t, err, context.Canceled)
	retried := b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'runnable'`)
	require.Equal(t, int64(retried), res.Changed, "the result says what the table holds")
	require.Equal(t, int64(gendurable.BulkBatch), res.Changed, "the batch under way when the deadline passed was finished")
	require.Len(t, res.ChangedIDs, gendurable.BulkBatch)
}

// cancelAfter is a context whose Err turns to Canceled after a number of
// checks (its Done never closes, so statements run to their end).
type cancelAfter struct {
	context.Context
	checks int
}

func (c *cancelAfter) Err() error {
	if c.checks == 0 {
		return context.Canceled
	}
	c.checks--
	return nil
}

// TestBulkCancelWhileWorkersRun: running children of 20 fan-outs are
// cancelled by filter again and again while the engine runs them. Every child ends done or cancelled, never
// both (a cancelled child's late outcome is fenced out), and every parent
// joins exactly once with a zero count: the cancels and the workers'
// outcomes decrement the same parents without losing or doubling one.
func TestBulkCancelWhileWorkersRun(t *testing.T) {
	t.Parallel()
	// The first two children to start wait (for the gate, or for their
	// context) so that the first cancel finds running children on a slow
	// machine too: without them, every child could finish before a cancel
	// statement reached it, and the test would prove nothing.
	gate := make(chan struct{})
	var held atomic.Int32
	leaf := &gendurable.Job[leafArgs]{Name: "bleaf", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
		if held.Add(1) <= 2 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		time.Sleep(time.Duration(2+j.State.N%5) * time.Millisecond)
		return nil
	}}
	const parents, width = 20, 10
	m := &gendurable.Machine[fanState]{Name: "bparent", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				kids := make([]gendurable.InsertParams, width)
				for i := range kids {
					kids[i] = leaf.New(leafArgs{N: i})
				}
				return r.ScheduleChildren("join", r.State, kids...), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return gendurable.Done(len(r.Children)), nil
			},
		}}
	cfg := fastConfig("", m, leaf)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 4, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	ids := make([]int64, parents)
	for i := range ids {
		ids[i] = b.insert(m.New(fanState{}))
	}
	// Start while children are live: some runnable, some running.
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'bleaf' AND status = 'executing'`) > 0
	}, "no child running yet")
	var cancelled int64
	for b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'bparent' AND status <> 'done'`) > 0 {
		// Only running children: each cancel races their outcomes.
		res, err := b.eng.CancelMatching(ctx, gendurable.ListFilter{Machine: "bleaf", Status: gendurable.StatusExecuting}, "bulk while running")
		require.NoError(t, err)
		cancelled += res.Changed
		if cancelled > 0 {
			select {
			case <-gate:
			default:
				close(gate)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.Positive(t, cancelled)
	require.Equal(t, int(cancelled), b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE fsm = 'bleaf' AND status = 'failed' AND errors -> -1 ->> 'kind' = 'cancelled'`))
	require.Equal(t, parents*width, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE fsm = 'bleaf' AND (status = 'done' OR (status = 'failed' AND errors -> -1 ->> 'kind' = 'cancelled'))`))
	for _, id := range ids {
		r := b.waitStatus(id, "done", 10*time.Second)
		require.JSONEq(t, fmt.Sprint(width), string(r.Result))
		require.Zero(t, b.count(`SELECT children_pending FROM {{s}}.gendurable_instances WHERE id = $1`, id))
	}
}

// TestBulkRetryWhileWorkersRun: 300 failed jobs are retried by two
// operators at once while the engine runs what is retried. Each instance is
// retried exactly once between them and then succeeds.
func TestBulkRetryWhileWorkersRun(t *testing.T) {
	t.Parallel()
	var runs sync.Map // id → runs
	job := &gendurable.Job[orderArgs]{Name: "bretry", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		n, _ := runs.LoadOrStore(j.ID, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) == 1 {
			return errors.New("first run fails")
		}
		return nil
	}}
	cfg := fastConfig("", job)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 8, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	const n = 300
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = job.New(orderArgs{I: i})
	}
	_, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'failed'`) == n
	}, "not all failed")

	var wg sync.WaitGroup
	results := make([]gendurable.BulkResult, 2)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			results[i], err = b.eng.RetryMatching(ctx, gendurable.ListFilter{Machine: "bretry", MaxScan: 100})
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	require.Equal(t, int64(n), results[0].Changed+results[1].Changed, "each instance retried once: %+v", results)
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`) == n
	}, "not all done after the retry")
	runs.Range(func(_, v any) bool {
		require.Equal(t, int32(2), v.(*atomic.Int32).Load())
		return true
	})
}

func TestRunNow(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "later", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, nil, job)
	ctx := context.Background()
	scheduled := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	backingOff := b.seedRow(`status, attempt, eligible_at`, `'runnable', 2, now() + interval '10 minutes'`)
	now := b.seedRow(`status`, `'runnable'`)
	parked := b.seedRow(`status, awaits`, `'awaiting_signal', '{go}'`)
	done := b.seedRow(`status, finished_at`, `'done', now()`)

	for _, id := range []int64{scheduled, backingOff} {
		require.NoError(t, b.eng.RunNow(ctx, id))
		r := b.row(id)
		require.Equal(t, "runnable", r.Status)
		require.False(t, r.EligibleAt.After(r.Now), "eligible now")
	}
	require.Equal(t, 2, b.row(backingOff).Attempt, "the attempt count is kept")
	require.NoError(t, b.eng.RunNow(ctx, now), "already eligible: nothing to do")
	require.ErrorIs(t, b.eng.RunNow(ctx, parked), gendurable.ErrNotDelayed)
	require.ErrorIs(t, b.eng.RunNow(ctx, done), gendurable.ErrNotDelayed)
	require.ErrorIs(t, b.eng.RunNow(ctx, 98765432), gendurable.ErrNotFound)

	// The engine runs it at once, not in an hour.
	b.start()
	b.waitStatus(scheduled, "done", 5*time.Second)
}

// TestNotMigratedSaysWhatToRun: operator calls on a schema without
// gendurable's tables return ErrNotMigrated with the command to run, not a
// bare "relation does not exist".
func TestNotMigratedSaysWhatToRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	eng, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema + "_none"})
	require.NoError(t, err)
	ctx := context.Background()
	calls := map[string]func() error{
		"list":   func() error { _, err := eng.List(ctx, gendurable.ListFilter{}); return err },
		"queues": func() error { _, err := eng.Queues(ctx); return err },
		"show":   func() error { _, err := eng.Describe(ctx, 1); return err },
		"retry":  func() error { return eng.Retry(ctx, 1) },
		"cancel": func() error { return eng.Cancel(ctx, 1, "") },
		"runnow": func() error { return eng.RunNow(ctx, 1) },
		"bulk":   func() error { _, err := eng.CancelMany(ctx, []int64{1}, ""); return err },
		"prune":  func() error { _, err := eng.Prune(ctx, time.Hour, nil); return err },
		"signal": func() error { _, err := eng.Signal(ctx, 1, "go", nil, nil); return err },
		"pause":  func() error { return eng.Pause(ctx, "default") },
		"machines": func() error {
			_, err := eng.ListMachines(ctx)
			return err
		},
		"graph":      func() error { _, err := eng.Graph(ctx, "order"); return err },
		"throughput": func() error { _, err := eng.Throughput(ctx); return err },
		"matching":   func() error { _, err := eng.RetryMatching(ctx, gendurable.ListFilter{Status: "failed"}); return err },
		"retrymany":  func() error { _, err := eng.RetryMany(ctx, []int64{1}); return err },
		"reap":       func() error { _, err := eng.Reap(ctx); return err },
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, gendurable.ErrNotMigrated, name)
		require.ErrorIs(t, err, gendurable.ErrSchemaVersion, name) // as Start's check says it
		require.Contains(t, err.Error(), "run `gendurable migrate up --schema "+b.schema+"_none`", name)
		require.NotContains(t, err.Error(), "does not exist", name)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the database's error is still wrapped")
		require.Equal(t, "42P01", pgErr.Code)
	}
}

// TestBulkByEmptyStateIsNoCriterion: a State of {} or [] is contained in
// every object or array state, so a bulk call by it alone is refused as a
// filter without criteria, not run over every instance.
func TestBulkByEmptyStateIsNoCriterion(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	live := b.seedRow(`status, state`, `'runnable', '{"a": 1}'`)
	failed := b.seedRow(`status, state, finished_at`, `'failed', '[1]', now()`)
	for _, s := range []string{`{}`, ` { } `, "{\n}", `[]`, `[ ]`} {
		_, err := b.eng.CancelMatching(ctx, gendurable.ListFilter{State: json.RawMessage(s)}, "")
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "cancel by %q", s)
		_, err = b.eng.RetryMatching(ctx, gendurable.ListFilter{State: json.RawMessage(s)})
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "retry by %q", s)
	}
	require.Equal(t, "runnable", b.row(live).Status)
	require.Equal(t, "failed", b.row(failed).Status)
	// A non-empty document is a criterion.
	res, err := b.eng.CancelMatching(ctx, gendurable.ListFilter{State: json.RawMessage(`{"a": 1}`)}, "")
	require.NoError(t, err)
	require.Equal(t, []int64{live}, res.ChangedIDs)
}

// TestBulkRetryOfAFanOutMakesTheParentAwaitItsChildren: a parent and its
// children cancelled together (a cancel by queue), then retried together (a
// retry by the same filter, or by ids: one statement), must have the parent
// await the children it retried beside it, as a single retry of the parent
// after its children does; its join must not run while they are live.
func TestBulkRetryOfAFanOutMakesTheParentAwaitItsChildren(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"RetryMatching", "RetryMany"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			started := make(chan struct{}, 8)
			leaf := &gendurable.Job[leafArgs]{Name: "bfleaf", Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
				if runs.Add(1) <= 2 { // the first runs wait for the cancel
					started <- struct{}{}
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}}
			m := statusParent("bfparent", func() []gendurable.InsertParams {
				return []gendurable.InsertParams{leaf.New(leafArgs{N: 1}), leaf.New(leafArgs{N: 2})}
			})
			b := setup(t, fastConfig("", m, leaf))
			b.start()
			ctx := context.Background()
			parent := b.insert(m.New(fanState{}))
			<-started
			<-started
			res, err := b.eng.CancelMatching(ctx, gendurable.ListFilter{Queue: "default"}, "drain")
			require.NoError(t, err)
			require.Equal(t, int64(3), res.Changed, "the parent and its two children")
			if how == "RetryMatching" {
				res, err = b.eng.RetryMatching(ctx, gendurable.ListFilter{Queue: "default"})
			} else {
				res, err = b.eng.RetryMany(ctx, res.ChangedIDs)
			}
			require.NoError(t, err)
			require.Equal(t, int64(3), res.Changed)
			require.Equal(t, "awaiting_children", b.row(parent).Status, "the parent's children were retried with it and are live")
			r := b.waitStatus(parent, "done", 15*time.Second)
			require.JSONEq(t, `["done", "done"]`, string(r.Result), "the join ran before its retried children finished")
		})
	}
}

// TestRetryManyOfAParentWithItsChildrenAfterAUniqueCollision: when two rows
// of a batch share a unique key the batch is retried one instance at a
// time; a parent and children of its current fan-out in that batch must
// still leave the parent awaiting them (the children first), as the batch
// statement does, down a nested fan-out too.
func TestRetryManyOfAParentWithItsChildrenAfterAUniqueCollision(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for _, twins := range []bool{false, true} {
		grand := b.seedRow(`status, fanout, children_total, children_pending, finished_at`, `'failed', 1, 1, 1, now()`)
		parent := b.seedRow(`status, fanout, children_total, children_pending, finished_at, parent_id, parent_fanout`, `'failed', 1, 2, 2, now(), $1, 1`, grand)
		kid1 := b.seedRow(`status, parent_id, parent_fanout, finished_at`, `'failed', $1, 1, now()`, parent)
		kid2 := b.seedRow(`status, parent_id, parent_fanout, finished_at`, `'failed', $1, 1, now()`, parent)
		ids := []int64{grand, parent, kid1, kid2}
		want := int64(4)
		if twins {
			key := fmt.Sprintf("'twin-%d'", parent)
			ids = append(ids, b.seedRow(`status, unique_key, unique_scope`, `'failed', `+key+`, `+liveScope),
				b.seedRow(`status, unique_key, unique_scope`, `'failed', `+key+`, `+liveScope))
			want = 5 // one twin collides
		}
		res, err := b.eng.RetryMany(ctx, ids)
		require.NoError(t, err)
		require.Equal(t, want, res.Changed, "twins %v", twins)
		for _, p := range []struct {
			id      int64
			pending int
		}{{grand, 1}, {parent, 2}} {
			require.Equal(t, "awaiting_children", b.row(p.id).Status, "twins %v: instance %d's retried children are live", twins, p.id)
			require.Equal(t, p.pending, b.count(`SELECT children_pending FROM {{s}}.gendurable_instances WHERE id = $1`, p.id))
		}
	}
}

type twigArgs struct {
	N     int  `json:"n"`
	Block bool `json:"block,omitempty"`
}

// treeKit is a tree of real machines: fan-out machines (treeFan) whose join
// steps are counted, and twigs that finish at once with their N, or, when
// Block, wait for gate (ignoring their context: their outcome comes late,
// after any cancel).
type treeKit struct {
	joins atomic.Int32
	gate  chan struct{}
	once  sync.Once
	twig  *gendurable.Machine[twigArgs]
}

func newTreeKit() *treeKit {
	k := &treeKit{gate: make(chan struct{})}
	k.twig = &gendurable.Machine[twigArgs]{Name: "twig", Start: "work",
		Steps: map[string]gendurable.StepFunc[twigArgs]{
			"work": func(ctx context.Context, r *gendurable.Run[twigArgs]) (gendurable.Outcome, error) {
				if r.State.Block {
					<-k.gate
					return gendurable.Done("late"), nil
				}
				return gendurable.Done(map[string]int{"n": r.State.N}), nil
			},
		}}
	return k
}

func (k *treeKit) open() { k.once.Do(func() { close(k.gate) }) }

// fan is a machine that fans out kids() and counts its join.
func (k *treeKit) fan(name string, kids func() []gendurable.InsertParams) *gendurable.Machine[fanState] {
	return &gendurable.Machine[fanState]{Name: name, Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("join", r.State, kids()...), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				k.joins.Add(1)
				return gendurable.Done(len(r.Children)), nil
			},
		}}
}

// TestCancelTreeStopsEveryLiveDescendantWithRealWorkers: a trunk fanned out
// to two branches, a twig blocked mid-step and a quick twig; each branch to a
// blocked twig and a quick one. Cancelled as a tree while the blocked twigs
// run, every live member ends failed and cancelled; the running twigs are
// fenced (their late outcomes change nothing) and keep their leases, as
// Cancel's do; the quick twigs, done before, keep their results; no join
// step runs.
func TestCancelTreeStopsEveryLiveDescendantWithRealWorkers(t *testing.T) {
	t.Parallel()
	k := newTreeKit()
	branch := k.fan("branch", func() []gendurable.InsertParams {
		return []gendurable.InsertParams{k.twig.New(twigArgs{Block: true}), k.twig.New(twigArgs{N: 2})}
	})
	trunk := k.fan("trunk", func() []gendurable.InsertParams {
		return []gendurable.InsertParams{branch.New(fanState{}), branch.New(fanState{}),
			k.twig.New(twigArgs{Block: true}), k.twig.New(twigArgs{N: 1})}
	})
	log := &eventLog{}
	cfg := fastConfig("", trunk, branch, k.twig)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 8, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}}
	cfg.Hooks = []gendurable.Hook{log}
	b := setup(t, cfg)
	b.start()
	t.Cleanup(k.open) // before the engine's Stop
	ctx := context.Background()
	root := b.insert(trunk.New(fanState{}))
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'twig' AND status = 'executing'`) == 3 &&
			b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'twig' AND status = 'done'`) == 3 &&
			b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm IN ('trunk', 'branch') AND status = 'awaiting_children'`) == 3
	}, "the tree did not reach its blocked twigs")
	members := func(where string) []int64 {
		rows, err := b.pool.Query(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances WHERE `+where+` ORDER BY id`, b.schema))
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return ids
	}
	blocked := members(`fsm = 'twig' AND status = 'executing'`)
	quick := members(`fsm = 'twig' AND status = 'done'`)
	branches := members(`fsm = 'branch'`)

	res, err := b.eng.CancelTree(ctx, root, "tree test")
	require.NoError(t, err)
	require.Equal(t, int64(9), res.Matched, "%+v", res)
	require.Equal(t, int64(6), res.Changed, "the trunk, its branches and the blocked twigs")
	require.Equal(t, int64(3), res.Skipped, "the quick twigs, done")
	require.Zero(t, res.NotFound)
	require.ElementsMatch(t, append(append([]int64{root}, branches...), blocked...), res.ChangedIDs)
	require.Equal(t, root, res.ChangedIDs[0], "the root first")

	for _, id := range append(append([]int64{root}, branches...), blocked...) {
		r := b.row(id)
		require.Equal(t, "failed", r.Status, "instance %d", id)
		require.Equal(t, "cancelled", r.Errors[len(r.Errors)-1]["kind"], "instance %d", id)
		require.Equal(t, "tree test", r.Errors[len(r.Errors)-1]["error"], "instance %d", id)
	}
	for _, id := range blocked {
		r := b.row(id)
		require.Nil(t, r.Token, "twig %d: its running step is fenced out", id)
		require.NotNil(t, r.LeaseExp, "twig %d keeps the lease of its running step, as a Cancel leaves it", id)
		require.True(t, r.LeaseExp.After(r.Now), "twig %d", id)
	}

	// The blocked steps return now: their outcomes are fenced out.
	k.open()
	eventually(t, 10*time.Second, func() bool {
		for _, id := range blocked {
			if ev, ok := findEvent(log, func(e *gendurable.StepEvent) bool { return e.InstanceID == id }); !ok || !ev.Fenced {
				return false
			}
		}
		return true
	}, "a running twig's late outcome was not fenced out")
	time.Sleep(300 * time.Millisecond) // time for a wrongly woken parent to run its join
	for _, id := range blocked {
		r := b.row(id)
		require.Equal(t, "failed", r.Status, "twig %d", id)
		require.Nil(t, r.Result, "twig %d: no step committed after the cancel", id)
	}
	for i, id := range quick {
		r := b.row(id)
		require.Equal(t, "done", r.Status, "a finished twig stays finished")
		require.NotEmpty(t, r.Result, "twig %d keeps its result", i)
	}
	require.Zero(t, k.joins.Load(), "a cancelled parent ran its join step")
	require.Equal(t, "failed", b.row(root).Status)
}

// TestCancelTreeCancelsParentsBeforeTheirChildren: a trunk over three
// branches of 300 parked twigs each (a queue no worker runs), cancelled as a
// tree in several batches. A trigger records every status change: no parent
// is ever woken (a cancelled child counts as finished: cancelling the
// children first would wake it, and it could run its next step before its
// own cancel), each member is failed after its parent, and no join runs.
func TestCancelTreeCancelsParentsBeforeTheirChildren(t *testing.T) {
	t.Parallel()
	k := newTreeKit()
	const width, twigs = 3, 300
	branch := k.fan("branch", func() []gendurable.InsertParams {
		kids := make([]gendurable.InsertParams, twigs)
		for i := range kids {
			kids[i] = k.twig.New(twigArgs{N: i}).With(gendurable.InsertOpts{Queue: "parked"})
		}
		return kids
	})
	trunk := k.fan("trunk", func() []gendurable.InsertParams {
		kids := make([]gendurable.InsertParams, width)
		for i := range kids {
			kids[i] = branch.New(fanState{})
		}
		return kids
	})
	b := setup(t, fastConfig("", trunk, branch, k.twig))
	b.start()
	ctx := context.Background()
	root := b.insert(trunk.New(fanState{}))
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'twig'`) == width*twigs &&
			b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'awaiting_children'`) == 1+width
	}, "the tree was not built")
	b.exec(`CREATE TABLE {{s}}.moves (seq bigserial PRIMARY KEY, id bigint, parent_id bigint, status text)`)
	b.exec(`CREATE FUNCTION {{s}}.record_move() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO {{s}}.moves (id, parent_id, status) VALUES (NEW.id, NEW.parent_id, NEW.status::text);
			RETURN NULL;
		END $$`)
	b.exec(`CREATE TRIGGER record_move AFTER UPDATE ON {{s}}.gendurable_instances
		FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION {{s}}.record_move()`)

	res, err := b.eng.CancelTree(ctx, root, "")
	require.NoError(t, err)
	n := int64(1 + width + width*twigs)
	require.Equal(t, gendurable.BulkResult{Matched: n, Changed: n, ChangedIDs: res.ChangedIDs}, res)
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.moves WHERE status <> 'failed'`), "a parent was woken")
	require.Equal(t, int(n), b.count(`SELECT count(*) FROM {{s}}.moves`))
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.moves AS c JOIN {{s}}.moves AS p ON p.id = c.parent_id WHERE c.seq < p.seq`),
		"a child was cancelled before its parent")
	require.Equal(t, "cancelled by an operator", b.row(root).Errors[0]["error"])
	time.Sleep(300 * time.Millisecond) // time for a wrongly woken parent to run its join
	require.Zero(t, k.joins.Load(), "a cancelled parent ran its join step")
}

// TestCancelTreeOfAFinishedParentAndBadInput: CancelTree of a parent an
// operator cancelled earlier (with Cancel, which left its children running)
// cancels what is still live under it, at any depth — under a failed child
// too — with Cancel's effect on each row (fenced, lease kept, inbox
// consumed); finished members are skipped and keep their results, and
// nothing outside the tree changes. Unknown and non-positive ids are
// refused.
func TestCancelTreeOfAFinishedParentAndBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	_, err := b.eng.CancelTree(ctx, 0, "")
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	require.ErrorIs(t, err, gendurable.ErrNotFound, "as every call on one instance (a probe)")
	require.Contains(t, err.Error(), "(ids are positive)")
	res, err := b.eng.CancelTree(ctx, 987654321, "")
	require.ErrorIs(t, err, gendurable.ErrNotFound)
	require.Equal(t, gendurable.BulkResult{ChangedIDs: []int64{}}, res)

	parent := b.seedRow(`status, finished_at, fanout, children_total, children_pending`, `'failed', now(), 1, 3, 2`)
	running := b.seedRow(`status, parent_id, parent_fanout, claim_token, lease_expires_at, inbox`,
		`'executing', $1, 1, 42, now() + interval '1 minute', '{"go": 1}'`, parent)
	b.exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES ($1, 'go')`, running)
	done := b.seedRow(`status, parent_id, parent_fanout, finished_at, result`, `'done', $1, 1, now(), '{"kept": true}'`, parent)
	failedKid := b.seedRow(`status, parent_id, parent_fanout, finished_at, fanout, children_total, children_pending`,
		`'failed', $1, 1, now(), 1, 1, 1`, parent)
	grandkid := b.seedRow(`status, parent_id, parent_fanout`, `'runnable', $1, 1`, failedKid)
	other := b.seedRow(`status`, `'runnable'`)

	res, err = b.eng.CancelTree(ctx, parent, "stop the rest")
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 5, Changed: 2, Skipped: 3, ChangedIDs: []int64{running, grandkid}}, res)
	r := b.row(running)
	require.Equal(t, "failed", r.Status)
	require.Nil(t, r.Token, "its running step is fenced out")
	require.NotNil(t, r.LeaseExp, "it keeps its running step's lease")
	require.Equal(t, "stop the rest", r.Errors[len(r.Errors)-1]["error"])
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE consumed_at IS NULL`), "its inbox is consumed")
	require.Equal(t, "failed", b.row(grandkid).Status, "a live grandchild under a failed child")
	require.JSONEq(t, `{"kept": true}`, string(b.row(done).Result))
	require.Equal(t, "done", b.row(done).Status)
	require.Equal(t, "runnable", b.row(other).Status, "outside the tree")

	res, err = b.eng.CancelTree(ctx, parent, "")
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 5, Skipped: 5, ChangedIDs: []int64{}}, res, "nothing live is left")
}

// TestCancelRefusesAReasonTextCannotHold: every cancel call refuses a
// reason over MaxReasonBytes or with a NUL byte or invalid UTF-8 with
// ErrInvalidInput before
// changing anything, rather than storing an altered copy.
func TestCancelRefusesAReasonTextCannotHold(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	id := b.seedRow(`status`, `'runnable'`)
	for _, reason := range []string{"stop\x00now", "bad \xff byte", strings.Repeat("r", gendurable.MaxReasonBytes+1)} {
		require.ErrorIs(t, b.eng.Cancel(ctx, id, reason), gendurable.ErrInvalidInput, "%q", reason)
		res, err := b.eng.CancelMany(ctx, []int64{id}, reason)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%q", reason)
		require.Zero(t, res.Changed)
		res, err = b.eng.CancelMatching(ctx, gendurable.ListFilter{All: true}, reason)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%q", reason)
		require.Zero(t, res.Changed)
		res, err = b.eng.CancelTree(ctx, id, reason)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%q", reason)
		require.Zero(t, res.Changed)
	}
	r := b.row(id)
	require.Equal(t, "runnable", r.Status)
	require.Empty(t, r.Errors)
	long := strings.Repeat("é", gendurable.MaxReasonBytes/2)
	require.NoError(t, b.eng.Cancel(ctx, id, long))
	require.Equal(t, long, b.row(id).Errors[0]["error"], "a reason of MaxReasonBytes is stored whole")
}

// stmtTracer records how long each statement of a pool took and how many
// rows it returned.
type stmtTracer struct {
	mu    sync.Mutex
	stmts []tracedStmt
}

type tracedStmt struct {
	sql  string
	took time.Duration
	rows int64
}

type stmtStartKey struct{}

type stmtStart struct {
	sql string
	at  time.Time
}

func (s *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, stmtStartKey{}, stmtStart{sql: d.SQL, at: time.Now()})
}

func (s *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	st, ok := ctx.Value(stmtStartKey{}).(stmtStart)
	if !ok {
		return
	}
	s.mu.Lock()
	s.stmts = append(s.stmts, tracedStmt{sql: st.sql, took: time.Since(st.at), rows: d.CommandTag.RowsAffected()})
	s.mu.Unlock()
}

// TestCancelTreeOfALargeTreeIsBatched: a tree of 100,050 descendants over
// three levels (50 parents of 40 parents of 49 leaves, one leaf in ten
// done) is cancelled in statements of at most BulkBatch rows, none of them
// TestCancelTreeEndsOnACycle: a parent_id cycle (written by hand or by a
// restore; the API makes none) was walked until the context ended — the
// CLI still running after 15 s on a two-instance cycle, blaming a locked
// row. Each instance is visited once now.
func TestCancelTreeEndsOnACycle(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	a := b.seedRow(`status, fanout, children_total, children_pending`, `'runnable', 1, 1, 1`)
	c := b.seedRow(`status, parent_id, parent_fanout, fanout, children_total, children_pending`, `'runnable', $1, 1, 1, 1, 1`, a)
	b.exec(`UPDATE {{s}}.gendurable_instances SET parent_id = $1, parent_fanout = 1 WHERE id = $2`, c, a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := b.eng.CancelTree(ctx, a, "cycle")
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Matched)
	require.ElementsMatch(t, []int64{a, c}, res.ChangedIDs)
}

// long; every live member ends failed. It logs what it measured.
func TestCancelTreeOfALargeTreeIsBatched(t *testing.T) {
	if testing.Short() {
		t.Skip("a tree of 100k instances")
	}
	t.Parallel()
	tr := &stmtTracer{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Tracer: tr})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Logger: testLogger(t)})
	require.NoError(t, err)
	b := &testBundle{t: t, pool: pool, schema: schema, eng: eng}
	ctx := context.Background()
	const cols = `INSERT INTO {{s}}.gendurable_instances (fsm, step, status, finished_at, fanout, children_total, children_pending, parent_id, parent_fanout) `
	root := b.seedRow(`status, fanout, children_total, children_pending`, `'awaiting_children', 1, 50, 50`)
	b.exec(cols+`SELECT 'm', 'a', 'awaiting_children', NULL, 1, 40, 40, $1, 1 FROM generate_series(1, 50)`, root)
	b.exec(cols+`SELECT 'm', 'a', 'awaiting_children', NULL, 1, 49, 49, p.id, 1
		FROM {{s}}.gendurable_instances AS p CROSS JOIN generate_series(1, 40) WHERE p.parent_id = $1`, root)
	b.exec(cols+`SELECT 'm', 'a', (CASE WHEN g % 10 = 0 THEN 'done' ELSE 'runnable' END)::{{s}}.gendurable_status,
		CASE WHEN g % 10 = 0 THEN now() END, 0, 0, 0, p.id, 1
		FROM {{s}}.gendurable_instances AS p CROSS JOIN generate_series(1, 49) AS g
		WHERE p.parent_id IN (SELECT id FROM {{s}}.gendurable_instances WHERE parent_id = $1)`, root)
	b.exec(`ANALYZE {{s}}.gendurable_instances`)
	require.Equal(t, 100_051, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`))
	tr.mu.Lock()
	tr.stmts = nil
	tr.mu.Unlock()

	start := time.Now()
	res, err := eng.CancelTree(ctx, root, "large tree")
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, int64(100_051), res.Matched)
	require.Equal(t, int64(1+50+2000+2000*45), res.Changed)
	require.Equal(t, int64(2000*4), res.Skipped)
	require.True(t, res.Truncated)
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed')`))

	var cancels, reads []tracedStmt
	for _, s := range tr.stmts {
		switch {
		case strings.Contains(s.sql, "'cancelled'"):
			cancels = append(cancels, s)
		case strings.Contains(s.sql, "c.parent_id = u.id"):
			reads = append(reads, s)
		}
	}
	longest := func(ss []tracedStmt) (time.Duration, int64) {
		var d time.Duration
		var rows int64
		for _, s := range ss {
			d, rows = max(d, s.took), max(rows, s.rows)
		}
		return d, rows
	}
	cd, crows := longest(cancels)
	rd, rrows := longest(reads)
	t.Logf("CancelTree of %d instances: %s; %d cancel statements (longest %s, at most %d rows), %d reads (longest %s, at most %d rows)",
		res.Matched, took.Round(time.Millisecond), len(cancels), cd.Round(time.Millisecond), crows, len(reads), rd.Round(time.Millisecond), rrows)
	require.LessOrEqual(t, crows, int64(gendurable.BulkBatch), "a cancel statement changed more than a batch")
	require.GreaterOrEqual(t, len(cancels), int(res.Changed)/gendurable.BulkBatch)
}

// nestState is a level of a nest tree: fan out Width nests until Max, whose
// leaves park awaiting a signal that never comes.
type nestState struct {
	Depth int `json:"depth"`
	Max   int `json:"max"`
	Width int `json:"width"`
}

// nestMachine fans out as nestState says, each spawn step first sleeping a
// few milliseconds (by its id) so fan-outs commit all through a walk; joins
// counts the join steps run. Nothing in a nest tree finishes by itself.
func nestMachine(joins *atomic.Int32) *gendurable.Machine[nestState] {
	m := &gendurable.Machine[nestState]{Name: "nest", Start: "spawn"}
	m.Steps = map[string]gendurable.StepFunc[nestState]{
		"spawn": func(ctx context.Context, r *gendurable.Run[nestState]) (gendurable.Outcome, error) {
			time.Sleep(time.Duration(r.ID*7919%16) * time.Millisecond)
			if r.State.Depth == r.State.Max {
				return r.Await("join", r.State, "never"), nil
			}
			kids := make([]gendurable.InsertParams, r.State.Width)
			for i := range kids {
				kids[i] = m.New(nestState{Depth: r.State.Depth + 1, Max: r.State.Max, Width: r.State.Width})
			}
			return r.ScheduleChildren("join", r.State, kids...), nil
		},
		"join": func(ctx context.Context, r *gendurable.Run[nestState]) (gendurable.Outcome, error) {
			joins.Add(1)
			return gendurable.Done(nil), nil
		},
	}
	return m
}

// treeSize counts the instances of the tree of root, root included.
func (b *testBundle) treeSize(root int64) int {
	return b.count(`WITH RECURSIVE t AS (SELECT id FROM {{s}}.gendurable_instances WHERE id = $1
		UNION ALL SELECT c.id FROM {{s}}.gendurable_instances AS c JOIN t ON c.parent_id = t.id)
		SELECT count(*) FROM t`, root)
}

// TestCancelTreeRacesFanOutsAtEveryLevel: trees of nests (1 + 3 + 9 + 27)
// cancelled while they are being built, at a later moment in each trial, so
// that fan-outs at every level commit before, during and after the walk
// passes their parent, with real workers. Every member the tree ends with
// was found (Matched is the tree's final size) and cancelled by the call;
// nothing of the tree is left live, so no fan-out slipped in after its
// parent was read; no parent ran its join step.
func TestCancelTreeRacesFanOutsAtEveryLevel(t *testing.T) {
	t.Parallel()
	var joins atomic.Int32
	nest := nestMachine(&joins)
	cfg := fastConfig("", nest)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 8, PollInterval: 5 * time.Millisecond, MaxPollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	for trial := range 24 {
		root := b.insert(nest.New(nestState{Max: 3, Width: 3}))
		time.Sleep(time.Duration(trial) * 1500 * time.Microsecond)
		reason := fmt.Sprintf("race %d", trial)
		res, err := b.eng.CancelTree(ctx, root, reason)
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond) // the fenced steps under way return
		size := b.treeSize(root)
		require.Equal(t, int64(size), res.Matched, "trial %d: a member of the tree was not found: %+v", trial, res)
		require.Equal(t, res.Matched, res.Changed, "trial %d: nothing in a nest tree finishes by itself", trial)
		require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed')`),
			"trial %d: a member was left live", trial)
		require.Equal(t, int(res.Changed), b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
			WHERE errors -> -1 ->> 'error' = $1`, reason), "trial %d", trial)
		t.Logf("trial %d: a tree of %d cancelled", trial, size)
	}
	require.Zero(t, joins.Load(), "a cancelled parent ran its join step")
}

// TestCancelTreeOfADeepChain: a chain of 50 nests, one child each, built by
// real workers, its leaf parked; CancelTree of the top cancels all 51, each
// after its parent, and none runs a join step.
func TestCancelTreeOfADeepChain(t *testing.T) {
	t.Parallel()
	var joins atomic.Int32
	nest := nestMachine(&joins)
	b := setup(t, nil, nest)
	b.start()
	ctx := context.Background()
	root := b.insert(nest.New(nestState{Max: 50, Width: 1}))
	eventually(t, 30*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'awaiting_signal'`) == 1
	}, "the chain was not built")
	require.Equal(t, 51, b.treeSize(root))
	res, err := b.eng.CancelTree(ctx, root, "deep")
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 51, Changed: 51, ChangedIDs: res.ChangedIDs}, res)
	// Ids grow down the chain: each was cancelled after its parent.
	require.True(t, slices.IsSorted(res.ChangedIDs), "%v", res.ChangedIDs)
	require.Equal(t, root, res.ChangedIDs[0])
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status <> 'failed'`))
	time.Sleep(300 * time.Millisecond) // time for a wrongly woken parent to run its join
	require.Zero(t, joins.Load())
}

// cutTracer calls cut when the n-th statement whose SQL contains marker
// starts (atStart) or ends.
type cutTracer struct {
	marker  string
	n       int
	atStart bool
	cut     func()
	mu      sync.Mutex
	seen    int
}

func (c *cutTracer) hit(sql string, start bool) {
	if start != c.atStart || !strings.Contains(sql, c.marker) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen++; c.seen == c.n {
		c.cut()
	}
}

func (c *cutTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.hit(d.SQL, true)
	return ctx
}

func (c *cutTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {}

// TestCancelTreeStoppedMidWalk: a root over 3 parents of 600 parked leaves,
// its CancelTree's context cancelled as the walk's 5th cancel statement (the
// second batch of leaves) or its 2nd read of children (the leaves') starts.
// The call returns ctx's error and a result that is exactly what the
// database holds: the statement under way ran to its end and is counted,
// nothing after it ran, and every member cancelled has its parent cancelled
// (parents first, even when cut short). A second CancelTree finishes the job.
func TestCancelTreeStoppedMidWalk(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		marker  string
		n       int
		changed int64
	}{
		{"in a cancel", "'cancelled'", 4, 1 + 3 + 2*gendurable.BulkBatch},
		{"in a read", "c.parent_id = u.id", 2, 1 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tr := &cutTracer{marker: tc.marker, n: tc.n, atStart: true, cut: cancel}
			pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Tracer: tr})
			eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Logger: testLogger(t)})
			require.NoError(t, err)
			b := &testBundle{t: t, pool: pool, schema: schema, eng: eng}
			root := b.seedRow(`status, fanout, children_total, children_pending`, `'awaiting_children', 1, 3, 3`)
			b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, fanout, children_total, children_pending, parent_id, parent_fanout)
				SELECT 'm', 'a', 'awaiting_children', 1, 600, 600, $1, 1 FROM generate_series(1, 3)`, root)
			b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, queue, parent_id, parent_fanout)
				SELECT 'm', 'a', 'runnable', 'parked', p.id, 1
				FROM {{s}}.gendurable_instances AS p CROSS JOIN generate_series(1, 600) WHERE p.parent_id = $1`, root)

			res, err := eng.CancelTree(ctx, root, "cut")
			require.ErrorIs(t, err, context.Canceled)
			require.Equal(t, tc.changed, res.Changed, "%+v", res)
			require.Equal(t, res.Changed, res.Matched)
			require.Equal(t, int(res.Changed), b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'failed'`),
				"the result counts what the database holds")
			require.Equal(t, min(int(res.Changed), gendurable.MaxBulkIDs), len(res.ChangedIDs))
			require.Equal(t, len(res.ChangedIDs), b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
				WHERE status = 'failed' AND id = ANY ($1)`, res.ChangedIDs))
			require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances AS c
				JOIN {{s}}.gendurable_instances AS p ON p.id = c.parent_id WHERE c.status = 'failed' AND p.status <> 'failed'`),
				"a member was cancelled before its parent")

			res, err = eng.CancelTree(context.Background(), root, "cut")
			require.NoError(t, err)
			require.Equal(t, int64(1+3+1800), res.Matched)
			require.Equal(t, 1+3+1800-tc.changed, res.Changed)
			require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status <> 'failed'`))
		})
	}
}

// TestCancelTreeThenRetryManyOfAKeyedTree: a parent over two children of
// one partition key, in a queue with a GlobalConcurrency of 1, cancelled as
// a tree while the first child runs, then retried at once, tree and all
// (RetryMany of the ids CancelTree changed). The fenced step keeps its key's
// slot and its queue's place until its lease ends: its retried row and its
// sibling wait, so never do two steps of the key (or the queue) run at
// once; the retried parent awaits its retried children again, and joins
// once, seeing both done.
func TestCancelTreeThenRetryManyOfAKeyedTree(t *testing.T) {
	t.Parallel()
	g := newKeyGauge()
	started := make(chan int64, 8)
	kid := &gendurable.Job[spanArgs]{Name: "keyedkid", Perform: func(ctx context.Context, r *gendurable.Run[spanArgs]) error {
		g.enter(r.PartitionKey)
		defer g.leave(r.PartitionKey)
		started <- r.ID
		select {
		case <-ctx.Done(): // fenced: seen at the worker's next heartbeat
			return ctx.Err()
		case <-time.After(time.Second):
			return nil
		}
	}}
	var joins atomic.Int32
	parent := &gendurable.Machine[fanState]{Name: "keyedparent", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				opts := gendurable.InsertOpts{Queue: "kq", PartitionKey: "K"}
				return r.ScheduleChildren("join", r.State, kid.New(spanArgs{}).With(opts), kid.New(spanArgs{}).With(opts)), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				joins.Add(1)
				done := 0
				for _, c := range r.Children {
					if c.Status == gendurable.StatusDone {
						done++
					}
				}
				return gendurable.Done(done), nil
			},
		}}
	cfg := fastConfig("", parent, kid) // lease 3s, heartbeat 1s
	cfg.Queues["kq"] = gendurable.QueueConfig{Concurrency: 4, GlobalConcurrency: 1,
		PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	root := b.insert(parent.New(fanState{}))
	first := <-started
	res, err := b.eng.CancelTree(ctx, root, "tree")
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Changed, "%+v", res)
	r := b.row(first)
	require.NotNil(t, r.LeaseExp, "the fenced step keeps its lease")
	retried, err := b.eng.RetryMany(ctx, res.ChangedIDs)
	require.NoError(t, err)
	require.Equal(t, int64(3), retried.Changed, "%+v", retried)
	require.Equal(t, "awaiting_children", b.row(root).Status, "the retried parent awaits its retried children")

	r = b.waitStatus(root, "done", 20*time.Second)
	require.JSONEq(t, `2`, string(r.Result), "both children done")
	require.Equal(t, int32(1), joins.Load())
	require.Equal(t, 1, g.max("K"), "two steps of key K ran at once")
}

// TestCancelTreeRacesOtherCancelsAndPrune: a tree of 3,011 parked instances
// (a root over 10 parents of 300 leaves), cancelled in two races. First by
// two CancelTree calls, a CancelMatching of its queue and a CancelMany of
// its newest 1,000 ids (children first) at once: their statements lock
// overlapping rows in different orders (a cancel also updates the parent of
// each row it cancels); each call ends without error, and every instance is
// cancelled by exactly one of them. Then by one CancelTree while prunes with
// no retention delete what it has finished meanwhile: the walk still
// reaches and cancels every member (it reads children by their parent's id,
// whether the parent is still there or not). Either way none is left live.
func TestCancelTreeRacesOtherCancelsAndPrune(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for _, withPrune := range []bool{false, true} {
		for trial := range 3 {
			root := b.seedRow(`status, queue, fanout, children_total, children_pending`, `'awaiting_children', 'parked', 1, 10, 10`)
			b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, queue, fanout, children_total, children_pending, parent_id, parent_fanout)
				SELECT 'm', 'a', 'awaiting_children', 'parked', 1, 300, 300, $1, 1 FROM generate_series(1, 10)`, root)
			b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, queue, parent_id, parent_fanout)
				SELECT 'm', 'a', 'runnable', 'parked', p.id, 1
				FROM {{s}}.gendurable_instances AS p CROSS JOIN generate_series(1, 300) WHERE p.parent_id = $1`, root)
			rows, err := b.pool.Query(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances ORDER BY id DESC LIMIT 1000`, b.schema))
			require.NoError(t, err)
			newest, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)

			var changed, pruned atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			start := make(chan struct{})
			run := func(f func() (gendurable.BulkResult, error)) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					res, err := f()
					changed.Add(res.Changed)
					errs <- err
				}()
			}
			run(func() (gendurable.BulkResult, error) { return b.eng.CancelTree(ctx, root, "tree") })
			if withPrune {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range 30 {
						n, err := b.eng.Prune(ctx, 0, nil)
						if err != nil {
							errs <- err
							return
						}
						pruned.Add(n)
					}
				}()
			} else {
				run(func() (gendurable.BulkResult, error) { return b.eng.CancelTree(ctx, root, "tree") })
				run(func() (gendurable.BulkResult, error) {
					return b.eng.CancelMatching(ctx, gendurable.ListFilter{Queue: "parked"}, "matching")
				})
				run(func() (gendurable.BulkResult, error) { return b.eng.CancelMany(ctx, newest, "many") })
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err, "prune %v, trial %d", withPrune, trial)
			}
			require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status <> 'failed'`), "prune %v, trial %d", withPrune, trial)
			require.Equal(t, int64(3011), changed.Load(), "prune %v, trial %d: each instance cancelled once", withPrune, trial)
			t.Logf("prune %v, trial %d: %d pruned by the prunes", withPrune, trial, pruned.Load())
			b.exec(`DELETE FROM {{s}}.gendurable_instances`)
		}
	}
}

// TestOperatorStormKeepsTheJoinCounts: eight sessions retry and cancel at
// random — RetryMany, Retry, CancelMany, Cancel, CancelTree — over 30
// families of a failed parent with three failed children and a live one,
// with no worker running. Afterwards every parent awaiting its children
// counts exactly its live children, and no call failed but for the
// instance's status (not failed, already finished): no deadlock reaches an
// operator. Without the parent's lock in a retry, a child and its parent
// retried at once by two sessions left the parent counting a child less
// than were live (TestRetryOfAChildRacingTheRetryOfItsParent lines that up).
func TestOperatorStormKeepsTheJoinCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var all []int64
	for range 30 {
		p := b.seedRow(`status, finished_at, fanout, children_total, children_pending`, `'failed', now(), 1, 4, 4`)
		all = append(all, p)
		for k := range 4 {
			st := `'failed', now()`
			if k == 3 {
				st = `'runnable', NULL`
			}
			all = append(all, b.seedRow(`status, finished_at, parent_id, parent_fanout, eligible_at`,
				st+`, $1, 1, now() + interval '1 hour'`, p))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for s := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(s), 1))
			for range 20 {
				ids := make([]int64, 8)
				for i := range ids {
					ids[i] = all[r.IntN(len(all))]
				}
				var err error
				one := func(f func(id int64) error) {
					for _, id := range ids {
						if e := f(id); e != nil && !errors.Is(e, gendurable.ErrNotRetryable) && !errors.Is(e, gendurable.ErrNotCancellable) {
							errs <- e
						}
					}
				}
				switch s % 4 {
				case 0:
					_, err = b.eng.RetryMany(ctx, ids)
				case 1:
					one(func(id int64) error { return b.eng.Retry(ctx, id) })
				case 2:
					_, err = b.eng.CancelMany(ctx, ids, "storm")
					if err == nil && r.IntN(3) == 0 {
						_, err = b.eng.CancelTree(ctx, ids[0], "storm")
					}
				case 3:
					one(func(id int64) error { return b.eng.Cancel(ctx, id, "storm") })
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("an operator call failed: %v", err)
	}
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances AS p
		WHERE p.fanout > 0 AND p.status = 'awaiting_children' AND p.children_pending <> (
			SELECT count(*) FROM {{s}}.gendurable_instances AS c
			WHERE c.parent_id = p.id AND c.parent_fanout = p.fanout AND c.status NOT IN ('done', 'failed'))`),
		"parents awaiting a count of children other than their live ones")
}

// TestABulkStatementDeadlockedAfterItsCallEndedRunsAgain: a bulk statement
// that waited on a row lock while the call's context ended (a deadline
// passed, as a probe of operator calls racing workers saw it; here a
// cancel), and that PostgreSQL then ended in a deadlock, returned the
// server's 40P01 with nothing changed: it was tried again only while the
// caller's context lived, though the statement itself runs on (for
// BulkStatementGrace past a deadline). It runs again in its own time now.
func TestABulkStatementDeadlockedAfterItsCallEndedRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var a, c int64
	require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, finished_at)
		VALUES ('m', 'a', 'failed', now()) RETURNING id`, b.schema)).Scan(&a))
	require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, finished_at)
		VALUES ('m', 'a', 'failed', now()) RETURNING id`, b.schema)).Scan(&c))
	// Another transaction holds c; the retry locks a, then waits for c;
	// the other transaction then asks for a: a deadlock, which the retry's
	// backend (waiting longest) detects after deadlock_timeout and loses.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, replaceSchema(`SELECT 1 FROM {{s}}.gendurable_instances WHERE id = $1 FOR UPDATE`, b.schema), c)
	require.NoError(t, err)
	type result struct {
		res gendurable.BulkResult
		err error
	}
	done := make(chan result, 1)
	// The call's context ends once its statement waits (a fixed deadline
	// could pass before the statement began on a loaded machine, and the
	// call would then start none).
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		res, err := b.eng.RetryMany(dctx, []int64{a, c})
		done <- result{res, err}
	}()
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, b.schema) > 0
	}, "the retry waits for c")
	cancel()
	_, err = tx.Exec(ctx, replaceSchema(`SELECT 1 FROM {{s}}.gendurable_instances WHERE id = $1 FOR UPDATE`, b.schema), a)
	require.NoError(t, err, "the retry's statement lost the deadlock")
	require.NoError(t, tx.Rollback(ctx))
	r := <-done
	require.NoError(t, r.err, "run again within the grace, the statement retried both")
	require.EqualValues(t, 2, r.res.Changed, "%+v", r.res)
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'failed'`))
}

// TestCancelMatchingSkipsARowThatStoppedMatchingWhileItWaited: a bulk
// cancel by filter leaves alone a row that no longer matches once it holds
// its lock. Here a transaction wakes one of two parked rows (as a SignalTx
// does) and commits while the cancel of "every row awaiting a signal" waits
// for that row: the woken row is runnable, not awaiting, and is skipped
// (a probe saw it cancelled, its signal swept with it, and runnable rows
// claimed meanwhile cancelled under their workers).
func TestCancelMatchingSkipsARowThatStoppedMatchingWhileItWaited(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var woken, parked int64
	for _, id := range []*int64{&woken, &parked} {
		require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, awaits)
			VALUES ('m', 'a', 'awaiting_signal', '{go}') RETURNING id`, b.schema)).Scan(id))
	}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, replaceSchema(`UPDATE {{s}}.gendurable_instances SET status = 'runnable', awaits = '{}' WHERE id = $1`, b.schema), woken)
	require.NoError(t, err)
	type result struct {
		res gendurable.BulkResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := b.eng.CancelMatching(ctx, gendurable.ListFilter{Status: gendurable.StatusAwaitingSignal}, "only the parked ones")
		done <- result{res, err}
	}()
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, b.schema) > 0
	}, "the cancel waits for the woken row")
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, []int64{parked}, r.res.ChangedIDs, "%+v", r.res)
	require.EqualValues(t, 2, r.res.Matched, "%+v", r.res)
	require.EqualValues(t, 1, r.res.Skipped, "%+v", r.res)
	require.Equal(t, "runnable", b.row(woken).Status, "the woken row was not cancelled")
	require.Equal(t, "failed", b.row(parked).Status)
}
