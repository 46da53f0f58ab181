package dbtest

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBudgetBoundsReservations: reservations wait until they fit, so the
// connections held at once never exceed Budget, and a request larger than
// the whole budget gets all of it, alone.
func TestBudgetBoundsReservations(t *testing.T) {
	t.Parallel()
	var held, peak atomic.Int32
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := int32(1 + i%10)
			if i == 7 {
				want = Budget * 2
			}
			n := reserve(want)
			now := held.Add(n)
			for {
				p := peak.Load()
				if now <= p || peak.CompareAndSwap(p, now) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			held.Add(-n)
			release(n)
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, peak.Load(), Budget)
	require.Equal(t, Budget, peak.Load(), "the oversized request held the whole budget")
	budget.Lock()
	defer budget.Unlock()
	require.Zero(t, budget.inUse)
}
