package maintenance

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/syncbuf"
)

const insertAwaiting = `INSERT INTO {{s}}.gendurable_instances (fsm, step, queue, status, awaits, await_deadline)
VALUES ('m', 'a', $1, 'awaiting_signal', '{go}', now() + $2::bigint * interval '1 millisecond') RETURNING id`

// kicks records the queues a sweeper kicked.
type kicks struct {
	mu     sync.Mutex
	queues []string
}

func (k *kicks) kick(q string) {
	k.mu.Lock()
	k.queues = append(k.queues, q)
	k.mu.Unlock()
}

func (k *kicks) has(q string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, x := range k.queues {
		if x == q {
			return true
		}
	}
	return false
}

// TestTimeoutSweeperWakesExpiredAwait: an await whose deadline passed is
// woken by the first sweep and its queue kicked; one without a deadline
// stays.
func TestTimeoutSweeperWakesExpiredAwait(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	due := d.id(insertAwaiting, "q1", -1000)
	open := d.id(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, awaits) VALUES ('m', 'a', 'awaiting_signal', '{go}') RETURNING id`)
	k := &kicks{}
	s := &TimeoutSweeper{Queries: d.q, DB: d.pool, Interval: time.Minute, Log: quiet, Kick: k.kick}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, 3*time.Second, func() bool { return k.has("q1") }, "queue of the woken await not kicked")
	if got := d.status(due); got != "runnable" {
		t.Fatalf("expired await is %s, want runnable", got)
	}
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND await_deadline IS NULL AND awaits = '{}'`, due); n != 1 {
		t.Fatal("woken row keeps its deadline or awaits")
	}
	if got := d.status(open); got != "awaiting_signal" {
		t.Fatalf("await without deadline is %s", got)
	}
}

// TestTimeoutSweeperSleepsUntilNextDeadline: with an interval of a minute,
// the sweep still wakes an await at its deadline, which it learnt from the
// sweep before — not earlier.
func TestTimeoutSweeperSleepsUntilNextDeadline(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	start := time.Now()
	id := d.id(insertAwaiting, "q", 400)
	s := &TimeoutSweeper{Queries: d.q, DB: d.pool, Interval: time.Minute, Log: quiet}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, 3*time.Second, func() bool { return d.status(id) == "runnable" }, "await not woken at its deadline")
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Fatalf("woken after %s, before its deadline", took)
	}
}

// TestTimeoutSweeperPoke: a sweeper sleeping for its whole interval (no
// deadline known) sweeps at once when poked.
func TestTimeoutSweeperPoke(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	db := &countingDB{DB: d.pool}
	k := &kicks{}
	s := &TimeoutSweeper{Queries: d.q, DB: db, Interval: time.Minute, Log: quiet, Kick: k.kick}
	s.PokeIn(0) // before Start: covered by the first sweep, not a second one
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, 3*time.Second, func() bool { return db.done.Load() == 1 }, "first sweep did not run")
	id := d.id(insertAwaiting, "poked", -1) // due, but nobody told the sweeper
	time.Sleep(200 * time.Millisecond)
	if got := d.status(id); got != "awaiting_signal" || db.done.Load() != 1 {
		t.Fatalf("before the poke: status %s after %d sweeps; the sweeper should sleep its interval", got, db.done.Load())
	}
	s.PokeIn(0)
	eventually(t, 3*time.Second, func() bool { return k.has("poked") }, "poke did not wake the sweeper")
	if got := d.status(id); got != "runnable" {
		t.Fatalf("after the poke: %s", got)
	}
}

