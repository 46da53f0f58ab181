package gendurable_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

type shopState struct {
	Go string `json:"go"` // the step "charge" moves to
}

// shopMachine declares its flow: reserve → charge → ship | refund; ship
// awaits "delivered"; delivered and refund finish.
func shopMachine(version int) *gendurable.Machine[shopState] {
	step := func(ctx context.Context, r *gendurable.Run[shopState]) (gendurable.Outcome, error) {
		switch r.Step {
		case "reserve":
			return r.Next("charge", r.State), nil
		case "charge":
			return r.Next(r.State.Go, r.State), nil
		case "ship":
			return r.Await("delivered", r.State, "parcel"), nil
		}
		return gendurable.Done(nil), nil
	}
	return &gendurable.Machine[shopState]{
		Name: "shop", Version: version, Start: "reserve", MaxAttempts: 5,
		Backoff: func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[shopState]{
			"reserve": step, "charge": step, "ship": step, "delivered": step, "refund": step,
		},
		Flow: []gendurable.FlowStep{
			{Step: "reserve", To: []string{"charge"}, Kinds: gendurable.OutcomeNext},
			{Step: "charge", To: []string{"ship", "refund"}, Kinds: gendurable.OutcomeNext},
			{Step: "ship", To: []string{"delivered"}, Kinds: gendurable.OutcomeAwait},
			{Step: "delivered", Kinds: gendurable.OutcomeDone},
			{Step: "refund"},
		},
	}
}

// TestFlowIsValidatedAtRegistration: every name a Flow gives must be a
// step; contradictions and bounds are refused by New, before any SQL.
func TestFlowIsValidatedAtRegistration(t *testing.T) {
	t.Parallel()
	pool := newPoolForConfigTests(t)
	steps := func() map[string]gendurable.StepFunc[shopState] {
		f := func(ctx context.Context, r *gendurable.Run[shopState]) (gendurable.Outcome, error) {
			return gendurable.Done(nil), nil
		}
		return map[string]gendurable.StepFunc[shopState]{"a": f, "b": f}
	}
	register := func(flow []gendurable.FlowStep) error {
		_, err := gendurable.New(pool, &gendurable.Config{Machines: []gendurable.Definition{
			&gendurable.Machine[shopState]{Name: "m", Start: "a", Steps: steps(), Flow: flow}}})
		return err
	}
	require.NoError(t, register(nil), "no Flow: nothing declared, as before")
	require.NoError(t, register([]gendurable.FlowStep{{Step: "a", To: []string{"b"}}}), "a partial Flow")

	for name, c := range map[string]struct {
		flow  []gendurable.FlowStep
		field string
		step  string
	}{
		"unknown To (a typo)":  {[]gendurable.FlowStep{{Step: "a", To: []string{"b", "bb"}}}, "Flow[0].To", "bb"},
		"unknown Flow step":    {[]gendurable.FlowStep{{Step: "a", To: []string{"b"}}, {Step: "c"}}, "Flow[1].Step", "c"},
		"empty Flow step name": {[]gendurable.FlowStep{{Step: ""}}, "Flow[0].Step", ""},
	} {
		err := register(c.flow)
		var use *gendurable.UnknownStepError
		require.ErrorAs(t, err, &use, name)
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, name)
		require.Equal(t, c.field, use.Field, name)
		require.Equal(t, c.step, use.Step, name)
		require.Equal(t, []string{"a", "b"}, use.Steps, name)
		require.Equal(t, "m", use.Machine, name)
		require.Equal(t, 1, use.Version, name)
	}
	for name, flow := range map[string][]gendurable.FlowStep{
		"declared twice":        {{Step: "a"}, {Step: "a"}},
		"Next without To":       {{Step: "a", Kinds: gendurable.OutcomeNext}},
		"To with only Done":     {{Step: "a", To: []string{"b"}, Kinds: gendurable.OutcomeDone}},
		"unknown kind bits":     {{Step: "a", Kinds: 1 << 6}},
		"await without targets": {{Step: "a", Kinds: gendurable.OutcomeAwait | gendurable.OutcomeDone}},
	} {
		err := register(flow)
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, name)
		var use *gendurable.UnknownStepError
		require.False(t, errors.As(err, &use), name)
	}
	many := map[string]gendurable.StepFunc[shopState]{}
	for i := range gendurable.MaxSteps + 1 {
		many[strings.Repeat("s", 1+i%50)+string(rune('a'+i/50))] = steps()["a"]
	}
	_, err := gendurable.New(pool, &gendurable.Config{Machines: []gendurable.Definition{
		&gendurable.Machine[shopState]{Name: "big", Start: "sa", Steps: many}}})
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	require.Contains(t, err.Error(), "more than 256")
}

