package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/gendurable/gendurable/internal/committer"
	"github.com/gendurable/gendurable/internal/feeder"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// infraRetryDelay is about how long a step whose transaction failed on its
// connection waits before it runs again (jittered down to half of it).
const infraRetryDelay = time.Second

// commitTx writes a WithTx outcome: the step's callback and the outcome in
// one transaction — the one outcome path that does not go through the
// group committer, because the user's writes share its transaction. If
// the callback fails, nothing of it is kept and the error goes to Handle,
// whose outcome is written the ordinary way — unless it failed on its
// connection (ErrInfrastructure): then the step runs again shortly,
// without counting an attempt. Transient failures retry the whole
// transaction (callback included) for up to a lease; a rejected outcome
// stops the instance (sqlq.RejectedStop), as the committer does. A
// transaction that waits (on a lock held elsewhere, for a connection) is
// not given up while the claim is heartbeated: only once the lease is lost
// (see txContext).
func (r *run) commitTx(stepCtx context.Context, in *Input, res *Result) (*sqlq.Applied, error) {
	x, h := r.x, r.h
	var db sqlq.DB = x.cfg.Pool
	ctx, cancel := x.txContext(stepCtx)
	defer cancel()
	var retry backoff.Write
	var retryUntil time.Time
	// lostCommit: an attempt's COMMIT was sent and its answer lost, so it
	// may have committed — and a later attempt then finds the claim gone
	// because of it. Neither is "fenced, nothing written" (a cut-off
	// probe: StepEvent.Fenced for WithTx writes that had committed).
	var lostCommit error
	maybe := func(err error) error {
		if lostCommit == nil {
			return err
		}
		switch {
		case err == nil:
			err = errors.New("a later attempt found the claim gone")
		case err == lostCommit:
			return fmt.Errorf("%w: %w", committer.ErrMaybeWritten, err)
		}
		return fmt.Errorf("%w (%w): %w", committer.ErrMaybeWritten, lostCommit, err)
	}
	for {
		applied, fnErr, err := x.tryCommitTx(ctx, stepCtx, db, res, h)
		if applied != nil && err != nil {
			applied, lostCommit = nil, err
		}
		switch {
		case errors.Is(fnErr, ErrInfrastructure):
			*res = Result{StepErr: fnErr, Out: sqlq.Outcome{
				ID: in.Claim.ID, Token: in.Claim.Token, Kind: sqlq.KindReplay, AttemptInc: 0,
				Delay:   backoff.Delay(infraRetryDelay, infraRetryDelay, 1),
				ErrKind: ptr("infrastructure"), Err: ptr(sqlq.ErrorText(fnErr.Error())),
			}}
		case fnErr != nil:
			*res = r.def.Handle(stepCtx, in, fnErr)
			res.Out.ID, res.Out.Token = in.Claim.ID, in.Claim.Token
		case err == nil && applied == nil && lostCommit != nil:
			return nil, maybe(nil) // fenced now, perhaps by that commit
		case err == nil:
			return applied, nil
		case sqlq.Rejected(err):
			res.Out, res.TxFn = sqlq.RejectedStop(&res.Out, err), nil
		case errors.Is(context.Cause(stepCtx), feeder.ErrLeaseLost):
			// The lease is gone (or this engine cancelled the instance): no
			// attempt more. Without a COMMIT sent, nothing was written;
			// after one whose answer was lost, it may have been.
			if lostCommit != nil {
				return nil, maybe(err)
			}
			return nil, nil
		}
		if fnErr != nil || res.TxFn == nil {
			// What to write instead is decided: an ordinary outcome.
			h.Committing()
			cr := x.cfg.Committer.Commit(&res.Out)
			if cr.Applied == nil && (cr.Err != nil || lostCommit != nil) {
				return nil, maybe(cr.Err)
			}
			return cr.Applied, cr.Err
		}
		if retryUntil.IsZero() {
			retryUntil = time.Now().Add(x.cfg.Lease)
		} else if time.Now().After(retryUntil) {
			return nil, maybe(err)
		}
		if !retry.Wait(ctx) {
			if x.cfg.Committer.Aborted().Err() != nil {
				// Given up by a Stop out of time, as the committer's are.
				err = fmt.Errorf("%w: %w", committer.ErrAborted, err)
			}
			return nil, maybe(err)
		}
	}
}

