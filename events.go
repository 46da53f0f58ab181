package gendurable

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/committer"
	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// execEvents turns what the executor observes into hook events, logs and
// the machine graph's observed transitions.
type execEvents struct{ e *Engine }

func (x execEvents) Step(ctx context.Context, queue string, c *sqlq.Claimed, res *executor.Result, applied bool, commitErr error, took time.Duration) {
	e := x.e
	if applied {
		e.trans.add(c.FSM, int(c.Version), c.Step, transitionTarget(c.Step, &res.Out), res.Out.Kind.String())
		if res.Out.Kind == sqlq.KindDone || res.Out.Kind == sqlq.KindStop {
			e.finished.notify(c.ID)
		}
	}
	if len(e.cfg.Hooks) == 0 && commitErr == nil && applied && res.StepErr == nil && !e.log.Enabled(ctx, slog.LevelDebug) {
		return // the common case: nothing to tell anyone
	}
	ev := &StepEvent{
		Queue: queue, Machine: c.FSM, Version: int(c.Version), InstanceID: c.ID, Step: c.Step,
		Attempt: int(c.Attempt), Outcome: res.Out.Kind.String(), Err: res.StepErr,
		Duration: took, Fenced: commitErr == nil && !applied, CommitErr: commitErr,
		Interrupted: res.Out.Kind == sqlq.KindReplay && res.Out.AttemptInc == 0 && res.Out.ErrKind != nil &&
			(*res.Out.ErrKind == "interrupted" || *res.Out.ErrKind == "infrastructure"),
	}
	// A replay with the step's error that counts no attempt and is no
	// interruption is a snooze the machine's Handle honoured (o.snooze).
	ev.Snoozed = res.Out.Kind == sqlq.KindReplay && res.Out.AttemptInc == 0 && res.StepErr != nil && !ev.Interrupted &&
		errors.As(res.StepErr, new(*SnoozeError))
	e.emit(ctx, ev)
	switch {
	case errors.Is(commitErr, committer.ErrAborted):
		e.log.Error("gendurable: outcome given up by a Stop out of time (it may have been written): "+
			"if it was not, the step runs again after its lease expires",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "err", commitErr)
	case commitErr != nil:
		e.unconfirmed.Add(1)
		// An earlier attempt whose answer was lost may have written it,
		// whatever the last attempt's error says.
		maybe := errors.Is(commitErr, committer.ErrMaybeWritten)
		if errors.Is(commitErr, puddle.ErrClosedPool) && !maybe {
			e.closedPool.Add(1)
		}
		// What became of the outcome, as far as this process can tell.
		msg := "outcome not confirmed (the database did not answer; it may have been written)"
		attrs := []any{"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "err", commitErr}
		switch {
		case maybe:
			msg = "outcome not confirmed (an attempt's answer was lost; it may have been written)"
		case errors.Is(commitErr, committer.ErrLockHeld):
			msg = "outcome given up by a Stop, not written: its row or its parent was locked by another transaction (a caller's open SignalTx?) for a lease"
		case errors.Is(commitErr, puddle.ErrClosedPool):
			msg = "outcome not written: the pool was closed while the engine ran (close it after Engine.Stop returns)"
		case errors.As(commitErr, new(*pgconn.ConnectError)):
			msg = "outcome not written: no connection to the database could be made"
		case sqlq.PreparedStatementClash(commitErr):
			// A pooler handed the statement to a server session that did
			// not know it (pgx's statement cache or describe_exec behind
			// PgBouncer in transaction pooling): refused, not written —
			// describe_exec's clash is a 08P01, which is no failed
			// connection. The line says what to change, as the picks'
			// warnings do (a PgBouncer probe read only "refused").
			msg = "outcome not written (the database refused it)"
			attrs = append(attrs, "advice", sqlq.PoolerHint)
		case sqlq.ConnectionRefusal(commitErr):
			// An error from the server or a proxy about the connection
			// (SQLSTATE class 08: PgBouncer's login refused, …; a server
			// shutting down), not a refusal of the statement. A network
			// error is not one: the answer was lost, and the outcome may
			// have been written (the default message).
			msg = "outcome not written: the database or a proxy on the way failed the connection"
		case sessionEnded(commitErr):
			// The server ended the session (FATAL): an idle-in-transaction
			// or idle-session timeout, a terminated backend. Its transaction
			// was rolled back; the outcome itself was not refused (a probe
			// read "refused" after a WithTx step frozen past the timeout).
			msg = "outcome not written: the database ended the session (" + pgMessage(commitErr) + ")"
		case errors.As(commitErr, new(*pgconn.PgError)):
			// The server answered with an error: the statement (and its
			// transaction) was rolled back.
			msg = "outcome not written (the database refused it)"
			if sqlq.StatementPooling(commitErr) {
				attrs = append(attrs, "hint", sqlq.StatementPoolingHint)
			}
		}
		e.log.Error("gendurable: "+msg+": if it was not written, the step runs again after its lease expires", attrs...)
	case ev.Fenced && errors.Is(res.StepErr, ErrInstanceCancelled):
		// This engine's own cancel ended the step (logged as it was made).
		e.log.Info("gendurable: outcome of a cancelled instance's step fenced out, as the cancel meant",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step)
	case ev.Fenced:
		e.log.Warn("gendurable: outcome fenced out: the claim no longer holds the instance (its lease was lost, or an operator moved it)",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step)
	case errors.Is(res.StepErr, ErrInfrastructure):
		e.log.Warn("gendurable: step's transaction failed on its connection; it runs again without counting an attempt",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "attempt", c.Attempt, "err", res.StepErr)
	case ev.Interrupted && errors.Is(res.StepErr, ErrEngineStopped):
		// A Stop's cancel, as documented: no failure (kind interrupted, no
		// attempt counted).
		e.log.Info("gendurable: step interrupted by Stop; it runs again, no attempt counted",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "attempt", c.Attempt)
	case ev.Interrupted:
		// The engine cancelled it: no heartbeat confirmed its lease in time
		// (ErrLeaseLost). Not the step's failure either.
		e.log.Warn("gendurable: step interrupted: its lease could not be confirmed in time; it runs again, no attempt counted",
			"queue", queue, "fsm", c.FSM, "id", c.ID, "step", c.Step, "attempt", c.Attempt)
	case ev.Snoozed:
		// Not a failure: it runs again after the delay, no attempt counted.
		e.log.Debug("gendurable: step snoozed", "queue", queue, "fsm", c.FSM, "id", c.ID,
			"step", c.Step, "attempt", c.Attempt, "err", res.StepErr)
	case res.StepErr != nil:
		e.log.Warn("gendurable: step failed", "queue", queue, "fsm", c.FSM, "id", c.ID,
			"step", c.Step, "attempt", c.Attempt, "outcome", ev.Outcome, "err", res.StepErr)
	default:
		e.log.Debug("gendurable: step done", "queue", queue, "fsm", c.FSM, "id", c.ID,
			"step", c.Step, "outcome", ev.Outcome, "took", took)
	}
}

func (x execEvents) Abandoned(ctx context.Context, queue string, c *sqlq.Claimed, a executor.Abandonment) {
	x.e.emit(ctx, &StepAbandonedEvent{Queue: queue, Machine: c.FSM, Version: int(c.Version), InstanceID: c.ID, Step: c.Step,
		Attempt: int(c.Attempt), Running: a.Running, Outcome: a.Outcome.String(), Written: a.Written, AbandonedSlots: a.Slots})
}

func (x execEvents) UnknownVersion(ctx context.Context, queue string, c *sqlq.Claimed, delay time.Duration) {
	x.e.emit(ctx, &UnknownVersionEvent{Queue: queue, Machine: c.FSM, Version: int(c.Version), InstanceID: c.ID, Delay: delay})
}

// transitionTarget names where an outcome leads, for the machine graph.
func transitionTarget(from string, o *sqlq.Outcome) string {
	switch o.Kind {
	case sqlq.KindDone:
		return "done"
	case sqlq.KindStop:
		return "failed"
	case sqlq.KindReplay:
		return from
	}
	if o.Step != nil {
		return *o.Step
	}
	return from
}

// sessionEnded reports an error answer of the server that ended the
// session (severity FATAL or PANIC), whatever its SQLSTATE.
func sessionEnded(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	sev := sqlq.Severity(pgErr)
	return sev == "FATAL" || sev == "PANIC"
}

// pgMessage is the server's message of err's *pgconn.PgError.
func pgMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}
