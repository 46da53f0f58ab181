package gendurable

import (
	"context"
	"time"
)

// Bounds of [Engine.Throughput].
const (
	// ThroughputWindow is the span Throughput counts: the last hour, in
	// ThroughputBuckets minutes.
	ThroughputWindow  = time.Hour
	ThroughputBuckets = 60
	// MaxThroughputRows bounds the finished instances one call reads: at
	// it, only the newest are counted and Throughput.Complete is false (the
	// read stops there, so exactly MaxThroughputRows finishes read as
	// possibly more).
	MaxThroughputRows = 100_000
)

// ThroughputBucket counts the instances that finished in one minute.
type ThroughputBucket struct {
	Start  time.Time `json:"start"` // the minute is [Start, Start+1m)
	Done   int64     `json:"done"`
	Failed int64     `json:"failed"`
}

// Throughput is how many instances finished (done or failed) in each minute
// of the last hour, from their finish times in the database, so every
// process sees the same figures and none has to be running to collect them.
type Throughput struct {
	// Now is the database's clock at the read: the last bucket ends there.
	Now time.Time `json:"now"`
	// Buckets are every queue's finishes, one per minute, oldest first
	// (ThroughputBuckets of them).
	Buckets []ThroughputBucket `json:"buckets"`
	// ByQueue are the same buckets for each queue with a finish in the hour.
	ByQueue map[string][]ThroughputBucket `json:"by_queue"`
	// Complete is false when MaxThroughputRows or more instances finished
	// in the hour (the read stops at MaxThroughputRows, so it cannot tell
	// exactly that many from more): only the newest of them were counted,
	// so the minutes before Since may be short.
	Complete bool      `json:"complete"`
	Since    time.Time `json:"since"` // the counts are whole from here on
}

// Throughput counts the instances that finished in each minute of the
// last hour, in total and by queue. It reads finished_at through the index
// the pruner uses (newest first, at most MaxThroughputRows rows), so its
// cost is bounded whatever the table holds. Pruned instances are not
// counted: with a retention under an hour the oldest minutes fall short.
func (e *Engine) Throughput(ctx context.Context) (*Throughput, error) {
	if err := e.usable(ctx, "Throughput"); err != nil {
		return nil, err
	}
	now, rows, err := e.q.Throughput(ctx, e.pool, ThroughputWindow, MaxThroughputRows)
	if err != nil {
		return nil, e.dbErr(ctx, err, "throughput")
	}
	t := &Throughput{Now: now, ByQueue: map[string][]ThroughputBucket{}, Complete: true}
	newBuckets := func() []ThroughputBucket {
		bs := make([]ThroughputBucket, ThroughputBuckets)
		for i := range bs {
			bs[i].Start = now.Add(-time.Duration(ThroughputBuckets-i) * time.Minute)
		}
		return bs
	}
	t.Buckets = newBuckets()
	t.Since = t.Buckets[0].Start
	var total int64
	oldest := 0
	for _, r := range rows {
		total += r.Count
		if r.Ago >= ThroughputBuckets { // the window's first instant
			r.Ago = ThroughputBuckets - 1
		}
		i := ThroughputBuckets - 1 - r.Ago
		qb := t.ByQueue[r.Queue]
		if qb == nil {
			qb = newBuckets()
			t.ByQueue[r.Queue] = qb
		}
		for _, b := range []*ThroughputBucket{&t.Buckets[i], &qb[i]} {
			if Status(r.Status) == StatusDone {
				b.Done += r.Count
			} else {
				b.Failed += r.Count
			}
		}
		oldest = max(oldest, r.Ago)
	}
	if total >= MaxThroughputRows {
		t.Complete = false
		// The oldest minute read may hold only part of its finishes.
		t.Since = now.Add(-time.Duration(oldest) * time.Minute)
	}
	return t, nil
}
