package gendurable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgconn"
)

// Bulk operator calls: retry or cancel many instances at once, by id or by
// filter, with the per-instance rules of [Engine.Retry] and [Engine.Cancel].

// MaxBulkIDs bounds the ids of one [Engine.RetryMany] or [Engine.CancelMany]
// call, and the ids a [BulkResult] lists.
const MaxBulkIDs = 1000

// BulkBatch is how many instances one statement of [Engine.RetryMatching]
// or [Engine.CancelMatching] changes at most.
const BulkBatch = 500

// BulkResult counts what a bulk call did. On error, the result holds what
// was changed before it: every statement commits on its own, so the batches
// (and, in a batch retried one instance at a time, the instances) done
// before the failing one stay changed and are counted and listed.
type BulkResult struct {
	// Matched: the instances the call looked at — the given ids that exist,
	// the instances the filter matched, or the root and descendants of a
	// [Engine.CancelTree].
	Matched int64 `json:"matched"`
	// Changed: the instances retried or cancelled.
	Changed int64 `json:"changed"`
	// Skipped: matched but left as they were — not in a status the action
	// applies to (a retry needs a failed instance, a cancel a live one),
	// changed by someone else meanwhile, or, for a retry, its unique key now
	// held by another live instance.
	Skipped int64 `json:"skipped"`
	// NotFound: given ids with no instance (RetryMany and CancelMany only).
	NotFound int64 `json:"not_found"`
	// ChangedIDs are the ids changed, the first MaxBulkIDs of them (empty,
	// not nil, when none was).
	ChangedIDs []int64 `json:"changed_ids"`
	// Truncated: more were changed than ChangedIDs lists.
	Truncated bool `json:"truncated,omitempty"`
}

func (r *BulkResult) add(changed []sqlq.BulkChanged, matched int64) {
	r.Matched += matched
	r.Changed += int64(len(changed))
	r.Skipped += matched - int64(len(changed))
	for _, c := range changed {
		if len(r.ChangedIDs) == MaxBulkIDs {
			r.Truncated = true
			break
		}
		r.ChangedIDs = append(r.ChangedIDs, c.ID)
	}
}

// bulkIDs checks and de-duplicates the ids of a by-id bulk call.
func bulkIDs(op string, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, errorf(ErrInvalidInput, "%s: no ids", op)
	}
	out := slices.Clone(ids)
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > MaxBulkIDs {
		return nil, errorf(ErrInvalidInput, "%s: %d ids, at most %d per call (or use a filter)", op, len(out), MaxBulkIDs)
	}
	if out[0] <= 0 {
		return nil, errorf(ErrInvalidInput, "%s: id %d is not an instance id", op, out[0])
	}
	return out, nil
}

// RetryMany retries the failed instances among ids (at most [MaxBulkIDs];
// duplicates count once) as [Engine.Retry] would each: back to runnable at
// the step they failed in with a fresh attempt budget, waited for again by a
// parent that still waits; a parent retried together with children of its
// current fan-out awaits them again, as a parent retried after them does. Instances not failed, or whose unique key another
// live instance now holds, are skipped; ids without an instance are counted
// in NotFound. Empty, oversized or non-positive ids are [ErrInvalidInput].
// On error, the result holds what was changed before it (see [BulkResult]).
// The change is logged at Info on the engine's Logger.
func (e *Engine) RetryMany(ctx context.Context, ids []int64) (BulkResult, error) {
	if err := e.usable(ctx, "RetryMany"); err != nil {
		return BulkResult{}, err
	}
	ids, err := bulkIDs("retry", ids)
	if err != nil {
		return BulkResult{}, err
	}
	res, err := e.byIDs(ctx, ids, "retry", e.retryBatch)
	e.logBulk("gendurable: instances retried", res, err)
	return res, err
}

