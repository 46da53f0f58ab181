package maintenance

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

const insertExecuting = `INSERT INTO {{s}}.gendurable_instances (fsm, step, status, lease_expires_at, claim_token, max_attempts)
VALUES ('m', 'a', 'executing', now() + $1::bigint * interval '1 millisecond', 7, $2) RETURNING id`

// TestReaperRecoversExpiredLease: the running reaper sends an expired lease
// back to runnable with attempt + 1, fails one whose attempts are spent,
// reports both, and leaves a live lease alone.
func TestReaperRecoversExpiredLease(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	expired := d.id(insertExecuting, -1000, 5)
	spent := d.id(insertExecuting, -1000, 1)
	live := d.id(insertExecuting, 60_000, 5)

	var mu sync.Mutex
	var reports []Reaped
	r := &Reaper{Queries: d.q, DB: d.pool, Interval: 20 * time.Millisecond, Log: quiet,
		OnReap: func(_ context.Context, rep *Reaped) {
			mu.Lock()
			reports = append(reports, *rep)
			mu.Unlock()
		}}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	eventually(t, 3*time.Second, func() bool { return d.status(expired) == "runnable" }, "expired lease not reaped")
	r.Stop()

	if got := d.status(spent); got != "failed" {
		t.Fatalf("row with attempts spent is %s, want failed", got)
	}
	if got := d.status(live); got != "executing" {
		t.Fatalf("live lease is %s, want executing", got)
	}
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND attempt = 1 AND claim_token IS NULL`, expired); n != 1 {
		t.Fatal("reaped row: attempt not 1 or claim token kept")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 1 || reports[0].Count != 2 || reports[0].Failed != 1 {
		t.Fatalf("reports %+v, want one of 2 rows, 1 failed", reports)
	}
	ids := slices.Sorted(slices.Values(reports[0].IDs))
	if !slices.Equal(ids, []int64{expired, spent}) {
		t.Fatalf("reported ids %v, want %v", ids, []int64{expired, spent})
	}
}

// TestReaperSweepsAtTheNextExpiry: with an Interval of a minute, the
// running reaper still recovers each lease just after it runs out (1.5 s
// and 3 s after Start here): it reads the next expiry at Start and after
// each sweep.
func TestReaperSweepsAtTheNextExpiry(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	first := d.id(insertExecuting, 1500, 5)
	second := d.id(insertExecuting, 3000, 5)
	r := &Reaper{Queries: d.q, DB: d.pool, Interval: time.Minute, Log: quiet}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	eventually(t, 10*time.Second, func() bool { return d.status(first) == "runnable" }, "first lease not reaped")
	eventually(t, 10*time.Second, func() bool { return d.status(second) == "runnable" }, "second lease not reaped")
}

// TestReaperRunOnceBatches: one sweep goes on batch after batch until no
// expired lease is left, reporting each batch.
func TestReaperRunOnceBatches(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	for range 5 {
		d.id(insertExecuting, -1000, 5)
	}
	var batches []int
	r := &Reaper{Queries: d.q, DB: d.pool, Batch: 2, Log: quiet,
		OnReap: func(_ context.Context, rep *Reaped) { batches = append(batches, rep.Count) }}
	n, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 || !slices.Equal(batches, []int{2, 2, 1}) {
		t.Fatalf("reaped %d in batches %v, want 5 in [2 2 1]", n, batches)
	}
	if n, err := r.RunOnce(context.Background()); n != 0 || err != nil {
		t.Fatalf("second sweep: %d, %v", n, err)
	}
}