// TestValidateOutcome checks outcomes as the engine does, with no database:
// what gendurabletest.RunStep calls.
func TestValidateOutcome(t *testing.T) {
	t.Parallel()
	m := shopMachine(1)
	r := &gendurable.Run[shopState]{}
	require.NoError(t, m.ValidateOutcome("charge", r.Next("ship", shopState{})))
	require.NoError(t, m.ValidateOutcome("charge", r.Replay(shopState{}, time.Second)), "Replay is always allowed")
	require.NoError(t, m.ValidateOutcome("charge", gendurable.Stop("no")), "Stop is always allowed")
	require.NoError(t, m.ValidateOutcome("ship", r.Await("delivered", shopState{}, "parcel")))
	require.NoError(t, m.ValidateOutcome("refund", gendurable.Done(nil)))

	for name, c := range map[string]struct {
		step    string
		out     gendurable.Outcome
		to      string
		outcome string
	}{
		"a typo":               {"charge", r.Next("shp", shopState{}), "shp", "next"},
		"an undeclared target": {"reserve", r.Next("ship", shopState{}), "ship", "next"},
		"a kind not declared":  {"ship", r.Next("delivered", shopState{}), "delivered", "next"},
		"Done where not":       {"charge", gendurable.Done(nil), "", "done"},
		"Next from a sink":     {"refund", r.Next("ship", shopState{}), "ship", "next"},
	} {
		err := m.ValidateOutcome(c.step, c.out)
		var te *gendurable.TransitionError
		require.ErrorAs(t, err, &te, name)
		require.ErrorIs(t, err, gendurable.ErrUndeclaredTransition, name)
		require.ErrorIs(t, err, gendurable.ErrInvalidOutcome, name)
		require.Equal(t, c.step, te.From, name)
		require.Equal(t, c.to, te.To, name)
		require.Equal(t, c.outcome, te.Outcome, name)
	}
	err := m.ValidateOutcome("charge", r.Next("ship", shopState{}).After(-time.Second))
	require.ErrorIs(t, err, gendurable.ErrInvalidOutcome, "the structural checks run too")
	require.ErrorIs(t, m.ValidateOutcome("nope", gendurable.Done(nil)), gendurable.ErrInvalidOutcome)
	require.ErrorIs(t, m.ValidateOutcome("charge", gendurable.Outcome{}), gendurable.ErrInvalidOutcome)
	other := &gendurable.Run[probeState]{}
	require.ErrorIs(t, m.ValidateOutcome("charge", other.Next("ship", probeState{})), gendurable.ErrStateEncode)

	// Without a Flow, only the structural checks.
	free := probeMachine(new(atomic.Int32))
	require.NoError(t, free.ValidateOutcome("a", gendurable.Done(nil)))
	require.ErrorIs(t, free.ValidateOutcome("a", (&gendurable.Run[probeState]{}).Next("nope", probeState{})), gendurable.ErrInvalidOutcome)
}

