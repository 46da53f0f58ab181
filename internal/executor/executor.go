// Package executor runs one claimed row to a committed outcome, straight
// through (docs/design.md §4): look up the row's definition, hand the step
// what its claim brought along, run it under
// the step watchdog, and write the outcome through the group committer (or,
// for a WithTx outcome, in the step's own transaction) — then, after a Next
// without delay, go straight on with the next step under the fresh claim
// the outcome statement handed back.
//
// The executor knows nothing of the user's types: the root package turns
// each registered machine into a [Definition], whose Run decodes the state,
// calls the step (and Handle on failure) and encodes the outcome. Everything
// else it needs is an explicit field of [Config]; it reports what happened
// through [Events].
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/committer"
	"github.com/gendurable/gendurable/internal/feeder"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Cancellation causes and failure classes the executor gives steps; the
// root package exports them under the same names.
var (
	// ErrEngineStopped cancels in-flight steps once the drain timeout of a
	// stop has passed.
	ErrEngineStopped = errors.New("gendurable: engine stopped")
	// ErrStepTimeout cancels a step that ran past its StepTimeout.
	ErrStepTimeout = errors.New("gendurable: step timeout")
	// ErrInfrastructure marks a WithTx transaction that failed on its
	// connection rather than by itself: it costs no attempt.
	ErrInfrastructure = errors.New("gendurable: infrastructure failure")
)

// Definition is one registered machine version, as the executor sees it.
type Definition struct {
	// StepTimeout bounds one run of a step (0: none); see watch.go.
	StepTimeout time.Duration
	// ReadsInbox: every step gets the inbox, not only a step after an await.
	ReadsInbox bool
	// Backoff is the retry delay of the default Handle, for steps the
	// watchdog abandons. Never nil; it must not panic.
	Backoff func(attempt int) time.Duration
	// Run decodes the state, runs the step (and Handle if it fails) and
	// encodes the outcome. It never returns without an outcome to apply.
	Run func(ctx context.Context, in *Input) Result
	// Handle runs the failure path for an error found after the step
	// returned (a WithTx callback that failed).
	Handle func(ctx context.Context, in *Input, err error) Result
}

// Input is what one run of a step gets besides user code: the claimed row
// and what the statement that claimed it brought along.
type Input struct {
	Claim    *sqlq.Claimed
	Queue    string
	Inbox    []sqlq.SignalRow // after an await, or when the machine reads its inbox
	Children []sqlq.ChildRow  // after a fan-out
}

// Result is a step's outcome, encoded for the database, plus what the
// executor reports about it. Out.ID and Out.Token are the executor's to set.
type Result struct {
	Out     sqlq.Outcome
	StepErr error // the handled error, if the step failed
	// TxFn (WithTx) runs in the outcome's transaction. The root package
	// wraps the user's func so that a panic comes back as its error.
	TxFn func(ctx context.Context, tx pgx.Tx) error
	// NoLocalWake: a row the outcome leaves runnable is not woken in this
	// process (its step is not declared here: a process that declares it
	// gets a chance at it by its poll).
	NoLocalWake bool
}

// Events receives what the executor observes; the root package turns the
// calls into its typed hook events and logs. Calls must be quick.
type Events interface {
	// Step: a step's outcome was written (applied), fenced out (neither),
	// or could not be written (commitErr).
	Step(ctx context.Context, queue string, c *sqlq.Claimed, res *Result, applied bool, commitErr error, took time.Duration)
	// Abandoned: the watchdog gave up a step that ignored its context.
	Abandoned(ctx context.Context, queue string, c *sqlq.Claimed, a Abandonment)
	// UnknownVersion: a claimed row's machine version is not registered
	// here; it was released, runnable again after delay.
	UnknownVersion(ctx context.Context, queue string, c *sqlq.Claimed, delay time.Duration)
}

