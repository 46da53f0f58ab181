// Package committer applies step outcomes with group commit: outcomes of
// concurrent steps that arrive while a statement is in flight are applied
// together in the next one (UPDATE … FROM unnest), the way a replicated log
// batches entries. Each caller waits until its own outcome has committed (or
// was fenced out) before its instance goes on, so the guarantee of docs/design.md §1
// holds; under load the statements per step fall to 1/batch. With no
// concurrency a batch is one outcome and nothing waits for a timer.
package committer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// Defaults of Config.
const (
	DefaultMaxBatch    = 500
	DefaultMaxInFlight = 2
)

// Config tunes a Committer.
type Config struct {
	MaxBatch    int           // outcomes per statement; default DefaultMaxBatch
	MaxInFlight int           // statements in flight at once; default DefaultMaxInFlight
	Lease       time.Duration // lease of continued outcomes, and how long a write is retried
	// LockWait bounds how long a batch's statement waits for a row lock
	// another transaction holds (a caller's open SignalTx on a parent whose
	// child finished, an operator's statement cut off mid-transaction)
	// before the batch is split so its other outcomes go on (see apply).
	// Default: an eighth of Lease, at least 100 ms and at most 1 s.
	LockWait time.Duration
}

// Result is one outcome's fate: Applied set when its fence held, nil with a
// nil Err when it was fenced out, Err when it could not be written.
type Result struct {
	Applied *sqlq.Applied
	Err     error
}

type request struct {
	out  *sqlq.Outcome
	done chan Result  // Commit waits here, or
	then func(Result) // CommitAsync's callback runs on the flushing goroutine

	// Set while parked (only waitLoop and the park that hands it over
	// touch them, one after the other).
	parkedAt  time.Time // first parked
	tried     time.Time // its last statement ran out of its lock wait
	timeouts  int       // statements that ran out of their lock wait
	notBefore time.Time // its next attempt, not before (a wait the look cannot see)

	// written: a statement holding this outcome failed in a way that may
	// have committed it (its answer lost). Set by apply, it stays with the
	// request through split, park and waitLoop, so that whichever
	// statement writes it next looks up what it finds fenced out (recover).
	written bool
}

func (r *request) deliver(res Result) {
	if r.then != nil {
		r.then(res)
		return
	}
	r.done <- res
}

// Committer batches outcomes onto one connection pool.
type Committer struct {
	cfg Config
	q   *sqlq.Queries
	db  sqlq.DB

	mu       sync.Mutex
	pending  []*request
	inFlight int
	// blocked holds the parked outcomes (see split): one goroutine
	// (waitLoop, running while waiting is set) writes them as their locks
	// go, while the flush loops go on with the rest.
	blocked []*request
	waiting bool
	// draining: the engine is stopping (Drain); a parked outcome is given
	// up once it has waited a lease.
	draining bool
	batches  sync.Pool
	// run bounds every statement besides its lease: Abort cancels it, and
	// it stays cancelled until Resume.
	run       context.Context
	runCancel context.CancelFunc
}

// ErrAborted is the error of an outcome the committer gave up on because
// Abort was called (an engine's Stop out of time).
var ErrAborted = errors.New("outcome abandoned by a stop out of time; its row is reaped after its lease")

// New returns a Committer writing through db.
func New(cfg Config, q *sqlq.Queries, db sqlq.DB) *Committer {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.LockWait <= 0 {
		cfg.LockWait = min(max(cfg.Lease/8, 100*time.Millisecond), time.Second)
	}
	c := &Committer{cfg: cfg, q: q, db: db}
	c.batches.New = func() any { return &sqlq.OutcomeBatch{} }
	c.run, c.runCancel = context.WithCancel(context.Background())
	return c
}

// Abort gives up, at once, the statements in flight and their retries,
// and every outcome applied after it until Resume: each is delivered with
// an error wrapping ErrAborted, and its row keeps its lease, to be reaped
// as a crashed worker's. An engine's Stop calls it when its context (and
// grace) ended with outcomes still waiting on the database — a network cut
// off, a stuck server — which would otherwise be retried for up to a lease
// after Stop returned, holding their pool connections.
func (c *Committer) Abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runCancel()
}