// txContext is the context of a WithTx outcome's transaction. A transaction
// that waits — on a row another transaction locked, for a pool connection —
// keeps its claim: the feeder heartbeats it all along. So the context has
// no deadline; it is cancelled when the lease is lost (the heartbeat found
// the row taken, or could not confirm it for a whole lease: the step
// context's cause is ErrLeaseLost), a lease after the step context was
// cancelled for another reason (a stop), or when the engine's Stop gives
// up on the outcomes still waiting on the database (Committer.Abort): a
// transaction cut off from the server then no longer outlives Stop by a
// lease, holding its pool connection.
func (x *Executor) txContext(stepCtx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(stepCtx))
	stopAborted := context.AfterFunc(x.cfg.Committer.Aborted(), cancel)
	stop := context.AfterFunc(stepCtx, func() {
		if errors.Is(context.Cause(stepCtx), feeder.ErrLeaseLost) {
			cancel()
			return
		}
		go func() {
			t := time.NewTimer(x.cfg.Lease)
			defer t.Stop()
			select {
			case <-t.C:
				cancel()
			case <-ctx.Done():
			}
		}()
	})
	return ctx, func() { stop(); stopAborted(); cancel() }
}

// tryCommitTx runs one transaction of a WithTx outcome. fnErr is the
// callback's own failure, wrapped in ErrInfrastructure if it failed on its
// connection rather than by itself; err a database failure.
func (x *Executor) tryCommitTx(ctx, stepCtx context.Context, db sqlq.DB, res *Result, h feeder.Holder) (applied *sqlq.Applied, fnErr, err error) {
	beginner, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	})
	if !ok {
		return nil, nil, errors.New("gendurable: internal: connection cannot begin a transaction")
	}
	// The server ends the transaction should it wait on this client for
	// TxIdle: a client cut off from it (a partition) would otherwise leave
	// the session holding fn's locks for the OS keepalive's hours, and the
	// step's rerun elsewhere would wait on them (docs/design.md §2).
	var opts pgx.TxOptions
	if x.cfg.TxIdle > 0 {
		opts.BeginQuery = sqlq.BeginIdleLimited(x.cfg.TxIdle)
	}
	tx, err := beginner.BeginTx(ctx, opts)
	if err != nil {
		if refused := statementPooling(err); refused != nil {
			return nil, refused, nil
		}
		return nil, nil, err
	}
	pid, err := x.backendPID(ctx, tx)
	if err != nil {
		_ = tx.Rollback(ctx)
		if refused := statementPooling(err); refused != nil {
			return nil, refused, nil
		}
		return nil, nil, err
	}
	// Without a deadline, a connection that died silently (half-open after
	// a failover) would keep the claim forever: watch its server session.
	ctx, gone := context.WithCancelCause(ctx)
	defer gone(nil)
	fnCtx, fnGone := context.WithCancelCause(stepCtx)
	defer fnGone(nil)
	defer x.watchTx(pid, func() { gone(errTxGone); fnGone(errTxGone) })()
	defer func() { _ = tx.Rollback(ctx) }()
	clock := newIdleClock()
	if fnErr := res.TxFn(fnCtx, &clockedTx{Tx: tx, c: clock, top: true}); fnErr != nil {
		// The session's failure only if this transaction's connection is
		// gone — a statement of it failed on the network, or the server
		// ended the session (PostgreSQL and PgBouncer send that as FATAL,
		// and pgx closes the connection) — and not because the callback's
		// own context ran out (pgx closes the connection at a statement's
		// deadline too). Not by the error's type or SQLSTATE: an io.EOF of
		// a request body, a net.Error of an HTTP call, a 08001 from
		// postgres_fdw or another pool had the step run again without an
		// attempt counted, past MaxAttempts, without end (a library-misuse
		// probe, and the review of its fix).
		ownDeadline := fnCtx.Err() == nil && (errors.Is(fnErr, context.DeadlineExceeded) || errors.Is(fnErr, context.Canceled))
		if stepCtx.Err() == nil && !ownDeadline && (tx.Conn().IsClosed() || context.Cause(fnCtx) == errTxGone) {
			fnErr = x.sessionLost(fnErr, clock.longestIdle())
		}
		return nil, fnErr, nil
	}
	// The callback's idle tail (its work after its last statement) counts:
	// a limit on idle time can end the transaction there, and the outcome
	// statement is then the first to hear of it.
	idle := clock.longestIdle()
	if err := EndedByCallback(tx); err != nil {
		return nil, err, nil
	}
	var b sqlq.OutcomeBatch
	b.Add(&res.Out)
	rows, err := x.cfg.Queries.ApplyOutcomes(ctx, tx, &b)
	if err != nil {
		var first error
		if pgErr := clock.first(); pgErr != nil {
			first = pgErr
		}
		if stepErr := AbortedByCallback(err, first); stepErr != nil {
			return nil, stepErr, nil
		}
		if stepCtx.Err() == nil && tx.Conn().IsClosed() && x.endedForItsOwnTime(err, idle) {
			// The callback returned nil after idling past a limit on the
			// transaction's time (PgBouncer's idle_transaction_timeout,
			// TxIdleTimeout): the step's failure, as when a statement of
			// the callback meets it — not a lost connection, rerun
			// without an attempt counted only after its lease (a PgBouncer
			// probe: each attempt waited for the reaper, and the last
			// error read "lease expired with no outcome").
			return nil, x.sessionLost(err, idle), nil
		}
		return nil, nil, err
	}
	if len(rows) == 0 {
		return nil, nil, nil // fenced out: the rollback undoes the step's writes too
	}
	// The callback has run; from the commit on, the row may be finished
	// before this worker lets go of its claim.
	h.Committing()
	if err := tx.Commit(ctx); err != nil {
		if refusedAtCommit(err) {
			return nil, fmt.Errorf("gendurable: the step's transaction failed at COMMIT: %w", err), nil
		}
		return &rows[0], nil, err
	}
	return &rows[0], nil, nil
}