// CancelMany cancels the live instances among ids (at most [MaxBulkIDs];
// duplicates count once) as [Engine.Cancel] would each, recording reason
// (default "cancelled by an operator"): finished instances are skipped, ids
// without an instance counted in NotFound. Empty, oversized or non-positive
// ids, and a reason over [MaxReasonBytes] or with a NUL byte or invalid
// UTF-8, are [ErrInvalidInput] (nothing changed; as for every cancel call). On error, the result holds what was changed
// before it (see [BulkResult]). The change is logged at Info on the engine's
// Logger.
func (e *Engine) CancelMany(ctx context.Context, ids []int64, reason string) (BulkResult, error) {
	if err := e.usable(ctx, "CancelMany"); err != nil {
		return BulkResult{}, err
	}
	if err := checkReason("cancel", reason); err != nil {
		return BulkResult{}, err
	}
	ids, err := bulkIDs("cancel", ids)
	if err != nil {
		return BulkResult{}, err
	}
	res, err := e.byIDs(ctx, ids, "cancel", e.cancelBatch(reason))
	e.logBulk("gendurable: instances cancelled", res, err, "reason", cancelReason(reason))
	return res, err
}

// bulkBatch changes the instances among ids it applies to and returns
// those it changed and how many of ids it is done with: all of them, or, on
// error, those before the failing statement's (their changes committed).
type bulkBatch func(ctx context.Context, ids []int64) (changed []sqlq.BulkChanged, done int, err error)

func (e *Engine) byIDs(ctx context.Context, ids []int64, op string, batch bulkBatch) (BulkResult, error) {
	res := BulkResult{ChangedIDs: []int64{}}
	found, err := e.q.Existing(ctx, e.pool, ids)
	if err != nil {
		return res, e.dbErr(ctx, err, op)
	}
	res.NotFound = int64(len(ids) - len(found))
	if len(found) == 0 {
		return res, nil
	}
	slices.Sort(found)
	changed, done, err := batch(ctx, found)
	res.add(changed, int64(done))
	return res, err
}

// RetryMatching retries every failed instance f matches, as
// [Engine.RetryMany] would, newest first, in batches of at most [BulkBatch]
// instances: each batch is one bounded list statement (at most f.MaxScan
// instances looked at, as a [Engine.List] page) and one bulk statement,
// committed on its own, so no statement locks an unbounded set and a large
// match neither holds locks long nor starves workers. Instances inserted
// after the call starts are not visited. f.Limit is ignored; f.Before, if
// set, starts the walk below that id.
//
// A filter without criteria (no Queue, Status, Machine, Step, From, To,
// Search or State; a State of {} or [] is contained in every object or array
// state, so it is none) is [ErrInvalidInput] unless f.All is set: "every failed instance"
// must be asked for explicitly. So is a filter whose only criterion is a
// time range that leaves out no instance: a To (if set) after the insert
// of the instance with the highest id and a From (if set) not after the
// insert of the one with the lowest id (two primary-key probes; a bound
// within an inserting transaction's length of those may be refused
// though it leaves a row out). An instance the filter matches that is not
// failed is counted in Skipped (set Status to "failed" to visit only those).
// The call stops at ctx's end between batches — a batch statement under way
// runs to its end (past a deadline, for at most [BulkStatementGrace], 15 s; at most 30 s in all), so what it changed is counted — returning
// what it did so far with ctx's error; on any other error too, the result holds what was
// changed before it (see [BulkResult]). The change is logged at Info on the
// engine's Logger.
func (e *Engine) RetryMatching(ctx context.Context, f ListFilter) (BulkResult, error) {
	if err := e.usable(ctx, "RetryMatching"); err != nil {
		return BulkResult{}, err
	}
	res, err := e.matching(ctx, f, "retry", e.retryBatch)
	e.logBulk("gendurable: instances retried", res, err, "filter", f.String())
	return res, err
}

