package gendurable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// standalone is an engine that registers no machine on b's schema: what the
// CLI and `gendurable ui` run.
func (b *testBundle) standalone() *gendurable.Engine {
	b.t.Helper()
	eng, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema})
	require.NoError(b.t, err)
	return eng
}

type storedDef struct {
	Steps, Flow, Observed string
	Registered, Updated   time.Time
	Seen                  time.Time
}

func (b *testBundle) storedDefs() map[string]storedDef {
	b.t.Helper()
	rows, err := b.pool.Query(context.Background(), replaceSchema(`
		SELECT name || ' v' || version, steps::text, coalesce(flow::text, ''), observed::text, registered_at, updated_at, seen_at
		FROM {{s}}.gendurable_machines`, b.schema))
	require.NoError(b.t, err)
	out := map[string]storedDef{}
	for rows.Next() {
		var k string
		var d storedDef
		require.NoError(b.t, rows.Scan(&k, &d.Steps, &d.Flow, &d.Observed, &d.Registered, &d.Updated, &d.Seen))
		out[k] = d
	}
	require.NoError(b.t, rows.Err())
	return out
}

// TestStandaloneGraphShowsTheStoredMachineWhole: an engine that starts
// stores its machines' definitions; a process that registers nothing then
// draws them whole — every step in declaration order, declared edges, the
// transitions taken (merged on Stop), versions — and lists them.
func TestStandaloneGraphShowsTheStoredMachineWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	shop := shopMachine(1)
	b := setup(t, nil, shop)
	ui := b.standalone()
	_, err := ui.Graph(ctx, "shop")
	require.ErrorIs(t, err, gendurable.ErrNotFound, "nothing stored before a start")

	b.start()
	g, err := ui.Graph(ctx, "shop")
	require.NoError(t, err)
	require.Equal(t, []string{"reserve", "charge", "ship", "delivered", "refund"}, g.Steps, "declaration order, not by name")
	require.Equal(t, "reserve", g.Start)
	require.Equal(t, []int{1}, g.Versions)
	require.Empty(t, g.Registered)
	require.NotNil(t, g.UpdatedAt)
	require.Equal(t, []gendurable.DeclaredTransition{
		{From: "reserve", To: "charge", Kinds: []string{"next"}},
		{From: "charge", To: "ship", Kinds: []string{"next"}},
		{From: "charge", To: "refund", Kinds: []string{"next"}},
		{From: "ship", To: "delivered", Kinds: []string{"await"}},
		{From: "delivered", To: "done", Kinds: []string{"done"}},
		{From: "refund", To: "done", Kinds: []string{"done"}},
	}, g.Declared)
	require.Empty(t, g.Transitions, "nothing ran yet")

	ms, err := ui.ListMachines(ctx)
	require.NoError(t, err)
	require.Len(t, ms, 1)
	require.Equal(t, "shop", ms[0].Name)
	require.True(t, ms[0].Stored && ms[0].Flow)
	require.False(t, ms[0].Registered)
	require.Equal(t, g.Steps, ms[0].Steps)
	require.Empty(t, ui.Machines(), "Machines lists this engine's registrations only")

	var ids []int64
	for _, to := range []string{"refund", "refund", "ship"} {
		ids = append(ids, b.insert(shop.New(shopState{Go: to})))
	}
	b.waitStatus(ids[0], "done", 10*time.Second)
	b.waitStatus(ids[1], "done", 10*time.Second)
	b.waitStatus(ids[2], "awaiting_signal", 10*time.Second)

	// The engine that ran them sees its own transitions at once.
	own, err := b.eng.Graph(ctx, "shop")
	require.NoError(t, err)
	require.Contains(t, own.Transitions, gendurable.Transition{From: "charge", To: "refund", Outcome: "next", Count: 2})
	require.Equal(t, []int{1}, own.Registered)

	// Every other process once they are merged: on Stop (or every 10s).
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, b.eng.Stop(stopCtx))
	g, err = ui.Graph(ctx, "shop")
	require.NoError(t, err)
	require.Equal(t, []gendurable.Transition{
		{From: "charge", To: "refund", Outcome: "next", Count: 2},
		{From: "charge", To: "ship", Outcome: "next", Count: 1},
		{From: "refund", To: "done", Outcome: "done", Count: 2},
		{From: "reserve", To: "charge", Outcome: "next", Count: 3},
		{From: "ship", To: "delivered", Outcome: "await", Count: 1},
	}, g.Transitions)
	require.Equal(t, int64(2), g.Counts["refund"][gendurable.StatusDone])
	require.Equal(t, gendurable.Parked{Signal: 1}, g.Parked["delivered"], "an await is parked at the step it runs when woken")

	// A second run adds to the stored counts.
	require.NoError(t, b.eng.Start(ctx))
	id := b.insert(shop.New(shopState{Go: "refund"}))
	b.waitStatus(id, "done", 10*time.Second)
	require.NoError(t, b.eng.Stop(stopCtx))
	g, err = ui.Graph(ctx, "shop")
	require.NoError(t, err)
	require.Contains(t, g.Transitions, gendurable.Transition{From: "reserve", To: "charge", Outcome: "next", Count: 4})
}

