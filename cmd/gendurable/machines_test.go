package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

// TestCLIMachines: the CLI registers no machine, yet lists every machine an
// engine stored at its start and prints one's graph whole.
func TestCLIMachines(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, nil)
	ctx := context.Background()
	s := []string{"--schema", schema}

	out, _, code := cli(t, append([]string{"machines"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "no machine is stored yet")

	step := func(ctx context.Context, r *gendurable.Run[args]) (gendurable.Outcome, error) {
		if r.Step == "pack" {
			return r.Next("post", r.State), nil
		}
		return gendurable.Done(nil), nil
	}
	m := &gendurable.Machine[args]{Name: "parcel", Start: "pack",
		Steps: map[string]gendurable.StepFunc[args]{"pack": step, "post": step, "lost": step},
		Flow:  []gendurable.FlowStep{{Step: "pack", To: []string{"post", "lost"}}, {Step: "post"}, {Step: "lost"}}}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{m},
		Queues: map[string]gendurable.QueueConfig{"default": {PollInterval: 20 * time.Millisecond}}})
	require.NoError(t, err)
	require.NoError(t, eng.Start(ctx))
	res, err := eng.Insert(ctx, m.New(args{}))
	require.NoError(t, err)
	_, err = gendurable.WaitResult[any](ctx, eng, res.ID)
	require.NoError(t, err)
	require.NoError(t, eng.Stop(ctx))

	out, _, code = cli(t, append([]string{"machines"}, s...)...)
	require.Equal(t, 0, code)
	require.Regexp(t, `parcel\s+1\s+pack\s+3\s+declared`, out)

	out, _, code = cli(t, append([]string{"machines", "parcel"}, s...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "machine parcel  versions 1  start pack")
	require.Regexp(t, `(?s)pack.*post.*lost`, out, "declared order, not by name")
	require.Contains(t, out, "pack → lost (next, await, children)")
	require.Contains(t, out, "post → done (done)")
	require.Regexp(t, `pack → post\s+next\s+1`, out)

	out, _, code = cli(t, append([]string{"machines", "parcel", "--json"}, s...)...)
	require.Equal(t, 0, code)
	var g gendurable.MachineGraph
	require.NoError(t, json.Unmarshal([]byte(out), &g))
	require.Equal(t, []string{"pack", "post", "lost"}, g.Steps)
	require.Equal(t, int64(1), g.Counts["post"][gendurable.StatusDone])

	out, _, code = cli(t, append([]string{"machines", "--json"}, s...)...)
	require.Equal(t, 0, code)
	var ms []gendurable.MachineInfo
	require.NoError(t, json.Unmarshal([]byte(out), &ms))
	require.Len(t, ms, 1)
	require.True(t, ms[0].Stored)

	// A machine known only from its instances (inserted, no engine that
	// registers it ever started): says so, not an empty header.
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('waiter', 'wait')`)
	require.NoError(t, err)
	out, _, code = cli(t, append([]string{"machines", "waiter"}, s...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "machine waiter  (no definition stored: no engine that registers it has started; steps from its instances)")
	require.Regexp(t, `wait\s+1`, out)

	_, errOut, code := cli(t, append([]string{"machines", "nope"}, s...)...)
	require.Equal(t, exitNotFound, code, errOut)
	require.Equal(t, "gendurable: machine not found: no machine \"nope\" is stored, registered here or in the table\n", errOut,
		"a machine, not an instance")
	_, _, code = cli(t, append([]string{"machines", "a\x1bb"}, s...)...)
	require.Equal(t, exitUsage, code)
	_, _, code = cli(t, append([]string{"machines", "a", "b"}, s...)...)
	require.Equal(t, exitUsage, code)
}
