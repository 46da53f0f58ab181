//go:build linux

package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/pgbouncer"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// bouncerExecMode is the pgx query exec mode the README recommends behind
// PgBouncer 1.18 in transaction pooling: no named prepared statements, and
// parameters encoded by the types the server describes, as in pgx's
// default mode (so a step's own statements in WithTx behave the same).
const bouncerExecMode = pgx.QueryExecModeCacheDescribe

// bouncerPoolSize is PgBouncer's server connections for the test database:
// fewer than the engine's client connections, so transactions really are
// multiplexed over shared server sessions.
const bouncerPoolSize = 4

// bouncerPool is a pool of connections through the pooler at url.
func bouncerPool(t *testing.T, url string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// setupBouncer is setup behind a PgBouncer in transaction pooling mode: the
// schema is created and migrated directly (b.pool, which the checks use),
// the engine works through the pooler with the given exec mode.
func setupBouncer(t *testing.T, mode pgx.QueryExecMode, poolSize int, cfg *gendurable.Config) (*testBundle, *pgxpool.Pool) {
	t.Helper()
	return setupBouncerWith(t, mode, pgbouncer.Options{PoolSize: poolSize}, cfg)
}

// setupBouncerWith is setupBouncer with the pooler's options (its
// settings); opts.PoolSize must be set.
func setupBouncerWith(t *testing.T, mode pgx.QueryExecMode, opts pgbouncer.Options, cfg *gendurable.Config) (*testBundle, *pgxpool.Pool) {
	t.Helper()
	poolSize := opts.PoolSize
	url := pgbouncer.StartWith(t, dbtest.URL(), opts).URL
	direct, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4, Extra: int32(poolSize)})
	pool := bouncerPool(t, url, mode, 16)
	cfg.Schema = schema
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	return &testBundle{t: t, pool: direct, schema: schema, eng: eng}, pool
}

// bouncerWorkload is one kind of work run through the pooler: the
// definitions and queues it needs, what to prepare before the engine
// starts, and what to run and check once it has.
type bouncerWorkload struct {
	name     string
	defs     []gendurable.Definition
	queues   map[string]gendurable.QueueConfig
	policies []gendurable.KeyPolicy
	prep     func(b *testBundle)
	// run gets the test's bundle (b.pool is the direct pool) and the
	// engine's pool, which goes through the pooler.
	run func(b *testBundle, through *pgxpool.Pool)
}

const bouncerWait = 30 * time.Second

// bouncerWorkloads is every kind of work that must finish behind PgBouncer
// in transaction pooling. They run at once, on one engine.
//
// Keyed instances are in it: a key's slot is its executing row and the
// pick's per-key lock is transaction-scoped, so nothing of a key lives in a
// server session.
func bouncerWorkloads(lease time.Duration) []bouncerWorkload {
	return []bouncerWorkload{
		bouncerJobs(), bouncerMachine(), bouncerSignals(), bouncerChildren(),
		bouncerUnique(), bouncerWithTx(lease, 2), bouncerInsertMany(), bouncerAdmin(),
		bouncerKeyed(), bouncerRated(), bouncerGlobal(),
	}
}

// bouncerRated: a key rated 20/s with a burst of 3 (its bucket is a table
// row the pick reads and writes under the key's transaction-level lock):
// its claims, on the database clock, stay within the bucket in any window.
func bouncerRated() bouncerWorkload {
	var mu sync.Mutex
	var claims []time.Time
	var direct *pgxpool.Pool
	var schema string
	job := &gendurable.Job[spanArgs]{Name: "brated", Perform: func(ctx context.Context, r *gendurable.Run[spanArgs]) error {
		var at time.Time
		if err := direct.QueryRow(ctx, replaceSchema(`SELECT updated_at FROM {{s}}.gendurable_instances WHERE id = $1 AND claim_token = $2`, schema),
			r.ID, r.Token).Scan(&at); err != nil {
			return err
		}
		mu.Lock()
		claims = append(claims, at)
		mu.Unlock()
		return nil
	}}
	return bouncerWorkload{name: "rated", defs: []gendurable.Definition{job},
		policies: []gendurable.KeyPolicy{{Prefix: "brate:", Limit: 4, Rate: 20, Per: time.Second, Burst: 3}},
		prep:     func(b *testBundle) { direct, schema = b.pool, b.schema },
		run: func(b *testBundle, _ *pgxpool.Pool) {
			var ps []gendurable.InsertParams
			for range 30 {
				ps = append(ps, job.New(spanArgs{}).With(gendurable.InsertOpts{PartitionKey: "brate:acme"}))
			}
			b.insertAllDone(ps, bouncerWait)
			mu.Lock()
			defer mu.Unlock()
			require.Len(b.t, claims, 30)
			slices.SortFunc(claims, func(a, b time.Time) int { return a.Compare(b) })
			for _, window := range []time.Duration{250 * time.Millisecond, time.Second} {
				for i, from := range claims {
					n := 0
					for _, c := range claims[i:] {
						if c.Sub(from) < window {
							n++
						}
					}
					most := 3 + int(20*window.Seconds()) + 1 // as TestKeyRateLimitsStarts
					require.LessOrEqual(b.t, n, most, "%d claims in the %s from %s (rate 20/s, burst 3)", n, window, from.Format(time.RFC3339Nano))
				}
			}
		}}
}