// EndedByCallback is the step's error (ErrTxEndedByCallback) when tx is
// no longer in a transaction after its WithTx callback returned nil: the
// callback ended it itself, with a COMMIT or a ROLLBACK sent as a
// statement (Commit and Rollback on tx are refused: ErrTxOwned), its writes
// committed or gone apart from the outcome. The outcome is then not
// written; the step's failure, for Handle. Before, the outcome went on in
// a transaction of its own: the instance was done with the step's writes
// rolled back (a library-misuse probe). nil otherwise.
// gendurabletest.RunStep uses it too.
func EndedByCallback(tx pgx.Tx) error {
	if tx.Conn().PgConn().TxStatus() == 'I' {
		return ErrTxEndedByCallback
	}
	return nil
}

// ErrTxEndedByCallback is EndedByCallback's error.
var ErrTxEndedByCallback = errors.New("gendurable: the WithTx callback ended the step's transaction itself " +
	"(a COMMIT or ROLLBACK sent as a statement): its writes were committed or rolled back apart from the outcome, " +
	"which was not written; let the engine commit (return nil) or roll back (return an error)")

// AbortedByCallback is the step's error when err, the error of a statement
// sent after a WithTx callback returned nil, says the transaction was
// already aborted (25P02): a statement of the callback's failed, and it did
// not return that error — first, if the engine saw it. Running the step
// again would most likely fail the same way: it is the step's failure,
// for Handle (docs/design.md §2). nil for any other err.
// gendurabletest.RunStep uses it too.
func AbortedByCallback(err, first error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25P02" {
		return nil
	}
	const msg = "gendurable: a statement of the step's transaction failed and the WithTx callback returned nil"
	if first != nil {
		return fmt.Errorf(msg+": %w (the transaction was aborted: %w)", first, err)
	}
	return fmt.Errorf(msg+"; the transaction was aborted: %w", err)
}

