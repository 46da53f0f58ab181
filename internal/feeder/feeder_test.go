package feeder

import (
	"bufio"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/childproc"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// pickLog records when picks ran and whether they failed.
type pickLog struct {
	mu     sync.Mutex
	failed []time.Time
}

func (p *pickLog) Pick(r PickReport) {
	if r.Err != nil {
		p.mu.Lock()
		p.failed = append(p.failed, time.Now())
		p.mu.Unlock()
	}
}
func (*pickLog) Saturation(string, int, int, int, int) {}
func (*pickLog) LeaseLost(string, int64, bool)         {}
func (*pickLog) HeartbeatFailed(string, error)         {}
func (*pickLog) Released(string, int, error)           {}

// TestFailedPicksBackOff: with the database unreachable (nothing listens on
// the port), a feeder polling every 10ms must not try every 10ms: failed
// picks back off exponentially with jitter.
func TestFailedPicksBackOff(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a port nobody listens on: every connection attempt is refused
	pcfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr + "/none?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q, err := sqlq.New("public")
	if err != nil {
		t.Fatal(err)
	}
	ev := &pickLog{}
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: 10 * time.Millisecond,
		MaxPollInterval: 20 * time.Millisecond, Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond},
		q, pool, func(context.Context, *sqlq.Claimed, Holder) Result { return Result{} }, ev, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	go func() { // kicks (local inserts, finished steps) must not bypass the backoff
		for ctx.Err() == nil {
			s.Kick()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	s.Run(ctx, context.Background())

	ev.mu.Lock()
	defer ev.mu.Unlock()
	// At a fixed 10ms cadence that is some 200 attempts; doubling from 10ms
	// reaches 1.28s after 8 failures.
	if n := len(ev.failed); n < 3 || n > 12 {
		t.Fatalf("%d failed picks in 2s, want 3-12 (backing off from 10ms)", n)
	}
	first, last := ev.failed[1].Sub(ev.failed[0]), ev.failed[len(ev.failed)-1].Sub(ev.failed[len(ev.failed)-2])
	if last < 4*first {
		t.Fatalf("gaps between failed picks did not grow: first %s, last %s", first, last)
	}
}

// TestAbandonAfterReturnChangesNothing: the engine's step watchdog may
// decide to abandon a step just as it returns. Whichever settles the step
// second must change nothing: the slot and the WaitGroup are given back
// exactly once.
func TestAbandonAfterReturnChangesNothing(t *testing.T) {
	t.Parallel()
	var h Holder
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond},
		nil, nil, func(_ context.Context, _ *sqlq.Claimed, hh Holder) Result { h = hh; return Result{} },
		&pickLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.held[7] = &held{id: 1, deadline: time.Now().Add(time.Second)}
	s.buffer = []sqlq.Claimed{{ID: 1, Token: 7}}
	s.lastBeat = time.Now()
	go s.worker()
	defer close(s.work)
	s.dispatch(context.Background())
	s.steps.Wait() // the step returned and settled its claim
	if slots, ok := h.Abandon(); ok || slots != 0 {
		t.Fatalf("Abandon after the step returned: %d slots, ok %v; want 0, false", slots, ok)
	}
	if s.Abandoned() != 0 || s.InFlight() != 0 || len(s.held) != 0 {
		t.Fatalf("abandoned %d, in flight %d, held %d after a late Abandon", s.Abandoned(), s.InFlight(), len(s.held))
	}
	s.steps.Add(1) // would panic (negative counter) had Abandon given the step back a second time
	s.steps.Done()
}

// lostLog records the instances reported as lost, and whether each one's
// step had started.
type lostLog struct {
	pickLog
	mu      sync.Mutex
	lost    []int64
	started []bool
}

func (l *lostLog) LeaseLost(_ string, id int64, started bool) {
	l.mu.Lock()
	l.lost = append(l.lost, id)
	l.started = append(l.started, started)
	l.mu.Unlock()
}

// TestHeartbeatTellsZombieFromNewClaim: a feeder holds one instance under
// two tokens, a zombie whose lease was reaped and the claim it picked again
// since. The heartbeat keeps the instance's id; only the new claim is held,
// the zombie is lost.
func TestHeartbeatTellsZombieFromNewClaim(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	q, err := sqlq.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".gendurable_instances (fsm, step) VALUES ('m', 's')"); err != nil {
		t.Fatal(err)
	}
	ev := &lostLog{}
	s := New(Config{Queue: "default", Concurrency: 2, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: time.Minute, HeartbeatInterval: time.Second},
		q, pool, func(context.Context, *sqlq.Claimed, Holder) Result { return Result{} }, ev, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pick := func() sqlq.Claimed {
		t.Helper()
		if n, err := s.pick(ctx, 1, 1, true); err != nil || n != 1 {
			t.Fatalf("pick: %d rows, %v", n, err)
		}
		return s.buffer[len(s.buffer)-1]
	}
	zombie := pick()
	// Its lease runs out and is reaped; the feeder claims the instance again.
	if _, err := pool.Exec(ctx, "UPDATE "+schema+".gendurable_instances SET lease_expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	if res, err := q.Reap(ctx, pool, 10, nil, 0); err != nil || len(res.Reaped) != 1 {
		t.Fatalf("reap: %v, %v", res.Reaped, err)
	}
	claim := pick()
	if claim.ID != zombie.ID || claim.Token <= zombie.Token {
		t.Fatalf("claims %+v then %+v: want one instance, a newer token", zombie, claim)
	}
	// The zombie runs on, ignoring its context; the new claim waits in the buffer.
	zctx, zcancel := context.WithCancelCause(ctx)
	defer zcancel(nil)
	s.held[zombie.Token].running, s.held[zombie.Token].started, s.held[zombie.Token].cancel = true, true, zcancel
	s.buffer = s.buffer[1:]

	s.heartbeatOnce(ctx)
	if s.held[claim.Token] == nil || len(s.buffer) != 1 {
		t.Fatalf("the new claim was dropped: held %v, buffer %v", s.held, s.buffer)
	}
	if s.held[zombie.Token] != nil {
		t.Fatal("the zombie is still held (and heartbeated) after the heartbeat")
	}
	if cause := context.Cause(zctx); cause != ErrLeaseLost {
		t.Fatalf("zombie's context: cause %v, want ErrLeaseLost", cause)
	}
	if len(ev.lost) != 1 || ev.lost[0] != zombie.ID || !ev.started[0] {
		t.Fatalf("lease-lost reports %v (started %v), want [%d] (started)", ev.lost, ev.started, zombie.ID)
	}
}

// heartbeatDB answers the heartbeat statement (the only one these tests
// send): "kept" confirms every lease; "hang" blocks until the statement's
// context is done (a dead or half-open connection); "fail" fails at once
// (the database refuses connections).
type heartbeatDB struct{ mode string }

func (d heartbeatDB) Query(ctx context.Context, _ string, args ...any) (pgx.Rows, error) {
	switch d.mode {
	case "kept":
		return &idRows{ids: args[0].([]int64), leftUs: args[2].(int64)}, nil
	case "hang":
		<-ctx.Done()
		return nil, ctx.Err()
	default:
		return nil, errors.New("connection refused")
	}
}

func (heartbeatDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("heartbeatDB: Exec")
}

func (heartbeatDB) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

// idRows is a heartbeat's result: (id, microseconds of lease left) rows,
// every lease extended in full.
type idRows struct {
	ids    []int64
	leftUs int64
	i      int
}

func (r *idRows) Close()                        {}
func (r *idRows) Err() error                    { return nil }
func (r *idRows) CommandTag() pgconn.CommandTag { return pgconn.CommandTag{} }
func (r *idRows) FieldDescriptions() []pgconn.FieldDescription {
	return []pgconn.FieldDescription{{Name: "id"}, {Name: "left"}}
}
func (r *idRows) Next() bool             { r.i++; return r.i <= len(r.ids) }
func (r *idRows) Values() ([]any, error) { return []any{r.ids[r.i-1], r.leftUs}, nil }
func (r *idRows) RawValues() [][]byte    { return nil }
func (r *idRows) Conn() *pgx.Conn        { return nil }
func (r *idRows) TypeMap() *pgtype.Map   { return nil }
func (r *idRows) Scan(dest ...any) error {
	*dest[0].(*int64) = r.ids[r.i-1]
	if len(dest) > 1 { // a heartbeat's row; a release's is the id alone
		*dest[1].(*int64) = r.leftUs
	}
	return nil
}

// runHeld starts one held claim (instance 1, token 7) of s as a running
// step that waits for its context; the returned channel gets the cause and
// the moment the step saw it.
func runHeld(s *Feeder) <-chan stepEnd {
	ended := make(chan stepEnd, 1)
	s.exec = func(ctx context.Context, _ *sqlq.Claimed, _ Holder) Result {
		<-ctx.Done()
		ended <- stepEnd{cause: context.Cause(ctx), at: time.Now()}
		return Result{}
	}
	s.mu.Lock()
	s.held[7] = &held{id: 1, deadline: s.lastBeat.Add(s.cfg.Lease)} // claimed when the leases were last confirmed
	s.armLocked(s.lastBeat.Add(s.cfg.Lease))
	s.buffer = []sqlq.Claimed{{ID: 1, Token: 7}}
	s.mu.Unlock()
	go s.worker()
	s.dispatch(context.Background())
	return ended
}

type stepEnd struct {
	cause error
	at    time.Time
}

// TestLeaseDeadlineCancelsTheStep: once no heartbeat has confirmed the
// leases for a whole lease, the running step is cancelled with ErrLeaseLost
// right at lastBeat + Lease — by the feeder's deadline timer, whether or
// not a heartbeat tick comes (with no heartbeat loop at all, only the timer
// can; a hanging or failing heartbeat says nothing in time either). A
// heartbeat that keeps confirming keeps the step running.
func TestLeaseDeadlineCancelsTheStep(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	for _, c := range []struct {
		name     string
		db       string // "": no heartbeat loop
		interval time.Duration
	}{
		{"no heartbeat loop", "", 100 * time.Millisecond},
		{"heartbeat hangs", "hang", 40 * time.Millisecond},
		{"heartbeat fails", "fail", 40 * time.Millisecond},
		{"heartbeat confirms", "kept", 40 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ev := &lostLog{}
			s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
				Lease: lease, HeartbeatInterval: c.interval},
				&sqlq.Queries{}, heartbeatDB{mode: c.db}, nil, ev, slog.New(slog.NewTextHandler(io.Discard, nil)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			defer close(s.work)
			s.mu.Lock()
			start := time.Now()
			s.confirmed(start) // as Heartbeat does when it starts
			s.mu.Unlock()
			ended := runHeld(s)
			if c.db != "" {
				hbDone := make(chan struct{})
				go func() { defer close(hbDone); s.Heartbeat(ctx) }()
				defer func() { cancel(); <-hbDone }()
			}

			if c.db == "kept" {
				select {
				case e := <-ended:
					t.Fatalf("a step whose leases are confirmed was cancelled after %s: %v", e.at.Sub(start), e.cause)
				case <-time.After(4 * lease):
				}
				return
			}
			select {
			case e := <-ended:
				after := e.at.Sub(start)
				if !errors.Is(e.cause, ErrLeaseLost) {
					t.Fatalf("cancelled with %v, want ErrLeaseLost", e.cause)
				}
				// Not before the local lease deadline (the heartbeat's own
				// start), and at once when it passes.
				if after < lease || after > lease+250*time.Millisecond {
					t.Fatalf("cancelled %s after the last confirmation, want within [%s, %s]", after, lease, lease+250*time.Millisecond)
				}
			case <-time.After(10 * lease):
				t.Fatalf("the step was not cancelled %s after its last confirmed heartbeat (lease %s)", 10*lease, lease)
			}
			// The report follows the cancellation (it is sent after the
			// feeder's lock is released).
			for wait := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
				ev.mu.Lock()
				lost := append([]int64(nil), ev.lost...)
				ev.mu.Unlock()
				if len(lost) == 1 && lost[0] == 1 {
					break
				}
				if len(lost) > 1 || time.Now().After(wait) {
					t.Fatalf("lease-lost reports %v, want [1]", lost)
				}
			}
		})
	}
}