// TestConcurrentStartsStoreEachDefinitionOnce: engines starting at once
// with the same machines (listed in different orders) all start, and each
// machine version has one row; a restart with the same definitions changes
// only seen_at.
func TestConcurrentStartsStoreEachDefinitionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	shop := shopMachine(1)
	var handled = probeMachine(nil)
	b := setup(t, nil, shop, handled)
	const n = 6
	engines := make([]*gendurable.Engine, n)
	for i := range engines {
		cfg := &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{shop, handled}, Logger: testLogger(t)}
		if i%2 == 1 {
			cfg.Machines = []gendurable.Definition{handled, shop}
		}
		eng, err := gendurable.New(b.pool, cfg)
		require.NoError(t, err)
		engines[i] = eng
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, eng := range engines {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = eng.Start(ctx) }()
	}
	wg.Wait()
	for i, eng := range engines {
		require.NoError(t, errs[i], "engine %d", i)
		require.NoError(t, eng.Stop(ctx))
	}
	defs := b.storedDefs()
	require.Len(t, defs, 2)
	require.Equal(t, `["reserve", "charge", "ship", "delivered", "refund"]`, defs["shop v1"].Steps)
	require.Equal(t, `["a", "b"]`, defs["probe v1"].Steps)
	require.Empty(t, defs["probe v1"].Flow, "no Flow: NULL")
	require.Contains(t, defs["shop v1"].Flow, `{"to": ["ship", "refund"], "step": "charge", "kinds": ["next"]}`)

	require.NoError(t, engines[0].Start(ctx))
	require.NoError(t, engines[0].Stop(ctx))
	again := b.storedDefs()
	require.Equal(t, defs["shop v1"].Updated, again["shop v1"].Updated, "same definition: updated_at stays")
	require.Equal(t, defs["shop v1"].Registered, again["shop v1"].Registered)
	require.True(t, again["shop v1"].Seen.After(defs["shop v1"].Seen), "seen_at moves")
}

// TestVersionBumpKeepsBothDefinitions: a new version is a new row beside
// the old one; the graph lists both versions and draws the newest's steps
// first, then the older's. A definition changed without a version bump
// replaces the stored one (and moves updated_at).
func TestVersionBumpKeepsBothDefinitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v1 := shopMachine(1)
	b := setup(t, nil, v1)
	b.start()
	v2 := shopMachine(2)
	delete(v2.Steps, "refund")
	v2.Steps["cancel"] = v2.Steps["delivered"]
	v2.Flow = []gendurable.FlowStep{
		{Step: "reserve", To: []string{"charge"}},
		{Step: "charge", To: []string{"ship", "cancel"}},
	}
	e2, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{v1, v2}, Logger: testLogger(t)})
	require.NoError(t, err)
	require.NoError(t, e2.Start(ctx))
	require.NoError(t, e2.Stop(ctx))

	g, err := b.standalone().Graph(ctx, "shop")
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, g.Versions)
	require.Equal(t, []string{"reserve", "charge", "cancel", "delivered", "ship", "refund"}, g.Steps,
		"v2: Start, Flow order, the rest by name; then v1's refund")
	require.Contains(t, g.Declared, gendurable.DeclaredTransition{From: "charge", To: "cancel", Kinds: []string{"next", "await", "children"}})
	require.Contains(t, g.Declared, gendurable.DeclaredTransition{From: "charge", To: "refund", Kinds: []string{"next"}}, "v1's edges too")

	before := b.storedDefs()["shop v1"]
	changed := shopMachine(1)
	changed.Flow = nil
	e3, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{changed}, Logger: testLogger(t)})
	require.NoError(t, err)
	require.NoError(t, e3.Start(ctx))
	require.NoError(t, e3.Stop(ctx))
	after := b.storedDefs()["shop v1"]
	require.Empty(t, after.Flow)
	require.True(t, after.Updated.After(before.Updated), "a changed definition moves updated_at")
	require.Equal(t, before.Registered, after.Registered)
}

