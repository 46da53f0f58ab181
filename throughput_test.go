package gendurable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// TestThroughputCountsFinishesPerMinute: finishes are counted in the
// minute of their finished_at (on the database's clock), in total and by
// queue; live instances and finishes older than an hour are not.
func TestThroughputCountsFinishesPerMinute(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("counted")
	b := setup(t, nil, job)
	ctx := context.Background()

	tp, err := b.eng.Throughput(ctx)
	require.NoError(t, err)
	require.Len(t, tp.Buckets, gendurable.ThroughputBuckets)
	require.Empty(t, tp.ByQueue)
	require.True(t, tp.Complete)

	// status, queue, finished this long ago
	rows := []struct {
		status, queue string
		ago           time.Duration
	}{
		{"done", "a", 10 * time.Second}, {"done", "a", 20 * time.Second}, {"failed", "b", 30 * time.Second},
		{"done", "b", 10*time.Minute + 30*time.Second}, {"failed", "a", 10*time.Minute + 40*time.Second},
		{"done", "a", 59*time.Minute + 30*time.Second},
		{"done", "a", 2 * time.Hour}, // too old
		{"runnable", "a", 0},         // live: not counted
	}
	for _, r := range rows {
		id := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: r.queue}))
		fin := "now() - $3::bigint * interval '1 microsecond'"
		if r.status == "runnable" {
			fin = "NULL"
		}
		_, err := b.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.gendurable_instances SET status = $2::%[1]s.gendurable_status,
			finished_at = %s WHERE id = $1 AND $3::bigint IS NOT NULL`, b.schema, fin), id, r.status, r.ago.Microseconds())
		require.NoError(t, err)
	}

	tp, err = b.eng.Throughput(ctx)
	require.NoError(t, err)
	require.True(t, tp.Complete)
	require.WithinDuration(t, time.Now(), tp.Now, 5*time.Second)
	last := len(tp.Buckets) - 1
	require.Equal(t, gendurable.ThroughputBucket{Start: tp.Now.Add(-time.Minute), Done: 2, Failed: 1}, tp.Buckets[last])
	require.Equal(t, gendurable.ThroughputBucket{Start: tp.Now.Add(-11 * time.Minute), Done: 1, Failed: 1}, tp.Buckets[last-10])
	require.Equal(t, gendurable.ThroughputBucket{Start: tp.Now.Add(-time.Hour), Done: 1}, tp.Buckets[0])
	var done, failed int64
	for _, bk := range tp.Buckets {
		done, failed = done+bk.Done, failed+bk.Failed
	}
	require.Equal(t, [2]int64{4, 2}, [2]int64{done, failed})
	require.Len(t, tp.ByQueue, 2)
	require.Equal(t, int64(2), tp.ByQueue["a"][last].Done)
	require.Equal(t, int64(0), tp.ByQueue["a"][last].Failed)
	require.Equal(t, int64(1), tp.ByQueue["b"][last].Failed)
	require.Equal(t, int64(1), tp.ByQueue["a"][last-10].Failed)
	require.Equal(t, int64(1), tp.ByQueue["b"][last-10].Done)
}