// envStoppedHelper makes the test binary the process that
// TestStoppedProcessCancelsItsStepOnResume stops and continues.
const envStoppedHelper = "GENDURABLE_FEEDER_STOPPED_HELPER"

// stoppedLease is the helper's lease: long beside its heartbeat interval
// (a fifth of it), so that a helper starved of CPU by a loaded parallel
// run still confirms its lease in time (at 500 ms with 100 ms beats, the
// test failed once so: its step was cancelled before the stop).
const stoppedLease = 2 * time.Second

// TestHelperStoppedFeeder is not a test: it is the process that
// TestStoppedProcessCancelsItsStepOnResume stops. It runs a feeder whose
// heartbeats confirm every lease at once, with one running step that
// waits for its context, and reports on stdout when the step started and
// when (unix nanoseconds) and why it was cancelled.
func TestHelperStoppedFeeder(t *testing.T) {
	if os.Getenv(envStoppedHelper) == "" {
		t.Skip("helper process only")
	}
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: stoppedLease, HeartbeatInterval: stoppedLease / 5},
		&sqlq.Queries{}, heartbeatDB{mode: "kept"}, nil, &lostLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go s.Heartbeat(context.Background())
	ended := runHeld(s)
	fmt.Printf("helper: started\n")
	e := <-ended
	fmt.Printf("helper: cancelled %d %q\n", e.at.UnixNano(), fmt.Sprint(e.cause))
	time.Sleep(100 * time.Millisecond) // let the parent read it
}

