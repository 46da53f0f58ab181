package gendurabletest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

type order struct {
	Item    string `json:"item"`
	Do      string `json:"do,omitempty"`
	Charged bool   `json:"charged,omitempty"`
	Paid    int    `json:"paid,omitempty"`
	hidden  int    // not stored: the step never sees it
}

type payment struct {
	Cents int `json:"cents"`
}

type shipment struct {
	Item string `json:"item"`
}

var shipJob = &gendurable.Job[shipment]{
	Name:    "ship",
	Queue:   "shipping",
	Perform: func(ctx context.Context, j *gendurable.Run[shipment]) error { return nil },
}

// orderMachine's "charge" step does what the state's Do says.
var orderMachine = &gendurable.Machine[order]{
	Name:        "order",
	Start:       "charge",
	MaxAttempts: 3,
	Backoff:     func(attempt int) time.Duration { return time.Duration(attempt+1) * time.Second },
	Steps: map[string]gendurable.StepFunc[order]{
		"charge": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			s := r.State
			switch s.Do {
			case "error":
				return gendurable.Outcome{}, errors.New("card declined")
			case "panic":
				panic("charge exploded")
			case "typo":
				return r.Next("shpi", s), nil
			case "sleep":
				return r.Next("await_payment", s).After(time.Hour), nil
			case "stop":
				return gendurable.Stop("out of stock"), nil
			case "hidden":
				if s.hidden != 0 {
					return gendurable.Stop("the step saw an unexported field"), nil
				}
			}
			s.Charged = true
			return r.Next("await_payment", s), nil
		},
		"await_payment": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			return r.Await("ship", r.State, "payment", "cancel").Timeout(30 * time.Minute), nil
		},
		"ship": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			if len(r.Awaited) == 0 {
				return gendurable.Stop("payment timed out"), nil
			}
			var p payment
			if err := r.Awaited[0].Decode(&p); err != nil {
				return gendurable.Outcome{}, err
			}
			s := r.State
			s.Paid = p.Cents
			return r.ScheduleChildren("complete", s,
				shipJob.New(shipment{Item: s.Item}).With(gendurable.InsertOpts{Priority: 2, UniqueKey: "ship:" + s.Item})), nil
		},
		"complete": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			done := 0
			for _, c := range r.Children {
				if c.Status == gendurable.StatusDone {
					done++
				}
			}
			return gendurable.Done(map[string]int{"paid": r.State.Paid, "shipped": done}), nil
		},
	},
}

func TestRunStepNext(t *testing.T) {
	t.Parallel()
	res := gendurabletest.RunStep(t.Context(), t, orderMachine, "charge", order{Item: "book"}, nil)
	require.Equal(t, "next", res.Kind)
	require.Equal(t, "await_payment", res.Step)
	require.Equal(t, order{Item: "book", Charged: true}, res.State)
	require.Zero(t, res.Delay)
	require.NoError(t, res.Err)
	require.Nil(t, res.Recorded)
	require.Equal(t, `next "await_payment"`, res.String())

	res = gendurabletest.RunStep(t.Context(), t, orderMachine, "charge", order{Item: "book", Do: "sleep"}, nil)
	require.Equal(t, time.Hour, res.Delay)
}

// The state reaches the step through JSON, as it does from the row.
func TestRunStepStateGoesThroughJSON(t *testing.T) {
	t.Parallel()
	res := gendurabletest.RunStep(t.Context(), t, orderMachine, "charge", order{Item: "book", Do: "hidden", hidden: 7}, nil)
	require.Equal(t, "next", res.Kind, res.String())
}

func TestRunStepAwait(t *testing.T) {
	t.Parallel()
	res := gendurabletest.RunStep(t.Context(), t, orderMachine, "await_payment", order{Item: "book"}, nil)
	require.Equal(t, "await", res.Kind)
	require.Equal(t, "ship", res.Step)
	require.Equal(t, []string{"payment", "cancel"}, res.Awaits)
	require.Equal(t, 30*time.Minute, res.Timeout)
}

