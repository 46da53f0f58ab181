package maintenance

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// insertSlotOnce inserts the row of slot $2 of schedule $1, unless it was
// inserted already: a unique key per slot, as the engine's own insert.
const insertSlotOnce = `INSERT INTO {{s}}.gendurable_instances (fsm, step, state, unique_key, unique_scope)
VALUES ($1, 'a', jsonb_build_object('slot', $2::timestamptz), convert_to($1 || $2::timestamptz::text, 'UTF8'),
        '{runnable,executing,awaiting_signal,awaiting_children,done,failed}')
ON CONFLICT (unique_guard) WHERE unique_guard IS NOT NULL DO NOTHING RETURNING id`

// slots is a schedule of fixed slots.
func slots(ts ...time.Time) func(time.Time) time.Time {
	return func(t time.Time) time.Time {
		for _, s := range ts {
			if s.After(t) {
				return s
			}
		}
		return time.Time{}
	}
}

// TestPeriodicInsertsDueSlotOnce: two services (two processes) with the
// same schedule insert its missed slot at start and its next slot when it
// comes due, each exactly once between them; a SkipMissed schedule only the
// slot that comes due. Their loops end when no slot is left.
func TestPeriodicInsertsDueSlotOnce(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	now := time.Now().Truncate(time.Millisecond)
	missed, due := now.Add(-10*time.Minute), now.Add(300*time.Millisecond)
	schedules := []Schedule{
		{Name: "catch-up", Next: slots(missed.Add(-time.Minute), missed, due)},
		{Name: "skip", Next: slots(missed, due), SkipMissed: true},
	}
	var mu sync.Mutex
	var calls []string
	insert := func(ctx context.Context, i int, slot time.Time) (int64, bool, error) {
		mu.Lock()
		calls = append(calls, schedules[i].Name+" "+slot.Sub(now).String())
		mu.Unlock()
		var id int64
		err := d.pool.QueryRow(ctx, d.sql(insertSlotOnce), schedules[i].Name, slot).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, true, nil
		}
		return id, false, err
	}
	a := &Periodic{Schedules: schedules, Insert: insert, Log: quiet}
	b := &Periodic{Schedules: schedules, Insert: insert, Log: quiet}
	for _, p := range []*Periodic{a, b} {
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer p.Stop()
	}
	eventually(t, 3*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 6
	}, "slots not inserted")
	a.Stop()
	b.Stop()

	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`); n != 3 {
		t.Fatalf("%d rows, want 3: the catch-up schedule's missed and due slots, the skip schedule's due slot", n)
	}
	var rows []string
	r, err := d.pool.Query(context.Background(), d.sql(`SELECT fsm || ' ' || (state->>'slot') FROM {{s}}.gendurable_instances ORDER BY 1`))
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var s string
		if err := r.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	if len(slices.Compact(slices.Clone(rows))) != 3 {
		t.Fatalf("rows %q: a slot inserted twice", rows)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(calls)
	want := []string{"catch-up -10m0s", "catch-up -10m0s", "catch-up 300ms", "catch-up 300ms", "skip 300ms", "skip 300ms"}
	if !slices.Equal(calls, want) {
		t.Fatalf("inserts %q, want %q (each slot once per process, the earlier missed slot skipped)", calls, want)
	}
}

// TestPeriodicRetriesFailedInsert: a failed insert is tried again after
// RetryDelay, then 2 × RetryDelay, …; after five failures the slot is given
// up.
func TestPeriodicRetriesFailedInsert(t *testing.T) {
	t.Parallel()
	missed := time.Now().Add(-time.Minute)
	var mu sync.Mutex
	tries := map[string]int{}
	p := &Periodic{Log: quiet, RetryDelay: 5 * time.Millisecond,
		Schedules: []Schedule{{Name: "flaky", Next: slots(missed)}, {Name: "broken", Next: slots(missed)}},
		Insert: func(_ context.Context, i int, _ time.Time) (int64, bool, error) {
			mu.Lock()
			defer mu.Unlock()
			name := []string{"flaky", "broken"}[i]
			tries[name]++
			if name == "flaky" && tries[name] == 3 {
				return 1, false, nil
			}
			return 0, false, errors.New("database unavailable")
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 3*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return tries["broken"] == 5
	}, "broken slot not tried five times")
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if tries["flaky"] != 3 || tries["broken"] != 5 {
		t.Fatalf("tries %v, want flaky 3 (two failures, then inserted) and broken 5", tries)
	}
}

// TestPeriodicSlotOnceWhenAnAbandonedInsertCommitted: a slot's insert is
// sent, and waits on a lock of the table; its connection is stranded
// (nothing crosses it, nothing is closed), then the lock goes and the
// insert commits on the server, its reply lost. At StatementTimeout the
// service abandons it (pgx closes the connection) and logs a warning; the
// retry, on a fresh connection, finds the slot's unique key taken. The slot
// is one row, and the service is not stuck: without the deadline it waited
// for the lost reply until the OS's TCP keepalive gave up.
func TestPeriodicSlotOnceWhenAnAbandonedInsertCommitted(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	ctx := context.Background()
	pool, proxy := d.proxied()
	logs := &logBuffer{}
	type result struct {
		dup bool
		err error
	}
	var mu sync.Mutex
	var results []result
	lock, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, d.sql(`LOCK TABLE {{s}}.gendurable_instances IN SHARE MODE`)); err != nil {
		t.Fatal(err)
	}

	missed := time.Now().Add(-time.Minute)
	p := &Periodic{Log: logs.logger(), RetryDelay: 50 * time.Millisecond, StatementTimeout: 2 * time.Second,
		Schedules: []Schedule{{Name: "stranded", Next: slots(missed)}},
		Insert: func(ctx context.Context, _ int, slot time.Time) (int64, bool, error) {
			var id int64
			// One Query message: the statement waits on the lock in its
			// execution, and commits once the lock goes. (Prepared first, as
			// pgx does on a new connection, it would wait in its Parse, and the
			// Execute would never be sent: no commit to lose.)
			err := pool.QueryRow(ctx, d.sql(insertSlotOnce), pgx.QueryExecModeSimpleProtocol, "stranded", slot).Scan(&id)
			dup := errors.Is(err, pgx.ErrNoRows)
			if dup {
				err = nil
			}
			mu.Lock()
			results = append(results, result{dup, err})
			mu.Unlock()
			return id, dup, err
		}}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 5*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0 AND strpos(query, 'INSERT') > 0`, d.q.Schema) == 1
	}, "the slot's insert is not waiting on the lock")
	proxy.Strand()
	if err := lock.Commit(ctx); err != nil { // the insert goes on, and commits; its reply is lost
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 1
	}, "the stranded insert did not commit")
	eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) == 2
	}, "the abandoned insert was not retried")
	p.Stop()

	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(results[0].err, context.DeadlineExceeded) || !results[1].dup || results[1].err != nil {
		t.Fatalf("inserts %v, want the first abandoned at its deadline, the retry a duplicate", results)
	}
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`); n != 1 {
		t.Fatalf("%d rows for one slot", n)
	}
	if !strings.Contains(logs.String(), "periodic slot insert failed") || strings.Contains(logs.String(), "not inserted") {
		t.Fatalf("want one warning of the abandoned insert, and the slot not given up; logs:\n%s", logs.String())
	}
}
