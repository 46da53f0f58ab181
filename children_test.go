package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

type fanState struct {
	Width    int      `json:"width"`
	Depth    int      `json:"depth"`
	Fail     bool     `json:"fail,omitempty"`
	Seen     []string `json:"seen,omitempty"`
	Resumes  int      `json:"resumes,omitempty"`
	ChildSum int      `json:"child_sum,omitempty"`
}

type leafArgs struct {
	N    int  `json:"n"`
	Fail bool `json:"fail,omitempty"`
}

// fanMachines: a parent that fans out Width leaf jobs (or, with Depth > 0,
// Width sub-parents), then sums its children's results.
func fanMachines() (*gendurable.Machine[fanState], *gendurable.Job[leafArgs]) {
	leaf := &gendurable.Job[leafArgs]{
		Name: "leaf", MaxAttempts: 1,
		Perform: func(ctx context.Context, j *gendurable.Run[leafArgs]) error {
			if j.State.Fail {
				return gendurable.JobCancel(errors.New("leaf failed on purpose"))
			}
			return nil
		},
	}
	var parent *gendurable.Machine[fanState]
	parent = &gendurable.Machine[fanState]{
		Name: "fan", Start: "spawn",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				var kids []gendurable.InsertParams
				for i := 0; i < r.State.Width; i++ {
					if r.State.Depth > 0 {
						kids = append(kids, parent.New(fanState{Width: r.State.Width, Depth: r.State.Depth - 1}))
					} else {
						kids = append(kids, leaf.New(leafArgs{N: i, Fail: r.State.Fail && i == 0}))
					}
				}
				return r.ScheduleChildren("join", r.State, kids...), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				s := r.State
				s.Resumes++
				for _, c := range r.Children {
					s.Seen = append(s.Seen, fmt.Sprintf("%s:%s", c.Machine, c.Status))
					var sub fanState
					if c.Machine == "fan" {
						if err := jsonUnmarshal(c.Result, &sub); err != nil {
							return gendurable.Outcome{}, err
						}
						s.ChildSum += 1 + sub.ChildSum
					} else {
						s.ChildSum++
					}
				}
				return gendurable.Done(s), nil
			},
		},
	}
	return parent, leaf
}

func TestFanOutFanIn(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	cfg := fastConfig("", parent, leaf)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 8, PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	id := b.insert(parent.New(fanState{Width: 5, Fail: true}))
	// While children run, the parent says what it waits for.
	eventually(t, 10*time.Second, func() bool { return b.row(id).Status == "awaiting_children" || b.row(id).Status == "done" }, "never parked")
	if b.row(id).Status == "awaiting_children" {
		w, err := b.eng.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 5, w.ChildrenTotal)
	}
	r := b.waitStatus(id, "done", 20*time.Second)
	var s fanState
	require.NoError(t, jsonUnmarshal(r.Result, &s))
	require.Equal(t, 1, s.Resumes, "the parent resumed exactly once, after its last child")
	require.Len(t, s.Seen, 5)
	require.Equal(t, "leaf:failed", s.Seen[0], "a failed child still counts towards the fan-in")
	for _, seen := range s.Seen[1:] {
		require.Equal(t, "leaf:done", seen)
	}
	require.Equal(t, 5, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE parent_id = $1`, id))
	require.Equal(t, 0, b.count(`SELECT children_pending FROM {{s}}.gendurable_instances WHERE id = $1`, id))
}

func TestNestedFanOut(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	cfg := fastConfig("", parent, leaf)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 10, PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	id := b.insert(parent.New(fanState{Width: 3, Depth: 2})) // 3 + 9 sub-parents' … 27 leaves
	r := b.waitStatus(id, "done", 30*time.Second)
	var s fanState
	require.NoError(t, jsonUnmarshal(r.Result, &s))
	require.Equal(t, 3+9+27, s.ChildSum, "every descendant finished before its ancestor resumed")
	require.Equal(t, 1+3+9+27, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`))
}