// TestUndeclaredTransitionFailsTheInstanceAtOnce: at run time an outcome
// that breaks the Flow fails the instance on its first attempt, without
// Handle and without retries, with kind "transition" in its history — also
// when Handle returns it.
func TestUndeclaredTransitionFailsTheInstanceAtOnce(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	m := shopMachine(1)
	m.Handle = func(ctx context.Context, r *gendurable.Run[shopState], err error) (gendurable.Outcome, error) {
		handled.Add(1)
		if r.State.Go == "handle-undeclared" {
			return r.Next("ship", r.State), nil // reserve may only go to charge
		}
		return r.Replay(r.State, 0), nil
	}
	steps := m.Steps
	steps["reserve"] = func(ctx context.Context, r *gendurable.Run[shopState]) (gendurable.Outcome, error) {
		if r.State.Go == "handle-undeclared" {
			return gendurable.Outcome{}, errors.New("reserve failed")
		}
		return r.Next("charge", r.State), nil
	}
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()

	ok := b.insert(m.New(shopState{Go: "refund"}))
	typo := b.insert(m.New(shopState{Go: "refnd"}))        // not a step at all
	undeclared := b.insert(m.New(shopState{Go: "charge"})) // a step, not a declared target
	viaHandle := b.insert(m.New(shopState{Go: "handle-undeclared"}))

	b.waitStatus(ok, "done", 10*time.Second)
	for _, id := range []int64{typo, undeclared} {
		r := b.waitStatus(id, "failed", 10*time.Second)
		require.Equal(t, "charge", r.Step)
		require.Equal(t, 0, r.Attempt, "no retry")
		require.Len(t, r.Errors, 1)
		require.Equal(t, "transition", r.Errors[0]["kind"])
		require.Contains(t, r.Errors[0]["error"], `step "charge" may not next to`)
		require.Contains(t, r.Errors[0]["error"], `(its Flow allows next to ["ship" "refund"])`)
	}
	r := b.waitStatus(viaHandle, "failed", 10*time.Second)
	require.Equal(t, int32(1), handled.Load(), "Handle is asked about viaHandle's error only, not about a broken Flow")
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, "transition", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], "reserve failed; Handle's outcome:")
	require.Contains(t, r.Errors[0]["error"], `step "reserve" may not next to "ship"`)

	_, err := gendurable.WaitResult[any](ctx, b.eng, undeclared)
	require.ErrorIs(t, err, gendurable.ErrInstanceFailed)
	require.Contains(t, err.Error(), "undeclared transition")
}

// TestPanicStackSurvivesABrokenFlow: a step that panics records its stack
// (StepError.Stack) whether Handle's answer keeps the Flow (a retry) or
// breaks it (a "transition" failure); in the second case the step event
// still carries the panic along with the *TransitionError.
func TestPanicStackSurvivesABrokenFlow(t *testing.T) {
	t.Parallel()
	m := shopMachine(1)
	m.Handle = func(ctx context.Context, r *gendurable.Run[shopState], err error) (gendurable.Outcome, error) {
		if r.State.Go == "break" {
			return r.Next("ship", r.State), nil // reserve may only go to charge
		}
		if r.Attempt == 0 {
			return r.Replay(r.State, 0), nil
		}
		return gendurable.Stop("gave up"), nil
	}
	m.Steps["reserve"] = func(ctx context.Context, r *gendurable.Run[shopState]) (gendurable.Outcome, error) {
		panic("reserve exploded")
	}
	log := &eventLog{}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{log}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	kept := b.insert(m.New(shopState{Go: "keep"}))
	broken := b.insert(m.New(shopState{Go: "break"}))

	b.waitStatus(kept, "failed", 10*time.Second)
	b.waitStatus(broken, "failed", 10*time.Second)
	for id, kinds := range map[int64][]string{kept: {"panic", "panic"}, broken: {"transition"}} {
		in, err := b.eng.Instance(ctx, id)
		require.NoError(t, err)
		require.Len(t, in.Errors, len(kinds))
		for i, e := range in.Errors {
			require.Equal(t, kinds[i], e.Kind)
			require.Contains(t, e.Error, "panic: reserve exploded")
			require.True(t, strings.HasPrefix(e.Stack, "goroutine "), "instance %d: %q", id, e.Stack)
			require.Contains(t, strings.Split(e.Stack, "\n")[1], "TestPanicStackSurvivesABrokenFlow",
				"the first frame is the one that panicked:\n%s", e.Stack)
		}
	}
	ev, ok := findEvent(log, func(e *gendurable.StepEvent) bool { return e.InstanceID == broken })
	require.True(t, ok)
	var perr *gendurable.PanicError
	require.ErrorAs(t, ev.Err, &perr, "the step's panic: %v", ev.Err)
	require.Contains(t, perr.Stack, "TestPanicStackSurvivesABrokenFlow")
	var terr *gendurable.TransitionError
	require.ErrorAs(t, ev.Err, &terr)
	require.Equal(t, "ship", terr.To)
	require.ErrorIs(t, ev.Err, gendurable.ErrUndeclaredTransition)
}

// newPoolForConfigTests is a pool that New can be given; the tests using
// it never reach the database (New does not touch it).
func newPoolForConfigTests(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), dbtest.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