// CancelMatching cancels every live instance f matches, as
// [Engine.CancelMany] would, in batches as [Engine.RetryMatching] does and
// with its rule for filters without criteria. Finished instances the filter
// matches are counted in Skipped; so is one that no longer matches its
// queue, status, step or state once the cancel holds its row (a signal
// woke it, a worker claimed it, a step moved it on while the batch was
// read or waited for it).
func (e *Engine) CancelMatching(ctx context.Context, f ListFilter, reason string) (BulkResult, error) {
	if err := e.usable(ctx, "CancelMatching"); err != nil {
		return BulkResult{}, err
	}
	if err := checkReason("cancel", reason); err != nil {
		return BulkResult{ChangedIDs: []int64{}}, err
	}
	res, err := e.matching(ctx, f, "cancel", e.cancelBatchRecheck(reason, f.recheck()))
	e.logBulk("gendurable: instances cancelled", res, err, "filter", f.String(), "reason", cancelReason(reason))
	return res, err
}

// CancelTree cancels the instance id and every live descendant at any
// depth — the children of its fan-outs, their children, and so on — each as
// [Engine.Cancel] would, recording reason (default "cancelled by an
// operator"): inboxes consumed, a worker still running a step fenced out
// with the step keeping its lease until it ends (its key's slot, its place
// in its queue's GlobalConcurrency). It is how to stop a whole tree, where a
// Cancel of a parent leaves its children running.
//
// Parents go before their children: the tree is walked top down, one level
// at a time, and an instance is cancelled before its children are read. A
// cancelled child counts as finished for its parent's join, so cancelling
// the children first could wake a waiting parent and run its next step
// before its own cancel; here the parent is failed already when its
// children's cancels count it down, and never runs another step (a step of
// it already running is fenced, as by Cancel). Reading the children only
// once their parent is cancelled also finds every child: a fan-out that
// committed before the parent's cancel is seen, and one after it is fenced
// out.
//
// The walk is bounded like [Engine.CancelMatching]: the children of at
// most [BulkBatch] instances are read per statement (an index lookup per
// instance, no lock taken), and at most BulkBatch live ones cancelled per
// statement, each committed on its own, so a tree of any size neither holds
// locks long nor starves workers. The walk goes through finished instances
// too (a parent cancelled earlier may have children still running), so
// calling CancelTree on an instance already cancelled by Cancel stops what
// it left running: prune keeps such an instance, whatever its age, while a
// child of it is live (not its finished ancestors, which may go after the
// retention; a CancelTree from above them then no longer reaches it).
// Matched counts the root and every descendant found; Skipped, those among
// them already finished (the root too), which keep their results.
//
// An id with no instance is [ErrNotFound], a non-positive one
// [ErrInvalidInput]. The call stops at ctx's end between statements (a
// cancel statement under way runs to its end, so what it changed is counted;
// a read of children under way is abandoned, having changed nothing), still
// parents before their children, returning what it did so far with ctx's
// error; on any other error too the result holds what was changed before it
// (see [BulkResult]). Descendants inserted after the walk passed their
// parent (a retry of a finished member meanwhile) are not visited, and a
// member retried (by [Engine.Retry] or a bulk retry) after the walk
// cancelled it runs again: CancelTree cancels what is live as it passes, it
// does not keep the tree cancelled. The change is logged at Info on the
// engine's Logger.
func (e *Engine) CancelTree(ctx context.Context, id int64, reason string) (BulkResult, error) {
	if err := e.usable(ctx, "CancelTree"); err != nil {
		return BulkResult{}, err
	}
	if err := checkID("cancel tree", id); err != nil { // ErrInvalidInput and ErrNotFound, as every call on one instance
		return BulkResult{ChangedIDs: []int64{}}, err
	}
	if err := checkReason("cancel tree", reason); err != nil {
		return BulkResult{ChangedIDs: []int64{}}, err
	}
	res, err := e.cancelTree(ctx, id, e.cancelBatch(reason))
	if res.Matched > 0 {
		e.logBulk("gendurable: instance tree cancelled", res, err, "root", id, "reason", cancelReason(reason))
	}
	return res, err
}

