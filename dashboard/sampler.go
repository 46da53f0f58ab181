package dashboard

import (
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// Throughput. The engine keeps no history of finished instances per time,
// and Engine.List filters by insertion time, not finish time. So the
// dashboard keeps, in memory, the done and failed counts of each queue every
// time it reads them (each load of the queues page) and derives a rate from
// the current counts and an older sample: preferably one about a minute old,
// at least minSampleAge old. The figure is per dashboard process, needs two
// page loads a few seconds apart to appear (the queues page can refresh
// itself), and is clamped at zero when pruning lowers the counts.

const (
	rateWindow   = time.Minute
	minSampleAge = 5 * time.Second
	keepSamples  = 5 * time.Minute
	maxSamples   = 256
	sampleEvery  = time.Second // samples closer together than this are not kept
)

type sample struct {
	at     time.Time
	done   map[string]int64
	failed map[string]int64
}

type sampler struct {
	mu      sync.Mutex
	samples []sample // oldest first
}

func newSampler() *sampler { return &sampler{} }

// rate is a queue's finishing rate.
type rate struct {
	Known      bool
	DonePerMin float64
	FailPerMin float64
	Over       time.Duration // the span measured
}

// observe records the counts read at now and returns each queue's rate.
func (s *sampler) observe(now time.Time, stats []gendurable.QueueStats) map[string]rate {
	cur := sample{at: now, done: map[string]int64{}, failed: map[string]int64{}}
	for _, q := range stats {
		cur.done[q.Queue] = q.ByStatus[gendurable.StatusDone]
		cur.failed[q.Queue] = q.ByStatus[gendurable.StatusFailed]
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	// Forget samples that are too old (or from the future: a clock step).
	keep := s.samples[:0]
	for _, o := range s.samples {
		if age := now.Sub(o.at); age <= keepSamples && age >= 0 {
			keep = append(keep, o)
		}
	}
	s.samples = keep

	// The reference: the newest sample at least rateWindow old, else the
	// oldest at least minSampleAge old.
	var ref *sample
	for i := range s.samples {
		o := &s.samples[i]
		age := now.Sub(o.at)
		if age >= rateWindow {
			ref = o
			continue
		}
		if ref == nil && age >= minSampleAge {
			ref = o
		}
		break
	}
	out := map[string]rate{}
	if ref != nil {
		span := now.Sub(ref.at)
		per := float64(time.Minute) / float64(span)
		for q := range cur.done {
			d0, ok := ref.done[q]
			f0 := ref.failed[q]
			if !ok {
				continue // a queue new since the reference: no rate yet
			}
			out[q] = rate{Known: true, Over: span.Round(time.Second),
				DonePerMin: max(0, float64(cur.done[q]-d0)*per),
				FailPerMin: max(0, float64(cur.failed[q]-f0)*per)}
		}
	}

	if n := len(s.samples); n == 0 || now.Sub(s.samples[n-1].at) >= sampleEvery {
		if n >= maxSamples {
			s.samples = append(s.samples[:0], s.samples[1:]...)
		}
		s.samples = append(s.samples, cur)
	}
	return out
}
