package feeder

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
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
func (*pickLog) LeaseLost(string, int64)               {}
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
	s.held[7] = &held{id: 1}
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

// lostLog records the instances reported as lost.
type lostLog struct {
	pickLog
	mu   sync.Mutex
	lost []int64
}

func (l *lostLog) LeaseLost(_ string, id int64) {
	l.mu.Lock()
	l.lost = append(l.lost, id)
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
		if n, err := s.pick(ctx, 1); err != nil || n != 1 {
			t.Fatalf("pick: %d rows, %v", n, err)
		}
		return s.buffer[len(s.buffer)-1]
	}
	zombie := pick()
	// Its lease runs out and is reaped; the feeder claims the instance again.
	if _, err := pool.Exec(ctx, "UPDATE "+schema+".gendurable_instances SET lease_expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Reap(ctx, pool, 10); err != nil || len(n) != 1 {
		t.Fatalf("reap: %v, %v", n, err)
	}
	claim := pick()
	if claim.ID != zombie.ID || claim.Token <= zombie.Token {
		t.Fatalf("claims %+v then %+v: want one instance, a newer token", zombie, claim)
	}
	// The zombie runs on, ignoring its context; the new claim waits in the buffer.
	zctx, zcancel := context.WithCancelCause(ctx)
	defer zcancel(nil)
	s.held[zombie.Token].running, s.held[zombie.Token].cancel = true, zcancel
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
	if len(ev.lost) != 1 || ev.lost[0] != zombie.ID {
		t.Fatalf("lease-lost reports %v, want [%d]", ev.lost, zombie.ID)
	}
}