// cancelTree is CancelTree's walk (docs/design.md §5): level holds the
// instances cancelled (or found finished) whose children are still to be read.
func (e *Engine) cancelTree(ctx context.Context, id int64, batch bulkBatch) (BulkResult, error) {
	res := BulkResult{ChangedIDs: []int64{}}
	found, err := e.q.Existing(ctx, e.pool, []int64{id})
	if err != nil {
		return res, e.dbErr(ctx, err, "cancel tree")
	}
	if len(found) == 0 {
		return res, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	changed, done, err := batch(ctx, found)
	res.add(changed, int64(done))
	if err != nil {
		return res, err
	}
	// Each instance is visited once: a parent_id cycle (written by hand, or
	// by a restore; the API makes none) would otherwise be walked until
	// ctx ends.
	seen := map[int64]bool{}
	for _, f := range found {
		seen[f] = true
	}
	for level := found; len(level) > 0; {
		var next []int64
		for len(level) > 0 {
			parents := level[:min(BulkBatch, len(level))]
			level = level[len(parents):]
			if err := ctx.Err(); err != nil {
				return res, err
			}
			kids, err := e.q.TreeChildren(ctx, e.pool, parents)
			if err != nil {
				return res, e.dbErr(ctx, err, "cancel tree")
			}
			var live []int64
			finished := 0
			for _, k := range kids {
				if seen[k.ID] {
					continue
				}
				seen[k.ID] = true
				next = append(next, k.ID)
				if k.Live {
					live = append(live, k.ID)
				} else {
					finished++
				}
			}
			res.add(nil, int64(finished)) // skipped
			slices.Sort(live)
			for len(live) > 0 {
				ids := live[:min(BulkBatch, len(live))]
				live = live[len(ids):]
				if err := ctx.Err(); err != nil {
					return res, err
				}
				changed, done, err := batch(ctx, ids)
				res.add(changed, int64(done))
				if err != nil {
					return res, err
				}
			}
		}
		level = next
	}
	return res, nil
}

func (e *Engine) matching(ctx context.Context, f ListFilter, op string, batch bulkBatch) (BulkResult, error) {
	res := BulkResult{ChangedIDs: []int64{}}
	checked := f
	checked.Limit = 0 // ignored here (a negative one was taken before)
	if err := checked.check(op); err != nil {
		return res, err // named as the action, not as the list it reads
	}
	if !f.HasCriteria() && !f.All {
		return res, errorf(ErrInvalidInput, "%s: the filter has no criteria (queue, status, machine, step, time range, search or state); set All to act on every instance", op)
	}
	if !f.All && f.OnlyTimeRange() {
		if err := e.checkTimeRangeExcludes(ctx, f, op); err != nil {
			return res, err
		}
	}
	f.Limit = BulkBatch
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		page, err := e.List(ctx, f)
		if err != nil {
			return res, err
		}
		if n := len(page.Instances); n > 0 {
			ids := make([]int64, n)
			for i, in := range page.Instances {
				ids[i] = in.ID
			}
			slices.Sort(ids)
			changed, done, err := batch(ctx, ids)
			res.add(changed, int64(done))
			if err != nil {
				return res, err
			}
		}
		if page.NextBefore == 0 {
			return res, nil
		}
		f.Before = page.NextBefore
	}
}

// OnlyTimeRange reports whether From and To are f's only criteria: a bulk
// action by such a filter, without All, is refused with ErrInvalidInput
// when the range leaves out no instance (an empty State document, {} or
// [], is no criterion).
func (f ListFilter) OnlyTimeRange() bool {
	rest := f
	rest.From, rest.To = time.Time{}, time.Time{}
	return f.HasCriteria() && !rest.HasCriteria()
}