// Abandonment describes a step the watchdog gave up.
type Abandonment struct {
	Running time.Duration // how long it had run
	Outcome sqlq.Kind     // what the executor wrote for it
	Written bool          // the outcome was applied
	Slots   int           // running slots abandoned steps of the queue hold
}

// Config is the executor's dependencies and knobs. Every field is set by
// the engine (no defaults here: the root's Config documents them).
type Config struct {
	Queries   *sqlq.Queries
	Pool      *pgxpool.Pool
	Committer *committer.Committer
	// Lookup finds the definition of a claimed row; nil if not registered.
	Lookup func(machine string, version int) *Definition
	Events Events
	Log    *slog.Logger
	// Kick wakes the local feeder of queue (an outcome left a row runnable).
	Kick func(queue string)
	// KickAt wakes the local feeder of queue at t (an outcome left a row
	// runnable after a delay: a retry's backoff, a durable sleep).
	KickAt func(queue string, t time.Time)
	// KickBelow wakes every local feeder for rows made eligible at or after
	// t, a time that may be below their picks' floors (docs/design.md §4): a
	// WithTx outcome's rows are eligible from its transaction's start.
	KickBelow func(t time.Time)
	// AwaitParked: an outcome parked an instance with an await timeout;
	// the await-timeout sweep should wake in (no later than) d, if that is
	// sooner than it planned: the deadline is the now() of the outcome's
	// statement (a group-committed outcome: after the step, so d is the
	// timeout) or of its transaction's start (WithTx: d is the timeout less
	// the time since the step began, which is before that start).
	AwaitParked func(d time.Duration)
	// RatedKey reports a partition key whose policy limits its starts per
	// interval: its rows never chain (a chained step would start without
	// drawing from the key's bucket; the pick draws for it instead).
	RatedKey func(key string) bool
	// HandoffLimit is the limit of a partition key's policy as this engine
	// sees it (1 without a policy), or 0 for a key that may not hand off
	// (a rated key: each of its starts draws a token in a pick).
	HandoffLimit func(key string) int

	Lease     time.Duration
	Heartbeat time.Duration
	// TxIdle: the server ends a WithTx transaction that waits on its client
	// this long (sqlq.BeginIdleLimited); ≤ 0: no limit of ours.
	TxIdle              time.Duration
	UnknownVersionDelay time.Duration
}

// Executor runs claimed rows; one serves every queue of an engine.
type Executor struct {
	cfg Config

	mu      sync.Mutex
	unknown map[unknownKey]*unknownLog // releaseUnknown's warnings, per machine version
}

// unknownKey is a machine version this process does not know.
type unknownKey struct {
	fsm     string
	version int32
}

// unknownLog is when releaseUnknown last logged a machine version, and
// how many releases of it went unlogged since.
type unknownLog struct {
	at    time.Time
	quiet int
}

// unknownLogEvery spaces releaseUnknown's warnings of one machine version:
// a process that meets thousands of rows of a machine it does not know
// (one removed from its Config, a newer deploy's) logged one line per row
// at every retry, hundreds a second.
const unknownLogEvery = time.Minute

// New returns an executor.
func New(cfg Config) *Executor { return &Executor{cfg: cfg, unknown: map[unknownKey]*unknownLog{}} }

