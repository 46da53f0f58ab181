package longhorizon

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every value lands in a bucket that holds it, at most 1/1,024 of it wide:
// three significant figures.
func TestBucketsHoldTheirValuesToThreeFigures(t *testing.T) {
	t.Parallel()
	prevTop := int64(-1)
	for b := int32(0); b <= bucketOf(maxMicros); b++ {
		top := bucketTop(b)
		require.Greater(t, top, prevTop, "bucket %d", b)
		low := prevTop + 1
		require.Equal(t, b, bucketOf(low), "low end of bucket %d", b)
		require.Equal(t, b, bucketOf(top), "top of bucket %d", b)
		require.LessOrEqual(t, float64(top-low), math.Max(0, float64(low)/1024), "width of bucket %d", b)
		prevTop = top
	}
	require.Equal(t, bucketOf(maxMicros), bucketOf(math.MaxInt64))
	require.Equal(t, int32(0), bucketOf(-5))
}

// Quantiles match the exact ones (nearest rank) within 0.1 %, over latencies
// spread from microseconds to minutes.
func TestQuantilesWithinAPerMille(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var h Histogram
	vals := make([]int64, 200_000)
	for i := range vals {
		vals[i] = int64(math.Exp(rng.Float64() * 18)) // 1 µs .. ~66 s
		h.Record(vals[i])
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	qs := []float64{0.01, 0.5, 0.95, 0.99, 0.999, 1}
	got := h.Quantiles(qs...)
	for i, q := range qs {
		exact := vals[int(math.Ceil(q*float64(len(vals))))-1]
		require.GreaterOrEqual(t, got[i], exact, "q=%v", q)
		require.LessOrEqual(t, float64(got[i]-exact), float64(exact)/1000+1, "q=%v: %d vs %d", q, got[i], exact)
	}
	require.Equal(t, []int64{0, 0}, (&Histogram{}).Quantiles(0.5, 0.99))
}

// The rolling window holds the last 30 seconds only.
func TestRollingKeepsThirtySeconds(t *testing.T) {
	t.Parallel()
	var r Rolling
	t0 := time.Unix(1_800_000_000, 0)
	for s := 0; s < 60; s++ {
		r.Record(t0.Add(time.Duration(s)*time.Second), int64(s+1)*1000)
	}
	h := r.Window(t0.Add(59 * time.Second))
	require.Equal(t, uint64(30), h.Count())
	q := h.Quantiles(0.01, 1)
	require.Equal(t, int64(31_000), q[0]/1000*1000) // oldest kept: second 30
	require.Equal(t, int64(60_000), q[1]/1000*1000)
	require.Zero(t, r.Window(t0.Add(200*time.Second)).Count())
}