// checkTimeRangeExcludes refuses a time range that is a filter's only
// criterion and leaves out no instance — a To after the insert of the
// instance with the highest id, a From not after the insert of the one
// with the lowest id — as a filter without criteria is refused: "from
// 1970" or "to 9999" acts on every instance as surely as no filter does.
// Two primary-key probes. Ids and insert times run nearly together (a row's
// insert time is its transaction's start), so a bound within an inserting
// transaction's length of the ends may be refused though it leaves a row
// out: the error says so.
func (e *Engine) checkTimeRangeExcludes(ctx context.Context, f ListFilter, op string) error {
	first, last, err := e.q.InsertSpan(ctx, e.pool)
	if err != nil {
		return e.dbErr(ctx, err, op)
	}
	toExcludes := !f.To.IsZero() && last != nil && !f.To.After(*last)
	fromExcludes := !f.From.IsZero() && first != nil && f.From.After(*first)
	if toExcludes || fromExcludes {
		return nil
	}
	var why []string
	if first == nil {
		why = append(why, "there is no instance")
	} else {
		if !f.From.IsZero() {
			why = append(why, "From is not after the first instance's insert, "+first.UTC().Format(time.RFC3339Nano))
		}
		if !f.To.IsZero() {
			why = append(why, "To is after the last instance's insert, "+last.UTC().Format(time.RFC3339Nano))
		}
	}
	return errorf(ErrInvalidInput, "%s: the filter's only criterion is a time range, and it leaves out no instance (%s); narrow it, or set All to act on every instance",
		op, strings.Join(why, "; "))
}

// HasCriteria reports whether f selects by anything but position (Before,
// Limit): a bulk action by a filter without criteria, and without All, is
// refused with ErrInvalidInput. An empty State document, {} or [], is no
// criterion: every object or array state contains it.
func (f ListFilter) HasCriteria() bool {
	return f.Queue != "" || f.Status != "" || f.Machine != "" || f.Step != "" || !f.From.IsZero() ||
		!f.To.IsZero() || f.Search != "" || (len(f.State) > 0 && !stateMatchesAll(f.State))
}

// String describes f's criteria for logs.
func (f ListFilter) String() string {
	s := ""
	add := func(k, v string) {
		if v != "" {
			if s != "" {
				s += " "
			}
			s += k + "=" + fmt.Sprintf("%q", v)
		}
	}
	add("queue", f.Queue)
	add("status", string(f.Status))
	add("machine", f.Machine)
	add("step", f.Step)
	if !f.From.IsZero() {
		add("from", f.From.Format(time.RFC3339))
	}
	if !f.To.IsZero() {
		add("to", f.To.Format(time.RFC3339))
	}
	add("search", f.Search)
	add("state", string(f.State))
	if f.Before > 0 {
		add("before", fmt.Sprint(f.Before))
	}
	if s == "" && f.All {
		s = "all"
	}
	return s
}

// retryBatch retries the failed instances among ids (sorted, at most
// MaxBulkIDs). Two of them sharing a unique key collide on the unique
// index; the batch is then retried one instance at a time (parents of
// others in the batch after them: childrenFirst), each collision skipped. On error, the instances retried before it are returned with it
// (their statements committed), and their queues woken all the same.
func (e *Engine) retryBatch(ctx context.Context, ids []int64) ([]sqlq.BulkChanged, int, error) {
	sctx, cancel := e.statementContext(ctx)
	defer cancel()
	changed, err := bulkStatement(sctx, func() ([]sqlq.BulkChanged, error) { return e.q.RetryMany(sctx, e.pool, ids) })
	if isUniqueViolation(err) {
		changed = nil
		var oerr error
		if ids, oerr = childrenFirst(sctx, e, ids); oerr != nil {
			return nil, 0, e.dbErr(ctx, oerr, "retry")
		}
		for i, id := range ids {
			if err := ctx.Err(); err != nil { // between statements
				e.kickQueues(changed)
				return changed, i, err
			}
			sctx, cancel := e.statementContext(ctx)
			one, err := bulkStatement(sctx, func() ([]sqlq.BulkChanged, error) { return e.q.RetryMany(sctx, e.pool, []int64{id}) })
			cancel()
			if isUniqueViolation(err) {
				continue
			}
			if err != nil {
				e.kickQueues(changed)
				return changed, i, e.dbErr(ctx, err, "retry")
			}
			changed = append(changed, one...)
		}
		err = nil
	}
	if err != nil {
		return nil, 0, e.dbErr(ctx, err, "retry")
	}
	e.kickQueues(changed)
	return changed, len(ids), nil
}