// TestStoppedProcessCancelsItsStepOnResume: a process holding a running
// step is stopped (SIGSTOP) for twice its lease, then continued. Its
// heartbeats confirmed the lease until the stop, and the step was not
// cancelled; on SIGCONT its step's context is cancelled with ErrLeaseLost
// at once — before it sends another heartbeat, and whatever the database
// would answer — since the lease may have run out on the database clock
// and another process may run the row (or, for a keyed row, its key).
func TestStoppedProcessCancelsItsStepOnResume(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc to see the process stopped")
	}
	const lease = stoppedLease
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStoppedFeeder$")
	cmd.Env = append(os.Environ(), envStoppedHelper+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "helper: "); ok {
				lines <- l
			}
		}
		close(lines)
	}()
	next := func(within time.Duration) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the helper process exited")
			}
			return l
		case <-time.After(within):
			return ""
		}
	}
	if l := next(30 * time.Second); l != "started" {
		t.Fatalf("helper: %q, want started", l)
	}
	// Heartbeats keep the step running for as long as the process runs.
	if l := next(2 * lease); l != "" {
		t.Fatalf("the step ended while its heartbeats confirmed its lease: %s", l)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !childproc.Stopped(cmd.Process.Pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the helper process did not stop")
		}
	}
	time.Sleep(2 * lease)
	cont := time.Now()
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	l := next(10 * time.Second)
	var nanos int64
	var cause string
	if _, err := fmt.Sscanf(l, "cancelled %d %q", &nanos, &cause); err != nil {
		t.Fatalf("helper: %q: %v", l, err)
	}
	if cause != ErrLeaseLost.Error() {
		t.Fatalf("the step was cancelled with %q, want %q", cause, ErrLeaseLost)
	}
	// At once (a fraction of a millisecond here; the bound leaves room for
	// a loaded machine).
	lag := time.Unix(0, nanos).Sub(cont)
	if lag < 0 || lag > 250*time.Millisecond {
		t.Fatalf("the step was cancelled %s after SIGCONT, want within 250ms", lag)
	}
	t.Logf("cancelled with ErrLeaseLost %s after SIGCONT", lag)
}

// TestLatePickStartsNothing: a pick that comes back late — here its
// statement was sent a second ago, as when the process was stopped while it
// was in flight — brings claims whose leases began a second ago, whatever
// the feeder confirmed since (here: everything, just now, as after it gave
// up its claims on waking). With a lease of 300ms they may have run out and
// run elsewhere: none is started, and the deadline gives them up.
func TestLatePickStartsNothing(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	ev := &lostLog{}
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: lease, HeartbeatInterval: 100 * time.Millisecond},
		&sqlq.Queries{}, heartbeatDB{}, nil, ev, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var started sync.WaitGroup
	s.exec = func(context.Context, *sqlq.Claimed, Holder) Result { started.Done(); return Result{} }
	go s.worker()
	defer close(s.work)
	s.mu.Lock()
	s.confirmed(time.Now())
	s.mu.Unlock()
	s.add([]sqlq.Claimed{{ID: 1, Token: 7}}, time.Now().Add(-time.Second))
	s.dispatch(context.Background())
	if n := s.InFlight(); n != 0 {
		t.Fatalf("%d steps started from a pick sent %s ago (lease %s)", n, time.Second, lease)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		s.mu.Lock()
		held, buffered := len(s.held), len(s.buffer)
		s.mu.Unlock()
		if held == 0 && buffered == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late pick's claim is still held (%d) or buffered (%d)", held, buffered)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.dispatch(context.Background())
	if n := s.InFlight(); n != 0 {
		t.Fatalf("%d steps started after the late claims were given up", n)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.lost) != 1 || ev.lost[0] != 1 {
		t.Fatalf("lease-lost reports %v, want [1]", ev.lost)
	}
	if ev.started[0] {
		t.Fatal("the lost claim never started, but was reported as a running step")
	}
}

