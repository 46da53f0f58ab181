package backoff

import (
	"testing"
	"time"
)

func TestDelayGrowsCapsAndJitters(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 40; n++ {
		want := min(10*time.Millisecond<<min(n-1, 30), time.Second)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := Delay(10*time.Millisecond, time.Second, n)
			if d < want/2 || d > want {
				t.Fatalf("retry %d: delay %s outside [%s, %s]", n, d, want/2, want)
			}
			seen[d] = true
		}
		if len(seen) < 50 {
			t.Fatalf("retry %d: only %d distinct delays in 200: not jittered", n, len(seen))
		}
	}
}
