package committer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/committer"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
	"github.com/stretchr/testify/require"
)

// batchTracer records how many outcomes each outcome statement carried (the
// fixture resets it after its pick, whose statement has a "locked" CTE too).
type batchTracer struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "WITH locked AS") {
		return ctx
	}
	n := -1
	for _, a := range d.Args { // the first bigint array is the outcomes' ids
		if ids, ok := a.([]int64); ok {
			n = len(ids)
			break
		}
	}
	b.mu.Lock()
	b.sizes = append(b.sizes, n)
	b.mu.Unlock()
	return ctx
}

func (b *batchTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// statements is the number of outcome statements so far.
func (b *batchTracer) statements() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sizes)
}

func (b *batchTracer) reset() {
	b.mu.Lock()
	b.sizes = nil
	b.mu.Unlock()
}

func (b *batchTracer) batches() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.sizes...)
}

// fixture is a migrated schema holding claimed (executing) rows.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	q      *sqlq.Queries
	tracer *batchTracer
	claims []sqlq.Claimed
}

// newFixture inserts n rows and claims them all with a one-minute lease.
func newFixture(t *testing.T, n int) *fixture {
	t.Helper()
	tracer := &batchTracer{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4, Tracer: tracer})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	rows := make([]sqlq.NewInstance, n)
	for i := range rows {
		rows[i] = sqlq.NewInstance{FSM: "m", Version: 1, Queue: "default", Step: "a", State: `{}`, MaxAttempts: 5}
	}
	_, err = q.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	picked, err := q.Pick(ctx, pool, "default", sqlq.PickOpts{Limit: n, Lease: time.Minute})
	claims := picked.Claimed
	require.NoError(t, err)
	require.Len(t, claims, n)
	tracer.reset()
	return &fixture{t: t, pool: pool, schema: schema, q: q, tracer: tracer, claims: claims}
}

func (f *fixture) committer(cfg committer.Config) *committer.Committer {
	if cfg.Lease == 0 {
		cfg.Lease = time.Minute
	}
	return committer.New(cfg, f.q, f.pool)
}

// instance is a row as these tests read it.
type instance struct {
	Status string
	Step   string
	State  string
	Token  *int64
	Errors []map[string]any
}

func (f *fixture) row(id int64) instance {
	f.t.Helper()
	var r instance
	var errs []byte
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT status::text, step, state::text, claim_token, errors
		FROM `+f.schema+`.gendurable_instances WHERE id = $1`, id).Scan(&r.Status, &r.Step, &r.State, &r.Token, &errs))
	require.NoError(f.t, json.Unmarshal(errs, &r.Errors))
	return r
}

// hold locks the row of id in a transaction of its own, so an outcome
// statement that includes it waits; the returned function lets it go.
func (f *fixture) hold(id int64) (release func()) {
	release, _ = f.holdPID(id)
	return release
}

// holdPID is hold, with the server process id of the holding transaction.
func (f *fixture) holdPID(id int64) (release func(), pid uint32) {
	f.t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(f.t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+f.schema+`.gendurable_instances WHERE id = $1 FOR UPDATE`, id)
	require.NoError(f.t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	f.t.Cleanup(release)
	return release, tx.Conn().PgConn().PID()
}

// waitingOn counts the sessions waiting for a lock the server process pid
// holds.
func (f *fixture) waitingOn(pid uint32) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))`, int(pid)).Scan(&n))
	return n
}