// childrenFirst orders ids (sorted) for a retry one at a time: the ids that
// are no other's parent in order, then the parents, newest first (a child
// fan-out's parent was inserted before it). A parent retried after its
// children awaits them again, as in the batch statement
// (sqlq.retryManyStatusSet); retried before them, it went runnable, and its
// next step ran while the children it was retried with ran.
func childrenFirst(ctx context.Context, e *Engine, ids []int64) ([]int64, error) {
	parents, err := e.q.ParentsAmong(ctx, e.pool, ids)
	if err != nil || len(parents) == 0 {
		return ids, err
	}
	isParent := make(map[int64]bool, len(parents))
	for _, p := range parents {
		isParent[p] = true
	}
	out := make([]int64, 0, len(ids))
	for _, id := range ids {
		if !isParent[id] {
			out = append(out, id)
		}
	}
	for i := len(ids) - 1; i >= 0; i-- {
		if isParent[ids[i]] {
			out = append(out, ids[i])
		}
	}
	return out, nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// MaxReasonBytes bounds a cancel's reason: the longest error text the
// error history stores whole.
const MaxReasonBytes = sqlq.MaxErrorText

// checkReason refuses a cancel reason the error history cannot hold as
// given — longer than MaxReasonBytes, holding a NUL byte (PostgreSQL's text
// cannot) or not UTF-8 — rather than storing an altered copy of it.
func checkReason(op, reason string) error {
	switch {
	case len(reason) > MaxReasonBytes:
		return errorf(ErrInvalidInput, "%s: the reason is %d bytes, at most %d", op, len(reason), MaxReasonBytes)
	case strings.ContainsRune(reason, 0) || !utf8.ValidString(reason):
		return errorf(ErrInvalidInput, "%s: the reason holds a NUL byte or invalid UTF-8", op)
	}
	return nil
}

// cancelReason is the reason a cancel records: reason, or the default,
// as the error history stores it.
func cancelReason(reason string) string {
	if reason == "" {
		reason = "cancelled by an operator"
	}
	return truncate(reason)
}

func (e *Engine) cancelBatch(reason string) bulkBatch {
	return e.cancelBatchRecheck(reason, sqlq.Recheck{})
}

// recheck is what of f a bulk cancel checks again on each row it locks.
func (f ListFilter) recheck() sqlq.Recheck {
	return sqlq.Recheck{Queue: nonEmpty(f.Queue), Status: nonEmpty(string(f.Status)), Step: nonEmpty(f.Step), State: nonEmpty(string(f.State))}
}

// cancelBatchRecheck is cancelBatch for CancelMatching: a row that no
// longer matches the filter's r once locked is skipped.
func (e *Engine) cancelBatchRecheck(reason string, r sqlq.Recheck) bulkBatch {
	reason = cancelReason(reason)
	return func(ctx context.Context, ids []int64) ([]sqlq.BulkChanged, int, error) {
		sctx, cancel := e.statementContext(ctx)
		defer cancel()
		changed, err := bulkStatement(sctx, func() ([]sqlq.BulkChanged, error) { return e.q.CancelStillMatching(sctx, e.pool, ids, reason, r) })
		if err != nil {
			return nil, 0, e.dbErr(ctx, err, "cancel") // one statement: nothing changed
		}
		cancelled := make([]int64, len(changed))
		for i, c := range changed {
			cancelled[i] = c.ID
		}
		e.cancelSteps(cancelled)
		return changed, len(ids), nil
	}
}

// bulkStatementTimeout bounds one statement of a bulk call, which runs to
// its end even if the call's context ends meanwhile (statementContext).
const bulkStatementTimeout = 30 * time.Second

// BulkStatementGrace is how long a statement of a bulk call (RetryMany,
// CancelMany, RetryMatching, CancelMatching, CancelTree) that is under way
// when the call's context reaches its deadline may run past that deadline:
// it is let finish, so that what it changed is counted in the result, and
// cancelled only after the grace (its changes then go uncounted if it
// committed all the same). A server that bounds a request by a context
// deadline should let its response be written this much later (the
// dashboard's DefaultWriteTimeout does). A context cancelled without a
// deadline gives the statement up to 30 s.
const BulkStatementGrace = 15 * time.Second

// statementContext is the context of one bulk statement: ctx's values but
// not its end, bounded by bulkStatementTimeout and by ctx's deadline plus
// the grace (BulkStatementGrace). A statement cancelled in flight may have
// committed on the server all the same, and its changes would then go
// uncounted (and unlisted in the audit line); so a bulk call checks its
// context between statements and lets a started one finish. Without the
// bound by the deadline, a dashboard request whose last statement waited on
// a row lock ran 40 s, past the server's 30 s write timeout: the client got
// an empty reply for changes that were made (a hostile-operator probe).
func (e *Engine) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := bulkStatementTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, max(time.Until(dl), 0)+e.bulkGrace)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// bulkStatement runs a bulk statement, again after a deadlock or
// serialization failure with another process's writes (againOnDeadlock),
// for as long as sctx, the statement's own context (statementContext),
// lives. Tried again only while the caller's context lived, a statement
// that lost a deadlock after the call's deadline passed returned the
// server's error with nothing changed, inside the grace meant to let it
// finish (a probe).
func bulkStatement(sctx context.Context, run func() ([]sqlq.BulkChanged, error)) ([]sqlq.BulkChanged, error) {
	return againOnDeadlock(sctx, run)
}