// TestDispatchGivesUpAClaimPastItsDeadline: a buffered claim whose
// deadline has passed when dispatch reaches it, before the deadline timer
// has run, is given up by dispatch itself. Left held, a heartbeat that ran
// before the timer would extend its lease — a claim in no buffer and no
// worker, its row executing under a live lease for as long as the process
// lives.
func TestDispatchGivesUpAClaimPastItsDeadline(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	ev := &lostLog{}
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: lease, HeartbeatInterval: 100 * time.Millisecond},
		&sqlq.Queries{}, heartbeatDB{mode: "kept"}, nil, ev, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.exec = func(context.Context, *sqlq.Claimed, Holder) Result {
		t.Error("a claim past its deadline started")
		return Result{}
	}
	s.mu.Lock()
	s.timerOff = true // the timer has not run yet
	s.confirmed(time.Now())
	s.mu.Unlock()
	s.add([]sqlq.Claimed{{ID: 1, Token: 7}}, time.Now().Add(-time.Second))
	s.dispatch(context.Background())
	s.heartbeatOnce(context.Background()) // answers "kept" for whatever it sends
	s.mu.Lock()
	held, buffered, inFlight := len(s.held), len(s.buffer), s.inFlight
	s.mu.Unlock()
	if held != 0 || buffered != 0 || inFlight != 0 {
		t.Fatalf("after dispatch and a heartbeat: held %d, buffered %d, in flight %d; want 0, 0, 0", held, buffered, inFlight)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.lost) != 1 || ev.lost[0] != 1 {
		t.Fatalf("lease-lost reports %v, want [1]", ev.lost)
	}
	if ev.started[0] {
		t.Fatal("the lost claim never started, but was reported as a running step")
	}
}

// TestADispatchedStepDoesNotStartPastItsDeadline: a claim handed to a
// worker goroutine whose step has not started yet when its deadline passes
// — the process was stopped (SIGSTOP, a suspended VM) between the hand-off
// and the start, or the goroutine was starved — never starts: its lease
// may have run out on the database clock and the row run elsewhere. Both
// orders of waking are covered: the deadline timer gave the claim up
// first, or the worker came first with the claim still held.
func TestADispatchedStepDoesNotStartPastItsDeadline(t *testing.T) {
	t.Parallel()
	for _, timerFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("timerFirst=%v", timerFirst), func(t *testing.T) {
			t.Parallel()
			const lease = 200 * time.Millisecond
			ev := &lostLog{}
			s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
				Lease: lease, HeartbeatInterval: 50 * time.Millisecond},
				&sqlq.Queries{}, heartbeatDB{}, nil, ev, slog.New(slog.NewTextHandler(io.Discard, nil)))
			var started atomic.Int32
			s.exec = func(context.Context, *sqlq.Claimed, Holder) Result { started.Add(1); return Result{} }
			if !timerFirst {
				s.mu.Lock()
				s.timerOff = true // the timer has not run yet when the worker wakes
				s.mu.Unlock()
			}
			s.mu.Lock()
			s.confirmed(time.Now())
			s.mu.Unlock()
			s.add([]sqlq.Claimed{{ID: 1, Token: 7}}, time.Now())
			s.dispatch(context.Background()) // handed on: no worker reads it yet
			if n := s.InFlight(); n != 1 {
				t.Fatalf("%d steps dispatched, want 1", n)
			}
			time.Sleep(lease + 50*time.Millisecond) // the "stop"
			go s.worker()
			defer close(s.work)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if !s.Wait(ctx) {
				t.Fatal("the dispatched step was never settled")
			}
			if n := started.Load(); n != 0 {
				t.Fatalf("%d steps started %s after their claim's deadline", n, 50*time.Millisecond)
			}
			s.mu.Lock()
			held, inFlight := len(s.held), s.inFlight
			s.mu.Unlock()
			if held != 0 || inFlight != 0 {
				t.Fatalf("held %d, in flight %d after the claim was given up, want 0 and 0", held, inFlight)
			}
			ev.mu.Lock()
			defer ev.mu.Unlock()
			if len(ev.lost) != 1 || ev.lost[0] != 1 || ev.started[0] {
				t.Fatalf("lease-lost reports %v (started %v), want [1], not started: its step never began", ev.lost, ev.started)
			}
		})
	}
}

// pickDuringHeartbeat answers the heartbeat (every lease kept) after first
// running during: claims picked while the heartbeat is under way.
type pickDuringHeartbeat struct {
	heartbeatDB
	during func()
}

func (d pickDuringHeartbeat) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.during()
	return heartbeatDB{mode: "kept"}.Query(ctx, sql, args...)
}

// TestHeartbeatConfirmsNoClaimPickedDuringIt: a pick sent before a
// heartbeat whose claims arrive while the heartbeat is under way is not in
// that heartbeat: the claims stay confirmed as of their pick, and the
// feeder's lease deadline stays no later than their leases' end.
func TestHeartbeatConfirmsNoClaimPickedDuringIt(t *testing.T) {
	t.Parallel()
	var s *Feeder
	pickStart := time.Now().Add(-50 * time.Millisecond)
	db := pickDuringHeartbeat{during: func() { s.add([]sqlq.Claimed{{ID: 2, Token: 8}}, pickStart) }}
	s = New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: time.Minute, HeartbeatInterval: time.Second},
		&sqlq.Queries{}, db, nil, &lostLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.mu.Lock()
	s.held[7] = &held{id: 1, deadline: time.Now().Add(time.Second)} // confirmed by the heartbeat
	s.confirmed(time.Now())
	s.mu.Unlock()
	s.heartbeatOnce(context.Background())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[8] == nil || s.held[7] == nil {
		t.Fatalf("held %v: both claims should be held", s.held)
	}
	if d := s.held[8].deadline; d.After(pickStart.Add(time.Minute)) {
		t.Fatalf("after the heartbeat, the claim it did not confirm has a deadline %s after its pick's lease", d.Sub(pickStart.Add(time.Minute)))
	}
	// The next heartbeat lists that claim and confirms it.
	s.mu.Unlock()
	db.during = func() {}
	s.db = db
	before := time.Now()
	s.heartbeatOnce(context.Background())
	s.mu.Lock()
	if d := s.held[8].deadline; d.Before(before.Add(time.Minute)) {
		t.Fatalf("the next heartbeat did not confirm the claim: its deadline is %s before the heartbeat's lease", before.Add(time.Minute).Sub(d))
	}
}

