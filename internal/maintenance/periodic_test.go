package maintenance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gendurable/gendurable/internal/syncbuf"
)

// insertSlotOnce inserts the row of slot $2 of schedule $1, unless it was
// inserted already: a unique key per slot, as the engine's own insert.
const insertSlotOnce = `INSERT INTO {{s}}.gendurable_instances (fsm, step, state, unique_key, unique_scope)
VALUES ($1, 'a', jsonb_build_object('slot', $2::timestamptz), convert_to($1 || $2::timestamptz::text, 'UTF8'),
        '{runnable,executing,awaiting_signal,awaiting_children,done,failed}')
ON CONFLICT (unique_guard) WHERE unique_guard IS NOT NULL DO NOTHING RETURNING id`

// insertSlot inserts the row of slot of the schedule name once: its id, or
// duplicate when the slot's row is there already (Periodic.Insert's answer).
func (d *db) insertSlot(ctx context.Context, name string, slot time.Time) (id int64, duplicate bool, err error) {
	err = d.pool.QueryRow(ctx, d.sql(insertSlotOnce), name, slot).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, true, nil
	}
	return id, false, err
}

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
		return d.insertSlot(ctx, schedules[i].Name, slot)
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
	rows := d.texts(`SELECT fsm || ' ' || (state->>'slot') FROM {{s}}.gendurable_instances ORDER BY 1`)
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

// TestPeriodicRetriesFailedInsert: a failed insert is tried again, with
// growing waits, for as long as the schedule's next slot is not due: the
// flaky schedule's slot goes in at its third attempt, and the broken one is
// still being tried well past five attempts (the service used to give a slot
// up after five).
func TestPeriodicRetriesFailedInsert(t *testing.T) {
	t.Parallel()
	missed := time.Now().Add(-time.Minute)
	var mu sync.Mutex
	tries := map[string]int{}
	p := &Periodic{Log: quiet, RetryDelay: 5 * time.Millisecond, MaxRetryDelay: 40 * time.Millisecond,
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
	eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return tries["broken"] >= 20
	}, "the broken slot was not tried 20 times")
	mu.Lock()
	defer mu.Unlock()
	if tries["flaky"] != 3 {
		t.Fatalf("tries %v, want flaky 3 (two failures, then inserted)", tries)
	}
}

// TestPeriodicSlotDueDuringAnOutageIsInsertedAfterIt: a slot comes due
// while its insert cannot get through (the table is locked for longer than
// five attempts take, each abandoned at its deadline). Once the lock goes,
// the slot is inserted, once, late. The service used to give it up after
// five attempts, and the slot never ran.
func TestPeriodicSlotDueDuringAnOutageIsInsertedAfterIt(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	ctx := context.Background()
	lock, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, d.sql(`LOCK TABLE {{s}}.gendurable_instances IN SHARE MODE`)); err != nil {
		t.Fatal(err)
	}
	var tries atomic.Int32
	due := time.Now().Add(100 * time.Millisecond)
	p := &Periodic{Log: quiet, RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond,
		StatementTimeout: 150 * time.Millisecond,
		Schedules:        []Schedule{{Name: "nightly", Next: slots(due), SkipMissed: true}},
		Insert: func(ctx context.Context, _ int, slot time.Time) (int64, bool, error) {
			tries.Add(1)
			return d.insertSlot(ctx, "nightly", slot)
		}}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 10*time.Second, func() bool { return tries.Load() >= 8 }, "the slot's insert was not tried 8 times")
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`); n != 0 {
		t.Fatalf("%d rows while the table was locked", n)
	}
	if err := lock.Commit(ctx); err != nil { // the outage ends
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE state->>'slot' IS NOT NULL`) == 1
	}, "the slot that came due during the outage was not inserted after it")
	p.Stop()
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`); n != 1 {
		t.Fatalf("%d rows for one slot", n)
	}
}

// TestPeriodicNextSlotTakesAFailedSlotsPlace: while a slot's insert keeps
// failing, the schedule's next slot comes due; the failed slot is given up
// (an error is logged) and the next one inserted — as on start, an outage
// leaves at most its most recent slot to run late. Another schedule's slot
// is inserted meanwhile: schedules do not wait for each other's retries.
func TestPeriodicNextSlotTakesAFailedSlotsPlace(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	now := time.Now()
	first, second := now.Add(-time.Minute), now.Add(400*time.Millisecond)
	healthy := now.Add(200 * time.Millisecond)
	logs := &syncbuf.Buffer{}
	var mu sync.Mutex
	var calls []string
	p := &Periodic{Log: bufLogger(logs), RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond,
		Schedules: []Schedule{{Name: "hourly", Next: slots(first, second)}, {Name: "healthy", Next: slots(healthy)}},
		Insert: func(ctx context.Context, i int, slot time.Time) (int64, bool, error) {
			name := []string{"hourly", "healthy"}[i]
			mu.Lock()
			calls = append(calls, name+" "+slot.Sub(now).Round(time.Millisecond).String())
			mu.Unlock()
			if name == "hourly" && time.Now().Before(second.Add(100*time.Millisecond)) {
				return 0, false, errors.New("database unavailable")
			}
			return d.insertSlot(ctx, name, slot)
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 5*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 2
	}, "the healthy slot and the hourly schedule's second slot were not inserted")
	p.Stop()
	rows := d.texts(`SELECT fsm || ' ' || (state->>'slot')::timestamptz FROM {{s}}.gendurable_instances ORDER BY 1`)
	if len(rows) != 2 || !strings.HasPrefix(rows[0], "healthy ") || !strings.HasPrefix(rows[1], "hourly ") {
		t.Fatalf("rows %q, want the healthy slot and one hourly slot", rows)
	}
	mu.Lock()
	defer mu.Unlock()
	var firstTries, secondTries int
	for _, c := range calls {
		switch c {
		case "hourly -1m0s":
			firstTries++
		case "hourly " + second.Sub(now).Round(time.Millisecond).String():
			secondTries++
		}
	}
	if firstTries < 5 || secondTries < 1 {
		t.Fatalf("calls %q: want the first hourly slot tried until the second came due, then the second", calls)
	}
	if d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'hourly' AND (state->>'slot')::timestamptz = $1`, first) != 0 {
		t.Fatal("the first hourly slot was inserted after the second took its place")
	}
	if !strings.Contains(logs.String(), "the next slot came due first") {
		t.Fatalf("no error logged for the slot given up; logs:\n%s", logs.String())
	}
}