// refusedAtCommit reports whether the server refused to commit a WithTx
// transaction for what it holds — a deferred constraint (class 23), a
// deferred trigger's exception: any server error but a lost connection
// (whose commit may or may not have happened: the transaction is tried
// again, and the claim's fence keeps a second commit out), a serialization
// failure or a deadlock (40001, 40P01), or a lock or statement timeout
// (55P03, 57014), for which the whole transaction is tried again. The
// step's writes did not commit, and running them again would most likely
// fail the same way: it is the step's failure, and goes to Handle.
func refusedAtCommit(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || connectionFailure(err) {
		return false
	}
	return !slices.Contains([]string{"40001", "40P01", "55P03", "57014"}, pgErr.Code)
}

// directPID marks, in a connection's CustomData, a connection whose
// announced backend pid is its server session's.
const directPID = "gendurable.directPID"

// backendPID is the server process id of tx's session, for watchTx.
//
// The pid a connection announced at startup (BackendKeyData) is not always
// the server's: behind a proxy that pools transactions (PgBouncer with
// pool_mode = transaction) it is one the proxy made up, and the server
// session under the connection changes from one transaction to the next.
// Looking that pid up in pg_stat_activity would find nothing and take a
// healthy transaction that outlasts a lease for dead. So the pid is asked
// for inside the transaction, whose server session a proxy keeps for the
// whole of it: one extra statement, on the WithTx path only. A connection
// whose announced pid turned out to be its server's is direct (a proxy
// cannot hand out a server's key: it must route cancel requests itself) and
// is trusted from then on: on a direct connection the question is asked
// once per connection, not per transaction. The alternative — skipping the
// watch when the pid cannot be trusted — would leave a WithTx transaction
// on a silently dead connection holding its claim forever behind a proxy.
func (x *Executor) backendPID(ctx context.Context, tx pgx.Tx) (uint32, error) {
	conn := tx.Conn().PgConn()
	data := conn.CustomData()
	if data[directPID] == true {
		return conn.PID(), nil
	}
	pid, err := x.cfg.Queries.BackendPID(ctx, tx)
	if err != nil {
		return 0, err
	}
	if pid == conn.PID() {
		data[directPID] = true
	}
	return pid, nil
}

// errTxGone: the server session of a WithTx transaction no longer exists.
var errTxGone = errors.New("gendurable: the transaction's server session is gone")

// watchTx checks once per lease, while a WithTx transaction runs, that its
// server session (backend pid) still exists, and calls gone once if it does
// not. A check that fails (the database is unreachable) proves nothing: the
// heartbeat gives the claim up if that lasts a lease. The returned func
// stops the watch and waits for it.
func (x *Executor) watchTx(pid uint32, gone func()) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(x.cfg.Lease)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			qctx, qcancel := context.WithTimeout(ctx, x.cfg.Heartbeat)
			alive, err := x.cfg.Queries.SessionAlive(qctx, x.cfg.Pool, pid)
			qcancel()
			if err == nil && !alive {
				gone()
				return
			}
		}
	}()
	return func() { cancel(); <-exited }
}