// Drain bounds the wait of parked outcomes (an engine's Stop calls it as it
// begins): one parked for a lease and still held is given up, delivered
// with ErrLockHeld, so a Stop without a deadline waits for a lock another
// transaction holds no longer than it did before outcomes were parked (the
// committer gave an outcome up after a lease then). Its row is reaped
// after its lease.
func (c *Committer) Drain() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.draining = true
}

// ErrMaybeWritten is wrapped by the error of an outcome given up after a
// statement holding it lost its answer: that statement may have committed
// it, whatever the last attempt's error says.
var ErrMaybeWritten = errors.New("an earlier attempt's answer was lost: it may have been written")

// ErrLockHeld is the error of a parked outcome given up after Drain: its
// row, or its parent, was still locked by another transaction.
var ErrLockHeld = errors.New("outcome not written: its row or its parent was locked by another transaction for a lease while the engine stopped")

// Resume undoes Abort and Drain: outcomes are written again, and parked
// ones wait for their locks (an engine started again).
func (c *Committer) Resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.draining = false
	if c.run.Err() != nil {
		c.run, c.runCancel = context.WithCancel(context.Background())
	}
}

// Aborted is a context cancelled by Abort (the current one: Resume makes
// another). A WithTx outcome's transaction, which does not go through the
// committer, ends with it too.
func (c *Committer) Aborted() context.Context { return c.runContext() }

func (c *Committer) runContext() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.run
}

// Commit applies o, possibly together with other outcomes, and returns once
// it has committed, was fenced out, or could not be written within the
// lease. A data exception (e.g. a JSON string holding \u0000, which jsonb
// cannot store) turns the outcome into a Stop that records the reason: the
// outcome could never be written as it is. o may be rewritten that way.
func (c *Committer) Commit(o *sqlq.Outcome) Result {
	r := &request{out: o, done: make(chan Result, 1)}
	c.enqueue(r)
	return <-r.done
}

// CommitAsync is Commit without waiting: then is called with the result,
// on the goroutine that applied the batch; it must be quick.
func (c *Committer) CommitAsync(o *sqlq.Outcome, then func(Result)) {
	c.enqueue(&request{out: o, then: then})
}

func (c *Committer) enqueue(r *request) {
	c.mu.Lock()
	c.pending = append(c.pending, r)
	start := c.inFlight < c.cfg.MaxInFlight
	if start {
		c.inFlight++
	}
	c.mu.Unlock()
	if start {
		go c.flushLoop()
	}
}

// flushLoop applies pending outcomes batch after batch until none are left.
func (c *Committer) flushLoop() {
	for {
		c.mu.Lock()
		n := min(len(c.pending), c.cfg.MaxBatch)
		if n == 0 {
			c.inFlight--
			c.mu.Unlock()
			return
		}
		batch := make([]*request, n)
		copy(batch, c.pending)
		c.pending = append(c.pending[:0], c.pending[n:]...)
		c.mu.Unlock()
		c.apply(batch, c.cfg.LockWait)
	}
}

// park hands an outcome whose statement ran out of its lock wait (split)
// to waitLoop, starting it if it is not running.
func (c *Committer) park(r *request) {
	r.timeouts++
	r.tried = time.Now()
	if r.parkedAt.IsZero() {
		r.parkedAt = r.tried
	}
	c.keep(r)
}

// keep puts r (back) among the parked outcomes.
func (c *Committer) keep(r *request) {
	c.mu.Lock()
	c.blocked = append(c.blocked, r)
	start := !c.waiting
	c.waiting = true
	c.mu.Unlock()
	if start {
		go c.waitLoop()
	}
}

