package benchrun

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

// benchSchema reserves the connections of a run's pool (8) from the test
// budget and names a schema for it: an empty one dbtest drops at the end,
// which the run may take over (ResetSchema) and drops itself.
func benchSchema(t *testing.T) Options {
	t.Helper()
	const conns = 8
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, Extra: conns, NoMigrate: true})
	return Options{DatabaseURL: dbtest.URL(), Schema: schema, ResetSchema: true, FreshStats: true, MaxConns: conns}
}

// TestKeysWorkload runs workload keys at a tiny size and checks that every
// figure it reports is there and sane; no timing is asserted.
func TestKeysWorkload(t *testing.T) {
	t.Parallel()
	o := benchSchema(t)
	o.Workload, o.N, o.Concurrency = "keys", 200, 20
	o.Keys, o.FairBacklog, o.FairRows, o.FairRounds = 4, 1000, 20, 2
	o.KeyRate, o.RateWindow = 20, 2*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Run(ctx, o)
	require.NoError(t, err)

	require.Equal(t, "keys", r.Workload)
	require.EqualValues(t, 200, r.Steps)
	require.Positive(t, r.StepsPerSec)
	require.Positive(t, r.StatementsPerStep)
	k := r.Keys
	require.NotNil(t, k)
	require.Equal(t, 4, k.Keys)
	require.Equal(t, 4, k.Limit)
	require.Equal(t, 5.0, k.SleepMs)
	require.LessOrEqual(t, k.MaxRunning, 4, "a key never runs more than its limit")
	require.GreaterOrEqual(t, k.MaxRunning, 2, "a key runs steps in parallel")
	require.LessOrEqual(t, k.KeysAtLimit, k.Keys)
	require.Positive(t, k.MeanRunning)
	require.LessOrEqual(t, k.MeanRunning, 4.0)
	require.Equal(t, r.StepsPerSec, k.StepsPerSec)

	f := k.Fairness
	require.Equal(t, 40, f.Limit, "concurrency + prefetch")
	require.Equal(t, 1000, f.ABacklog)
	require.LessOrEqual(t, f.ARunnableAtB, 1000)
	require.Equal(t, 20, f.BRows)
	require.Equal(t, 2, f.BRounds)
	require.Equal(t, 40, f.BIdleStarted, "all of B's rows ran with A idle")
	require.Equal(t, 40, f.BStarted, "all of B's rows ran behind A's backlog")
	for _, p := range [][2]float64{{f.BIdleP50Ms, f.BIdleP99Ms}, {f.BP50Ms, f.BP99Ms}} {
		require.Positive(t, p[0])
		require.LessOrEqual(t, p[0], p[1])
	}
	require.InDelta(t, f.BP99Ms/f.BIdleP99Ms, f.P99Ratio, 1e-9)
	// B's rows were claimed by picks the trace saw, and started after
	// their insert committed.
	for _, tr := range []BTrace{f.IdleTrace, f.Trace} {
		require.GreaterOrEqual(t, tr.Picks, 1.0, "%+v", tr)
		require.Positive(t, tr.PickRows, "%+v", tr)
		require.Positive(t, tr.CommitMs, "%+v", tr)
		require.LessOrEqual(t, tr.FirstStartMs, tr.LastStartMs, "%+v", tr)
	}

	// The JSON carries every documented field.
	var buf bytes.Buffer
	require.NoError(t, Print(&buf, r, true))
	var out struct {
		Keys map[string]any `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &out))
	for _, name := range []string{"keys", "limit", "sleep_ms", "max_running", "keys_at_limit", "mean_running", "steps_per_sec", "fairness"} {
		require.Contains(t, out.Keys, name)
	}
	fair, ok := out.Keys["fairness"].(map[string]any)
	require.True(t, ok)
	for _, name := range []string{"limit", "a_backlog", "a_runnable_at_b", "b_rows", "b_rounds", "b_started", "b_idle_started",
		"b_p50_ms", "b_p99_ms", "b_idle_p50_ms", "b_idle_p99_ms", "p99_ratio"} {
		require.Contains(t, fair, name)
	}
	rate, ok := out.Keys["rate"].(map[string]any)
	require.True(t, ok)
	for _, name := range []string{"asked_per_sec", "burst", "window_s", "starts", "measured_per_sec", "error_pct", "most_in_a_second"} {
		require.Contains(t, rate, name)
	}
	rr := r.Keys.Rate
	require.Equal(t, 20.0, rr.Asked)
	require.Equal(t, 2, rr.Burst)
	require.Positive(t, rr.Starts, "the rated key started")
	// Never above the rate: the burst plus the rate over the window.
	require.LessOrEqual(t, float64(rr.Starts), rr.Asked*rr.WindowS+float64(rr.Burst)+1)
	buf.Reset()
	require.NoError(t, Print(&buf, r, false))
	require.Contains(t, buf.String(), "B's p99 busy / idle")
	require.Contains(t, buf.String(), "rated key starts/s")
}

// TestPartitionWorkload: workload partition works on key leases, with no
// statements of its own per step (it paid a lock and an unlock per step on
// session locks).
func TestPartitionWorkload(t *testing.T) {
	t.Parallel()
	o := benchSchema(t)
	o.Workload, o.N, o.Concurrency = "partition", 500, 50
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Run(ctx, o)
	require.NoError(t, err)
	require.EqualValues(t, 500, r.Steps)
	require.Nil(t, r.Keys)
	require.Less(t, r.StatementsPerStep, 1.0)
	for _, st := range r.Statements {
		require.NotContains(t, st.Kind, "advisory", "no session lock statements")
	}
}

func TestKeysWorkloadWantsOneEngineAndQueue(t *testing.T) {
	_, err := Run(context.Background(), Options{Workload: "keys", Queues: 2})
	require.ErrorContains(t, err, "one engine on one queue")
}
