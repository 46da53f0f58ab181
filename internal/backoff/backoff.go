// Package backoff computes the delays between retries of a failing database
// call: exponential, capped, and jittered, so that the processes a database
// restart disconnected together do not all reconnect in the same instant.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay is the wait before retry n (n ≥ 1) of something that failed n times
// in a row: base·2^(n-1), at most ceiling, then a random point in the upper
// half of that ([d/2, d]), so the expected wait still grows geometrically.
func Delay(base, ceiling time.Duration, n int) time.Duration {
	d := max(base, time.Millisecond)
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
