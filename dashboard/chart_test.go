package dashboard

import (
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// TestLayoutChart: bars are stacked (failed on top of done) and scaled to
// an even axis top, one per minute, with the x axis labelled from −60m to
// now; the per-queue rate averages the newest five minutes.
func TestLayoutChart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	bs := make([]gendurable.ThroughputBucket, 60)
	for i := range bs {
		bs[i].Start = now.Add(-time.Duration(60-i) * time.Minute)
	}
	bs[59] = gendurable.ThroughputBucket{Start: bs[59].Start, Done: 30, Failed: 10}
	bs[58].Done = 10
	bs[0].Failed = 1
	c := layoutChart(bs)
	require.Equal(t, int64(40), c.Max)
	require.Equal(t, [2]int64{40, 11}, [2]int64{c.Done, c.Failed})
	require.Len(t, c.Bars, 60)
	last := c.Bars[59]
	require.Equal(t, chartPlotH*30/40, last.DoneH)
	require.Equal(t, chartPlotH*10/40, last.FailH)
	require.Equal(t, chartTop+chartPlotH-last.DoneH, last.DoneY)
	require.Equal(t, last.DoneY-last.FailH, last.FailY, "failed sits on top of done")
	require.Equal(t, chartTop, last.FailY, "the tallest bar reaches the top")
	require.Equal(t, "14:59–15:00 UTC: 30 done, 10 failed", last.Title)
	require.Equal(t, 3, c.Bars[0].FailH)
	require.Zero(t, c.Bars[1].DoneH+c.Bars[1].FailH)
	require.Equal(t, []chartTick{{chartTop + chartPlotH, "0"}, {chartTop + chartPlotH/2, "20"}, {chartTop, "40"}}, c.YTicks)
	require.Equal(t, "−60m", c.XTicks[0].Label)
	require.Equal(t, "now", c.XTicks[len(c.XTicks)-1].Label)
	require.Equal(t, c.PlotX+c.PlotW, c.XTicks[len(c.XTicks)-1].Pos)

	require.Equal(t, rate{DonePerMin: 8, FailPerMin: 2}, rateOf(bs))
	require.Equal(t, rate{}, rateOf(nil))
	require.Equal(t, int64(4), layoutChart(make([]gendurable.ThroughputBucket, 60)).Max, "an empty hour")
	for n, want := range map[int64]int64{0: 4, 5: 6, 7: 8, 9: 10, 11: 20, 21: 40, 41: 60, 99: 100, 101: 200, 12345: 20000} {
		require.Equal(t, want, niceCeil(n), n)
	}
}