// outageInserts is an Insert that fails ("connection refused") until up,
// then records the slots it inserts; inserted returns them so far.
type outageInserts struct {
	up       time.Time
	mu       sync.Mutex
	slots    []time.Time
	override func(i int) bool // true: schedule i's insert is someone else's (it succeeds)
}

func (o *outageInserts) insert(ctx context.Context, i int, slot time.Time) (int64, bool, error) {
	if o.override != nil && o.override(i) {
		return 1, false, nil
	}
	if time.Now().Before(o.up) {
		return 0, false, errors.New("connection refused")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.slots = append(o.slots, slot)
	return int64(len(o.slots)), false, nil
}

func (o *outageInserts) inserted() []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.slots)
}

// run starts p (its Insert o.insert) and waits until it has inserted as
// many slots as want, which must be those, in that order.
func (o *outageInserts) run(t *testing.T, p *Periodic, want ...time.Time) {
	t.Helper()
	p.Insert = o.insert
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 5*time.Second, func() bool { return len(o.inserted()) >= len(want) }, fmt.Sprintf("%d slots were not inserted", len(want)))
	if got := o.inserted(); !slices.EqualFunc(got[:len(want)], want, time.Time.Equal) {
		t.Fatalf("inserted %v, want %v", got, want)
	}
}

// TestPeriodicFailedSlotIsTriedOnceMoreWhenTheNextComesDue (a probe): a
// slot's insert failed (the database down) and its backoff put the next
// attempt past the schedule's next slot; the database came back before
// that slot. The failed slot is tried once more when the next one comes
// due, and both are inserted. Before, the next slot took its place
// untried: an outage that ended within MaxRetryDelay of the next slot
// lost its slot, though the database answered before the next one.
func TestPeriodicFailedSlotIsTriedOnceMoreWhenTheNextComesDue(t *testing.T) {
	t.Parallel()
	now := time.Now()
	first, second := now.Add(100*time.Millisecond), now.Add(900*time.Millisecond)
	o := &outageInserts{up: first.Add(300 * time.Millisecond)}
	o.run(t, &Periodic{Log: quiet, RetryDelay: 3 * time.Second, MaxRetryDelay: 3 * time.Second,
		Schedules: []Schedule{{Name: "s", Next: slots(first, second), SkipMissed: true}}}, first, second)
}