// TestMayHandOff: a keyed outcome may hand its slot on only while the
// feeder is not stopping, its last pick came back short and no kick came
// since, and it keeps at least MinDemand free places (so it still picks for
// other keys).
func TestMayHandOff(t *testing.T) {
	t.Parallel()
	s := New(Config{Queue: "q", Concurrency: 4, Prefetch: 4, MinDemand: 3, PollInterval: time.Second,
		MaxPollInterval: time.Second, Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond},
		nil, nil, nil, &pickLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := &holder{s: s, token: 1}
	s.inFlight = 1
	if h.MayHandOff() {
		t.Fatal("allowed before any short pick")
	}
	s.short.Store(true)
	if !h.MayHandOff() {
		t.Fatal("not allowed after a short pick, 7 free places")
	}
	s.inFlight, s.buffer = 4, make([]sqlq.Claimed, 2)
	if h.MayHandOff() {
		t.Fatal("allowed with 2 free places, below MinDemand 3")
	}
	s.inFlight, s.buffer = 1, nil
	s.Kick() // a local insert: its rows may wait for the slot
	if h.MayHandOff() {
		t.Fatal("allowed after a kick, before the next pick")
	}
	s.short.Store(true)
	s.stopping.Store(true)
	if h.MayHandOff() {
		t.Fatal("allowed while stopping")
	}
}

// TestHandOffMovesTheClaim: the held claim moves to the successor, with a
// deadline one lease after the outcome statement was about to be sent; it
// is refused (the caller releases the successor) if the old claim is gone,
// its deadline has passed, or the feeder is stopping.
func TestHandOffMovesTheClaim(t *testing.T) {
	t.Parallel()
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second,
		MaxPollInterval: time.Second, Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond},
		nil, nil, nil, &pickLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.held[7] = &held{id: 1, running: true, deadline: time.Now().Add(time.Second), cancel: func(error) {}}
	t.Cleanup(func() { s.mu.Lock(); s.timerOff = true; s.deadline.Stop(); s.mu.Unlock() })
	h := &holder{s: s, token: 7}
	h.Committing()
	sent := s.held[7].committingAt
	if !h.HandOff(7, &sqlq.Claimed{ID: 2, Token: 9}) {
		t.Fatal("hand-off refused")
	}
	e := s.held[9]
	if s.held[7] != nil || e == nil || e.id != 2 || e.committing || !e.deadline.Equal(sent.Add(time.Second)) || h.token != 9 {
		t.Fatalf("after the hand-off: held %v, token %d", s.held, h.token)
	}
	if h.HandOff(7, &sqlq.Claimed{ID: 3, Token: 11}) {
		t.Fatal("hand-off from a claim no longer held")
	}
	h.Committing()
	s.held[9].committingAt = time.Now().Add(-2 * time.Second)
	if h.HandOff(9, &sqlq.Claimed{ID: 3, Token: 11}) {
		t.Fatal("hand-off whose deadline has passed")
	}
	h.Committing()
	s.stopping.Store(true)
	if h.HandOff(9, &sqlq.Claimed{ID: 3, Token: 11}) {
		t.Fatal("hand-off while stopping")
	}
	if s.held[9] == nil {
		t.Fatal("a refused hand-off dropped the claim")
	}
}

// TestFloorTickWaitsForARunningCheck: a tick that comes while the last
// floor check still runs is not spent: the rows claimed since stay to be
// checked, by the first pick after that check ends (docs/design.md §4).
func TestFloorTickWaitsForARunningCheck(t *testing.T) {
	t.Parallel()
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second,
		MaxPollInterval: time.Second, Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond},
		nil, nil, nil, &pickLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	floor := time.Now().Add(-time.Second)
	ticked := time.Now().Add(-time.Hour)
	s.floor, s.floorTicked, s.claimedSince = &floor, ticked, true
	s.checking = true // a check started by an earlier tick
	s.floorTick(context.Background())
	if !s.floorTicked.Equal(ticked) || !s.claimedSince || s.floor == nil {
		t.Fatalf("a tick during a check was spent: ticked %v (was %v), claimed since %v, floor %v",
			s.floorTicked, ticked, s.claimedSince, s.floor)
	}
}

// TestContinueRefusesALapsedClaim: a chaining outcome whose answer comes
// back late — the process was stopped (SIGSTOP) while the statement was in
// flight, and on waking the answer reached the executor before the
// deadline timer had run — must not move the claim to the continued row:
// the row's new lease began when the statement ran, a lease ago or more,
// so it may have been reaped and run elsewhere (for a keyed row, its key
// taken by its next row), and the executor would start the next step on a
// claim that is no longer current. Continue refuses, as HandOff does, when
// the new lease's deadline (one lease after the statement was about to be
// sent) has passed, and also when the old claim's deadline has passed (for
// a row of a queue with a GlobalConcurrency the statement re-claims a row
// whose lease ran out, whose place may be another step's); the claim stays
// held under its old token for the timer to give up.
func TestContinueRefusesALapsedClaim(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second,
		MaxPollInterval: time.Second, Lease: lease, HeartbeatInterval: 300 * time.Millisecond},
		nil, nil, nil, &pickLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { s.mu.Lock(); s.timerOff = true; s.deadline.Stop(); s.mu.Unlock() })
	// The timer is not armed: as in a process that just woke, it has not
	// run yet.
	s.held[7] = &held{id: 1, running: true, deadline: time.Now().Add(lease), cancel: func(error) {}}
	h := &holder{s: s, token: 7}
	h.Committing()
	if !h.Continue(7, 9) {
		t.Fatal("a chaining outcome answered at once was refused")
	}
	if s.held[7] != nil || s.held[9] == nil || h.token != 9 {
		t.Fatalf("after Continue: held %v, token %d", s.held, h.token)
	}

	// Answered two leases after it was sent; a heartbeat during the
	// statement had confirmed the old lease, so its deadline is still ahead.
	h.Committing()
	s.held[9].committingAt = time.Now().Add(-2 * lease)
	if h.Continue(9, 11) {
		t.Fatal("Continue moved the claim to a row whose new lease ran out a lease ago")
	}
	if s.held[9] == nil || s.held[11] != nil || h.token != 9 {
		t.Fatalf("a refused Continue changed the claims: held %v, token %d", s.held, h.token)
	}

	// Answered in time for the new lease, but the old claim's deadline
	// has passed: the statement may have re-claimed a row whose lease had
	// run out.
	h.Committing()
	s.held[9].deadline = time.Now().Add(-time.Millisecond)
	if h.Continue(9, 11) {
		t.Fatal("Continue moved a claim whose deadline had passed")
	}
}