// TestTimeoutSweeperPokeInSweepsAtTheDeadline: a poke for an await whose
// deadline is 400 ms away has the sweeper sweep then, once — not at once,
// and not once per poke: 50 parked awaits poking for that deadline, and 50
// for deadlines past the sweeper's plan, add one statement. Before, every
// poke swept at once (a statement per parked await with a timeout).
func TestTimeoutSweeperPokeInSweepsAtTheDeadline(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	db := &countingDB{DB: d.pool}
	k := &kicks{}
	s := &TimeoutSweeper{Queries: d.q, DB: db, Interval: time.Minute, Log: quiet, Kick: k.kick}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, 3*time.Second, func() bool { return db.done.Load() == 1 }, "first sweep did not run")
	const timeout = 400 * time.Millisecond
	id := d.id(insertAwaiting, "later", timeout.Milliseconds())
	parked := time.Now()
	for range 50 {
		s.PokeIn(timeout)
		s.PokeIn(10 * time.Minute)
	}
	time.Sleep(timeout / 2)
	if n := db.done.Load(); n != 1 {
		t.Fatalf("%d sweeps before the deadline, want the first only", n)
	}
	eventually(t, 3*time.Second, func() bool { return k.has("later") }, "the sweep at the deadline did not come")
	if took := time.Since(parked); took < timeout {
		t.Fatalf("woken %s after the park, before its %s deadline", took, timeout)
	}
	if got := d.status(id); got != "runnable" {
		t.Fatalf("after the deadline: %s", got)
	}
	time.Sleep(100 * time.Millisecond)
	if n := db.done.Load(); n != 2 {
		t.Fatalf("%d sweeps, want 2: the first and the one at the deadline", n)
	}
}

// TestTimeoutSweeperFullBatchSweepsAgain: a sweep that filled its batch is
// followed by another at once, not after the interval.
func TestTimeoutSweeperFullBatchSweepsAgain(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	for range 5 {
		d.id(insertAwaiting, "q", -1000)
	}
	s := &TimeoutSweeper{Queries: d.q, DB: d.pool, Interval: time.Minute, Batch: 2, Log: quiet}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, 3*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'awaiting_signal'`) == 0
	}, "not every due await woken")
}

// TestTimeoutSweeperAbandonsAStatementOnADeadConnection: between two
// sweeps, the sweeper's connection is stranded (nothing crosses it, nothing
// is closed). The next sweep's statement never gets a reply; at
// StatementTimeout the sweeper abandons it and logs a warning, and the
// sweep an Interval later, on a fresh connection, wakes the await that
// came due meanwhile. Without the deadline it waited for the reply for as
// long as the OS's TCP keepalive allows.
func TestTimeoutSweeperAbandonsAStatementOnADeadConnection(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	pool, proxy := d.proxied()
	logs := &syncbuf.Buffer{}
	k := &kicks{}
	d.id(insertAwaiting, "before", -1000)
	s := &TimeoutSweeper{Queries: d.q, DB: pool, Interval: strandedSweepInterval, StatementTimeout: strandedSweepTimeout,
		Log: bufLogger(logs), Kick: k.kick}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, 5*time.Second, func() bool { return k.has("before") }, "await due before the strand not woken")

	proxy.Strand()
	stranded := time.Now()
	after := d.id(insertAwaiting, "after", -1000)
	eventually(t, 10*time.Second, func() bool { return k.has("after") }, "await due after the strand not woken")
	recoveredAfterDeadline(t, time.Since(stranded))
	if got := d.status(after); got != "runnable" {
		t.Fatalf("await due after the strand is %s, want runnable", got)
	}
	if !strings.Contains(logs.String(), "await-timeout sweep failed") {
		t.Fatalf("no warning of the abandoned statement; logs:\n%s", logs.String())
	}
}

// TestTimeoutSweeperFindsADeadlineBelowItsFloor: between full sweeps the
// sweeper starts at the floor its last sweep returned (about
// sqlq.WakeFloorSlack before its now()). A deadline that passed an hour
// before it became visible — an await written by a transaction that
// committed long after its now() — is below that floor: the sweeps of the
// next seconds leave it, and the next full sweep, fullSweepEvery Intervals
// after the one at Start, wakes it.
func TestTimeoutSweeperFindsADeadlineBelowItsFloor(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	first := d.id(insertAwaiting, "q", -1000)
	s := &TimeoutSweeper{Queries: d.q, DB: d.pool, Interval: time.Second, Log: quiet}
	started := time.Now()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, 5*time.Second, func() bool { return d.status(first) == "runnable" }, "the full sweep at Start did not run")
	late := d.id(insertAwaiting, "q", -3600*1000)
	time.Sleep(3 * time.Second)
	if got, since := d.status(late), time.Since(started); got != "awaiting_signal" && since < fullSweepEvery*time.Second {
		t.Fatalf("the await below the floor is %s %v after Start, before a full sweep was due: the sweeps do not start at their floor", got, since)
	}
	eventually(t, 20*time.Second, func() bool { return d.status(late) == "runnable" }, "the await below the floor not woken by a full sweep")
}