// TestPeriodicFailedSlotIsTriedOnceMoreAfterTheLoopWasHeldUp (a review):
// the failed slot's retry and the next slot both came due while another
// schedule's insert held the loop up; the failed slot is still tried once
// more before the next takes its place (the first form of the extra try
// required its retry not yet due, and the next slot took its place untried).
func TestPeriodicFailedSlotIsTriedOnceMoreAfterTheLoopWasHeldUp(t *testing.T) {
	t.Parallel()
	now := time.Now()
	first, second := now.Add(100*time.Millisecond), now.Add(900*time.Millisecond)
	o := &outageInserts{up: first.Add(200 * time.Millisecond), override: func(i int) bool {
		if i == 1 {
			time.Sleep(time.Second) // a statement that hangs, up to its timeout
		}
		return i == 1
	}}
	o.run(t, &Periodic{Log: quiet, RetryDelay: 500 * time.Millisecond, MaxRetryDelay: 500 * time.Millisecond,
		Schedules: []Schedule{
			{Name: "a", Next: slots(first, second), SkipMissed: true},
			{Name: "b", Next: slots(now.Add(110 * time.Millisecond)), SkipMissed: true},
		}}, first, second)
}

// TestPeriodicExtraTryKeepsCatchUpWithin (a review): the extra try of a
// failed slot when the next comes due does not insert a slot older than
// CatchUpWithin, which the retries give up (its row may have been pruned).
func TestPeriodicExtraTryKeepsCatchUpWithin(t *testing.T) {
	t.Parallel()
	now := time.Now()
	first, second := now.Add(100*time.Millisecond), now.Add(900*time.Millisecond)
	o := &outageInserts{up: first.Add(100 * time.Millisecond)}
	// The first slot is 800 ms old when the second comes due: past
	// CatchUpWithin, it is not inserted.
	o.run(t, &Periodic{Log: quiet, RetryDelay: 3 * time.Second, MaxRetryDelay: 3 * time.Second,
		Schedules: []Schedule{{Name: "a", Next: slots(first, second), SkipMissed: true, CatchUpWithin: 500 * time.Millisecond}}},
		second)
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
	logs := &syncbuf.Buffer{}
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
	p := &Periodic{Log: bufLogger(logs), RetryDelay: 50 * time.Millisecond, StatementTimeout: 2 * time.Second,
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

// TestPeriodicNegativeRetryDelaysKeepTheDefaults: a Periodic whose
// RetryDelay and MaxRetryDelay are negative waits the defaults between a
// failing slot's attempts. A negative MaxRetryDelay used to cap every wait
// below zero: the failing insert was sent again at once, hundreds of times
// a second, for as long as it failed.
func TestPeriodicNegativeRetryDelaysKeepTheDefaults(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	var tries atomic.Int32
	p := &Periodic{Log: quiet, RetryDelay: -time.Second, MaxRetryDelay: -time.Second,
		Schedules: []Schedule{{Name: "broken", Next: slots(time.Now().Add(-time.Minute))}},
		Insert: func(ctx context.Context, _ int, _ time.Time) (int64, bool, error) {
			tries.Add(1)
			var n int64
			return 0, false, d.pool.QueryRow(ctx, `SELECT 1/0`).Scan(&n) // division_by_zero, every time
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	p.Stop()
	// The default 200 ms doubling, jittered into its upper half: attempts
	// at 0, 100–200 ms, 300–600 ms.
	if n := tries.Load(); n < 2 || n > 3 {
		t.Fatalf("%d attempts in 500 ms, want 2 or 3 (the default retry delays)", n)
	}
}

// TestPeriodicSlotDueWhileTheLoopWasHeldUpIsTheMostRecent: the loop is held
// up past several slots of a schedule (here another schedule's insert takes
// a second on the server; a suspended process or a clock jumped forward
// does the same). When it gets round to the schedule, the slot it inserts is
// the most recent one that passed, as on start, and the earlier ones are
// skipped. It used to insert the earliest of them, and skip the others.
func TestPeriodicSlotDueWhileTheLoopWasHeldUpIsTheMostRecent(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	now := time.Now().Truncate(time.Millisecond)
	var frequent []time.Time
	for k := 1; k <= 6; k++ {
		frequent = append(frequent, now.Add(time.Duration(k)*100*time.Millisecond))
	}
	var slow atomic.Bool
	logs := &syncbuf.Buffer{}
	p := &Periodic{Log: bufLogger(logs),
		Schedules: []Schedule{{Name: "slow", Next: slots(now.Add(-time.Minute))}, {Name: "frequent", Next: slots(frequent...)}},
		Insert: func(ctx context.Context, i int, slot time.Time) (int64, bool, error) {
			name := []string{"slow", "frequent"}[i]
			if name == "slow" && !slow.Swap(true) {
				if _, err := d.pool.Exec(ctx, `SELECT pg_sleep(1)`); err != nil {
					return 0, false, err
				}
			}
			return d.insertSlot(ctx, name, slot)
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 5*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'frequent'`) == 1
	}, "no slot of the frequent schedule inserted after the hold-up")
	time.Sleep(200 * time.Millisecond) // nothing more comes
	p.Stop()
	var got time.Time
	if err := d.pool.QueryRow(context.Background(), d.sql(`SELECT (state->>'slot')::timestamptz FROM {{s}}.gendurable_instances WHERE fsm = 'frequent'`)).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'frequent'`); n != 1 || !got.Equal(frequent[len(frequent)-1]) {
		t.Fatalf("%d rows of the frequent schedule, slot %s after the start; want one, its last slot (%s)",
			n, got.Sub(now), frequent[len(frequent)-1].Sub(now))
	}
	// The slots passed over are said (an outage probe: five went unlogged).
	if !strings.Contains(logs.String(), "periodic slots skipped: the loop was held up past them") ||
		!strings.Contains(logs.String(), "periodic=frequent") {
		t.Fatalf("no line for the skipped slots: %s", logs.String())
	}
}

// TestPeriodicSlotSupersededBeforeItsFirstAttemptIsNoError: a schedule's
// missed slot is due at start, and its next slot comes due before the loop
// first looks (here: another schedule's Next is slow to answer at start).
// The next slot runs as the most recent, the missed one is skipped, and no
// error is logged: nothing failed (the error once claimed "attempts 0").
func TestPeriodicSlotSupersededBeforeItsFirstAttemptIsNoError(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	now := time.Now()
	missed, soon := now.Add(-time.Minute), now.Add(20*time.Millisecond)
	logs := &syncbuf.Buffer{}
	var slowOnce atomic.Bool
	p := &Periodic{Log: bufLogger(logs),
		Schedules: []Schedule{
			{Name: "soon", Next: slots(missed, soon)},
			{Name: "slow", Next: func(t time.Time) time.Time {
				if !slowOnce.Swap(true) {
					time.Sleep(100 * time.Millisecond) // past "soon"'s next slot
				}
				return time.Time{}
			}},
		},
		Insert: func(ctx context.Context, i int, slot time.Time) (int64, bool, error) {
			return d.insertSlot(ctx, []string{"soon", "slow"}[i], slot)
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 5*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 1
	}, "no slot inserted")
	p.Stop()
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE (state->>'slot')::timestamptz = $1`, soon); n != 1 {
		t.Fatalf("%d rows of the most recent slot, want 1 (and none of the missed one)", n)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("an error was logged for a slot never tried:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "periodic slot skipped") {
		t.Fatalf("the skipped slot is not in the log:\n%s", logs.String())
	}
}

// TestPeriodicSlotDueAfterTheClockJumpedForwardIsInsertedThen: the wall
// clock is set an hour forward while the loop waits for a slot an hour away.
// The slot is due at once, and is inserted within the loop's longest wait
// (here 100ms). The loop used to wait out the hour it computed before the
// jump on its timer, which runs on the monotonic clock (as it does while a
// machine is suspended): the slot went in an hour late.
func TestPeriodicSlotDueAfterTheClockJumpedForwardIsInsertedThen(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	slot := now().Add(time.Hour).Truncate(time.Millisecond)
	p := &Periodic{Log: quiet, now: now, maxSleep: 100 * time.Millisecond,
		Schedules: []Schedule{{Name: "hourly", Next: slots(slot, slot.Add(2*time.Hour))}},
		Insert: func(ctx context.Context, i int, s time.Time) (int64, bool, error) {
			return d.insertSlot(ctx, "hourly", s)
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	time.Sleep(300 * time.Millisecond) // the loop waits for the slot
	skew.Store(int64(time.Hour + time.Second))
	eventually(t, 3*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 1
	}, "the slot the clock jumped past not inserted")
	p.Stop()
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestPeriodicRunsLateOnlyASlotYoungerThanCatchUpWithin: on start the most
// recent slot that passed is inserted only while it is younger than
// CatchUpWithin (the retention of finished rows): an older one's row may
// have been pruned, and inserting it again ran the slot twice (a @monthly
// schedule under 7 days' retention ran the month's slot again at every
// restart after the 8th). The skip is logged; a schedule with no slot left
// is logged too.
func TestPeriodicRunsLateOnlyASlotYoungerThanCatchUpWithin(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	now := time.Now()
	later := now.Add(time.Hour)
	names := []string{"young", "old", "unlimited", "over"}
	logs := &syncbuf.Buffer{}
	p := &Periodic{Log: bufLogger(logs),
		Schedules: []Schedule{
			{Name: "young", Next: slots(now.Add(-10*time.Minute), later), CatchUpWithin: time.Hour},
			{Name: "old", Next: slots(now.Add(-2*time.Hour), later), CatchUpWithin: time.Hour},
			{Name: "unlimited", Next: slots(now.Add(-2*time.Hour), later)},
			{Name: "over", Next: slots(now.Add(-time.Minute))},
		},
		Insert: func(ctx context.Context, i int, slot time.Time) (int64, bool, error) {
			return d.insertSlot(ctx, names[i], slot)
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 5*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 3
	}, "the missed slots were not inserted")
	time.Sleep(100 * time.Millisecond)
	p.Stop()
	got := d.texts(`SELECT fsm FROM {{s}}.gendurable_instances ORDER BY 1`)
	if !slices.Equal(got, []string{"over", "unlimited", "young"}) {
		t.Fatalf("slots run late: %q, want over, unlimited and young (not old, older than its CatchUpWithin)", got)
	}
	for _, want := range []string{"periodic slot not run late", "periodic=old",
		"periodic schedule has no slot within the next five years", "periodic=over"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("%q is not in the log:\n%s", want, logs.String())
		}
	}
}

// TestPeriodicHeldUpPastASlotOlderThanCatchUpWithinSkipsIt: the loop held
// up past a slot by more than CatchUpWithin (here the clock set three hours
// forward, as a machine suspended that long) skips it, logged, as a start
// would: its row may have run and been pruned meanwhile.
func TestPeriodicHeldUpPastASlotOlderThanCatchUpWithinSkipsIt(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	slot := now().Add(time.Hour).Truncate(time.Millisecond)
	logs := &syncbuf.Buffer{}
	p := &Periodic{Log: bufLogger(logs), now: now, maxSleep: 50 * time.Millisecond,
		Schedules: []Schedule{{Name: "hourly", Next: slots(slot, slot.Add(10*time.Hour)), CatchUpWithin: time.Hour}},
		Insert: func(ctx context.Context, i int, s time.Time) (int64, bool, error) {
			return d.insertSlot(ctx, "hourly", s)
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	time.Sleep(200 * time.Millisecond) // the loop waits for the slot
	skew.Store(int64(3*time.Hour + time.Second))
	eventually(t, 3*time.Second, func() bool { return strings.Contains(logs.String(), "periodic slot not run late") },
		"the skip is not in the log")
	p.Stop()
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`); n != 0 {
		t.Fatalf("%d rows, want 0: the slot was two hours old, older than CatchUpWithin", n)
	}
}

// TestPeriodicRetriesStopAtCatchUpWithin: a slot whose inserts keep failing
// (the process cut off from the database) is not retried once it is older
// than CatchUpWithin: another process may have run it meanwhile and its
// row been pruned, as for a slot missed while no process ran.
func TestPeriodicRetriesStopAtCatchUpWithin(t *testing.T) {
	t.Parallel()
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	slot := now().Add(-time.Second)
	var tries atomic.Int64
	logs := &syncbuf.Buffer{}
	p := &Periodic{Log: bufLogger(logs), now: now, maxSleep: 20 * time.Millisecond,
		RetryDelay: 5 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond,
		Schedules: []Schedule{{Name: "daily", Next: slots(slot, slot.Add(24*time.Hour)), CatchUpWithin: time.Hour}},
		Insert: func(context.Context, int, time.Time) (int64, bool, error) {
			tries.Add(1)
			return 0, false, errors.New("database unavailable")
		}}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 3*time.Second, func() bool { return tries.Load() >= 3 }, "the slot was not tried")
	skew.Store(int64(2 * time.Hour)) // the outage outlasts the catch-up window
	eventually(t, 3*time.Second, func() bool { return strings.Contains(logs.String(), "periodic slot not run late") },
		"the slot was not given up")
	n := tries.Load()
	time.Sleep(200 * time.Millisecond)
	if got := tries.Load(); got > n+1 {
		t.Fatalf("tried %d more times after the slot was older than CatchUpWithin", got-n)
	}
}