// waitLoop writes the parked outcomes until none is left, on one
// connection whatever their number. Each round it asks, without waiting,
// which of them another transaction still holds (sqlq.LockedOutcomes: the
// parents first, then the rows of the others), writes the others together
// (as any batch: split again if one still waits), keeps the rest for the
// next round, and pauses (a quarter of LockWait, at most 100 ms, and at
// least four times the look). So a parked outcome's statement does not sit
// on its own row while it waits — the heartbeat, which passes over a
// locked row, keeps extending its lease — and parked outcomes do not wait
// for each other's locks. One that the look found free and whose statement
// still ran out of its wait waits on something the look cannot see (a
// unique key another transaction is inserting, a signal row): it is tried
// alone, with a quarter of the wait, at growing intervals (LockWait, twice
// that, … up to 8 LockWaits), so its statement sits on its row a small
// share of the time; so is one the look has found held for two leases since
// its statement last tried, in case the look is wrong. There is no limit on
// the rounds: a parked outcome waits for as long as the lock is held (its
// step run again would meet the same lock) — until Abort, until Drain and
// a lease (Drain gives up only outcomes still held or backing off: one
// whose lock went is written), or until its row is taken from it (fenced
// out).
func (c *Committer) waitLoop() {
	for {
		c.mu.Lock()
		batch := c.blocked
		c.blocked = nil
		draining := c.draining
		if len(batch) == 0 {
			c.waiting = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		began := time.Now()
		run := c.runContext()
		var held map[int64]bool
		if run.Err() == nil { // else apply gives each up at once
			held, _ = c.heldAmong(run, batch) // on error none: apply retries and splits
		}
		looked := time.Since(began)
		var free, unseen []*request
		for _, r := range batch {
			heldNow := held[r.out.ID]
			backingOff := r.timeouts > 1 && began.Before(r.notBefore)
			switch {
			case run.Err() != nil:
				free = append(free, r)
			case (heldNow || backingOff) && draining && began.Sub(r.parkedAt) >= c.cfg.Lease:
				if r.written {
					r.deliver(Result{Err: fmt.Errorf("%w (%w)", ErrLockHeld, ErrMaybeWritten)})
				} else {
					r.deliver(Result{Err: ErrLockHeld})
				}
			case heldNow && began.Sub(r.tried) < 2*c.cfg.Lease, backingOff:
				c.keep(r)
			case heldNow || r.timeouts > 1:
				// A wait the look cannot see; or held, by the look's
				// account, for two leases since its statement last tried:
				// tried again, alone, in case the look is wrong (a case
				// it does not know).
				r.notBefore = began.Add(min(c.cfg.LockWait<<min(max(r.timeouts-2, 0), 3), 8*c.cfg.LockWait))
				unseen = append(unseen, r)
			default:
				free = append(free, r)
			}
		}
		for len(free) > 0 {
			n := min(len(free), c.cfg.MaxBatch)
			c.apply(free[:n], c.cfg.LockWait)
			free = free[n:]
		}
		for _, r := range unseen {
			c.apply([]*request{r}, max(c.cfg.LockWait/4, 10*time.Millisecond))
		}
		pause := max(min(c.cfg.LockWait/4, 100*time.Millisecond), 4*looked)
		if rest := pause - time.Since(began); rest > 0 {
			select {
			case <-time.After(rest):
			case <-run.Done():
			}
		}
	}
}

// heldAmong asks, without waiting, which outcomes of batch another
// transaction holds up (sqlq.LockedOutcomes): their ids.
func (c *Committer) heldAmong(ctx context.Context, batch []*request) (map[int64]bool, error) {
	ids := make([]int64, len(batch))
	tokens := make([]int64, len(batch))
	terminal := make([]bool, len(batch))
	for i, r := range batch {
		ids[i], tokens[i] = r.out.ID, r.out.Token
		terminal[i] = r.out.Kind == sqlq.KindDone || r.out.Kind == sqlq.KindStop
	}
	qctx, cancel := context.WithTimeout(ctx, c.cfg.Lease/2)
	defer cancel()
	locked, err := c.q.LockedOutcomes(qctx, c.db, ids, tokens, terminal)
	if err != nil {
		return nil, err
	}
	held := make(map[int64]bool, len(locked))
	for _, id := range locked {
		held[id] = true
	}
	return held, nil
}

// apply writes one batch, retrying transient failures (lost connection,
// deadlock with another process's batch) until the lease runs out. A
// rejected batch is halved, and each half written the same way, so only
// the offending outcomes are stopped.
//
// lockWait (0: none) bounds each row lock wait of the statement. A batch
// whose statement runs out of it waits on a row another transaction holds
// — a child's Done on a parent a caller's open SignalTx locked, an outcome
// of a row locked itself: split takes the waiting outcomes out, so the
// others are written after one lockWait rather than failing with the
// waiting one at the lease's end; an outcome that waits alone is parked
// for waitLoop (which calls apply again). Nothing of a statement that ran
// out of its wait was written.
func (c *Committer) apply(batch []*request, lockWait time.Duration) {
	if len(batch) > 1 && sharesAnID(batch) {
		// Two claims of one instance (a step fenced out whose context still
		// runs, and the claim that replaced it): results are delivered by
		// instance id, so each goes in a statement of its own, where only
		// the one whose token still matches is written.
		for _, r := range batch {
			c.apply([]*request{r}, lockWait)
		}
		return
	}
	run := c.runContext()
	ctx, cancel := context.WithTimeout(run, c.cfg.Lease)
	defer cancel()
	if run.Err() != nil {
		for _, r := range batch {
			r.deliver(Result{Err: ErrAborted})
		}
		return
	}
	b := c.batches.Get().(*sqlq.OutcomeBatch)
	defer c.batches.Put(b)
	var retry backoff.Write
	for {
		b.Reset()
		b.Lease, b.LockWait = c.cfg.Lease, lockWait
		for _, r := range batch {
			b.Add(r.out)
		}
		// One attempt may take half the lease: a connection that swallowed
		// the statement without an answer (a proxy or a network that drops
		// traffic without closing anything) is given up, and pgx closes it,
		// while there is time left to write the outcome on a fresh one — the
		// heartbeat keeps its other half for the same reason. A statement
		// that waits on a row lock is abandoned and sent again as well.
		actx, acancel := context.WithTimeout(ctx, c.cfg.Lease/2)
		applied, err := c.q.ApplyOutcomes(actx, c.db, b)
		acancel()
		if err == nil {
			byID := make(map[int64]*sqlq.Applied, len(applied))
			for i := range applied {
				byID[applied[i].ID] = &applied[i]
			}
			var fenced []*request
			for _, r := range batch {
				switch a := byID[r.out.ID]; {
				case a == nil && r.written:
					fenced = append(fenced, r) // perhaps by its own lost write: looked up below
				default:
					r.deliver(Result{Applied: a})
				}
			}
			if len(fenced) > 0 {
				c.recover(ctx, fenced, byID)
				for _, r := range fenced {
					r.deliver(Result{Applied: byID[r.out.ID]})
				}
			}
			return
		}
		if lockWait > 0 && sqlq.LockTimedOut(err) && run.Err() == nil {
			c.split(ctx, batch, lockWait)
			return
		}
		if sqlq.Rejected(err) {
			if len(batch) > 1 {
				// Halves, each written the same way, down to the offending
				// outcomes: one in a batch of n costs about 2·log2(n)
				// statements, where each outcome alone, as before, cost n
				// (TestRejectedOutcomeStopsOnlyItself: 12 against 34 for a
				// batch of 32). When most of a batch is rejected, halving
				// costs up to 2n − 1.
				h := len(batch) / 2
				c.apply(batch[:h], lockWait)
				c.apply(batch[h:], lockWait)
				return
			}
			if o := batch[0].out; o.Kind != sqlq.KindStop {
				*o = sqlq.RejectedStop(o, err)
				continue
			}
		}
		// A closed pool does not open again (the application closed it after
		// Stop, with a step that ignored its cancel still running): give up
		// at once rather than retry until the lease runs out.
		if errors.Is(err, puddle.ErrClosedPool) || !retry.Wait(ctx) {
			if run.Err() != nil {
				err = fmt.Errorf("%w: %w", ErrAborted, err)
			}
			for _, r := range batch {
				e := err
				if r.written {
					e = fmt.Errorf("%w (%w)", err, ErrMaybeWritten)
				}
				r.deliver(Result{Err: e})
			}
			return
		}
		// The failed attempt may have committed (a connection lost after
		// the commit): its outcomes are then fenced out on the retry, which
		// recovers them (recover). A successor it claimed stays executing
		// without a heartbeat until its lease runs out (docs/design.md §6).
		// The retry hands nothing on, so it cannot strand a second one.
		// Not an attempt the server refused (an ERROR: the statement's
		// implicit transaction rolled back) or that never left: that one
		// wrote nothing, and an outcome given up after such attempts only
		// is not "may have been written" (an outage probe: the read-only
		// database's refusals were reported so).
		maybe := !definitelyNotWritten(err)
		for _, r := range batch {
			r.out.Handoff = 0
			r.written = r.written || maybe
		}
	}
}

// definitelyNotWritten reports whether a failed outcome statement surely
// committed nothing: the server answered it with an ERROR (a FATAL, such as
// an administrator's termination, can come after a commit), or nothing of
// it was sent.
func definitelyNotWritten(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return sqlq.Severity(pgErr) == "ERROR"
	}
	return pgconn.SafeToRetry(err)
}

