package longhorizon

import (
	"math/bits"
	"sort"
	"sync"
	"time"
)

// Latencies are kept in an HDR-like histogram of microseconds: values below
// 2,048 µs each have a bucket of their own; above, every power of two is cut
// into 1,024 equal buckets, so a bucket is at most 1/1,024 of its values wide
// — three significant figures. The histogram is sparse (a map from bucket to
// count), so its memory is bounded by the number of buckets (about 45,000 up
// to maxMicros) whatever the number of values.

const (
	subBits    = 10             // 1,024 buckets per power of two
	subCount   = 1 << subBits   // 1,024
	linearTop  = 2 * subCount   // values below this have exact buckets
	maxMicros  = int64(1) << 42 // about 51 days; larger values are clamped
	windowSecs = 30             // the rolling window of the claim percentiles
)

// bucketOf is the bucket of v (µs, clamped to [0, maxMicros]).
func bucketOf(v int64) int32 {
	if v < 0 {
		v = 0
	}
	if v > maxMicros {
		v = maxMicros
	}
	if v < linearTop {
		return int32(v)
	}
	shift := bits.Len64(uint64(v)) - (subBits + 1) // v>>shift is in [1024, 2047]
	return int32(linearTop + (shift-1)*subCount + int(v>>uint(shift)) - subCount)
}

// bucketTop is the largest value (µs) of bucket b: percentiles report it, as
// HDR histograms report the highest value equivalent to the one at the rank.
func bucketTop(b int32) int64 {
	if b < linearTop {
		return int64(b)
	}
	i := int(b) - linearTop
	shift := i/subCount + 1
	low := int64(subCount+i%subCount) << uint(shift)
	return low + int64(1)<<uint(shift) - 1
}

// Histogram counts values by bucket. The zero value is empty and usable.
type Histogram struct {
	counts map[int32]uint64
	total  uint64
}

// Record adds one value in microseconds.
func (h *Histogram) Record(micros int64) {
	if h.counts == nil {
		h.counts = map[int32]uint64{}
	}
	h.counts[bucketOf(micros)]++
	h.total++
}

// Count is how many values were recorded.
func (h *Histogram) Count() uint64 { return h.total }

// merge adds o's counts to h.
func (h *Histogram) merge(o *Histogram) {
	if o.total == 0 {
		return
	}
	if h.counts == nil {
		h.counts = map[int32]uint64{}
	}
	for b, n := range o.counts {
		h.counts[b] += n
	}
	h.total += o.total
}

// Quantiles returns, for each q in qs (0 < q ≤ 1), the value in
// microseconds at rank ceil(q × count): the top of its bucket. An empty
// histogram returns zeros.
func (h *Histogram) Quantiles(qs ...float64) []int64 {
	out := make([]int64, len(qs))
	if h.total == 0 {
		return out
	}
	keys := make([]int32, 0, len(h.counts))
	for b := range h.counts {
		keys = append(keys, b)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for i, q := range qs {
		rank := uint64(q*float64(h.total) + 0.999999999)
		if rank < 1 {
			rank = 1
		}
		var seen uint64
		for _, b := range keys {
			seen += h.counts[b]
			if seen >= rank {
				out[i] = bucketTop(b)
				break
			}
		}
	}
	return out
}

// Rolling is a histogram of the last 30 seconds, kept as one histogram per
// second of the wall clock: recording and reading are safe for concurrent use.
type Rolling struct {
	mu    sync.Mutex
	slots [windowSecs]struct {
		sec  int64
		hist Histogram
	}
}

// Record adds a value (µs) observed at time at.
func (r *Rolling) Record(at time.Time, micros int64) {
	sec := at.Unix()
	r.mu.Lock()
	s := &r.slots[sec%windowSecs]
	if s.sec != sec {
		s.sec, s.hist = sec, Histogram{}
	}
	s.hist.Record(micros)
	r.mu.Unlock()
}

// Window merges the seconds (now-30s, now] into one histogram.
func (r *Rolling) Window(now time.Time) *Histogram {
	sec := now.Unix()
	var h Histogram
	r.mu.Lock()
	for i := range r.slots {
		if s := &r.slots[i]; s.sec > sec-windowSecs && s.sec <= sec {
			h.merge(&s.hist)
		}
	}
	r.mu.Unlock()
	return &h
}
