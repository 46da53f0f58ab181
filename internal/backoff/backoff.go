// Package backoff computes the delays between retries of a failing database
// call: exponential, capped, and jittered, so that the processes a database
// restart disconnected together do not all reconnect in the same instant.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay is the wait before retry n (n ≥ 1) of something that failed n times
// in a row: base·2^(n-1), at most ceiling, then a random point in the upper
// half of that ([d/2, d]), so the expected wait still grows geometrically.
func Delay(base, ceiling time.Duration, n int) time.Duration {
	d := Exp(max(base, time.Millisecond), ceiling, n)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// Spaced is the least time from the start of a recurring read to the next's
// when its cost grows with something it cannot bound (under a snapshot held
// elsewhere, the dead index entries it passes): every, or duty times the
// last one's duration if that is longer, so the reads take at most 1/duty
// of a server process. The floor checks, the reaper's full sweeps and the
// long-horizon adapter's depth polls are spaced so.
func Spaced(every time.Duration, duty int, took time.Duration) time.Duration {
	return max(every, time.Duration(duty)*took)
}

// Exp is Delay without the jitter: base·2^(n-1), at most ceiling, for a
// wait that only one caller keeps (nothing to spread).
func Exp(base, ceiling time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// Write is the retry schedule of an outcome write that failed transiently
// (a lost connection, a deadlock with another process's batch): the group
// committer and a WithTx outcome's transaction both wait through it, 20 ms
// doubling to 2 s, jittered.
type Write struct{ failures int }

// Wait counts one more failure and sleeps before the next try. It returns
// false, at once, if ctx ends first: give up.
func (w *Write) Wait(ctx context.Context) bool {
	w.failures++
	t := time.NewTimer(Delay(20*time.Millisecond, 2*time.Second, w.failures))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Failures is how many failures Wait has counted.
func (w *Write) Failures() int { return w.failures }