// sessionLost is the error of a WithTx callback whose transaction lost its
// server session, idle its longest stretch without a statement. The
// server's own reason, where it gave one, decides; the idle clock only when
// none arrived (the session watch found the session gone, a proxy between
// reported its own error). Ended by the server's idle limit
// (BeginIdleLimited), fn left the transaction waiting on fn's own work for
// TxIdle: running it again would do the same, so it is the step's failure,
// counted as an attempt; so is one a pooler between ended for the
// transaction's own time (poolerTimedOut). Otherwise it is the
// infrastructure's.
func (x *Executor) sessionLost(fnErr error, idle time.Duration) error {
	if setting := poolerTimedOut(fnErr); setting != "" {
		// The pooler's limit on this transaction's own time: a callback
		// that outlasted it will again (a PgBouncer probe: a callback of
		// 2.5 s under query_timeout = 1 ran 48 times in 90 s at attempt 0).
		return fmt.Errorf("gendurable: a connection pooler between (PgBouncer's %s) ended the step's transaction: "+
			"the callback's work outlasted the pooler's limit: %w", setting, fnErr)
	}
	if x.idleEndedIt(fnErr, idle) {
		return fmt.Errorf("gendurable: the step's transaction was left idle for %s between statements, "+
			"and the server ends a WithTx transaction left idle for Config.TxIdleTimeout (%s): %w",
			idle.Round(time.Millisecond), x.cfg.TxIdle, fnErr)
	}
	return fmt.Errorf("%w: the step's transaction failed on its connection: %w", ErrInfrastructure, fnErr)
}

// idleEndedIt reports whether the server most likely ended a transaction
// idle for idle at its longest for that (Config.TxIdleTimeout): its own
// word (25P03), or, with none, an idle of nine tenths of the limit unless
// the server gave another reason.
func (x *Executor) idleEndedIt(err error, idle time.Duration) bool {
	return idleEnded(err) || (!endedOtherwise(err) && x.cfg.TxIdle > 0 && idle >= x.cfg.TxIdle*9/10)
}

// endedForItsOwnTime reports whether the session of a transaction idle for
// idle at its longest was ended, with err, by a limit on the transaction's
// own time: a pooler's (poolerTimedOut) or the server's idle limit.
func (x *Executor) endedForItsOwnTime(err error, idle time.Duration) bool {
	return poolerTimedOut(err) != "" || x.idleEndedIt(err, idle)
}

// poolerTimedOut names the PgBouncer setting whose limit on the
// transaction's own time ended its session — query_timeout (a statement
// ran too long), idle_transaction_timeout (the transaction sat idle too
// long between statements), transaction_timeout (the whole transaction) —
// from the FATAL error PgBouncer sends then (SQLSTATE 08P01 with that
// message); "" for any other error. Like PostgreSQL's statement_timeout
// (57014) or idle_in_transaction_session_timeout (25P03), each is the
// step's failure, counted as an attempt: not a lost connection, which
// runs the step again without one.
func poolerTimedOut(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "08P01" {
		return ""
	}
	switch pgErr.Message {
	case "query timeout":
		return "query_timeout"
	case "idle transaction timeout":
		return "idle_transaction_timeout"
	case "transaction timeout":
		return "transaction_timeout"
	}
	return ""
}

// idleEnded reports whether err is the server's notice that it ended the
// session for idling in a transaction (idle_in_transaction_session_timeout).
func idleEnded(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25P03"
}

// endedOtherwise reports whether err is the server's notice that it ended
// the session for a reason other than idling (57P01 terminated by an
// administrator or a failover, 57P02 crash shutdown, …): whatever the idle
// clock says — a callback waiting in a statement the clock does not time
// (tx.Conn(), tx.LargeObjects()) looks idle to it — the transaction was
// not ended for its idle.
func endedOtherwise(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "57P")
}

// connectionFailure is sqlq.ConnectionFailure: the connection or the
// server failed rather than the statement.
var connectionFailure = sqlq.ConnectionFailure

// statementPooling is the step's failure for err, PgBouncer's refusal of a
// transaction block in statement pooling, put in after Start (which
// refuses it): no transaction can run, this attempt or the next, and
// nothing was written. Named so — as a lost connection it waited out a
// lease per attempt, its error "lease expired with no outcome" (a
// PgBouncer probe). Nil for any other error.
func statementPooling(err error) error {
	if !sqlq.StatementPooling(err) {
		return nil
	}
	return fmt.Errorf("gendurable: the step's transaction was refused: %s: %w", sqlq.StatementPoolingHint, err)
}