// ForQueue returns the feeder.Executor of queue: it runs a claimed row to a
// committed outcome and, after a Next without delay, goes straight on with
// the next step (up to chain steps, never while the feeder is stopping)
// instead of releasing the row and picking it again. With handoff (a queue
// without GlobalConcurrency), a keyed row's outcome that frees its key's
// slot may claim the key's next row in the same statement, and the worker
// goes on with that row (docs/design.md §6).
func (x *Executor) ForQueue(queue string, chain int, handoff bool) feeder.Executor {
	return func(ctx context.Context, c *sqlq.Claimed, h feeder.Holder) feeder.Result {
		r := run{x: x, queue: queue, h: h, handoff: handoff}
		handed := false // c was handed off by its predecessor's outcome
		for n := 0; ; n++ {
			if r.def == nil {
				if r.def = x.cfg.Lookup(c.FSM, int(c.Version)); r.def == nil {
					x.releaseUnknown(ctx, queue, c)
					// A handed-off row released: its key's slot is free again.
					return feeder.Result{KeyFreed: handed}
				}
			}
			if inbox, kids := inputStale(r.def, c); (inbox || kids) && !x.readInputAgain(ctx, queue, c, inbox, kids) {
				return feeder.Result{RunnableNow: ctx.Err() == nil, KeyFreed: c.PartitionKey != nil}
			}
			if liveChild(c) {
				return x.reawait(queue, c)
			}
			next, res := r.step(ctx, c, n < chain)
			if next == nil {
				return res
			}
			if next.ID != c.ID {
				// A successor of the key: a row of its own, chained afresh.
				r.def, n, handed = nil, -1, true
			}
			c = next
		}
	}
}

// floorSlack is how far behind a pick's now() its floor lies (migration 011):
// a row made eligible longer than this before its commit may be below it.
const floorSlack = time.Second

// run is one claimed row's trip through the executor.
type run struct {
	x       *Executor
	queue   string
	def     *Definition // of the row being run
	h       feeder.Holder
	handoff bool // the queue allows the key hand-off
}

// step runs one step of c and writes its outcome. It returns the claim of
// the next step when the row is still this worker's (a chained Next), or
// nil and what to tell the feeder.
func (r *run) step(ctx context.Context, c *sqlq.Claimed, mayChain bool) (*sqlq.Claimed, feeder.Result) {
	x, h := r.x, r.h
	if !h.Begin(ctx) {
		// Cancelled through this engine after the claim was taken (a
		// chained or handed-off claim, or one a worker had not begun):
		// the cancel took its token, so there is nothing to write, and
		// the step must not start after the cancel returned (a probe).
		return nil, feeder.Result{}
	}
	start := time.Now()
	in := r.input(c)
	res, ok := r.runStep(ctx, in)
	if !ok {
		return nil, feeder.Result{} // abandoned: the watchdog wrote its outcome
	}
	res.Out.ID, res.Out.Token = c.ID, c.Token
	res.Out.Continue = mayChain && res.Out.Kind == sqlq.KindNext && res.Out.Delay <= 0 && res.TxFn == nil &&
		ctx.Err() == nil && !h.Stopping() && (c.PartitionKey == nil || !x.cfg.RatedKey(*c.PartitionKey))
	if !res.Out.Continue && res.TxFn == nil && r.handoff && c.PartitionKey != nil && ctx.Err() == nil && h.MayHandOff() {
		// The outcome frees the key's slot: let its statement claim the
		// key's next row, and wait for it here (not detached) to run it.
		res.Out.Handoff = int32(x.cfg.HandoffLimit(*c.PartitionKey))
	}
	if !res.Out.Continue && res.TxFn == nil && res.Out.Handoff == 0 {
		// Nothing in this worker depends on the commit any more: free the
		// slot now; the claim stays held until the outcome commits.
		r.commitDetached(ctx, c, &res, h.Detach(), start)
		return nil, feeder.Result{}
	}
	var applied *sqlq.Applied
	var commitErr error
	if res.TxFn != nil {
		began := time.Now()
		applied, commitErr = r.commitTx(ctx, in, &res)
		if applied != nil && x.cfg.KickBelow != nil && time.Since(began) > floorSlack/2 {
			// What the transaction made runnable (its row, a parent it
			// woke, children it scheduled, in any queue) is eligible from
			// its start, on the database clock: maybe below the floor of
			// a pick since (now() less floorSlack). The local clock stands
			// in for the database's, less floorSlack for the skew.
			x.cfg.KickBelow(began.Add(-floorSlack))
		}
	} else {
		h.Committing()
		cr := x.cfg.Committer.Commit(&res.Out)
		applied, commitErr = cr.Applied, cr.Err
	}
	x.settled(ctx, r.queue, c, &res, applied, commitErr, time.Since(start))
	if applied != nil && applied.Successor != nil {
		return r.handedOff(ctx, c, applied, &res)
	}
	if applied != nil && applied.Token != nil && !h.Continue(c.Token, *applied.Token) {
		// The feeder gave up the claim meanwhile (its lease looked lost),
		// or the answer came too late to trust the new lease (the process
		// was stopped while the statement was in flight): hand the
		// re-claimed row back rather than strand it or run it.
		x.releaseClaim(&sqlq.Claimed{ID: c.ID, Token: *applied.Token}, 0)
		return nil, feeder.Result{RunnableNow: true}
	}
	if applied == nil || applied.Token == nil {
		return nil, r.result(c, applied, &res)
	}
	// Still ours: the next step, with the state just committed.
	next := *c
	next.Token, next.Step, next.State = *applied.Token, *res.Out.Step, []byte(*res.Out.State)
	next.Attempt, next.Awaits, next.Children, next.Seen, next.Buffered = 0, nil, 0, nil, time.Time{}
	next.Inbox, next.ChildRows = applied.Inbox, nil
	return &next, feeder.Result{}
}