// waitStatements waits until n outcome statements have started.
func (f *fixture) waitStatements(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.tracer.statements() < n {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d outcome statements started, want %d", f.tracer.statements(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func str(s string) *string { return &s }

// done is an outcome finishing claim c.
func done(c sqlq.Claimed) *sqlq.Outcome {
	return &sqlq.Outcome{ID: c.ID, Token: c.Token, Kind: sqlq.KindDone, Result: str(`{}`)}
}

// receive is the next value of ch, failing the test if none comes within d.
func receive[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %v", what, d)
	}
	panic("unreachable")
}

// next is an outcome moving claim c to step b with state {"i": i}.
func next(c sqlq.Claimed, i int) *sqlq.Outcome {
	return &sqlq.Outcome{ID: c.ID, Token: c.Token, Kind: sqlq.KindNext, Step: str("b"), State: str(fmt.Sprintf(`{"i": %d}`, i))}
}

func TestCommitAppliesAndReturnsApplied(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	c := f.committer(committer.Config{})
	res := c.Commit(&sqlq.Outcome{ID: f.claims[0].ID, Token: f.claims[0].Token, Kind: sqlq.KindDone, Result: str(`{"ok": true}`)})
	require.NoError(t, res.Err)
	require.NotNil(t, res.Applied)
	require.Equal(t, f.claims[0].ID, res.Applied.ID)
	require.Equal(t, "done", res.Applied.Status)
	require.Equal(t, "default", res.Applied.Queue)
	r := f.row(f.claims[0].ID)
	require.Equal(t, "done", r.Status)
	require.Nil(t, r.Token, "the claim is released")
	require.Equal(t, []int{1}, f.tracer.batches(), "one outcome, one statement")
}

// TestConcurrentCommitsAreGroupCommitted: outcomes committed from many
// goroutines while a statement is in flight share the next statements, and
// each caller gets its own row's result.
func TestConcurrentCommitsAreGroupCommitted(t *testing.T) {
	t.Parallel()
	const n = 100
	f := newFixture(t, n)
	c := f.committer(committer.Config{MaxInFlight: 1})
	// The first outcome's statement waits on a row lock: the others queue
	// up behind it meanwhile.
	release := f.hold(f.claims[0].ID)
	results := make([]committer.Result, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		results[0] = c.Commit(next(f.claims[0], 0))
	}()
	f.waitStatements(1)
	var started sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			started.Done()
			results[i] = c.Commit(next(f.claims[i], i))
		}()
	}
	started.Wait()
	time.Sleep(100 * time.Millisecond) // each goroutine has queued its outcome
	release()
	wg.Wait()

	for i, res := range results {
		require.NoError(t, res.Err, "outcome %d", i)
		require.NotNil(t, res.Applied, "outcome %d", i)
		require.Equal(t, f.claims[i].ID, res.Applied.ID, "caller %d got another row's result", i)
		require.Equal(t, "runnable", res.Applied.Status)
		r := f.row(f.claims[i].ID)
		require.Equal(t, "b", r.Step)
		require.JSONEq(t, fmt.Sprintf(`{"i": %d}`, i), r.State)
	}
	batches := f.tracer.batches()
	t.Logf("%d outcomes in %d statements: %v", n, len(batches), batches)
	require.Less(t, len(batches), n, "outcomes share statements")
	require.GreaterOrEqual(t, slices.Max(batches), n/2, "the outcomes queued behind the first went in one statement (bar stragglers)")
}

// TestFencedOutOutcomeChangesNothing: an outcome whose claim token no
// longer matches is dropped whole: nil Applied, nil Err, the row unchanged.
func TestFencedOutOutcomeChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	c := f.committer(committer.Config{})
	cl := f.claims[0]
	before := f.row(cl.ID)
	res := c.Commit(&sqlq.Outcome{ID: cl.ID, Token: cl.Token + 1000, Kind: sqlq.KindDone, Result: str(`{"zombie": true}`)})
	require.NoError(t, res.Err)
	require.Nil(t, res.Applied, "a fenced-out outcome is not applied")
	after := f.row(cl.ID)
	require.Equal(t, before, after, "the row is unchanged")
	require.Equal(t, "executing", after.Status)
	require.Equal(t, cl.Token, *after.Token)
}