func TestRunStepAfterAwait(t *testing.T) {
	t.Parallel()
	opts := &gendurabletest.StepOpts{
		Awaits: []string{"payment", "cancel"},
		Inbox: []gendurable.Signal{
			gendurabletest.NewSignal(t, "note", "gift wrap"),
			gendurabletest.NewSignal(t, "payment", payment{Cents: 4200}),
		},
		Registered: []gendurable.Definition{shipJob},
	}
	res := gendurabletest.RunStep(t.Context(), t, orderMachine, "ship", order{Item: "book"}, opts)
	require.Equal(t, "children", res.Kind, res.String())
	require.Equal(t, "complete", res.Step)
	require.Equal(t, 4200, res.State.Paid)
	require.Equal(t, []int64{2}, res.Consumes, "only the awaited signal is consumed")
	require.Len(t, res.Children, 1)
	c := res.Children[0]
	require.Equal(t, gendurabletest.ChildInsert{Machine: "ship", Version: 1, Queue: "shipping", Step: gendurable.JobStep,
		State: c.State, Priority: 2, MaxAttempts: gendurable.DefaultMaxAttempts, UniqueKey: "ship:book"}, c)
	var s shipment
	require.NoError(t, c.DecodeState(&s))
	require.Equal(t, shipment{Item: "book"}, s)

	// Timed out: nothing awaited.
	res = gendurabletest.RunStep(t.Context(), t, orderMachine, "ship", order{Item: "book"}, &gendurabletest.StepOpts{TimedOut: true})
	require.Equal(t, "stop", res.Kind)
	require.Equal(t, "payment timed out", res.Reason)
	require.Equal(t, &gendurable.StepError{Step: "ship", Kind: "stop", Error: "payment timed out"}, res.Recorded)
}

// A child of a machine the engine would not know is an invalid outcome.
func TestRunStepUnregisteredChild(t *testing.T) {
	t.Parallel()
	opts := &gendurabletest.StepOpts{
		Awaits:     []string{"payment"},
		Inbox:      []gendurable.Signal{gendurabletest.NewSignal(t, "payment", payment{Cents: 1})},
		Registered: []gendurable.Definition{},
	}
	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RunStep(t.Context(), tb, orderMachine, "ship", order{Item: "book"}, opts)
	}))
	require.Contains(t, f.message(), `outcome the engine rejects`)
	require.Contains(t, f.message(), `"ship" version 1 (add it to Config.Machines)`)
}

func TestRunStepChildren(t *testing.T) {
	t.Parallel()
	children := []gendurable.Child{
		{ID: 10, Machine: "ship", Version: 1, Step: gendurable.JobStep, Status: gendurable.StatusDone},
		{ID: 11, Machine: "ship", Version: 1, Step: gendurable.JobStep, Status: gendurable.StatusFailed},
	}
	res := gendurabletest.RunStep(t.Context(), t, orderMachine, "complete", order{Paid: 4200}, &gendurabletest.StepOpts{Children: children})
	require.Equal(t, "done", res.Kind)
	require.JSONEq(t, `{"paid": 4200, "shipped": 1}`, string(res.Result))
	var got map[string]int
	require.NoError(t, res.DecodeResult(&got))
	require.Equal(t, 1, got["shipped"])
	require.Equal(t, order{Paid: 4200}, res.State, "Done keeps the state")
}

func TestRunStepFailures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	res := gendurabletest.RunStep(ctx, t, orderMachine, "charge", order{Do: "error"}, &gendurabletest.StepOpts{Attempt: 1})
	require.Equal(t, "replay", res.Kind)
	require.True(t, res.CountsAttempt)
	require.Equal(t, 2*time.Second, res.Delay, "the machine's Backoff for attempt 1")
	require.EqualError(t, res.Err, "card declined")
	require.Nil(t, res.Panic)
	require.Equal(t, &gendurable.StepError{Step: "charge", Attempt: 1, Kind: "error", Error: "card declined"}, res.Recorded)

	res = gendurabletest.RunStep(ctx, t, orderMachine, "charge", order{Do: "panic"}, nil)
	require.Equal(t, "replay", res.Kind)
	require.NotNil(t, res.Panic, "a panic is reported as one")
	require.Equal(t, "charge exploded", res.Panic.Value)
	require.Contains(t, res.Panic.Stack, "step_test.go")
	require.Equal(t, "panic", res.Recorded.Kind)
	require.Equal(t, `replay in 1s after a panic: charge exploded`, res.String())

	// The last attempt: the default Handle stops.
	res = gendurabletest.RunStep(ctx, t, orderMachine, "charge", order{Do: "error"}, &gendurabletest.StepOpts{Attempt: 2})
	require.Equal(t, "stop", res.Kind)
	require.Equal(t, "card declined; stopped: attempts exhausted (3 of 3)", res.Reason)

	res = gendurabletest.RunStep(ctx, t, orderMachine, "charge", order{Do: "stop"}, nil)
	require.Equal(t, "stop", res.Kind)
	require.Equal(t, "out of stock", res.Reason)
	require.NoError(t, res.Err)
}

