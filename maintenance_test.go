package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// TestAwaitTimeoutIntervalKnob: the await-timeout sweep follows
// ReaperInterval unless AwaitTimeoutInterval is set — off with a negative
// ReaperInterval, as before the knob existed — and AwaitTimeoutInterval
// runs or stops it on its own. The deadline is written behind the engine's
// back (as by another process), so only the sweep's own timer can find it.
func TestAwaitTimeoutIntervalKnob(t *testing.T) {
	t.Parallel()
	b := setup(t, &gendurable.Config{})
	for _, c := range []struct {
		name          string
		reaper, sweep time.Duration
		wakes         bool
		sweepInConfig time.Duration
	}{
		{"follows a disabled reaper", -1, 0, false, 0},
		{"disabled alone", 50 * time.Millisecond, -1, false, -1},
		{"runs alone", -1, 50 * time.Millisecond, true, 50 * time.Millisecond},
	} {
		eng, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, ReaperInterval: c.reaper,
			AwaitTimeoutInterval: c.sweep, Logger: testLogger(t)})
		require.NoError(t, err)
		require.Equal(t, c.sweepInConfig, eng.Config().AwaitTimeoutInterval, c.name)
		require.NoError(t, eng.Start(context.Background()))
		b.exec(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, awaits, await_deadline)
			VALUES ('m', 'a', 'awaiting_signal', '{go}', now() + interval '100 milliseconds')`)
		due := func() bool {
			return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'awaiting_signal'`) == 0
		}
		if c.wakes {
			eventually(t, 3*time.Second, due, "%s: await not woken", c.name)
		} else {
			time.Sleep(400 * time.Millisecond)
			require.False(t, due(), "%s: await woken with no sweep", c.name)
		}
		require.NoError(t, eng.Stop(context.Background()))
		b.exec(`DELETE FROM {{s}}.gendurable_instances`)
	}
}