// TestRejectedOutcomeStopsOnlyItself: an outcome the database refuses
// (jsonb cannot store \u0000) in one batch with good outcomes becomes a
// Stop recording the reason; the others apply as they were, the batch
// halved down to the rejected one (each outcome alone took a statement of
// its own: 34 statements here, where halving takes 12).
func TestRejectedOutcomeStopsOnlyItself(t *testing.T) {
	t.Parallel()
	const n, bad = 33, 5
	f := newFixture(t, n)
	c := f.committer(committer.Config{MaxInFlight: 1})
	release := f.hold(f.claims[0].ID)
	results := make([]chan committer.Result, n)
	for i := range results {
		results[i] = make(chan committer.Result, 1)
	}
	commit := func(i int) {
		o := next(f.claims[i], i)
		if i == bad {
			o.State = str(`{"name": "nul\u0000"}`)
		}
		c.CommitAsync(o, func(r committer.Result) { results[i] <- r })
	}
	commit(0)
	f.waitStatements(1)
	for i := 1; i < n; i++ { // queued behind the first: one batch
		commit(i)
	}
	release()

	for i := range results {
		res := receive(t, results[i], 10*time.Second, fmt.Sprintf("outcome %d", i))
		require.NoError(t, res.Err, "outcome %d", i)
		require.NotNil(t, res.Applied, "outcome %d", i)
		require.Equal(t, f.claims[i].ID, res.Applied.ID)
		r := f.row(f.claims[i].ID)
		if i == bad {
			require.Equal(t, "failed", res.Applied.Status)
			require.Equal(t, "failed", r.Status)
			require.Equal(t, "a", r.Step, "the rejected Next did not move the step")
			require.Len(t, r.Errors, 1)
			require.Equal(t, "outcome_rejected", r.Errors[0]["kind"])
			require.Contains(t, r.Errors[0]["error"], "outcome rejected by the database")
			continue
		}
		require.Equal(t, "runnable", res.Applied.Status, "outcome %d", i)
		require.Equal(t, "b", r.Step)
		require.JSONEq(t, fmt.Sprintf(`{"i": %d}`, i), r.State)
		require.Empty(t, r.Errors)
	}
	batches := f.tracer.batches()
	t.Logf("outcome statements: %v", batches)
	require.Equal(t, n-1, batches[1], "the good outcomes and the rejected one were tried in one statement")
	// The batch of 32, two halves at each of five levels, the rejected one's Stop.
	require.LessOrEqual(t, len(batches)-1, 1+2*5+1, "statements after the first")
}

// TestCommitAsyncCallsBackOnce: CommitAsync does not wait, and calls its
// callback exactly once with the outcome's result.
func TestCommitAsyncCallsBackOnce(t *testing.T) {
	t.Parallel()
	const n = 20
	f := newFixture(t, n)
	c := f.committer(committer.Config{})
	var calls [n]atomic.Int32
	got := make(chan committer.Result, 2*n)
	for i, cl := range f.claims {
		c.CommitAsync(next(cl, i), func(r committer.Result) {
			calls[i].Add(1)
			got <- r
		})
	}
	seen := map[int64]bool{}
	for range n {
		select {
		case r := <-got:
			require.NoError(t, r.Err)
			require.NotNil(t, r.Applied)
			require.False(t, seen[r.Applied.ID], "row %d reported twice", r.Applied.ID)
			seen[r.Applied.ID] = true
		case <-time.After(10 * time.Second):
			t.Fatal("a callback was never called")
		}
	}
	// A later commit flushes after them: no callback runs again.
	res := c.Commit(&sqlq.Outcome{ID: f.claims[0].ID, Token: f.claims[0].Token, Kind: sqlq.KindDone})
	require.NoError(t, res.Err)
	require.Nil(t, res.Applied, "the first outcome released the claim")
	time.Sleep(20 * time.Millisecond)
	for i := range calls {
		require.Equal(t, int32(1), calls[i].Load(), "callback %d", i)
	}
	require.Empty(t, got)
}

// TestMaxBatchBoundsAStatement: outcomes queued behind a statement in
// flight go in statements of at most MaxBatch outcomes.
func TestMaxBatchBoundsAStatement(t *testing.T) {
	t.Parallel()
	const n, maxBatch = 36, 10
	f := newFixture(t, n)
	c := f.committer(committer.Config{MaxBatch: maxBatch, MaxInFlight: 1})
	release := f.hold(f.claims[0].ID)
	var done sync.WaitGroup
	var failed atomic.Int32
	for i, cl := range f.claims {
		done.Add(1)
		c.CommitAsync(next(cl, i), func(r committer.Result) {
			if r.Err != nil || r.Applied == nil {
				failed.Add(1)
			}
			done.Done()
		})
		if i == 0 {
			f.waitStatements(1)
		}
	}
	release()
	done.Wait()
	require.Zero(t, failed.Load())
	require.Equal(t, []int{1, 10, 10, 10, 5}, f.tracer.batches(), "the first alone, then the 35 queued behind it in batches of MaxBatch")
}