// bouncerGlobal: a queue bounded to 2 running steps (the pick counts its
// live leases under the queue's transaction-level lock), with 4 slots:
// never more than 2 at once, and 2 reached.
func bouncerGlobal() bouncerWorkload {
	g := newKeyGauge()
	job := &gendurable.Job[spanArgs]{Name: "bglobal", Perform: func(ctx context.Context, r *gendurable.Run[spanArgs]) error {
		g.enter("all")
		defer g.leave("all")
		time.Sleep(40 * time.Millisecond)
		return nil
	}}
	return bouncerWorkload{name: "global", defs: []gendurable.Definition{job},
		queues: map[string]gendurable.QueueConfig{"bglobal": {Concurrency: 4, GlobalConcurrency: 2,
			PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond}},
		run: func(b *testBundle, _ *pgxpool.Pool) {
			var ps []gendurable.InsertParams
			for range 20 {
				ps = append(ps, job.New(spanArgs{}).With(gendurable.InsertOpts{Queue: "bglobal"}))
			}
			b.insertAllDone(ps, bouncerWait)
			require.Equal(b.t, 2, g.max("all"), "most steps of the queue at once")
		}}
}

// bouncerKeyed: keyed instances of a few hot keys, limit 1 and limit 2, with
// steps long enough to collide: never more running per key than its limit.
func bouncerKeyed() bouncerWorkload {
	g := newKeyGauge()
	job := &gendurable.Job[spanArgs]{Name: "bkeyed", Perform: func(ctx context.Context, r *gendurable.Run[spanArgs]) error {
		g.enter(r.PartitionKey)
		defer g.leave(r.PartitionKey)
		time.Sleep(15 * time.Millisecond)
		return nil
	}}
	return bouncerWorkload{name: "keyed", defs: []gendurable.Definition{job}, run: func(b *testBundle, _ *pgxpool.Pool) {
		var ps []gendurable.InsertParams
		for i := range 30 {
			ps = append(ps, job.New(spanArgs{}).With(gendurable.InsertOpts{PartitionKey: fmt.Sprint("bk-one-", i%2)}))
			ps = append(ps, job.New(spanArgs{}).With(gendurable.InsertOpts{PartitionKey: "bk-two", KeyLimit: 2}))
		}
		b.insertAllDone(ps, bouncerWait)
		for key, limit := range map[string]int{"bk-one-0": 1, "bk-one-1": 1, "bk-two": 2} {
			require.LessOrEqual(b.t, g.max(key), limit, "key %s: most steps at once", key)
			require.GreaterOrEqual(b.t, g.max(key), 1, "key %s ran", key)
		}
	}}
}