// handedOff takes over the successor that the outcome of c claimed in its
// place (the key hand-off): the feeder's claim moves to it, and the worker
// runs it next. If the feeder gave the claim up meanwhile or is stopping,
// or the step's context is done, the successor goes back to runnable at
// once, as buffered rows do on stop, and the key's slot counts as freed.
func (r *run) handedOff(ctx context.Context, c *sqlq.Claimed, applied *sqlq.Applied, res *Result) (*sqlq.Claimed, feeder.Result) {
	next := applied.Successor
	if ctx.Err() != nil || !r.h.HandOff(c.Token, next) {
		r.x.releaseClaim(next, 0)
		fr := r.result(c, applied, res)
		fr.RunnableNow = true
		return nil, fr
	}
	return next, feeder.Result{}
}

// input hands the step what the claim brought along (docs/design.md §4):
// the inbox after an await, or for machines that read it; the children
// after a fan-out. The statement that claimed the row read them, so a step
// never costs a load of its own.
func (r *run) input(c *sqlq.Claimed) *Input {
	in := &Input{Claim: c, Queue: r.queue}
	if c.Awaits != nil || r.def.ReadsInbox {
		in.Inbox = c.Inbox
	}
	if c.Children > 0 {
		in.Children = c.ChildRows
	}
	return in
}

// commitDetached hands a final outcome (no chaining, no transaction) to the group committer and returns at once; the feeder's
// claim is settled by finish when the outcome has committed.
func (r *run) commitDetached(ctx context.Context, c *sqlq.Claimed, res *Result, finish func(feeder.Result), start time.Time) {
	claimed, result := *c, *res
	r.x.cfg.Committer.CommitAsync(&result.Out, func(cr committer.Result) {
		r.x.settled(context.WithoutCancel(ctx), r.queue, &claimed, &result, cr.Applied, cr.Err, time.Since(start))
		finish(r.result(&claimed, cr.Applied, &result))
	})
}

// settled reports a written (or fenced, or failed) outcome and wakes who
// should know: the local feeder of a row it left runnable (now, or when its
// delay ends), the await-timeout sweep of an await with a deadline.
func (x *Executor) settled(ctx context.Context, queue string, c *sqlq.Claimed, res *Result, applied *sqlq.Applied, commitErr error, took time.Duration) {
	if applied != nil {
		switch {
		case res.NoLocalWake:
		case applied.Runnable() && res.Out.Delay > 0:
			x.cfg.KickAt(applied.Queue, time.Now().Add(res.Out.Delay))
		case applied.Runnable():
			x.cfg.Kick(applied.Queue)
		}
		if applied.AwaitingSignal() && res.Out.Timeout != nil {
			d := *res.Out.Timeout
			if res.TxFn != nil {
				// The deadline counts from the transaction's start, some
				// time before this: wake no later than it (a sweep a
				// little early costs a statement, and it says when).
				d -= took
			}
			x.cfg.AwaitParked(d)
		}
	}
	x.cfg.Events.Step(ctx, queue, c, res, applied != nil, commitErr, took)
}