// TestFloorChecksAreSpacedByTheirDuration: a floor check that took long
// (under a snapshot held elsewhere it reads every entry claimed since the
// hold began) is not followed by the next one FloorCheck later, but only
// after floorCheckDuty times its duration: checks once a second that each
// took 1.2 s kept a server process busy per engine through a hold.
func TestFloorChecksAreSpacedByTheirDuration(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, c := range []struct {
		since, took time.Duration
		due         bool
	}{
		{time.Second, 0, true},                            // no check yet: FloorCheck
		{999 * time.Millisecond, 0, false},                // within FloorCheck
		{time.Second, 50 * time.Millisecond, true},        // a fast check: FloorCheck
		{5 * time.Second, 1200 * time.Millisecond, false}, // a slow one: 10 × 1.2 s
		{12 * time.Second, 1200 * time.Millisecond, true},
	} {
		if got := floorCheckDue(now, now.Add(-c.since), c.took, time.Second); got != c.due {
			t.Errorf("%v after a check that took %v: due %v, want %v", c.since, c.took, got, c.due)
		}
	}
	// The tick does not start a check before then: nothing is spent.
	s := New(Config{Queue: "q", Concurrency: 1, MinDemand: 1, PollInterval: time.Second,
		MaxPollInterval: time.Second, Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond},
		nil, nil, nil, &pickLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	floor := now.Add(-time.Second)
	ticked := now.Add(-5 * time.Second)
	s.floor, s.floorTicked, s.claimedSince, s.checkTook = &floor, ticked, true, 1200*time.Millisecond
	s.floorTick(context.Background())
	if !s.floorTicked.Equal(ticked) || !s.claimedSince || s.checking {
		t.Fatalf("a check started 5 s after one that took 1.2 s: ticked %v (was %v), checking %v", s.floorTicked, ticked, s.checking)
	}
}

// TestABufferedRowWithLittleLeaseLeftWaitsForAHeartbeat: a buffered row
// with less than half its lease left (heartbeats failed while the database
// was down) does not start; the rows behind it do; once a heartbeat has
// extended it, it starts.
func TestABufferedRowWithLittleLeaseLeftWaitsForAHeartbeat(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	s := New(Config{Queue: "q", Concurrency: 2, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: lease, HeartbeatInterval: 500 * time.Millisecond},
		&sqlq.Queries{}, heartbeatDB{mode: "kept"}, nil, &lostLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	started := make(chan int64, 2)
	s.exec = func(_ context.Context, c *sqlq.Claimed, _ Holder) Result { started <- c.ID; return Result{} }
	go s.worker()
	go s.worker()
	defer close(s.work)
	s.mu.Lock()
	s.confirmed(time.Now())
	s.mu.Unlock()
	s.add([]sqlq.Claimed{{ID: 1, Token: 7}}, time.Now().Add(-lease*6/10)) // 0.4 of its lease left
	s.add([]sqlq.Claimed{{ID: 2, Token: 8}}, time.Now())
	s.dispatch(context.Background())
	select {
	case id := <-started:
		if id != 2 {
			t.Fatalf("row %d started first, want 2 (row 1 has less than half its lease left)", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the row with its whole lease left did not start")
	}
	s.mu.Lock()
	buffered, heldBack := len(s.buffer), s.heldBack
	s.held[7].deadline = time.Now().Add(lease) // what a heartbeat that extended it sets
	s.mu.Unlock()
	if buffered != 1 || !heldBack {
		t.Fatalf("buffered %d, held back %v; want row 1 buffered and dispatch waiting for a heartbeat", buffered, heldBack)
	}
	select {
	case id := <-started:
		t.Fatalf("row %d started with less than half its lease left", id)
	case <-time.After(100 * time.Millisecond):
	}
	s.dispatch(context.Background())
	select {
	case id := <-started:
		if id != 1 {
			t.Fatalf("row %d started, want 1", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("row 1 did not start once its lease was extended")
	}
}

// TestPaceLocked: a rated key's starts in this process come from a bucket
// of its own policy (Config.KeyRate): Burst at once, then one each 1/Rate;
// an unrated key is never held. Past maxPaced keys, a key is forgotten only
// by its own policy's refill (a slow key is not dropped by a fast key's),
// else the fullest goes. A wait never rounds to 0 (0 means go).
func TestPaceLocked(t *testing.T) {
	t.Parallel()
	s := &Feeder{cfg: Config{KeyRate: func(key string) (float64, int) {
		switch {
		case strings.HasPrefix(key, "slow-"):
			return 1.0 / 3600, 1
		case strings.HasPrefix(key, "fast-"):
			return 1000, 1000
		case strings.HasPrefix(key, "rx"): // a policy with no rate: not paced
			return 0, 0
		case strings.HasPrefix(key, "r"):
			return 5, 2
		}
		return 0, 0
	}}}
	t0 := time.Unix(1_000_000, 0)
	require.Zero(t, s.paceLocked("plain", t0))
	for range 5 {
		require.Zero(t, s.paceLocked("rx-1", t0), "its policy has no rate")
	}
	require.Zero(t, s.paceLocked("r1", t0))
	require.Zero(t, s.paceLocked("r1", t0))
	require.Equal(t, 200*time.Millisecond, s.paceLocked("r1", t0), "burst 2 spent: the next in 1/5 s")
	require.Equal(t, 100*time.Millisecond, s.paceLocked("r1", t0.Add(100*time.Millisecond)))
	require.Zero(t, s.paceLocked("r1", t0.Add(200*time.Millisecond)))
	// A hair before the token: still a wait, not 0.
	require.Positive(t, s.paceLocked("r1", t0.Add(400*time.Millisecond-time.Nanosecond)))

	// maxPaced slow keys, each started once: none has refilled after a second.
	for i := range maxPaced {
		require.Zero(t, s.paceLocked(fmt.Sprint("slow-", i), t0))
	}
	require.Zero(t, s.paceLocked("fast-1", t0.Add(time.Second)))
	require.LessOrEqual(t, len(s.paced), maxPaced)
	n := 0
	for i := range maxPaced {
		if s.paceLocked(fmt.Sprint("slow-", i), t0.Add(2*time.Second)) > 0 {
			n++
		}
	}
	require.GreaterOrEqual(t, n, maxPaced-2, "slow keys kept their spent buckets (at most the one evicted, and r1's room, start again)")
}

// TestWakeHeapKeepsTheEarliest: a full wake heap drops its later
// instants, never an earlier one for a later: an early instant pushed
// last is kept and is the next wake, and what is kept comes out in order.
// It dropped whatever came once it was full: a row due in a second,
// inserted after 4,000 rows an hour ahead, lost its wake and waited for the
// idle poll.
func TestWakeHeapKeepsTheEarliest(t *testing.T) {
	base := time.Now()
	var h wakeHeap
	for i := range 100 {
		h.pushBounded(base.Add(time.Hour+time.Duration(i)*time.Second), 10)
		require.LessOrEqual(t, len(h), 10)
	}
	h.pushBounded(base.Add(time.Second), 10)
	require.LessOrEqual(t, len(h), 10)
	require.True(t, h[0].Equal(base.Add(time.Second)), "the early instant is the next wake")
	var got []time.Time
	for len(h) > 0 {
		got = append(got, heap.Pop(&h).(time.Time))
	}
	require.True(t, got[0].Equal(base.Add(time.Second)))
	require.True(t, slices.IsSortedFunc(got, func(a, b time.Time) int { return a.Compare(b) }))

	// Pushed in descending order, the heap keeps the latest pushes (the
	// earliest instants) as they come.
	h = nil
	for i := range 100 {
		h.pushBounded(base.Add(time.Duration(100-i)*time.Second), 10)
	}
	require.True(t, h[0].Equal(base.Add(time.Second)))
}

// TestAHandBackOutlastsAFewFailedTries: claims given back while the
// worker's sessions keep being ended (pg_terminate_backend back to back for
// a second, as a proxy or an operator's storm would) go back once a session
// lives; before, the hand-back gave up after eight tries in 400 ms, and the
// claims waited for the reaper — a keyed one's key for the whole lease,
// and an attempt charged (a fault probe: 60 s and attempt 1).
func TestAHandBackOutlastsAFewFailedTries(t *testing.T) {
	t.Parallel()
	app := fmt.Sprintf("gd_giveback_%d", time.Now().UnixNano())
	sep := "?"
	if strings.Contains(dbtest.URL(), "?") {
		sep = "&"
	}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Extra: 1, URL: dbtest.URL() + sep + "application_name=" + app})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+schema+`.gendurable_instances (fsm, step, partition_key, status, claim_token, lease_expires_at)
		VALUES ('m', 's', 'k', 'executing', 42, now() + interval '1 minute') RETURNING id`).Scan(&id))
	s := New(Config{Queue: "default", Concurrency: 1, MinDemand: 1, PollInterval: time.Second, MaxPollInterval: time.Second,
		Lease: time.Minute, HeartbeatInterval: time.Second},
		q, pool, func(context.Context, *sqlq.Claimed, Holder) Result { return Result{} }, &lostLog{}, slog.New(slog.NewTextHandler(io.Discard, nil)))

	killer, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	defer killer.Close(ctx)
	stop := time.Now().Add(time.Second)
	storm := make(chan int)
	go func() {
		n := 0
		for time.Now().Before(stop) {
			var k int
			if err := killer.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&k); err == nil {
				n += k
			}
		}
		storm <- n
	}()
	time.Sleep(50 * time.Millisecond) // the storm is under way
	s.giveBack(unstarted{ids: []int64{id}, tokens: []int64{42}})
	t.Logf("sessions ended: %d", <-storm)
	var status string
	require.NoError(t, killer.QueryRow(ctx, "SELECT status FROM "+schema+".gendurable_instances WHERE id = $1", id).Scan(&status))
	require.Equal(t, "runnable", status, "the claim went back")
}

// walkLog records every pick: when it began, what it claimed, and how many
// full keys it passed over (none: it walked no key, or found none full).
type walkLog struct {
	pickLog
	mu    sync.Mutex
	picks []walkPick
}

type walkPick struct {
	start time.Time
	took  time.Duration
	count int
	full  int
}

func (w *walkLog) Pick(r PickReport) {
	full := 0
	for _, n := range r.KeysFull {
		full += int(n)
	}
	w.mu.Lock()
	w.picks = append(w.picks, walkPick{start: time.Now().Add(-r.Duration), took: r.Duration, count: r.Count, full: full})
	w.mu.Unlock()
}

func (w *walkLog) since(t time.Time) []walkPick {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []walkPick
	for _, p := range w.picks {
		if !p.start.Before(t) {
			out = append(out, p)
		}
	}
	return out
}

// heldKeys inserts rows rows of each of keys keys (k00, k01, …) in queue q,
// the first of each executing under a live lease of another process: every
// key is full.
func heldKeys(t *testing.T, pool *pgxpool.Pool, schema string, keys, rows int) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.gendurable_instances (fsm, step, queue, partition_key)
		SELECT 'm', 's', 'q', 'k' || lpad(k::text, 2, '0') FROM generate_series(1, $1) AS k, generate_series(1, $2)`, keys, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.gendurable_instances SET status = 'executing',
		lease_expires_at = now() + interval '1 minute', claim_token = 1
		WHERE id IN (SELECT min(id) FROM `+schema+`.gendurable_instances GROUP BY partition_key)`); err != nil {
		t.Fatal(err)
	}
}