// againOnDeadlock runs an operator's statement (or transaction) again after
// a deadlock or serialization failure (SQLSTATE 40P01, 40001), up to 5
// tries: PostgreSQL ends one of the transactions caught in a deadlock with
// nothing changed, and the operator asked for a change, not a race. A
// Cancel of a child locks the child and then its parent; a retry locks the
// parent of a retried row before a child of it that is the parent of
// another: the two can meet half way (TestCancelDeadlockedWithARetryManyIsRetried).
func againOnDeadlock[T any](ctx context.Context, run func() (T, error)) (T, error) {
	for try := 1; ; try++ {
		v, err := run()
		if try == 5 || !sqlq.Deadlocked(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("%w, after a deadlock: %w", ctx.Err(), err)
		case <-time.After(time.Duration(try*10) * time.Millisecond):
		}
	}
}

// kickQueues wakes this process's feeders of the queues rows went back to,
// at once or when a row becomes eligible.
func (e *Engine) kickQueues(changed []sqlq.BulkChanged) {
	seen := map[string]bool{}
	for _, c := range changed {
		if c.Wait > 0 {
			// Eligible when its cancelled step's lease ends: wake the
			// feeder then (see Engine.Retry).
			e.kickQueueAt(c.Queue, time.Now().Add(c.Wait))
			continue
		}
		if !seen[c.Queue] {
			seen[c.Queue] = true
			e.kickQueue(c.Queue)
		}
	}
}

func (e *Engine) logBulk(msg string, res BulkResult, err error, kv ...any) {
	if res.Changed == 0 && err != nil {
		return
	}
	// Which instances, not only how many: an audit trail answers "who
	// cancelled instance 9?" (the first MaxBulkIDs, as BulkResult holds).
	args := append([]any{"matched", res.Matched, "changed", res.Changed, "skipped", res.Skipped, "not_found", res.NotFound,
		"changed_ids", res.ChangedIDs}, kv...)
	if res.Truncated {
		args = append(args, "changed_ids_truncated", true)
	}
	if err != nil {
		args = append(args, "err", err)
	}
	e.log.Info(msg, args...)
}