func TestZeroChildrenRunsOnAtOnce(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	b := setup(t, nil, parent, leaf)
	b.start()
	id := b.insert(parent.New(fanState{Width: 0}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"width":0,"depth":0,"resumes":1}`, string(r.Result))
}

func TestInvalidChildIsAnInvalidOutcome(t *testing.T) {
	t.Parallel()
	ghost := &gendurable.Job[leafArgs]{Name: "ghost", Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	m := &gendurable.Machine[fanState]{
		Name: "badkids", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[fanState]{
			"a": func(ctx context.Context, r *gendurable.Run[fanState]) (gendurable.Outcome, error) {
				return r.ScheduleChildren("a", r.State, ghost.New(leafArgs{})), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(fanState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Contains(t, r.Errors[0]["error"], "machine not registered")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE parent_id IS NOT NULL`))
}

// TestTransactionalOutcome: the step's own writes commit with its outcome,
// exactly once even when the step runs twice, and roll back when the
// callback fails.
func TestTransactionalOutcome(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	var mu sync.Mutex
	m := &gendurable.Machine[leafArgs]{
		Name: "ledger", Start: "post", MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[leafArgs]{
			"post": func(ctx context.Context, r *gendurable.Run[leafArgs]) (gendurable.Outcome, error) {
				calls.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					mu.Lock()
					defer mu.Unlock()
					if _, err := tx.Exec(ctx, `INSERT INTO ledger_`+r.Queue+` (instance, amount) VALUES ($1, $2)`, r.ID, r.State.N); err != nil {
						return err
					}
					if r.State.Fail && r.Attempt == 0 {
						return errors.New("ledger rejected the first try")
					}
					return nil
				}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.Queues = map[string]gendurable.QueueConfig{"tx": {PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.exec(`CREATE TABLE ledger_tx (instance bigint, amount int)`)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP TABLE IF EXISTS ledger_tx`) })
	b.start()
	ctx := context.Background()
	ok, err := b.eng.Insert(ctx, m.New(leafArgs{N: 10}).With(gendurable.InsertOpts{Queue: "tx"}))
	require.NoError(t, err)
	flaky, err := b.eng.Insert(ctx, m.New(leafArgs{N: 20, Fail: true}).With(gendurable.InsertOpts{Queue: "tx"}))
	require.NoError(t, err)
	b.waitStatus(ok.ID, "done", 10*time.Second)
	r := b.waitStatus(flaky.ID, "done", 10*time.Second)
	require.Equal(t, 1, r.Attempt, "the failed callback went to Handle, which replayed")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM ledger_tx WHERE instance = $1`, ok.ID))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM ledger_tx WHERE instance = $1`, flaky.ID), "the failed try's write was rolled back")
}

// TestFencedTransactionalOutcomeRollsBack: a zombie's WithTx writes vanish
// with its fenced-out outcome.
func TestFencedTransactionalOutcomeRollsBack(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	m := &gendurable.Machine[leafArgs]{
		Name: "zledger", Start: "post",
		Steps: map[string]gendurable.StepFunc[leafArgs]{
			"post": func(ctx context.Context, r *gendurable.Run[leafArgs]) (gendurable.Outcome, error) {
				close(started)
				<-release
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO zledger (instance) VALUES ($1)`, r.ID)
					return err
				}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.ReaperInterval = -1
	b := setup(t, cfg)
	b.exec(`CREATE TABLE zledger (instance bigint)`)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP TABLE IF EXISTS zledger`) })
	b.start()
	id := b.insert(m.New(leafArgs{}))
	<-started
	// The lease is taken away (reaped, then claimed by someone else).
	b.exec(`UPDATE {{s}}.gendurable_instances SET claim_token = -1 WHERE id = $1`, id)
	close(release)
	time.Sleep(300 * time.Millisecond)
	require.Zero(t, b.count(`SELECT count(*) FROM zledger`), "the zombie's own writes rolled back with its outcome")
	require.Equal(t, "executing", b.row(id).Status)
}