// result is what the feeder learns of a step whose outcome committed (applied)
// or was fenced out (nil) without chaining: whether it left its row runnable
// at once, and whether it freed a slot of the row's partition key.
func (r *run) result(c *sqlq.Claimed, applied *sqlq.Applied, res *Result) feeder.Result {
	return feeder.Result{RunnableNow: runnableNow(applied, res), KeyFreed: applied != nil && c.PartitionKey != nil}
}

// runnableNow: the outcome left its row runnable at once, so there is work
// to pick even if the last pick came back short.
func runnableNow(applied *sqlq.Applied, res *Result) bool {
	return applied != nil && applied.Runnable() && res.Out.Delay <= 0 && !res.NoLocalWake
}

// releaseUnknown hands back a row of a machine version this process does
// not know: another process, or a later deploy, may.
func (x *Executor) releaseUnknown(ctx context.Context, queue string, c *sqlq.Claimed) {
	// Say so in the row's history: without it an operator saw a row
	// "sleeping" for UnknownVersionDelay, again and again, with no error.
	msg := fmt.Sprintf("machine %q version %d is not registered in the process that claimed it (%s); released, tried again in %s",
		c.FSM, c.Version, processName(), x.cfg.UnknownVersionDelay)
	rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	err := x.cfg.Queries.ReleaseUnknown(rctx, x.cfg.Pool, c.ID, c.Token, x.cfg.UnknownVersionDelay, msg)
	cancel()
	if err != nil {
		x.cfg.Log.Warn("gendurable: release failed; the reaper will recover the row", "id", c.ID, "err", err)
	}
	if quiet, ok := x.unknownDue(c); ok {
		x.cfg.Log.Warn("gendurable: claimed a row of a machine version this process does not know; released it",
			"queue", queue, "fsm", c.FSM, "version", c.Version, "id", c.ID, "retry_in", x.cfg.UnknownVersionDelay,
			"released_unlogged", quiet)
	}
	x.cfg.Events.UnknownVersion(context.WithoutCancel(ctx), queue, c, x.cfg.UnknownVersionDelay)
}

// unknownDue reports whether releaseUnknown logs c's release: the first of
// its machine version, then one every unknownLogEvery, with the number of
// releases left unlogged since the last line (each is in its row's
// history, and in the UnknownVersion hook).
func (x *Executor) unknownDue(c *sqlq.Claimed) (quiet int, due bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := unknownKey{c.FSM, c.Version}
	l := x.unknown[k]
	now := time.Now()
	if l != nil && now.Sub(l.at) < unknownLogEvery {
		l.quiet++
		return 0, false
	}
	if l == nil {
		if len(x.unknown) >= 1024 { // bounded: forget the versions met before
			clear(x.unknown)
		}
		l = &unknownLog{}
		x.unknown[k] = l
	}
	quiet, l.at, l.quiet = l.quiet, now, 0
	return quiet, true
}

// processName names this process in a row's history: host and pid.
func processName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// inputStaleAfter is how long a claim waits in its feeder's buffer before
// its step reads its inbox again as it starts (inputStale): a claim
// dispatched at once starts within it.
const inputStaleAfter = 5 * time.Millisecond

// inputStale reports whether what claim c's step reads besides its row may
// have changed since its claim read it. inbox: a step that reads its inbox
// (after an Await, or of a machine that reads its inbox) whose claim waited
// in its feeder's buffer for a free slot (inputStaleAfter or more): a
// signal may have come meanwhile. children: a step after a fan-out claimed
// by a pick, whatever its wait: an operator may have retried a child since
// the pick read the children (Engine.Retry leaves a parent whose next step
// is claimed to that claim, which must then not join beside the child), and
// a retry committed in the milliseconds before a slot freed was missed when
// only a claim that waited inputStaleAfter read them again — one round trip
// per join, not per step. A claim an outcome statement made (Buffered zero)
// runs at once.
func inputStale(def *Definition, c *sqlq.Claimed) (inbox, children bool) {
	if c.Buffered.IsZero() {
		return false, false
	}
	return (c.Awaits != nil || def.ReadsInbox) && time.Since(c.Buffered) >= inputStaleAfter, c.Children > 0
}

