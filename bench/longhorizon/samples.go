package longhorizon

import (
	"math"
	"sort"
	"time"
)

// Sample is one instant of a system run: the replicas' metrics merged and
// the database's, keyed by column name (NaN: not reported at that instant).
type Sample struct {
	T       time.Time
	Elapsed float64 // seconds since the run's start
	Phase   string
	V       map[string]float64
}

// Columns of a Sample, in the order of samples.csv. Merging the replicas:
// rates are summed; claim percentiles are the maximum over the replicas
// (claim_p95_ms_mean is the mean); queue_depth and producer_target_rate,
// which only instance 0 reports (the queue's depth; its own rate), are the
// maximum.
var Columns = []string{
	"offered", "producer_target_rate", "enqueue_rate", "completion_rate",
	"claim_p50_ms", "claim_p95_ms", "claim_p95_ms_mean", "claim_p99_ms", "queue_depth", "replicas",
	"live_tuples", "dead_tuples", "autovacuum_count", "vacuum_count", "autoanalyze_count", "hot_update_frac",
	"heap_bytes", "index_bytes", "total_bytes", "wal_bytes_per_s", "xmin_age",
}

// finish merges the points and database samples into Samples and totals
// the telemetry counts.
func (s *system) finish() {
	r := s.run
	p := s.o.SampleEvery
	byKey := map[int64]*Sample{}
	get := func(t time.Time) *Sample {
		k := t.Round(p).UnixMilli()
		if x, ok := byKey[k]; ok {
			return x
		}
		x := &Sample{T: t.Round(p), V: map[string]float64{}}
		for _, c := range Columns {
			x.V[c] = math.NaN()
		}
		byKey[k] = x
		return x
	}
	type agg struct {
		max, sum float64
		n        int
	}
	perKey := map[int64]map[string]*agg{}
	replicas := map[int64]map[int]bool{}
	for _, pt := range r.Points {
		x := get(pt.T)
		k := x.T.UnixMilli()
		if perKey[k] == nil {
			perKey[k] = map[string]*agg{}
			replicas[k] = map[int]bool{}
		}
		replicas[k][pt.Replica] = true
		a := perKey[k][pt.Metric]
		if a == nil {
			a = &agg{max: math.Inf(-1)}
			perKey[k][pt.Metric] = a
		}
		a.max = max(a.max, pt.Value)
		a.sum += pt.Value
		a.n++
		switch pt.Metric {
		case MetricEnqueue:
			r.Inserted += pt.Value * pt.WindowS
		case MetricCompletion:
			r.Completed += pt.Value * pt.WindowS
		}
	}
	for k, m := range perKey {
		x := byKey[k]
		for metric, a := range m {
			switch metric {
			case MetricEnqueue, MetricCompletion:
				x.V[metric] = a.sum
			case MetricClaimP50, MetricClaimP95, MetricClaimP99, MetricDepth, MetricTargetRate:
				x.V[metric] = a.max
				if metric == MetricClaimP95 {
					x.V["claim_p95_ms_mean"] = a.sum / float64(a.n)
				}
			}
		}
		x.V["replicas"] = float64(len(replicas[k]))
	}
	var prev *DBSample
	for i := range r.DBSamples {
		ds := &r.DBSamples[i]
		x := get(ds.T)
		var live, dead, av, vac, an, upd, hot, heap, idx, total float64
		for _, t := range ds.Tables {
			live += float64(t.Live)
			dead += float64(t.Dead)
			av += float64(t.Autovacuum)
			vac += float64(t.Vacuum)
			an += float64(t.Analyze)
			upd += float64(t.Updates)
			hot += float64(t.HOTUpdates)
			heap += float64(t.HeapBytes)
			idx += float64(t.IndexBytes)
			total += float64(t.TotalBytes)
		}
		x.V["live_tuples"], x.V["dead_tuples"] = live, dead
		x.V["autovacuum_count"], x.V["vacuum_count"], x.V["autoanalyze_count"] = av, vac, an
		if upd > 0 {
			x.V["hot_update_frac"] = hot / upd
		}
		x.V["heap_bytes"], x.V["index_bytes"], x.V["total_bytes"] = heap, idx, total
		x.V["xmin_age"] = float64(ds.XminAge)
		if prev != nil {
			if dt := ds.T.Sub(prev.T).Seconds(); dt > 0 {
				x.V["wal_bytes_per_s"] = float64(ds.WALBytes-prev.WALBytes) / dt
			}
		}
		prev = ds
	}
	out := make([]Sample, 0, len(byKey))
	for _, x := range byKey {
		x.Elapsed = x.T.Sub(r.Start).Seconds()
		x.Phase = r.phaseAt(x.T)
		x.V["offered"] = r.offeredAt(x.T)
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].T.Before(out[j].T) })
	r.Samples = out
	for i := range r.Spans {
		r.Spans[i].StartS = r.Spans[i].Start.Sub(r.Start).Seconds()
		r.Spans[i].EndS = r.Spans[i].End.Sub(r.Start).Seconds()
	}
}

// phaseAt names the phase running at t: "start" before the first, "drain"
// after the last.
func (r *SystemRun) phaseAt(t time.Time) string {
	if len(r.Spans) == 0 || t.Before(r.Spans[0].Start) {
		return "start"
	}
	for _, sp := range r.Spans {
		if t.Before(sp.End) {
			return sp.Name
		}
	}
	return "drain"
}

// offeredAt is the total rate the live replicas were told to offer at t.
func (r *SystemRun) offeredAt(t time.Time) float64 {
	v := math.NaN()
	for _, c := range r.rates {
		if c.T.After(t) {
			break
		}
		v = c.Rate
	}
	return v
}

// quantile is the q-quantile (nearest rank) of the non-NaN values; NaN if
// there are none.
func quantile(vals []float64, q float64) float64 {
	xs := make([]float64, 0, len(vals))
	for _, v := range vals {
		if !math.IsNaN(v) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// phaseValues are column c's values over the samples of phase.
func (r *SystemRun) phaseValues(phase, c string) []float64 {
	var out []float64
	for _, x := range r.Samples {
		if x.Phase == phase {
			out = append(out, x.V[c])
		}
	}
	return out
}

// lastValue is column c's last non-NaN value in phase.
func (r *SystemRun) lastValue(phase, c string) float64 {
	vs := r.phaseValues(phase, c)
	for i := len(vs) - 1; i >= 0; i-- {
		if !math.IsNaN(vs[i]) {
			return vs[i]
		}
	}
	return math.NaN()
}

// delta is the growth of a cumulative column over phase.
func (r *SystemRun) delta(phase, c string) float64 {
	vs := r.phaseValues(phase, c)
	first, last := math.NaN(), math.NaN()
	for _, v := range vs {
		if math.IsNaN(v) {
			continue
		}
		if math.IsNaN(first) {
			first = v
		}
		last = v
	}
	return last - first
}

// secondsUntil is the time from instant from (seconds since start) to the
// first sample at or after it where ok holds; NaN if none does.
func (r *SystemRun) secondsUntil(from float64, ok func(Sample) bool) float64 {
	for _, x := range r.Samples {
		if x.Elapsed >= from && ok(x) {
			return x.Elapsed - from
		}
	}
	return math.NaN()
}

func (r *SystemRun) span(name string) (Span, bool) {
	for _, s := range r.Spans {
		if s.Name == name {
			return s, true
		}
	}
	return Span{}, false
}
