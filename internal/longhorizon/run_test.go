package longhorizon

import (
	"testing"
	"time"
)

// TestDepthPollsAreSpacedByTheirDuration: in fixed mode the depth is polled
// once a sample period, and no sooner than depthPollDuty times the last
// poll's duration after it started; every 200 ms (or back to back) when the
// producer steers by it.
func TestDepthPollsAreSpacedByTheirDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode       string
		took, want time.Duration
	}{
		{ModeFixed, 20 * time.Millisecond, 5 * time.Second},
		{ModeFixed, 2 * time.Second, 20 * time.Second},
		{ModeDepthTarget, 5 * time.Millisecond, 200 * time.Millisecond},
		{ModeDepthTarget, 100 * time.Millisecond, 200 * time.Millisecond},
	} {
		if got := depthPollGap(c.mode, 5*time.Second, c.took); got != c.want {
			t.Errorf("%s, a poll of %v: next after %v, want %v", c.mode, c.took, got, c.want)
		}
	}
}