// readInputAgain reads claim c's inbox (inbox) and children (children)
// again before its step starts, so that a signal committed while the claim
// waited is not consumed unseen by the step's finish, and a child retried
// meanwhile is seen live (liveChild). If the read fails, the claim is no
// longer the row's, or ctx ended meanwhile (the lease looked lost while the
// process was stopped during the read, or a stop past its drain), it hands
// the claim back unstarted and reports false: the row runs later on a fresh
// claim.
func (x *Executor) readInputAgain(ctx context.Context, queue string, c *sqlq.Claimed, inbox, children bool) bool {
	in, kids, held, err := x.cfg.Queries.ClaimInput(ctx, x.cfg.Pool, c.ID, c.Token, inbox, children)
	if err == nil && held && ctx.Err() == nil {
		if inbox {
			c.Inbox = in
		}
		if children {
			c.ChildRows = kids
		}
		return true
	}
	if err != nil && ctx.Err() == nil {
		x.cfg.Log.Warn("gendurable: reading what a claim that waited for a slot reads (its inbox, its children) failed; released, it runs later",
			"queue", queue, "id", c.ID, "err", err)
	}
	x.releaseClaim(c, 0)
	return false
}

// liveChild reports whether claim c follows a fan-out of which a child is
// not finished: retried by an operator after its finish woke the parent,
// while the parent's claim was taken (a claim reads the children once, and
// the retry leaves a parent whose join is claimed to it), and that claim
// then let go without the join's outcome — released, reaped, its join
// failed or replayed. The join must not run beside the child.
func liveChild(c *sqlq.Claimed) bool {
	if c.Children <= 0 {
		return false
	}
	for _, ch := range c.ChildRows {
		if ch.Status != "done" && ch.Status != "failed" {
			return true
		}
	}
	return false
}

// reawait gives up claim c of a parent whose child is live (liveChild),
// without running its step or counting an attempt: the parent awaits its
// live children again (sqlq.Reawait), or is runnable at once if they
// finished meanwhile. If the write fails, the reaper recovers the row
// after its lease, and its next claim looks again.
func (x *Executor) reawait(queue string, c *sqlq.Claimed) feeder.Result {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	status, err := x.cfg.Queries.Reawait(ctx, x.cfg.Pool, c.ID, c.Token)
	if err != nil {
		x.cfg.Log.Warn("gendurable: a claimed parent found a child of its fan-out unfinished, and could not be put back to await it; the reaper will recover the row",
			"queue", queue, "id", c.ID, "err", err)
		return feeder.Result{}
	}
	if status != "" {
		x.cfg.Log.Info("gendurable: a claimed parent found a child of its fan-out unfinished (retried since it woke the parent); it awaits it again, its next step not run",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "status", status)
	}
	return feeder.Result{RunnableNow: status == "runnable", KeyFreed: status != "" && c.PartitionKey != nil}
}

// releaseTimeout bounds handing a claimed row back; if it does not make it,
// the reaper recovers the row after its lease.
const releaseTimeout = 10 * time.Second

// releaseClaim hands a claimed row back to runnable without counting an attempt.
func (x *Executor) releaseClaim(c *sqlq.Claimed, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if _, err := x.cfg.Queries.Release(ctx, x.cfg.Pool, []int64{c.ID}, []int64{c.Token}, delay); err != nil {
		x.cfg.Log.Warn("gendurable: release failed; the reaper will recover the row", "id", c.ID, "err", err)
	}
}