// recover completes byID, the answer of a retried statement, with the
// outcomes of batch (those the retry found fenced out) that an earlier
// attempt whose answer was lost had written (sqlq.RecoverOutcomes,
// docs/design.md §4 "A lost answer"): they
// are fenced out on the retry by their own write. A chained step comes
// back with the claim the lost attempt drew for it, while that claim is
// still the row's, so the worker runs it rather than leaving it to the
// reaper (which charged it an attempt it never had). recover asks only
// while a quarter of the lease is left, for at most an eighth of it: a
// claim the attempt drew lives a lease from its statement's start, after
// this apply began (the look checks the claim token too, so a row claimed
// by another since is never taken for it). If the look fails, the
// outcomes stay fenced out, as before.
func (c *Committer) recover(ctx context.Context, batch []*request, byID map[int64]*sqlq.Applied) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < c.cfg.Lease/4 {
		return
	}
	ids, tokens := make([]int64, len(batch)), make([]int64, len(batch))
	for i, r := range batch {
		ids[i], tokens[i] = r.out.ID, r.out.Token
	}
	// An eighth of the lease at most (the network that lost the answer may
	// swallow this one too): a claim found in the apply that lost the answer
	// is then handed on with at least an eighth of its lease left (it was
	// drawn after this apply began, and lives a lease from then). One found
	// for an outcome parked since may have less: the worker gives back a
	// claim too late for it (executor, Holder.Continue).
	lctx, cancel := context.WithTimeout(ctx, c.cfg.Lease/8)
	found, err := c.q.RecoverOutcomes(lctx, c.db, ids, tokens)
	cancel()
	if err != nil {
		return
	}
	// A claim comes back only for an outcome that chained: chain_token is
	// written by the same outcome as outcome_token, and only then.
	for i := range found {
		byID[found[i].ID] = &found[i]
	}
}