// A Next to a step the machine does not declare fails the test, as it
// would fail every run in the engine.
func TestRunStepInvalidOutcomeFailsTheTest(t *testing.T) {
	t.Parallel()
	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RunStep(t.Context(), tb, orderMachine, "charge", order{Do: "typo"}, nil)
	}))
	require.Contains(t, f.message(), `step "charge" of machine "order" returned an outcome the engine rejects`)
	require.Contains(t, f.message(), `Next names step "shpi", which the machine does not declare`)

	// Allowed: the result shows what Handle made of it.
	res := gendurabletest.RunStep(t.Context(), t, orderMachine, "charge", order{Do: "typo"}, &gendurabletest.StepOpts{AllowInvalidOutcome: true})
	require.Equal(t, "replay", res.Kind)
	require.ErrorIs(t, res.Err, gendurable.ErrInvalidOutcome)

	f = newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RunStep(t.Context(), tb, orderMachine, "refund", order{}, nil)
	}))
	require.Contains(t, f.message(), `machine "order" has no step "refund" (its steps: await_payment, charge, complete, ship)`)
}

// Options outside what an instance can hold fail the test: converted
// unchecked, Priority 40000 ran as -25536 and Attempt 1<<32 as 0 (a misuse
// probe).
func TestRunStepOptionsOutOfRangeFailTheTest(t *testing.T) {
	t.Parallel()
	for _, opts := range []gendurabletest.StepOpts{{Priority: 40000}, {Priority: -40000}, {Attempt: 1 << 32}, {MaxAttempts: 1<<32 + 5}} {
		f := newFakeTB(t)
		require.True(t, f.run(func(tb testing.TB) {
			gendurabletest.RunStep(t.Context(), tb, orderMachine, "charge", order{}, &opts)
		}), "%+v", opts)
		require.Contains(t, f.message(), "out of range")
	}
}

// A retry's delay is shown to the millisecond: the jittered backoff read
// "replay in 842.917526ms after error: boom" (a newcomer's probe).
func TestRunStepStringRoundsTheDelay(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[shipment]{Name: "boom", Perform: func(context.Context, *gendurable.Run[shipment]) error { return errors.New("boom") }}
	res := gendurabletest.RunStep(t.Context(), t, job, gendurable.JobStep, shipment{}, nil)
	require.Equal(t, "replay", res.Kind)
	require.Regexp(t, `^replay in (\d+ms|\d+(\.\d{1,3})?s) after error: boom$`, res.String())
}

func TestRunStepJob(t *testing.T) {
	t.Parallel()
	attempts := 0
	job := &gendurable.Job[shipment]{
		Name: "flaky",
		Perform: func(ctx context.Context, j *gendurable.Run[shipment]) error {
			attempts++
			switch j.State.Item {
			case "later":
				return gendurable.JobSnooze(time.Minute)
			case "never":
				return gendurable.JobCancel(errors.New("no such item"))
			}
			return nil
		},
	}
	res := gendurabletest.RunStep(t.Context(), t, job, gendurable.JobStep, shipment{Item: "book"}, nil)
	require.Equal(t, "done", res.Kind)
	require.Equal(t, json.RawMessage("null"), res.Result)

	res = gendurabletest.RunStep(t.Context(), t, job, gendurable.JobStep, shipment{Item: "later"}, nil)
	require.Equal(t, "replay", res.Kind)
	require.False(t, res.CountsAttempt, "a snooze counts no attempt")
	require.Equal(t, time.Minute, res.Delay)

	res = gendurabletest.RunStep(t.Context(), t, job, gendurable.JobStep, shipment{Item: "never"}, nil)
	require.Equal(t, "stop", res.Kind)
	require.Equal(t, "JobCancel: no such item; stopped: not retried", res.Reason)
	require.Equal(t, 3, attempts)
}

// The inbox reaches a step that does not follow an await only when the
// machine sets Inbox, as in the engine.
func TestRunStepInbox(t *testing.T) {
	t.Parallel()
	count := func(inbox bool) int {
		m := &gendurable.Machine[order]{Name: "inbox", Start: "a", Inbox: inbox, Steps: map[string]gendurable.StepFunc[order]{
			"a": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
				return gendurable.Done(len(r.Inbox)), nil
			},
		}}
		res := gendurabletest.RunStep(t.Context(), t, m, "a", order{}, &gendurabletest.StepOpts{
			Inbox: []gendurable.Signal{gendurabletest.NewSignal(t, "x", nil)},
		})
		var n int
		require.NoError(t, res.DecodeResult(&n))
		return n
	}
	require.Equal(t, 0, count(false))
	require.Equal(t, 1, count(true))

	// A signal no engine could hold fails the test, as Signal refuses it.
	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RunStep(t.Context(), tb, orderMachine, "charge", order{}, &gendurabletest.StepOpts{
			Inbox: []gendurable.Signal{{Name: ""}},
		})
	}))
	require.Contains(t, f.message(), "invalid signal: StepOpts.Inbox signal 1")
}