// TestGraphCountsParkedInstances: instances waiting — for a signal, for
// children, backing off after a failure, delayed on purpose — are counted
// at the step they wait at.
func TestGraphCountsParkedInstances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := probeMachine(nil)
	m.Handle = nil // the default: back off
	m.Backoff = func(int) time.Duration { return time.Hour }
	idle := &gendurable.Job[leafArgs]{Name: "idle", Queue: "nobody-works-it",
		Perform: func(context.Context, *gendurable.Run[leafArgs]) error { return nil }}
	parent := &gendurable.Machine[probeState]{Name: "parent", Start: "spawn", Steps: map[string]gendurable.StepFunc[probeState]{
		"spawn": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
			return r.ScheduleChildren("join", r.State, idle.New(leafArgs{})), nil
		},
		"join": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
			return r.Await("end", r.State, "go"), nil
		},
		"end": func(ctx context.Context, r *gendurable.Run[probeState]) (gendurable.Outcome, error) {
			return gendurable.Done(nil), nil
		},
	}}
	b := setup(t, nil, m, parent, idle)
	b.start()
	fan := b.insert(parent.New(probeState{}))
	backing := b.insert(m.New(probeState{Do: "error"}))
	delayed := b.insert(m.New(probeState{Do: "next_delay"}))
	eventually(t, 10*time.Second, func() bool { return b.row(backing).Attempt == 1 }, "no retry")
	eventually(t, 10*time.Second, func() bool { return b.row(delayed).Step == "b" }, "no next")
	g, err := b.eng.Graph(ctx, "probe")
	require.NoError(t, err)
	require.Equal(t, gendurable.Parked{BackingOff: 1}, g.Parked["a"])
	require.Equal(t, gendurable.Parked{Delayed: 1}, g.Parked["b"])
	require.Equal(t, int64(1), g.Counts["a"][gendurable.StatusRunnable], "still counted by status too")

	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() - interval '1 minute' WHERE id = $1`, delayed)
	g, err = b.eng.Graph(ctx, "probe")
	require.NoError(t, err)
	_, parked := g.Parked["b"]
	require.False(t, parked, "an eligible row is not parked")

	b.waitStatus(fan, "awaiting_children", 10*time.Second)
	g, err = b.eng.Graph(ctx, "parent")
	require.NoError(t, err)
	require.Equal(t, gendurable.Parked{Children: 1}, g.Parked["join"])
	b.exec(`UPDATE {{s}}.gendurable_instances SET queue = 'default' WHERE fsm = 'idle'`)
	b.waitStatus(fan, "awaiting_signal", 10*time.Second)
	g, err = b.eng.Graph(ctx, "parent")
	require.NoError(t, err)
	require.Equal(t, gendurable.Parked{Signal: 1}, g.Parked["end"])
	require.Equal(t, []string{"spawn", "end", "join"}, g.Steps)
}

// TestTwoEnginesMergeTheirTransitions: two engines work the same machine
// at once; their steps write nothing to the stored definition (no write per
// step), and stopping both at once merges every transition exactly once.
func TestTwoEnginesMergeTheirTransitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	shop := shopMachine(1)
	b := setup(t, nil, shop)
	second, err := gendurable.New(b.pool, fastConfig(b.schema, shop))
	require.NoError(t, err)
	b.start()
	require.NoError(t, second.Start(ctx))
	const n = 60
	var ids []int64
	for i := range n {
		eng := b.eng
		if i%2 == 1 {
			eng = second
		}
		res, err := eng.Insert(ctx, shop.New(shopState{Go: "refund"}))
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	for _, id := range ids {
		b.waitStatus(id, "done", 20*time.Second)
	}
	require.Equal(t, "[]", b.storedDefs()["shop v1"].Observed, "no write per step (merges come every 10s)")

	var wg sync.WaitGroup
	for _, eng := range []*gendurable.Engine{b.eng, second} {
		wg.Add(1)
		go func() { defer wg.Done(); require.NoError(t, eng.Stop(ctx)) }()
	}
	wg.Wait()
	g, err := b.standalone().Graph(ctx, "shop")
	require.NoError(t, err)
	require.Equal(t, []gendurable.Transition{
		{From: "charge", To: "refund", Outcome: "next", Count: n},
		{From: "refund", To: "done", Outcome: "done", Count: n},
		{From: "reserve", To: "charge", Outcome: "next", Count: n},
	}, g.Transitions)
}