// TestTwoClaimsOfOneInstanceGetTheirOwnResults: a fenced-out step's
// outcome (a stale token) and the current claim's outcome of the same
// instance, queued into one batch, each get their own answer: the current
// one is applied, the stale one is fenced out — not both told the current
// one's result.
func TestTwoClaimsOfOneInstanceGetTheirOwnResults(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.committer(committer.Config{MaxInFlight: 1})
	release := f.hold(f.claims[1].ID)
	first := make(chan committer.Result, 1)
	c.CommitAsync(next(f.claims[1], 1), func(r committer.Result) { first <- r })
	f.waitStatements(1)
	cl := f.claims[0]
	stale, live := make(chan committer.Result, 1), make(chan committer.Result, 1)
	c.CommitAsync(&sqlq.Outcome{ID: cl.ID, Token: cl.Token - 1000, Kind: sqlq.KindDone, Result: str(`{"zombie": true}`)},
		func(r committer.Result) { stale <- r })
	c.CommitAsync(next(cl, 7), func(r committer.Result) { live <- r }) // queued behind the first: one batch
	release()
	for _, ch := range []chan committer.Result{first, stale, live} {
		select {
		case r := <-ch:
			ch <- r
		case <-time.After(10 * time.Second):
			t.Fatal("no result")
		}
	}
	s, l := <-stale, <-live
	require.NoError(t, s.Err)
	require.Nil(t, s.Applied, "the stale claim's outcome is fenced out")
	require.NoError(t, l.Err)
	require.NotNil(t, l.Applied, "the current claim's outcome is applied")
	require.Equal(t, "runnable", l.Applied.Status)
	r := f.row(cl.ID)
	require.Equal(t, "runnable", r.Status)
	require.JSONEq(t, `{"i": 7}`, r.State)
}

// TestClosedPoolGivesUpAtOnce: an outcome committed after the application
// closed the pool (a step that ignored its cancel returned after Stop) is
// given up at once with the pool's error, not retried until its lease (a
// minute here) runs out.
func TestClosedPoolGivesUpAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	closed, err := pgxpool.NewWithConfig(context.Background(), f.pool.Config().Copy())
	require.NoError(t, err)
	closed.Close()
	c := committer.New(committer.Config{Lease: time.Minute}, f.q, closed)
	t0 := time.Now()
	res := c.Commit(done(f.claims[0]))
	require.ErrorIs(t, res.Err, puddle.ErrClosedPool)
	require.Less(t, time.Since(t0), 10*time.Second, "retried a closed pool")
	require.Equal(t, "executing", f.row(f.claims[0].ID).Status)
}

// TestAnOutcomeRefusedEveryTimeIsNotMaybeWritten: an outcome whose every
// attempt the server refused (here a read-only database: SQLSTATE 25006,
// retried as a state that may pass) is given up without "it may have been
// written" — nothing was — and its row is as it was. An outage probe saw
// that message after definite refusals only.
func TestAnOutcomeRefusedEveryTimeIsNotMaybeWritten(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	cfg := f.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	ro, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(ro.Close)
	c := committer.New(committer.Config{Lease: 2 * time.Second}, f.q, ro)
	res := c.Commit(done(f.claims[0]))
	require.Error(t, res.Err)
	require.ErrorContains(t, res.Err, "read-only")
	require.NotErrorIs(t, res.Err, committer.ErrMaybeWritten)
	require.Equal(t, "executing", f.row(f.claims[0].ID).Status)
}

// TestAbortGivesUpOutcomesUntilResume: an outcome whose statement waits on
// the database (here on a row lock; in an engine's Stop out of time, on a
// network cut off) is given up at once by Abort, with ErrAborted, instead
// of being retried for up to its lease (a minute here); so is every
// outcome until Resume, after which outcomes are written again.
func TestAbortGivesUpOutcomesUntilResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.committer(committer.Config{})
	release := f.hold(f.claims[0].ID)
	got := make(chan committer.Result, 1)
	go func() {
		got <- c.Commit(done(f.claims[0]))
	}()
	f.waitStatements(1)
	t0 := time.Now()
	c.Abort()
	select {
	case res := <-got:
		require.ErrorIs(t, res.Err, committer.ErrAborted)
		require.Nil(t, res.Applied)
		require.Less(t, time.Since(t0), 2*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("the aborted outcome was not given up")
	}
	release()
	require.Equal(t, "executing", f.row(f.claims[0].ID).Status, "the row keeps its claim, for the reaper")
	res := c.Commit(done(f.claims[1]))
	require.ErrorIs(t, res.Err, committer.ErrAborted, "aborted until Resume")
	c.Resume()
	res = c.Commit(done(f.claims[1]))
	require.NoError(t, res.Err)
	require.NotNil(t, res.Applied)
	require.Equal(t, "done", f.row(f.claims[1].ID).Status)
}