func TestRunStepTimeout(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[order]{Name: "slow", Start: "a", StepTimeout: 20 * time.Millisecond, Steps: map[string]gendurable.StepFunc[order]{
		"a": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			<-ctx.Done()
			return gendurable.Outcome{}, context.Cause(ctx)
		},
	}}
	res := gendurabletest.RunStep(t.Context(), t, m, "a", order{}, nil)
	require.Equal(t, "replay", res.Kind)
	require.ErrorIs(t, res.Err, gendurable.ErrStepTimeout)
}

// A WithTx callback runs only in the transaction the test gives; its
// error goes to Handle.
func TestRunStepWithTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m := &gendurable.Machine[order]{Name: "tx", Start: "a", Steps: map[string]gendurable.StepFunc[order]{
		"a": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
				var ok bool
				if err := tx.QueryRow(ctx, `SELECT set_config('gendurabletest.item', $1, true) <> 'fail'`, r.State.Item).Scan(&ok); err != nil {
					return err
				}
				if !ok {
					return errors.New("the ledger refused")
				}
				return nil
			}), nil
		},
	}}
	res := gendurabletest.RunStep(ctx, t, m, "a", order{Item: "book"}, nil)
	require.True(t, res.WithTx)
	require.Equal(t, "done", res.Kind, "without a Tx the callback does not run")

	db := gendurabletest.NewDB(t, &gendurabletest.DBOpts{MaxConns: 1})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res = gendurabletest.RunStep(ctx, t, m, "a", order{Item: "book"}, &gendurabletest.StepOpts{Tx: tx})
	require.Equal(t, "done", res.Kind)
	var item string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('gendurabletest.item')`).Scan(&item))
	require.Equal(t, "book", item, "the callback ran in the test's transaction")

	res = gendurabletest.RunStep(ctx, t, m, "a", order{Item: "fail"}, &gendurabletest.StepOpts{Tx: tx})
	require.Equal(t, "replay", res.Kind, res.String())
	require.EqualError(t, res.Err, "the ledger refused")

	// As in the engine: the callback may not end the transaction, and one
	// that swallows a failed statement goes to Handle.
	m2 := &gendurable.Machine[order]{Name: "tx2", Start: "b", Steps: map[string]gendurable.StepFunc[order]{
		"b": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
				if err := tx.Commit(ctx); !errors.Is(err, gendurable.ErrTxOwned) {
					return fmt.Errorf("Commit: %v", err)
				}
				_, _ = tx.Exec(ctx, `SELECT 1/0`)
				return nil
			}), nil
		},
	}}
	sp, err := tx.Begin(ctx) // a savepoint, so the test's transaction survives the abort
	require.NoError(t, err)
	res = gendurabletest.RunStep(ctx, t, m2, "b", order{}, &gendurabletest.StepOpts{Tx: sp})
	require.Equal(t, "replay", res.Kind, res.String())
	require.ErrorContains(t, res.Err, "25P02")
	require.NoError(t, sp.Rollback(ctx))

	// A ROLLBACK sent as a statement ends the transaction: the step fails,
	// as the engine fails it.
	m3 := &gendurable.Machine[order]{Name: "tx3", Start: "c", Steps: map[string]gendurable.StepFunc[order]{
		"c": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
			return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `ROLLBACK`)
				return err
			}), nil
		},
	}}
	res = gendurabletest.RunStep(ctx, t, m3, "c", order{}, &gendurabletest.StepOpts{Tx: tx})
	require.Equal(t, "replay", res.Kind, res.String())
	require.ErrorContains(t, res.Err, "ended the step's transaction itself")
}

// A Next that breaks the machine's declared Flow (to a step that exists but
// is not a declared target) fails the test, as it fails the instance at once
// in the engine (a *gendurable.TransitionError, docs/design.md §9).
func TestRunStepUndeclaredTransitionFailsTheTest(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[order]{
		Name:  "flowed",
		Start: "charge",
		Steps: map[string]gendurable.StepFunc[order]{
			"charge": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
				if r.State.Do == "refund" {
					return r.Next("refund", r.State), nil // a step, but not a declared target
				}
				return r.Next("ship", r.State), nil
			},
			"ship": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
			"refund": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
		Flow: []gendurable.FlowStep{{Step: "charge", To: []string{"ship"}}},
	}
	res := gendurabletest.RunStep(t.Context(), t, m, "charge", order{}, nil)
	require.Equal(t, "next", res.Kind)
	require.Equal(t, "ship", res.Step)

	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RunStep(t.Context(), tb, m, "charge", order{Do: "refund"}, nil)
	}))
	require.Contains(t, f.message(), `returned an outcome the engine rejects`)
	require.Contains(t, f.message(), `refund`)

	res = gendurabletest.RunStep(t.Context(), t, m, "charge", order{Do: "refund"}, &gendurabletest.StepOpts{AllowInvalidOutcome: true})
	var te *gendurable.TransitionError
	require.ErrorAs(t, res.Err, &te)
	require.Equal(t, "stop", res.Kind, "the engine fails the instance at once: no retry")
}

// nestedPanic's String panics with a nestedPanic, which fmt cannot print.
type nestedPanic struct{}

func (nestedPanic) String() string { panic(nestedPanic{}) }

// TestRunStepPanicValueFmtCannotPrint: the result's String names the
// value's type instead of panicking again.
func TestRunStepPanicValueFmtCannotPrint(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[order]{Name: "nested", Start: "a", Backoff: func(int) time.Duration { return time.Second }, Steps: map[string]gendurable.StepFunc[order]{
		"a": func(context.Context, *gendurable.Run[order]) (gendurable.Outcome, error) { panic(nestedPanic{}) },
	}}
	res := gendurabletest.RunStep(t.Context(), t, m, "a", order{}, nil)
	require.NotNil(t, res.Panic)
	require.Equal(t, "replay in 1s after a panic: a gendurabletest_test.nestedPanic value (formatting it panicked)", res.String())
}

// TestRunStepFailsAnOutcomeThePostgreSQLRefuses (an API probe): a Next
// whose state holds a NUL came back as a plain "next", while the engine's
// statement is refused (22P05) and the instance fails at once; a number
// numeric cannot hold written without an exponent, as a "done". The first
// fails the test now; the second goes to Handle, as in the engine.
func TestRunStepFailsAnOutcomeThePostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[order]{
		Name: "nul", Start: "a",
		Steps: map[string]gendurable.StepFunc[order]{
			"a": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
				switch r.State.Do {
				case "nul":
					return r.Next("b", order{Item: "x\x00y"}), nil
				case "digits":
					return gendurable.Done(json.RawMessage(strings.Repeat("9", 131073))), nil
				}
				return r.Next("b", r.State), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[order]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	require.Equal(t, "next", gendurabletest.RunStep(t.Context(), t, m, "a", order{}, nil).Kind)
	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RunStep(t.Context(), tb, m, "a", order{Do: "nul"}, nil)
	}))
	require.Contains(t, f.message(), "PostgreSQL refuses")
	require.Contains(t, f.message(), "NUL")
	res := gendurabletest.RunStep(t.Context(), t, m, "a", order{Do: "nul"}, &gendurabletest.StepOpts{AllowInvalidOutcome: true})
	require.Equal(t, "next", res.Kind)

	res = gendurabletest.RunStep(t.Context(), t, m, "a", order{Do: "digits"}, &gendurabletest.StepOpts{AllowInvalidOutcome: true})
	require.Equal(t, "replay", res.Kind, "the engine's Handle retries it")
	require.ErrorContains(t, res.Err, "cannot store")
}

// TestRunStepLeavesAGoexitToTheTest: RunStep runs the step on the test's
// own goroutine, so t.Fatal, t.Skip or a require assertion inside the step
// stops the test there, as anywhere in it. (An engine's workers contain a
// Goexit in a test binary; RunStep must not, or the test went on after its
// t.Fatal with a "panic: runtime.Goexit called" outcome: a review.)
func TestRunStepLeavesAGoexitToTheTest(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[order]{Name: "goexits", Start: "a",
		Steps: map[string]gendurable.StepFunc[order]{
			"a": func(context.Context, *gendurable.Run[order]) (gendurable.Outcome, error) {
				runtime.Goexit() // what t.FailNow does
				return gendurable.Done(nil), nil
			},
		}}
	returned := make(chan bool)
	go func() {
		ok := false
		defer func() { returned <- ok }()
		gendurabletest.RunStep(context.Background(), t, m, "a", order{}, nil)
		ok = true
	}()
	require.False(t, <-returned, "the Goexit ended the caller's goroutine")
}