// TestPgBouncerTransactionPooling runs jobs, machines, signals, children,
// unique inserts, WithTx outcomes longer than a lease, InsertMany, the
// admin API, keyed, rated and GlobalConcurrency-bounded work through a
// PgBouncer in transaction pooling mode, in each pgx
// exec mode that PgBouncer 1.18 supports (the README's first): all finish.
//
// Not parallel with other tests: its workloads are parallel subtests, which
// would wait for a slot that a parallel test waiting for the connection
// budget holds, while this test holds budget.
func TestPgBouncerTransactionPooling(t *testing.T) {
	modes := []pgx.QueryExecMode{bouncerExecMode, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	if testing.Short() {
		modes = modes[:1]
	}
	for _, mode := range modes {
		// One after the other: each holds a share of the connection budget,
		// and its workloads run in parallel.
		t.Run(mode.String(), func(t *testing.T) { runBouncerWorkloads(t, mode) })
	}
}

func runBouncerWorkloads(t *testing.T, mode pgx.QueryExecMode) {
	const lease = 2 * time.Second
	workloads := bouncerWorkloads(lease)
	cfg := &gendurable.Config{
		Queues: map[string]gendurable.QueueConfig{
			"default": {Concurrency: 8, PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond},
		},
		LeaseDuration:     lease,
		HeartbeatInterval: lease / 4,
		ReaperInterval:    200 * time.Millisecond,
		DrainTimeout:      5 * time.Second,
	}
	for _, w := range workloads {
		cfg.Machines = append(cfg.Machines, w.defs...)
		cfg.KeyPolicies = append(cfg.KeyPolicies, w.policies...)
		for q, qc := range w.queues {
			cfg.Queues[q] = qc
		}
	}
	b, through := setupBouncer(t, mode, bouncerPoolSize, cfg)
	for _, w := range workloads {
		if w.prep != nil {
			w.prep(b)
		}
	}
	b.start()
	t.Run("workloads", func(t *testing.T) {
		for _, w := range workloads {
			t.Run(w.name, func(t *testing.T) {
				t.Parallel()
				wb := *b
				wb.t = t
				w.run(&wb, through)
			})
		}
	})
}

func bouncerJobs() bouncerWorkload {
	var runs sync.Map // id → *atomic.Int32
	job := &gendurable.Job[orderArgs]{Name: "bjob", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		n, _ := runs.LoadOrStore(j.ID, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return nil
	}}
	return bouncerWorkload{name: "jobs", defs: []gendurable.Definition{job}, run: func(b *testBundle, _ *pgxpool.Pool) {
		var ids []int64
		for i := range 40 {
			ids = append(ids, b.insert(job.New(orderArgs{I: i})))
		}
		for _, id := range ids {
			b.waitStatus(id, "done", bouncerWait)
			n, ok := runs.Load(id)
			require.True(b.t, ok)
			require.Equal(b.t, int32(1), n.(*atomic.Int32).Load(), "job %d ran once", id)
		}
	}}
}

type bouncerSteps struct {
	Trail []string `json:"trail"`
}

func bouncerMachine() bouncerWorkload {
	step := func(name, next string) gendurable.StepFunc[bouncerSteps] {
		return func(ctx context.Context, r *gendurable.Run[bouncerSteps]) (gendurable.Outcome, error) {
			s := r.State
			s.Trail = append(s.Trail, name)
			if next == "" {
				return gendurable.Done(s), nil
			}
			o := r.Next(next, s)
			if name == "b" {
				o = o.After(50 * time.Millisecond) // a durable sleep between steps
			}
			return o, nil
		}
	}
	m := &gendurable.Machine[bouncerSteps]{Name: "bsteps", Start: "a", Steps: map[string]gendurable.StepFunc[bouncerSteps]{
		"a": step("a", "b"), "b": step("b", "c"), "c": step("c", "d"), "d": step("d", ""),
	}}
	return bouncerWorkload{name: "machine", defs: []gendurable.Definition{m}, run: func(b *testBundle, _ *pgxpool.Pool) {
		var ids []int64
		for range 20 {
			ids = append(ids, b.insert(m.New(bouncerSteps{})))
		}
		for _, id := range ids {
			r := b.waitStatus(id, "done", bouncerWait)
			require.JSONEq(b.t, `{"trail":["a","b","c","d"]}`, string(r.Result))
		}
	}}
}

func bouncerSignals() bouncerWorkload {
	m := awaiter(0)
	return bouncerWorkload{name: "signals", defs: []gendurable.Definition{m}, run: func(b *testBundle, _ *pgxpool.Pool) {
		ctx := context.Background()
		var ids []int64
		for range 10 {
			ids = append(ids, b.insert(m.New(waitState{})))
		}
		for _, id := range ids {
			eventually(b.t, bouncerWait, func() bool {
				w, err := b.eng.WaitReason(ctx, id)
				require.NoError(b.t, err)
				return w.Status == gendurable.StatusAwaitingSignal
			}, "instance %d never awaited", id)
			res, err := b.eng.Signal(ctx, id, "pay", payment{Amount: int(id)}, &gendurable.SignalOpts{DedupKey: fmt.Sprint("pay-", id)})
			require.NoError(b.t, err)
			require.True(b.t, res.Woke)
			dup, err := b.eng.Signal(ctx, id, "pay", payment{Amount: int(id)}, &gendurable.SignalOpts{DedupKey: fmt.Sprint("pay-", id)})
			require.NoError(b.t, err)
			require.True(b.t, dup.Duplicate)
		}
		for _, id := range ids {
			r := b.waitStatus(id, "done", bouncerWait)
			require.JSONEq(b.t, `{"got":["pay"],"rounds":1}`, string(r.Result))
		}
	}}
}

func bouncerChildren() bouncerWorkload {
	parent, leaf := fanMachines()
	return bouncerWorkload{name: "children", defs: []gendurable.Definition{parent, leaf}, run: func(b *testBundle, _ *pgxpool.Pool) {
		var ids []int64
		for range 3 {
			ids = append(ids, b.insert(parent.New(fanState{Width: 4, Depth: 1})))
		}
		for _, id := range ids {
			r := b.waitStatus(id, "done", bouncerWait)
			var s fanState
			require.NoError(b.t, jsonUnmarshal(r.Result, &s))
			require.Equal(b.t, 4+4*4, s.ChildSum, "every child and grandchild joined")
		}
	}}
}

func bouncerUnique() bouncerWorkload {
	release := make(chan struct{})
	job := &gendurable.Job[orderArgs]{Name: "bunique", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	return bouncerWorkload{name: "unique", defs: []gendurable.Definition{job}, run: func(b *testBundle, _ *pgxpool.Pool) {
		ctx := context.Background()
		opts := gendurable.InsertOpts{UniqueKey: "bouncer-order-7"}
		var wg sync.WaitGroup
		results := make([]gendurable.InsertResult, 8)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := b.eng.Insert(ctx, job.New(orderArgs{I: i}).With(opts))
				if err != nil {
					b.t.Error(err)
				}
				results[i] = res
			}()
		}
		wg.Wait()
		var inserted int
		for _, r := range results {
			if !r.Duplicate {
				inserted++
			}
			require.Equal(b.t, results[0].ID, r.ID, "every insert names the one live instance")
		}
		require.Equal(b.t, 1, inserted)
		// Within one InsertMany too.
		res, err := b.eng.InsertMany(ctx, []gendurable.InsertParams{job.New(orderArgs{}).With(opts), job.New(orderArgs{}).With(opts)})
		require.NoError(b.t, err)
		require.True(b.t, res[0].Duplicate && res[1].Duplicate)
		close(release)
		b.waitStatus(results[0].ID, "done", bouncerWait)
		again := b.insert(job.New(orderArgs{}).With(opts))
		require.NotEqual(b.t, results[0].ID, again, "the key is free once the holder is done")
		b.waitStatus(again, "done", bouncerWait)
		require.Equal(b.t, 2, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE unique_key = 'bouncer-order-7'`))
	}}
}

// bouncerWithTx: n WithTx outcomes, at once, whose transactions outlast a
// lease commit once each. Behind PgBouncer the connection's backend pid
// (from BackendKeyData) is a random number of PgBouncer's, not the server's,
// so a watch that looked it up in pg_stat_activity would take the healthy
// transaction for dead — when the number fits an int4 (the lookup of a
// larger one fails, which proves nothing): about one connection in two,
// hence several transactions on their own connections.
func bouncerWithTx(lease time.Duration, n int) bouncerWorkload {
	var calls atomic.Int32
	var ledger string // schema.table, set by prep before the engine starts
	m := &gendurable.Machine[leafArgs]{Name: "blongtx", Start: "post", MaxAttempts: 1, Steps: map[string]gendurable.StepFunc[leafArgs]{
		"post": func(ctx context.Context, r *gendurable.Run[leafArgs]) (gendurable.Outcome, error) {
			return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
				calls.Add(1)
				if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (instance, amount) VALUES ($1, $2)`, r.ID, r.State.N); err != nil {
					return err
				}
				// Hold the transaction open for two leases and a half: two
				// checks of its session. It waits on the server (a statement
				// that runs is not idle: Config.TxIdleTimeout does not end it).
				_, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, (2*lease + lease/2).Seconds())
				return err
			}), nil
		},
	}}
	return bouncerWorkload{
		name: "withtx", defs: []gendurable.Definition{m},
		prep: func(b *testBundle) {
			ledger = b.schema + ".bouncer_ledger"
			b.exec(`CREATE TABLE ` + ledger + ` (instance bigint, amount int)`)
		},
		run: func(b *testBundle, _ *pgxpool.Pool) {
			ps := make([]gendurable.InsertParams, n)
			for i := range ps {
				ps[i] = m.New(leafArgs{N: i})
			}
			res, err := b.eng.InsertMany(context.Background(), ps)
			require.NoError(b.t, err)
			for _, r := range res {
				row := b.waitStatus(r.ID, "done", bouncerWait)
				require.Equal(b.t, 0, row.Attempt)
				require.Empty(b.t, row.Errors, "instance %d: its transaction was taken for dead", r.ID)
				require.Equal(b.t, 1, b.count(`SELECT count(*) FROM {{s}}.bouncer_ledger WHERE instance = $1`, r.ID))
			}
			require.Equal(b.t, int32(n), calls.Load(), "each callback ran once")
		},
	}
}