// swallowFirst is a DB whose first statement is swallowed by a connection
// that never answers (a network that drops traffic without closing
// anything): it returns only when its context ends. Later statements go
// through.
type swallowFirst struct {
	sqlq.DB
	once sync.Once
}

func (s *swallowFirst) swallowed(ctx context.Context) bool {
	first := false
	s.once.Do(func() { first = true })
	if first {
		<-ctx.Done()
	}
	return first
}

func (s *swallowFirst) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.swallowed(ctx) {
		return nil, ctx.Err()
	}
	return s.DB.Query(ctx, sql, args...)
}

func (s *swallowFirst) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.swallowed(ctx) {
		return errRow{ctx.Err()}
	}
	return s.DB.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// TestASwallowedStatementIsSentAgainWithinTheLease: an outcome statement
// whose connection never answers is given up after half the lease and
// sent again, so the outcome is written within the lease. Before, the one
// attempt had the whole lease: the committer gave up when it ended, and
// the step ran again (with MaxAttempts 1 the instance failed though its
// step had finished; a probe's stranded connection).
func TestASwallowedStatementIsSentAgainWithinTheLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	const lease = 2 * time.Second
	c := committer.New(committer.Config{Lease: lease}, f.q, &swallowFirst{DB: f.pool})
	start := time.Now()
	res := c.Commit(done(f.claims[0]))
	took := time.Since(start)
	t.Logf("written %v after the commit began (lease %v)", took.Round(time.Millisecond), lease)
	require.NoError(t, res.Err)
	require.NotNil(t, res.Applied, "written, not fenced out")
	require.Equal(t, "done", f.row(f.claims[0].ID).Status)
	require.Less(t, took, lease, "within the lease")
}

// gateFirst is a DB whose first statement, once it arrived, waits for open
// to be closed before it is sent: the outcomes committed meanwhile queue up
// behind it.
type gateFirst struct {
	sqlq.DB
	once          sync.Once
	arrived, open chan struct{}
}

func (g *gateFirst) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	g.once.Do(func() {
		close(g.arrived)
		<-g.open
	})
	return g.DB.Query(ctx, sql, args...)
}

// TestABatchDoesNotWaitForARowLockedElsewhere: a batch holding the outcome
// of a row another transaction keeps locked (a caller's open SignalTx, an
// operator cut off mid-transaction) is split when its statement runs out of
// LockWait: the other outcomes are written at once, in one statement, and the waiting one on
// its own once the lock goes, though that is more than a lease later (its
// claim is heartbeated meanwhile). Before, the whole batch waited on the lock,
// and when it outlasted the lease every outcome of the batch failed (a
// probe: 10 of 12 unrelated jobs with MaxAttempts 1 failed).
func TestABatchDoesNotWaitForARowLockedElsewhere(t *testing.T) {
	t.Parallel()
	const n, lease, held = 12, 2 * time.Second, 4500 * time.Millisecond
	f := newFixture(t, n)
	gate := &gateFirst{DB: f.pool, arrived: make(chan struct{}), open: make(chan struct{})}
	c := committer.New(committer.Config{Lease: lease, MaxInFlight: 1}, f.q, gate)
	release := f.hold(f.claims[1].ID)
	results := make([]chan committer.Result, n)
	took := make([]time.Duration, n)
	start := time.Now()
	for i := range results {
		results[i] = make(chan committer.Result, 1)
		c.CommitAsync(done(f.claims[i]),
			func(r committer.Result) { took[i] = time.Since(start); results[i] <- r })
		if i == 0 {
			<-gate.arrived
		}
	}
	close(gate.open) // the other 11, one held, go in one batch
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(held)
		released <- time.Now()
		release()
	}()
	for i := range results {
		res := receive(t, results[i], 15*time.Second, fmt.Sprintf("outcome %d", i))
		require.NoError(t, res.Err, "outcome %d (after %v)", i, took[i])
		require.NotNil(t, res.Applied, "outcome %d", i)
		require.Equal(t, "done", f.row(f.claims[i].ID).Status, "outcome %d", i)
	}
	rel := <-released
	for i := range n {
		if i == 1 {
			require.Greater(t, took[i], rel.Sub(start), "the held row's outcome waits for the lock")
			continue
		}
		require.Less(t, took[i], lease, "outcome %d is not held up by the locked row", i)
	}
	batches := f.tracer.batches()
	t.Logf("outcome statements: %v; took %v", batches, took)
	require.Equal(t, []int{1, n - 1, n - 2}, batches[:3],
		"the outcomes queued behind the first went in one statement, and all but the held one in the next")
}