// walkingFeeder runs a feeder of concurrency slots on queue q, polling every
// poll, over keys full keys of rows rows each (heldKeys) whose steps return
// at once; stop ends it and waits.
func walkingFeeder(t *testing.T, keys, rows, concurrency int, poll time.Duration) (*pgxpool.Pool, string, *Feeder, *walkLog, func()) {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3})
	q, err := sqlq.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	heldKeys(t, pool, schema, keys, rows)
	ev := &walkLog{}
	s := New(Config{Queue: "q", Concurrency: concurrency, MinDemand: 1, BusyPollInterval: poll, PollInterval: poll, MaxPollInterval: poll,
		Lease: time.Minute, HeartbeatInterval: 20 * time.Second},
		q, pool, func(context.Context, *sqlq.Claimed, Holder) Result { return Result{} }, ev, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pickCtx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); s.Run(pickCtx, context.Background()) }()
	var once sync.Once
	return pool, schema, s, ev, func() { once.Do(func() { cancel(); <-ran }) }
}

// TestAWalkThatFindsEveryKeyFullIsNotRepeatedAtEveryPick: while every key
// is full, picks every 1 ms walk the keys at most every other time
// (keysWalkDuty: ten times the walk's duration, at least the busy poll);
// a key freed elsewhere is still claimed within keysRecheckAfter's bound,
// and after a local insert (a kick) the very next pick walks. The poll is
// 1 ms so that the duty bound, not the busy poll's floor, decides: at a
// 5 ms poll a quiet machine's walk of 0.3 ms was due again after the
// floor, one poll later, and every pick walked (the test failed there,
// and passed only on a loaded machine, whose walks are slower).
func TestAWalkThatFindsEveryKeyFullIsNotRepeatedAtEveryPick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const poll = time.Millisecond
	pool, schema, s, ev, stop := walkingFeeder(t, 10, 3, 4, poll)
	defer stop()

	began := time.Now()
	time.Sleep(time.Second)
	picks := ev.since(began)
	walks := 0
	var took time.Duration
	for _, p := range picks {
		if p.count > 0 {
			t.Fatalf("a pick claimed %d rows while every key was full", p.count)
		}
		if p.full > 0 {
			walks++
			took += p.took
		}
	}
	if len(picks) < 20 || walks < 2 || 2*walks > len(picks) {
		t.Fatalf("%d of %d picks walked the 10 full keys (%s each on average): want at least 2, and at most half",
			walks, len(picks), took/time.Duration(max(walks, 1)))
	}
	t.Logf("%d of %d picks walked the 10 full keys, %s each on average", walks, len(picks), took/time.Duration(walks))

	// Another process's step on k03 ends without a hand-off: its key has room.
	freed := time.Now()
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.gendurable_instances SET status = 'done', lease_expires_at = NULL,
		claim_token = NULL, finished_at = now() WHERE partition_key = 'k03' AND status = 'executing'`); err != nil {
		t.Fatal(err)
	}
	bound := keysRecheckAfter(time.Hour, poll, poll) // the longest recheck
	for {
		if n := countOf(ev.since(freed)); n > 0 {
			break
		}
		if time.Since(freed) > bound+time.Second {
			t.Fatalf("k03's next row not claimed %s after its key freed (recheck at most %s)", time.Since(freed), bound)
		}
		time.Sleep(poll)
	}

	// A local insert of a new key's row, the loop stopped (no pick races
	// the state set here): with the next walk an hour off, as after a slow
	// walk that found every key full, a pick walks no key and claims
	// nothing; the kick makes the walk due, and the pick claims the row.
	stop()
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.gendurable_instances (fsm, step, queue, partition_key) VALUES ('m', 's', 'q', 'fresh')`); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.keysFullAt, s.keysRecheck, s.keyNews = time.Now(), time.Hour, false
	due := s.keysWalkDueLocked(time.Now())
	s.mu.Unlock()
	if due {
		t.Fatal("a walk is due within the recheck, with no news")
	}
	if n, err := s.pick(ctx, 4, 4, false); err != nil || n != 0 {
		t.Fatalf("a pick that walks no key claimed %d rows (%v)", n, err)
	}
	s.Kick()
	s.mu.Lock()
	due = s.keysWalkDueLocked(time.Now())
	s.mu.Unlock()
	if !due {
		t.Fatal("no walk is due after a kick")
	}
	if n, err := s.pick(ctx, 4, 4, true); err != nil || n != 1 || *s.buffer[len(s.buffer)-1].PartitionKey != "fresh" {
		t.Fatalf("the pick after the kick claimed %d rows (%v), want the new key's row", n, err)
	}
}

func countOf(picks []walkPick) int {
	n := 0
	for _, p := range picks {
		n += p.count
	}
	return n
}

// TestAWalkCutShortByMaxKeysIsRepeated: with more full keys than a pick
// visits (PickOpts.MaxKeys: 20 for a pick of one row), no walk goes round
// every key, so every pick walks on from where the last stopped.
func TestAWalkCutShortByMaxKeysIsRepeated(t *testing.T) {
	t.Parallel()
	const poll = 5 * time.Millisecond
	_, _, _, ev, stop := walkingFeeder(t, 30, 2, 1, poll)
	time.Sleep(500 * time.Millisecond)
	stop()
	picks := ev.since(time.Time{})
	if len(picks) < 10 {
		t.Fatalf("%d picks in 500 ms, polling every %s", len(picks), poll)
	}
	for i, p := range picks {
		if p.full == 0 {
			t.Fatalf("pick %d of %d walked no key, with 30 full keys and 20 visited per pick", i+1, len(picks))
		}
	}
}