func bouncerInsertMany() bouncerWorkload {
	var ran atomic.Int32
	job := &gendurable.Job[orderArgs]{Name: "bmany", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		ran.Add(1)
		return nil
	}}
	return bouncerWorkload{name: "insertmany", defs: []gendurable.Definition{job}, run: func(b *testBundle, through *pgxpool.Pool) {
		ctx := context.Background()
		ps := make([]gendurable.InsertParams, 300)
		for i := range ps {
			ps[i] = job.New(orderArgs{I: i})
		}
		res, err := b.eng.InsertMany(ctx, ps)
		require.NoError(b.t, err)
		require.Len(b.t, res, len(ps))
		// InsertManyTx inside the caller's transaction, through the pooler.
		require.NoError(b.t, pgx.BeginFunc(ctx, through, func(tx pgx.Tx) error {
			_, err := b.eng.InsertManyTx(ctx, tx, ps[:20])
			return err
		}))
		eventually(b.t, bouncerWait, func() bool {
			return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'bmany' AND status = 'done'`) == 320
		}, "InsertMany's instances did not all finish")
		require.Equal(b.t, int32(320), ran.Load())
	}}
}

func bouncerAdmin() bouncerWorkload {
	fail := atomic.Bool{}
	fail.Store(true)
	job := &gendurable.Job[orderArgs]{Name: "badmin", Queue: "badmin", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		if j.State.I == 0 && fail.Load() {
			return errors.New("fails until retried")
		}
		return nil
	}}
	return bouncerWorkload{
		name: "admin", defs: []gendurable.Definition{job},
		queues: map[string]gendurable.QueueConfig{"badmin": {Concurrency: 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond}},
		run: func(b *testBundle, _ *pgxpool.Pool) {
			ctx := context.Background()
			failing := b.insert(job.New(orderArgs{I: 0}))
			b.waitStatus(failing, "failed", bouncerWait)

			require.NoError(b.t, b.eng.Pause(ctx, "badmin"))
			var held []int64
			for i := 1; i <= 3; i++ {
				held = append(held, b.insert(job.New(orderArgs{I: i})))
			}
			time.Sleep(300 * time.Millisecond)
			page, err := b.eng.List(ctx, gendurable.ListFilter{Queue: "badmin", Status: gendurable.StatusRunnable})
			require.NoError(b.t, err)
			require.Len(b.t, page.Instances, 3, "a paused queue is not picked")
			d, err := b.eng.Describe(ctx, held[0])
			require.NoError(b.t, err)
			require.Equal(b.t, gendurable.StatusRunnable, d.Status)
			require.NoError(b.t, b.eng.Cancel(ctx, held[0], "not wanted"))
			qs, err := b.eng.Queues(ctx)
			require.NoError(b.t, err)
			require.NotEmpty(b.t, qs)
			inst, err := b.eng.Instance(ctx, held[1])
			require.NoError(b.t, err)
			require.Equal(b.t, gendurable.StatusRunnable, inst.Status)
			g, err := b.eng.Graph(ctx, "badmin")
			require.NoError(b.t, err)
			require.NotEmpty(b.t, g.Steps)
			require.NoError(b.t, b.eng.Resume(ctx, "badmin"))
			b.waitStatus(held[1], "done", bouncerWait)
			b.waitStatus(held[2], "done", bouncerWait)
			require.Equal(b.t, "failed", b.row(held[0]).Status)

			fail.Store(false)
			require.NoError(b.t, b.eng.Retry(ctx, failing))
			b.waitStatus(failing, "done", bouncerWait)

			b.exec(`UPDATE {{s}}.gendurable_instances SET finished_at = now() - interval '2 days' WHERE queue = 'badmin'`)
			// Prune skips rows another transaction has locked: a heartbeat
			// that still lists a row finished a moment ago locks it for its
			// own short transaction. The next run takes it, so run until the
			// four are gone and check that nothing else went with them.
			var pruned int64
			eventually(b.t, bouncerWait, func() bool {
				n, err := b.eng.Prune(ctx, 24*time.Hour, nil)
				require.NoError(b.t, err)
				pruned += n
				return pruned >= 4
			}, "the queue's four finished instances were not all pruned")
			require.Equal(b.t, int64(4), pruned, "the queue's four finished instances, and nothing of the others")
			_, err = b.eng.Describe(ctx, failing)
			require.ErrorIs(b.t, err, gendurable.ErrNotFound)
		},
	}
}

// TestPgBouncerWithTxLongerThanALease is the withtx workload alone, with
// six transactions at once and server sessions to spare, so that the
// watch's checks of each transaction's session (once a lease, each bounded
// by the heartbeat interval) are answered rather than queued: without the
// real backend pid, all six pass only if all six connections drew a pid
// above the int4 range (1 in 64).
func TestPgBouncerWithTxLongerThanALease(t *testing.T) {
	const lease, n = 1500 * time.Millisecond, 6
	w := bouncerWithTx(lease, n)
	cfg := &gendurable.Config{
		Machines:          w.defs,
		Queues:            map[string]gendurable.QueueConfig{"default": {Concurrency: n, PollInterval: 20 * time.Millisecond}},
		LeaseDuration:     lease,
		HeartbeatInterval: lease / 3,
		ReaperInterval:    200 * time.Millisecond,
	}
	b, through := setupBouncer(t, bouncerExecMode, n+2, cfg)
	w.prep(b)
	b.start()
	w.run(b, through)
}

// TestPgBouncerMigrate: migrations run through the pooler — one
// transaction each, serialized by a transaction-level advisory lock, so
// concurrent migrators through shared server sessions apply each version
// once — and down again.
func TestPgBouncerMigrate(t *testing.T) {
	url := pgbouncer.StartWith(t, dbtest.URL(), pgbouncer.Options{PoolSize: 2}).URL
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, Extra: 2, NoMigrate: true})
	pool := bouncerPool(t, url, bouncerExecMode, 6)
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]migrate.Result, 4)
	errs := make([]error, len(results))
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrate.Up(ctx, pool, schema)
		}()
	}
	wg.Wait()
	var applied int
	for i := range results {
		require.NoError(t, errs[i])
		applied += len(results[i].Applied)
	}
	require.Equal(t, len(sqlq.Migrations()), applied, "each version applied once")
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)
	_, err = migrate.Down(ctx, pool, schema)
	require.NoError(t, err)
	v, err = migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Zero(t, v)
}

// TestPgBouncerExecModes: pgx's default mode (named prepared statements,
// cached per client connection) breaks through PgBouncer 1.18 in
// transaction pooling as soon as two client connections share a server
// session; the modes without named statements work. Of those, only
// cache_describe encodes parameters by the types the server describes, as
// the default mode does: exec and simple_protocol guess from the Go type,
// so JSON as []byte becomes bytea and a map has no encoding at all — which
// a step's own statements in WithTx would run into.
func TestPgBouncerExecModes(t *testing.T) {
	url := pgbouncer.StartWith(t, dbtest.URL(), pgbouncer.Options{PoolSize: 1}).URL
	_, _ = dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, Extra: 1, NoMigrate: true}) // reserves the budget
	ctx := context.Background()
	const q = "SELECT $1::int + 1"
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := bouncerPool(t, url, mode, 2)
			a, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer a.Release()
			c, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer c.Release()
			var n int
			require.NoError(t, a.QueryRow(ctx, q, 1).Scan(&n))
			err = c.QueryRow(ctx, q, 1).Scan(&n) // the same server session, another client
			if mode == pgx.QueryExecModeCacheStatement {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "42P05", pgErr.Code, "prepared statement already exists: %v", err)
				// Start and the CLI add the advice to such an error.
				require.True(t, sqlq.PreparedStatementClash(err))
				require.False(t, sqlq.PreparedStatementClash(&pgconn.PgError{Code: "42P05", Message: `cursor "c" already exists`}))
				return
			}
			require.NoError(t, err)
			require.Equal(t, 2, n)

			var doc string
			errBytes := c.QueryRow(ctx, "SELECT $1::jsonb::text", []byte(`{"a":1}`)).Scan(&doc)
			errMap := c.QueryRow(ctx, "SELECT $1::jsonb::text", map[string]int{"a": 1}).Scan(&doc)
			if mode == bouncerExecMode {
				require.NoError(t, errBytes)
				require.NoError(t, errMap)
				require.JSONEq(t, `{"a":1}`, doc)
			} else {
				require.Error(t, errBytes, "[]byte sent as bytea")
				require.Error(t, errMap, "no text encoding for a map")
			}
		})
	}
}

// pidQuestions counts the statements that ask for the backend pid.
type pidQuestions struct{ n atomic.Int32 }

func (c *pidQuestions) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "pg_backend_pid()") {
		c.n.Add(1)
	}
	return ctx
}

func (c *pidQuestions) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestPgBouncerWithTxAsksForTheBackendPID: a WithTx transaction asks the
// server for its backend pid (the one its watch looks for) — through the
// pooler once per transaction, since the pid a connection announced is
// PgBouncer's own; on a direct connection once per connection, after which
// the announced pid is trusted.
func TestPgBouncerWithTxAsksForTheBackendPID(t *testing.T) {
	const instances = 6
	m := &gendurable.Machine[leafArgs]{Name: "pidtx", Start: "post", Steps: map[string]gendurable.StepFunc[leafArgs]{
		"post": func(ctx context.Context, r *gendurable.Run[leafArgs]) (gendurable.Outcome, error) {
			return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error { return nil }), nil
		},
	}}
	url := pgbouncer.StartWith(t, dbtest.URL(), pgbouncer.Options{PoolSize: 2}).URL
	for _, c := range []struct {
		name string
		url  string
		mode pgx.QueryExecMode
		want func(t *testing.T, asked int32)
	}{
		{"direct", dbtest.URL(), pgx.QueryExecModeCacheStatement, func(t *testing.T, asked int32) {
			require.Positive(t, asked)
			require.LessOrEqual(t, asked, int32(3), "at most once per connection (MaxConns 3)")
		}},
		{"through PgBouncer", url, bouncerExecMode, func(t *testing.T, asked int32) {
			require.Equal(t, int32(instances), asked, "once per transaction")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			direct, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, Extra: 3})
			q := &pidQuestions{}
			pcfg, err := pgxpool.ParseConfig(c.url)
			require.NoError(t, err)
			pcfg.MaxConns = 3
			pcfg.ConnConfig.DefaultQueryExecMode = c.mode
			pcfg.ConnConfig.Tracer = q
			pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			cfg := fastConfig(schema, m)
			cfg.Logger = testLogger(t)
			eng, err := gendurable.New(pool, cfg)
			require.NoError(t, err)
			b := &testBundle{t: t, pool: direct, schema: schema, eng: eng}
			b.start()
			for range instances {
				b.waitStatus(b.insert(m.New(leafArgs{})), "done", bouncerWait)
			}
			c.want(t, q.n.Load())
		})
	}
}

// TestStartRefusesStatementPooling: behind PgBouncer in statement pooling
// mode, which runs no transaction blocks, an engine with queues used to
// start, run plain steps, and lose every WithTx outcome (each waited out
// a lease and was charged an attempt) with no word of the pool mode.
// Start now fails, naming the mode and the fix.
func TestStartRefusesStatementPooling(t *testing.T) {
	t.Parallel()
	url := pgbouncer.StartWith(t, dbtest.URL(), pgbouncer.Options{PoolSize: 2, PoolMode: "statement"}).URL
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, Extra: 2})
	pool := bouncerPool(t, url, bouncerExecMode, 2)
	job := &gendurable.Job[orderArgs]{Name: "stmtpool", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}, Logger: testLogger(t),
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 1}}})
	require.NoError(t, err)
	err = eng.Start(context.Background())
	require.Error(t, err)
	require.ErrorContains(t, err, "use pool_mode = transaction")
	t.Logf("Start: %v", err)
	_ = eng.Stop(context.Background())
}

// TestWithTxRefusedByStatementPoolingAfterStartSaysSo (a PgBouncer probe):
// the pooler switched to statement pooling after Start (its check passed)
// refuses every WithTx outcome's transaction. Each was taken for a lost
// connection: an attempt waited out its lease, the error "lease expired
// with no outcome", never naming the mode. It is the step's failure now,
// at once, its error naming the mode and the fix.
func TestWithTxRefusedByStatementPoolingAfterStartSaysSo(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncer.StartWith(t, dbtest.URL(), pgbouncer.Options{PoolSize: 2})
	direct, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Extra: 2})
	pool := bouncerPool(t, bouncer.URL, bouncerExecMode, 4)
	job := &gendurable.Job[orderArgs]{Name: "stmtswitch", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil },
		MaxAttempts: 1}
	m := &gendurable.Machine[orderArgs]{Name: "stmtswitchtx", Start: "a", MaxAttempts: 1, Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error { return nil }), nil
		}}}
	cfg := &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job, m}, Logger: testLogger(t),
		LeaseDuration: 20 * time.Second, HeartbeatInterval: time.Second,
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 2, PollInterval: 20 * time.Millisecond}}}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	b := &testBundle{t: t, pool: direct, schema: schema, eng: eng}
	b.start()

	admin, err := pgx.ParseConfig(bouncer.URL)
	require.NoError(t, err)
	admin.Database = "pgbouncer"
	admin.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	console, err := pgx.ConnectConfig(context.Background(), admin)
	require.NoError(t, err)
	t.Cleanup(func() { _ = console.Close(context.Background()) })
	_, err = console.Exec(context.Background(), "SET pool_mode = 'statement'")
	require.NoError(t, err)

	plain := b.insert(job.New(orderArgs{}))
	b.waitStatus(plain, "done", 10*time.Second) // a plain outcome is one statement
	start := time.Now()
	withTx := b.insert(m.New(orderArgs{}))
	r := b.waitStatus(withTx, "failed", 10*time.Second) // not after its 20 s lease
	require.Less(t, time.Since(start), 10*time.Second)
	require.Len(t, r.Errors, 1)
	require.Equal(t, "error", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], "the step's transaction was refused: PgBouncer in statement pooling runs no transaction blocks")
	require.Contains(t, r.Errors[0]["error"], "use pool_mode = transaction")
}

// TestPgBouncerDescribeExecSaysWhy: pgx's describe_exec mode sends a
// statement's describe and its execute as two round trips, and PgBouncer in
// transaction pooling may hand them to different server sessions: the
// execute's bind meets another client's unnamed statement. With another
// count of parameters it fails with a protocol violation (08P01) that
// Start, the CLI and the logs now answer with the advice (a probe saw
// Start fail "storing machine definitions: bind message supplies 1
// parameters, but prepared statement "" requires 3" without it); with the
// same count, the other client's statement runs with this one's
// parameters, which is why the README rules the mode out. The two round
// trips are made here as pgx makes them (pgconn's Prepare of "" and
// ExecPrepared), two clients on one server session.
func TestPgBouncerDescribeExecSaysWhy(t *testing.T) {
	url := pgbouncer.StartWith(t, dbtest.URL(), pgbouncer.Options{PoolSize: 1}).URL
	_, _ = dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, Extra: 1, NoMigrate: true}) // reserves the budget
	ctx := context.Background()
	pool := bouncerPool(t, url, pgx.QueryExecModeDescribeExec, 2)
	a, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer a.Release()
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()

	execute := func(conn *pgxpool.Conn, args ...string) (string, error) {
		params := make([][]byte, len(args))
		for i, s := range args {
			params[i] = []byte(s)
		}
		res := conn.Conn().PgConn().ExecPrepared(ctx, "", params, nil, nil).Read()
		if res.Err != nil {
			return "", res.Err
		}
		require.Len(t, res.Rows, 1)
		return string(res.Rows[0][0]), nil
	}

	// Another count of parameters: refused, with the advice.
	_, err = a.Conn().PgConn().Prepare(ctx, "", "SELECT $1::int + 1", nil)
	require.NoError(t, err)
	_, err = c.Conn().PgConn().Prepare(ctx, "", "SELECT $1::int + $2::int", nil)
	require.NoError(t, err)
	_, err = execute(a, "1")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "08P01", pgErr.Code, "%v", err)
	require.Equal(t, sqlq.PoolerHint, sqlq.PoolerAdvice(err), "%v", err)

	// The same count: the other client's statement answers.
	_, err = a.Conn().PgConn().Prepare(ctx, "", "SELECT $1::int + 1", nil)
	require.NoError(t, err)
	_, err = c.Conn().PgConn().Prepare(ctx, "", "SELECT $1::int * 100", nil)
	require.NoError(t, err)
	got, err := execute(a, "1")
	require.NoError(t, err)
	require.Equal(t, "100", got, "a's execute ran c's statement")
}