// TestParkedOutcomesDoNotWaitForEachOther: two parked outcomes, each
// waiting on a row another transaction holds: the one whose lock goes
// first is written then, while the other still waits — past its lease,
// and is written once its own lock goes. Neither statement sits on its row
// between rounds (a heartbeat passes over a locked row: the lease would not
// be extended).
func TestParkedOutcomesDoNotWaitForEachOther(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	f := newFixture(t, 2)
	c := committer.New(committer.Config{Lease: lease}, f.q, f.pool)
	releaseLong, holderLong := f.holdPID(f.claims[0].ID)
	releaseShort := f.hold(f.claims[1].ID)
	results := make([]chan time.Duration, 2)
	start := time.Now()
	for i := range results {
		results[i] = make(chan time.Duration, 1)
		c.CommitAsync(done(f.claims[i]),
			func(r committer.Result) {
				if r.Err != nil || r.Applied == nil {
					t.Errorf("outcome %d: %+v", i, r)
				}
				results[i] <- time.Since(start)
			})
	}
	time.Sleep(time.Second)
	releaseShort()
	shortAt := time.Since(start)
	short := receive(t, results[1], 5*time.Second, "the outcome whose lock went")
	require.Greater(t, short, shortAt)
	require.Less(t, short, shortAt+lease/2, "written within a round or two of its lock going")
	// Parked, the other's statements do not sit waiting on its lock: the
	// committer looks (without waiting) and writes once it is gone.
	waits := 0
	for range 20 {
		waits += f.waitingOn(holderLong)
		time.Sleep(25 * time.Millisecond)
	}
	require.LessOrEqual(t, waits, 2, "statements waiting on the held row, in 20 looks")
	time.Sleep(lease + 500*time.Millisecond - time.Since(start))
	select {
	case d := <-results[0]:
		t.Fatalf("the outcome still held was delivered after %v", d)
	default:
	}
	releaseLong()
	longAt := time.Since(start)
	require.Greater(t, receive(t, results[0], 5*time.Second, "the outcome held past its lease, once its lock went"), longAt)
	require.Equal(t, "done", f.row(f.claims[0].ID).Status)
	require.Equal(t, "done", f.row(f.claims[1].ID).Status)
}