// split writes a batch whose statement ran out of lockWait: it parks the
// outcomes whose row, or whose parent (a finishing child's), another
// transaction holds locked now (sqlq.LockedOutcomes) and writes the rest
// again at once. When that finds none of them (the wait was on something
// the look cannot see — a unique key another transaction is inserting, a
// signal row — or the lock went meanwhile) the batch is halved instead,
// and each half written the same way; an outcome alone is parked.
func (c *Committer) split(ctx context.Context, batch []*request, lockWait time.Duration) {
	if len(batch) == 1 {
		c.park(batch[0])
		return
	}
	if held, err := c.heldAmong(ctx, batch); err == nil && len(held) > 0 {
		rest := make([]*request, 0, len(batch))
		for _, r := range batch {
			if held[r.out.ID] {
				c.park(r)
			} else {
				rest = append(rest, r)
			}
		}
		if len(rest) > 0 {
			c.apply(rest, lockWait)
		}
		return
	}
	h := len(batch) / 2
	c.apply(batch[:h], lockWait)
	c.apply(batch[h:], lockWait)
}

// sharesAnID reports whether two requests of batch are outcomes of the same
// instance.
func sharesAnID(batch []*request) bool {
	seen := make(map[int64]struct{}, len(batch))
	for _, r := range batch {
		if _, dup := seen[r.out.ID]; dup {
			return true
		}
		seen[r.out.ID] = struct{}{}
	}
	return false
}
