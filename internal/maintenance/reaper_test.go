package maintenance

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/syncbuf"
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

// TestReaperKeepsUpWithDenseExpiries: 500 leases running out 2 ms apart
// from 1.5 s on (a busy worker that crashed) are all reaped within seconds
// with an Interval of a minute. A probe that took a lease running out
// during a sweep for a locked row waited the whole Interval after it.
func TestReaperKeepsUpWithDenseExpiries(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	last := d.id(`WITH ins AS (INSERT INTO {{s}}.gendurable_instances (fsm, step, status, lease_expires_at, claim_token, max_attempts)
		SELECT 'm', 'a', 'executing', now() + (1500 + 2*g) * interval '1 millisecond', 7, 5 FROM generate_series(0, 499) AS g
		RETURNING id) SELECT max(id) FROM ins`)
	r := &Reaper{Queries: d.q, DB: d.pool, Interval: time.Minute, Log: quiet}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	eventually(t, 10*time.Second, func() bool { return d.status(last) == "runnable" }, "the last lease (2.5 s) not reaped")
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`); n != 0 {
		t.Fatalf("%d leases not reaped", n)
	}
}

// TestReaperIsNotBlindedByALockedRow: an expired row held locked (a WithTx
// running past its lease) does not keep the reaper from sweeping at the
// next lease expiry after it.
func TestReaperIsNotBlindedByALockedRow(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	ctx := context.Background()
	locked := d.id(insertExecuting, -1000, 5)
	crashed := d.id(insertExecuting, 1500, 5)
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, d.sql(`SELECT 1 FROM {{s}}.gendurable_instances WHERE id = $1 FOR UPDATE`), locked); err != nil {
		t.Fatal(err)
	}
	r := &Reaper{Queries: d.q, DB: d.pool, Interval: time.Minute, Log: quiet}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	eventually(t, 10*time.Second, func() bool { return d.status(crashed) == "runnable" }, "the lease expiring at 1.5 s not reaped")
	if got := d.status(locked); got != "executing" {
		t.Fatalf("the locked row is %s, want executing", got)
	}
}

// TestReaperFindsALeaseBelowItsFloor: between full sweeps the running
// reaper sweeps from the floor its last sweep returned (about
// sqlq.ReapFloorSlack before its now()). A lease that ran out an hour
// before it became visible — a transaction that wrote it and committed long
// after — is below that floor: the sweeps of the next seconds leave it, and
// the next full sweep, fullSweepEvery Intervals after the one at Start,
// recovers it.
func TestReaperFindsALeaseBelowItsFloor(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	first := d.id(insertExecuting, -1000, 5)
	r := &Reaper{Queries: d.q, DB: d.pool, Interval: time.Second, Log: quiet}
	started := time.Now()
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	eventually(t, 5*time.Second, func() bool { return d.status(first) == "runnable" }, "the full sweep at Start did not run")
	late := d.id(insertExecuting, -3600*1000, 5)
	// Sweeps from the floor, one a second; the next full one is due
	// fullSweepEvery seconds after Start (later, never sooner, on a slow
	// machine).
	time.Sleep(3 * time.Second)
	if got, since := d.status(late), time.Since(started); got != "executing" && since < fullSweepEvery*time.Second {
		t.Fatalf("the lease below the floor is %s %v after Start, before a full sweep was due: the sweeps do not start at their floor", got, since)
	}
	eventually(t, 20*time.Second, func() bool { return d.status(late) == "runnable" }, "the lease below the floor not reaped by a full sweep")
}

// TestFullSweepsAreSpaced: a full sweep runs first, then once
// fullSweepEvery Intervals have passed, or fullSweepDuty times its
// duration if that is longer.
func TestFullSweepsAreSpaced(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, c := range []struct {
		since, took time.Duration
		due         bool
	}{
		{0, 0, true}, // none yet
		{9 * time.Second, 10 * time.Millisecond, false},
		{10 * time.Second, 10 * time.Millisecond, true},
		{15 * time.Second, 2 * time.Second, false}, // a slow one: 10 × 2 s
		{20 * time.Second, 2 * time.Second, true},
	} {
		last := now.Add(-c.since)
		if c.since == 0 {
			last = time.Time{}
		}
		if got := fullSweepDue(now, last, c.took, time.Second); got != c.due {
			t.Errorf("%v after a full sweep that took %v: due %v, want %v", c.since, c.took, got, c.due)
		}
	}
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

// TestReaperAbandonsAStatementOnADeadConnection: between two sweeps, the
// reaper's connection is stranded — nothing crosses it any more and nothing
// is closed, as when a NAT or proxy forgets it. The next reap statement,
// sent on it, never gets a reply. At StatementTimeout the reaper abandons
// it (pgx closes the connection) and logs a warning; its next sweep, an
// Interval later on a fresh connection, recovers the lease that expired
// meanwhile. Without the deadline the reaper waited for the reply until the
// OS's TCP keepalive gave up (two hours by default).
func TestReaperAbandonsAStatementOnADeadConnection(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	pool, proxy := d.proxied()
	logs := &syncbuf.Buffer{}
	before := d.id(insertExecuting, -1000, 5)
	r := &Reaper{Queries: d.q, DB: pool, Interval: strandedSweepInterval, StatementTimeout: strandedSweepTimeout, Log: bufLogger(logs)}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	eventually(t, 5*time.Second, func() bool { return d.status(before) == "runnable" }, "lease expired before the strand not reaped")

	proxy.Strand() // the pool's one connection, which carried that sweep
	stranded := time.Now()
	after := d.id(insertExecuting, -1000, 5)
	eventually(t, 10*time.Second, func() bool { return d.status(after) == "runnable" }, "lease expired after the strand not reaped")
	recoveredAfterDeadline(t, time.Since(stranded))
	if !strings.Contains(logs.String(), "reaper sweep failed") {
		t.Fatalf("no warning of the abandoned statement; logs:\n%s", logs.String())
	}
}