// TestHeldChildrenAreParkedTogether: a batch made only of outcomes waiting
// on one held parent (children finishing while a caller's SignalTx holds
// it) is parked whole after one lock wait — not halved down to single
// outcomes, each waiting a lock wait and sitting on its row meanwhile — an
// unrelated outcome committed while they wait is written at once, and the
// children are written together once the parent's lock goes.
func TestHeldChildrenAreParkedTogether(t *testing.T) {
	t.Parallel()
	const kids, lease = 8, 2 * time.Second
	f := newFixture(t, kids+2)
	ctx := context.Background()
	parent := f.claims[0]
	var fanout int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT fanout FROM `+f.schema+`.gendurable_instances WHERE id = $1`, parent.ID).Scan(&fanout))
	ids := make([]int64, kids)
	for i := range ids {
		ids[i] = f.claims[1+i].ID
	}
	_, err := f.pool.Exec(ctx, `UPDATE `+f.schema+`.gendurable_instances SET parent_id = $1, parent_fanout = $2 WHERE id = ANY ($3)`,
		parent.ID, fanout, ids)
	require.NoError(t, err)
	// The parent awaits them (a finishing child counts down only such a parent).
	_, err = f.pool.Exec(ctx, `UPDATE `+f.schema+`.gendurable_instances SET status = 'awaiting_children', children_pending = $2,
		claim_token = NULL, lease_expires_at = NULL WHERE id = $1`, parent.ID, kids)
	require.NoError(t, err)
	gate := &gateFirst{DB: f.pool, arrived: make(chan struct{}), open: make(chan struct{})}
	c := committer.New(committer.Config{Lease: lease, MaxInFlight: 1}, f.q, gate)
	release := f.hold(parent.ID)
	results := make(chan committer.Result, kids)
	// A first outcome holds the gate while the children queue up behind it.
	first := make(chan committer.Result, 1)
	c.CommitAsync(done(f.claims[kids+1]), func(r committer.Result) { first <- r })
	<-gate.arrived
	for i := 1; i <= kids; i++ {
		c.CommitAsync(done(f.claims[i]), func(r committer.Result) { results <- r })
	}
	close(gate.open)
	require.NoError(t, (<-first).Err)
	f.waitStatements(2)
	time.Sleep(500 * time.Millisecond) // the children's batch ran out of its wait and was parked
	// An unrelated outcome (a fresh row) is written at once.
	var extra sqlq.Claimed
	{
		_, err := f.q.InsertMany(ctx, f.pool, []sqlq.NewInstance{{FSM: "m", Version: 1, Queue: "default", Step: "a", State: `{}`, MaxAttempts: 5}})
		require.NoError(t, err)
		picked, err := f.q.Pick(ctx, f.pool, "default", sqlq.PickOpts{Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, picked.Claimed, 1)
		extra = picked.Claimed[0]
	}
	start := time.Now()
	res := c.Commit(done(extra))
	require.NoError(t, res.Err)
	require.NotNil(t, res.Applied)
	require.Less(t, time.Since(start), lease/2, "the unrelated outcome waited for the parked ones")
	time.Sleep(300 * time.Millisecond)
	release()
	for range kids {
		r := receive(t, results, 5*time.Second, "a child's outcome, once the parent's lock went")
		require.NoError(t, r.Err)
		require.NotNil(t, r.Applied)
	}
	var pending int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.schema+`.gendurable_instances WHERE id = ANY ($1) AND status = 'done'`, ids).Scan(&pending))
	require.Equal(t, kids, pending)
	batches := f.tracer.batches()
	require.Equal(t, []int{1, kids, 1, kids}, batches,
		"the children's batch was parked whole (not halved), the unrelated outcome went alone, the children together")
}

// TestDrainGivesUpAParkedOutcomeAfterALease: once the engine drains
// (Stop), an outcome parked on a lock another transaction still holds is
// given up after a lease of waiting (ErrLockHeld): a Stop without a
// deadline is not held up for as long as the caller keeps its lock.
func TestDrainGivesUpAParkedOutcomeAfterALease(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	f := newFixture(t, 1)
	c := committer.New(committer.Config{Lease: lease}, f.q, f.pool)
	f.hold(f.claims[0].ID)
	got := make(chan committer.Result, 1)
	start := time.Now()
	c.CommitAsync(done(f.claims[0]),
		func(r committer.Result) { got <- r })
	select {
	case r := <-got:
		t.Fatalf("delivered before Drain: %+v", r)
	case <-time.After(2 * lease):
	}
	c.Drain()
	require.ErrorIs(t, receive(t, got, 5*time.Second, "the parked outcome, given up after Drain").Err, committer.ErrLockHeld)
	t.Logf("given up %v after the commit began", time.Since(start).Round(time.Millisecond))
	require.Equal(t, "executing", f.row(f.claims[0].ID).Status, "nothing written: the row is reaped after its lease")
}

// TestDrainWritesAParkedOutcomeWhoseLockWent: Drain gives up only parked
// outcomes still held; one whose lock went since the last round is written
// (it was given up, and its finished step would have run again).
func TestDrainWritesAParkedOutcomeWhoseLockWent(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	f := newFixture(t, 1)
	c := committer.New(committer.Config{Lease: lease}, f.q, f.pool)
	release := f.hold(f.claims[0].ID)
	got := make(chan committer.Result, 1)
	c.CommitAsync(done(f.claims[0]),
		func(r committer.Result) { got <- r })
	time.Sleep(2 * lease)
	release()
	c.Drain()
	r := receive(t, got, 5*time.Second, "the parked outcome")
	require.NoError(t, r.Err)
	require.NotNil(t, r.Applied)
	require.Equal(t, "done", f.row(f.claims[0].ID).Status)
}

// answerLost lets the first outcome statement run to its commit, then
// reports the connection lost, as a network cut between the commit and its
// answer does; then it calls after, if set. Other statements pass.
type answerLost struct {
	sqlq.DB
	once  sync.Once
	after func()
}

func (a *answerLost) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	first := false
	if strings.Contains(sql, "WITH locked AS MATERIALIZED") {
		a.once.Do(func() { first = true })
	}
	if !first {
		return a.DB.Query(ctx, sql, args...)
	}
	rows, err := a.DB.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if a.after != nil {
		a.after()
	}
	return nil, fmt.Errorf("unexpected EOF (the answer was lost after the commit)")
}

// chainNext is a Next that chains its next step in the same worker.
func chainNext(c sqlq.Claimed) *sqlq.Outcome {
	o := next(c, 1)
	o.Continue = true
	return o
}

// TestALostAnswerIsRecoveredThroughAParkedRetry (schema version 19; a
// review): a chained Next whose statement committed and lost its answer is
// looked up when its retry finds it fenced out — also when the retry first
// ran out of its lock wait (a caller's transaction on the row) and was
// parked, and the statement that finally wrote it was another apply's. The
// chained claim comes back to the worker; it was stranded (reaped later,
// charged an attempt) when only the apply that lost the answer knew.
func TestALostAnswerIsRecoveredThroughAParkedRetry(t *testing.T) {
	t.Parallel()
	for _, parked := range []bool{false, true} {
		t.Run(map[bool]string{false: "retried", true: "parked"}[parked], func(t *testing.T) {
			f := newFixture(t, 1)
			db := &answerLost{DB: f.pool}
			if parked {
				db.after = func() {
					release := f.hold(f.claims[0].ID)
					time.AfterFunc(1500*time.Millisecond, release)
				}
			}
			c := committer.New(committer.Config{Lease: 4 * time.Second}, f.q, db)
			res := c.Commit(chainNext(f.claims[0]))
			require.NoError(t, res.Err)
			require.NotNil(t, res.Applied, "written by the lost attempt, reported fenced out")
			require.NotNil(t, res.Applied.Token, "the chained claim is not handed back")
			r := f.row(f.claims[0].ID)
			require.Equal(t, "executing", r.Status)
			require.Equal(t, *res.Applied.Token, *r.Token)
		})
	}
}

// lookNeverAnswers fails the first outcome statement before it is sent
// (its fate unknown to the committer, as for a reset connection) and
// swallows RecoverOutcomes' look, as a connection that never answers does.
type lookNeverAnswers struct {
	sqlq.DB
	once sync.Once
}

func (l *lookNeverAnswers) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "WITH locked AS MATERIALIZED") {
		first := false
		l.once.Do(func() { first = true })
		if first {
			return nil, fmt.Errorf("write: connection reset by peer")
		}
	}
	if strings.Contains(sql, "outcome_token = u.token") {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.DB.Query(ctx, sql, args...)
}

// TestALookThatDoesNotAnswerHoldsBackNothingWritten (a review): after a
// retry, the outcomes it wrote are delivered before the look for fenced
// ones, and the look is bounded (an eighth of the lease): an outcome the
// retry wrote waited the whole lease for a look that never answered, its
// chained claim then too late for its worker.
func TestALookThatDoesNotAnswerHoldsBackNothingWritten(t *testing.T) {
	t.Parallel()
	const lease = 4 * time.Second
	f := newFixture(t, 2)
	// The second claim's row was taken meanwhile: fenced out for good.
	_, err := f.pool.Exec(context.Background(), `UPDATE `+f.schema+`.gendurable_instances SET claim_token = claim_token + 1000 WHERE id = $1`, f.claims[1].ID)
	require.NoError(t, err)
	c := committer.New(committer.Config{Lease: lease, MaxInFlight: 1}, f.q, &lookNeverAnswers{DB: f.pool})
	start := time.Now()
	type got struct {
		r    committer.Result
		took time.Duration
	}
	results := make([]chan got, 2)
	for i := range 2 {
		results[i] = make(chan got, 1)
		c.CommitAsync(chainNext(f.claims[i]), func(r committer.Result) { results[i] <- got{r, time.Since(start)} })
	}
	written := <-results[0]
	require.NotNil(t, written.r.Applied)
	require.Less(t, written.took, lease/2, "the written outcome waited for the look")
	fenced := <-results[1]
	require.Nil(t, fenced.r.Applied)
	require.Less(t, fenced.took, lease*3/4, "the look was not bounded")
}
