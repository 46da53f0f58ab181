package gendurable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file is the operator's API: what the CLI and the dashboard call.
// None of it is on the hot path, and every read is bounded.

// ErrNotCancellable: only a live (not done, not failed) instance can be cancelled.
var ErrNotCancellable = errors.New("gendurable: instance not cancellable, already finished")

// MaxListLimit bounds one page of [Engine.List].
const MaxListLimit = 500

// MaxStateFilter bounds ListFilter.State, in bytes.
const MaxStateFilter = 1000

// Bounds of the rows one [Engine.List] page looks at (ListFilter.MaxScan).
const (
	DefaultListScan = 10_000
	MaxListScan     = 100_000
)

// ListFilter selects instances for [Engine.List]. Zero fields do not filter.
// Queue, Machine and Step (at most 200 bytes) and Search (at most 1000) must be
// valid UTF-8 without NUL, other control characters or bidirectional
// controls (and the names do not start or end with white space), and From and To
// within the years PostgreSQL's timestamps hold (4713 BC to 294275 AD);
// anything else is [ErrInvalidInput].
//
// A page is bounded by the rows it looks at, not only by the rows it
// returns: it takes the newest MaxScan instances below Before (those
// matching Search, when set, found through the primary key and the key
// indexes) and applies the other filters to them. A filter that matches
// little may so return a short or empty page with [ListPage.Partial] set;
// NextBefore continues below what was looked at.
type ListFilter struct {
	Queue   string
	Status  Status
	Machine string
	Step    string
	From    time.Time // inserted at or after
	To      time.Time // inserted before
	// Search matches an exact instance id (written in decimal without sign
	// or leading zeros: "0009" is a key, not id 9), partition key or unique
	// key, each through an index.
	Search string
	// State keeps instances whose state contains this JSON document, in
	// the sense of PostgreSQL's jsonb containment (@>): {"customer": "c-7"}
	// matches every state holding that key and value, at any other content;
	// [1, 2] matches a state that is an array holding 1 and 2. It needs no
	// index: like the other filters it is checked on the instances a page
	// looks at (MaxScan). At most [MaxStateFilter] bytes, a JSON object or
	// array; anything else is [ErrInvalidInput].
	State json.RawMessage
	// Before pages: only instances with a smaller id (pass the last page's
	// NextBefore). Negative is [ErrInvalidInput].
	Before int64
	// Limit is the page size; default (0) 50, at most MaxListLimit (a
	// larger one is taken as MaxListLimit); negative is [ErrInvalidInput].
	Limit int
	// MaxScan bounds the instances one page looks at; default (0)
	// DefaultListScan, at most MaxListScan (a larger one is taken as
	// MaxListScan); negative is [ErrInvalidInput].
	MaxScan int
	// All lets [Engine.RetryMatching] and [Engine.CancelMatching] act on a
	// filter without criteria: every instance. List ignores it.
	All bool
}

// InstanceSummary is one row of a list.
type InstanceSummary struct {
	ID           int64      `json:"id"`
	Machine      string     `json:"machine"`
	Version      int        `json:"version"`
	Queue        string     `json:"queue"`
	Step         string     `json:"step"`
	Status       Status     `json:"status"`
	Attempt      int        `json:"attempt"` // from 0, as Instance.Attempt
	MaxAttempts  int        `json:"max_attempts"`
	Priority     int        `json:"priority"`
	PartitionKey string     `json:"partition_key,omitempty"`
	ParentID     *int64     `json:"parent_id,omitempty"`
	EligibleAt   time.Time  `json:"eligible_at"`
	InsertedAt   time.Time  `json:"inserted_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	FinishedAt   *time.Time `json:"finished_at,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
}

// ListPage is one page of instances, newest first.
type ListPage struct {
	Instances []InstanceSummary `json:"instances"`
	// NextBefore is the Before of the next page; 0 when this is the last.
	NextBefore int64 `json:"next_before,omitempty"`
	// Scanned is how many instances a Partial page looked at (MaxScan).
	Scanned int `json:"scanned,omitempty"`
	// Partial: the page stopped at MaxScan instances looked at before it
	// filled up; older matches may follow NextBefore.
	Partial bool `json:"partial,omitempty"`
}

// Validate reports a filter that [Engine.List] and the bulk actions by
// filter would refuse for its values ([ErrInvalidInput]: an unknown status,
// a name or search text they cannot hold, a negative limit, …), before any
// SQL: a caller can check a filter before it asks someone to confirm an
// action by it. It does not judge the filter's scope (no criteria, a time
// range that leaves nothing out): the bulk actions refuse those themselves.
func (f ListFilter) Validate() error { return f.check("filter") }

// check is Validate, its message starting with op.
func (f ListFilter) check(op string) error {
	// A cursor is a previous page's NextBefore, never negative; taken as
	// none, a bad one would restart the walk from the newest. Each field
	// is named alone (a probe read "negative before (0), limit (-1) or max
	// scan (0)").
	for _, c := range []struct {
		field string
		v     int64
	}{{"Before", f.Before}, {"Limit", int64(f.Limit)}, {"MaxScan", int64(f.MaxScan)}} {
		if c.v < 0 {
			return errorf(ErrInvalidInput, "%s: negative %s (%d)", op, c.field, c.v)
		}
	}
	if f.Status != "" && !validStatus(f.Status) {
		return errorf(ErrInvalidInput, "%s: unknown status %q", op, f.Status)
	}
	for _, c := range []struct{ field, value string }{{"queue", f.Queue}, {"machine", f.Machine}, {"step", f.Step}} {
		if c.value != "" {
			if err := checkName(op+": "+c.field, c.value); err != nil {
				return err
			}
		}
	}
	if p := searchProblem(f.Search); p != "" {
		return errorf(ErrInvalidInput, "%s: search text %s", op, p)
	}
	if p := stateFilterProblem(f.State); p != "" {
		return errorf(ErrInvalidInput, "%s: state filter %s", op, p)
	}
	for _, c := range []struct {
		field string
		t     time.Time
	}{{"from", f.From}, {"to", f.To}} {
		if !c.t.IsZero() && !timestampYear(c.t) {
			return errorf(ErrInvalidInput, "%s: %s %s outside the years %d..%d that PostgreSQL's timestamps hold",
				op, c.field, c.t.UTC().Format(time.RFC3339), minTimestampYear, maxTimestampYear)
		}
	}
	return nil
}

// List returns instances matching f, newest first, one page at a time.
func (e *Engine) List(ctx context.Context, f ListFilter) (*ListPage, error) {
	if err := e.usable(ctx, "List"); err != nil {
		return nil, err
	}
	if err := f.check("list"); err != nil {
		return nil, err
	}
	limit := f.Limit
	switch {
	case limit <= 0:
		limit = 50
	case limit > MaxListLimit:
		limit = MaxListLimit
	}
	scan := f.MaxScan
	switch {
	case scan <= 0:
		scan = DefaultListScan
	case scan > MaxListScan:
		scan = MaxListScan
	}
	q := sqlq.ListFilter{Limit: limit + 1, Scan: scan}
	q.Queue, q.Status, q.FSM, q.Step, q.Search = nonEmpty(f.Queue), nonEmpty(string(f.Status)), nonEmpty(f.Machine), nonEmpty(f.Step), nonEmpty(f.Search)
	if !f.From.IsZero() {
		q.From = &f.From
	}
	if !f.To.IsZero() {
		q.To = &f.To
	}
	if f.Before > 0 {
		q.Before = &f.Before
	}
	if len(f.State) > 0 {
		q.State = nonEmpty(string(f.State))
	}
	// An id only as an id is written: "0009" or "+9" is a key (zero-padded
	// account numbers are common keys), not also instance 9.
	if id, err := strconv.ParseInt(f.Search, 10, 64); err == nil && id > 0 && strconv.FormatInt(id, 10) == f.Search {
		q.SearchID = &id
	}
	rows, win, err := e.q.ListInstances(ctx, e.pool, q)
	var pgErr *pgconn.PgError
	if err != nil && q.State != nil && errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
		// The database refused the state filter as jsonb (a lone UTF-16
		// surrogate, a number beyond numeric's range): bad input, not a
		// failure.
		return nil, errorf(ErrInvalidInput, "list: state filter: %s", pgErr.Message)
	}
	if err != nil {
		return nil, e.dbErr(ctx, err, "list")
	}
	page := &ListPage{Instances: make([]InstanceSummary, 0, min(len(rows), limit))}
	if len(rows) <= limit && win.Full && win.Low > 1 {
		// The page did not fill up and its window was full: older matches
		// may lie below it.
		page.NextBefore, page.Partial, page.Scanned = win.Low, true, scan
	}
	for i, r := range rows {
		if i == limit {
			page.NextBefore = page.Instances[limit-1].ID
			break
		}
		s := InstanceSummary{ID: r.ID, Machine: r.FSM, Version: int(r.Version), Queue: r.Queue, Step: r.Step,
			Status: Status(r.Status), Attempt: int(r.Attempt), MaxAttempts: int(r.MaxAttempts), Priority: int(r.Priority),
			ParentID: r.ParentID, EligibleAt: r.EligibleAt, InsertedAt: r.InsertedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt}
		if r.PartitionKey != nil {
			s.PartitionKey = *r.PartitionKey
		}
		if r.LastError != nil {
			s.LastError = *r.LastError
		}
		page.Instances = append(page.Instances, s)
	}
	return page, nil
}

// stateFilterProblem says what is wrong with a ListFilter.State, or "".
func stateFilterProblem(doc json.RawMessage) string {
	if len(doc) == 0 {
		return ""
	}
	s := strings.TrimSpace(string(doc))
	switch {
	case len(doc) > MaxStateFilter:
		return fmt.Sprintf("is longer than %d bytes", MaxStateFilter)
	case !json.Valid(doc):
		return "is not valid JSON"
	case s[0] != '{' && s[0] != '[':
		return `is not a JSON object or array (e.g. {"customer": "c-7"})`
	case !utf8.Valid(doc):
		return "is not valid UTF-8"
	}
	// A NUL (\u0000) or a lone surrogate escape: no stored state holds one;
	// nor a number beyond numeric's range, which the database would refuse
	// only once the statement ran.
	sc := scanJSON([]byte(doc), -1)
	if sc.number != "" {
		return "holds " + sc.number
	}
	return sc.jsonb
}

// stateMatchesAll reports whether doc, a valid state filter, is an empty
// object or array: it is contained in every object (or array) state, so it
// selects nothing out and is no bulk criterion.
func stateMatchesAll(doc json.RawMessage) bool {
	var b bytes.Buffer
	if json.Compact(&b, doc) != nil {
		return false
	}
	return b.String() == "{}" || b.String() == "[]"
}

// checkName validates a queue, machine or step name an operator gave to
// find what exists (a filter, a pause, a removal) the way config and
// inserts validate theirs (nameProblem), so a bad byte is a typed error
// here instead of a database error (SQLSTATE 22021) later — but for the
// invisible characters: a name stored before they were refused (a queue
// "default" with U+3164, from an older version) can still be filtered,
// paused and removed. What creates a name checks it whole (createName).
func checkName(field, s string) error {
	p := ""
	if s == "" {
		p = "is empty"
	} else if p = textProblem(s, maxNameLen); p == "" {
		p = edgeSpaceProblem(s)
	}
	if p != "" {
		return errorf(ErrInvalidInput, "%s %s %s", field, quoted(s), p)
	}
	return nil
}

// createName is checkName for a name an operator's call creates (a pause
// with QueueOpts.Create): the rule of config and inserts, whole.
func createName(field, s string) error {
	if p := nameProblem(s); p != "" {
		return errorf(ErrInvalidInput, "%s %s %s", field, quoted(s), p)
	}
	return nil
}

func validStatus(s Status) bool {
	for _, st := range statusOrder {
		if st == s {
			return true
		}
	}
	return false
}

// SignalInfo is one signal as an operator sees it.
type SignalInfo struct {
	ID      int64           `json:"id"`
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload,omitempty"`
	// PayloadLeftOut, above 0, is the length in bytes (as JSON text) of a
	// payload [DescribeOptions].ValueBytes left out: Payload is then nil.
	PayloadLeftOut int        `json:"payload_left_out,omitempty"`
	DedupKey       string     `json:"dedup_key,omitempty"`
	SentAt         time.Time  `json:"sent_at"`
	ConsumedAt     *time.Time `json:"consumed_at,omitempty"`
}

// InstanceDetail is everything known about one instance.
type InstanceDetail struct {
	Instance
	Wait     *WaitReason      `json:"wait"`
	Signals  []SignalInfo     `json:"signals"`  // newest first, the last 100
	Children []Child          `json:"children"` // of every fan-out, the first 500
	Parent   *InstanceSummary `json:"parent,omitempty"`
	// MoreSignals and MoreChildren say that Signals or Children were cut
	// at their bound: the instance has more.
	MoreSignals  bool `json:"more_signals,omitempty"`
	MoreChildren bool `json:"more_children,omitempty"`
}

// Bounds of InstanceDetail's lists.
const (
	describeSignals  = 100
	describeChildren = 500
)

// Describe reads an instance with its signals, children, parent and wait
// reason, all as of one moment (one read-only repeatable-read transaction:
// its status, its wait and its children's statuses agree); [ErrNotFound]
// if it does not exist. Signal payloads and children's results are whole:
// up to 100 of the one and 500 of the other, each up to
// [Config.MaxSignalBytes] or [Config.MaxStateBytes] — hundreds of
// megabytes at worst. [Engine.DescribeWith] bounds them.
func (e *Engine) Describe(ctx context.Context, id int64) (*InstanceDetail, error) {
	if err := e.usable(ctx, "Describe"); err != nil {
		return nil, err
	}
	return e.DescribeWith(ctx, id, DescribeOptions{})
}

// DescribeOptions bound what [Engine.DescribeWith] reads.
type DescribeOptions struct {
	// ValueBytes, above 0, leaves out each signal payload and child result
	// longer than this many bytes as JSON text: the server measures it
	// but does not send it, its Payload (Result) is nil and its
	// PayloadLeftOut (ResultLeftOut) is its length. 0: all of them whole,
	// as Describe.
	// The instance's own state and result are read whole either way
	// (bounded by MaxStateBytes when written). Negative is ErrInvalidInput.
	ValueBytes int
}

// DescribeWith is [Engine.Describe] with options: the dashboard reads an
// instance's page with ValueBytes 4,096, so that the page is bounded in
// bytes as well as in rows.
func (e *Engine) DescribeWith(ctx context.Context, id int64, o DescribeOptions) (*InstanceDetail, error) {
	if err := e.usable(ctx, "DescribeWith"); err != nil {
		return nil, err
	}
	if err := checkID("describe", id); err != nil {
		return nil, err
	}
	if o.ValueBytes < 0 || o.ValueBytes > math.MaxInt32 {
		return nil, errorf(ErrInvalidInput, "describe: DescribeOptions.ValueBytes %d outside 0..%d", o.ValueBytes, math.MaxInt32)
	}
	tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, e.dbErr(ctx, err, fmt.Sprintf("describe %d", id))
	}
	defer func() { _ = tx.Rollback(ctx) }()
	in, err := e.instanceOn(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	d := &InstanceDetail{Instance: *in, Signals: []SignalInfo{}, Children: []Child{}}
	if d.Wait, err = e.waitReasonOn(ctx, tx, id); err != nil {
		return nil, err
	}
	sigs, err := e.q.ListSignals(ctx, tx, id, describeSignals+1, o.ValueBytes)
	if err != nil {
		return nil, e.dbErr(ctx, err, fmt.Sprintf("describe %d", id))
	}
	if len(sigs) > describeSignals {
		sigs, d.MoreSignals = sigs[:describeSignals], true
	}
	for _, s := range sigs {
		si := SignalInfo{ID: s.ID, Name: s.Name, Payload: s.Payload, PayloadLeftOut: int(s.LeftOut), SentAt: s.InsertedAt, ConsumedAt: s.ConsumedAt}
		if s.DedupKey != nil {
			si.DedupKey = *s.DedupKey
		}
		d.Signals = append(d.Signals, si)
	}
	kids, err := e.q.ListAllChildren(ctx, tx, id, describeChildren+1, o.ValueBytes)
	if err != nil {
		return nil, e.dbErr(ctx, err, fmt.Sprintf("describe %d", id))
	}
	if len(kids) > describeChildren {
		kids, d.MoreChildren = kids[:describeChildren], true
	}
	for _, c := range kids {
		d.Children = append(d.Children, Child{ID: c.ID, Machine: c.FSM, Version: int(c.Version), Step: c.Step,
			Status: Status(c.Status), Result: c.Result, ResultLeftOut: int(c.LeftOut), FinishedAt: c.FinishedAt, InsertedAt: c.InsertedAt})
	}
	if in.ParentID != nil {
		if p, err := e.instanceOn(ctx, tx, *in.ParentID); err == nil {
			d.Parent = &InstanceSummary{ID: p.ID, Machine: p.Machine, Version: p.Version, Queue: p.Queue, Step: p.Step,
				Status: p.Status, Attempt: p.Attempt, MaxAttempts: p.MaxAttempts, InsertedAt: p.InsertedAt, UpdatedAt: p.UpdatedAt}
		}
	}
	return d, nil
}

// Cancel fails a live instance at once, recording reason in its error
// history (an empty reason records "cancelled by an operator"): its
// inbox is consumed, a parent counts it as finished, and a worker still
// running one of its steps is fenced out (its outcome changes nothing).
// A step this engine runs has its context cancelled as the cancel commits
// ([ErrInstanceCancelled]; so does one whose claim a pick or a key
// hand-off in flight brings in afterwards, and a claim of it waiting for a
// slot is dropped, its step never started); one running in another
// process may run until its worker's next heartbeat. Either way the
// instance keeps that step's lease until it ends — its
// key's slot, its place in its queue's GlobalConcurrency; a prune keeps it
// until then, and a retry before then waits for it ([Engine.Retry]).
// [ErrNotFound], or [ErrNotCancellable] for a finished instance; a reason
// over [MaxReasonBytes] or with a NUL byte or invalid UTF-8 is
// [ErrInvalidInput], nothing changed.
// The cancel is logged at Info on the engine's Logger. A parent's children
// are left as they are, running; [Engine.CancelTree] cancels them too. A
// cancel that PostgreSQL ends in a deadlock with another transaction (a
// retry locking the instance's parent first) runs again, up to 5 times.
func (e *Engine) Cancel(ctx context.Context, id int64, reason string) error {
	if err := e.usable(ctx, "Cancel"); err != nil {
		return err
	}
	if err := checkID("cancel", id); err != nil {
		return err
	}
	if err := checkReason("cancel", reason); err != nil {
		return err
	}
	if reason == "" {
		reason = "cancelled by an operator"
	}
	type answer struct {
		status *string
		ok     bool
	}
	a, err := againOnDeadlock(ctx, func() (answer, error) {
		status, ok, err := e.q.Cancel(ctx, e.pool, id, truncate(reason))
		return answer{status, ok}, err
	})
	status, ok := a.status, a.ok
	if err != nil {
		return e.dbErr(ctx, err, fmt.Sprintf("cancel %d", id))
	}
	switch {
	case status == nil:
		return fmt.Errorf("%w: id %d", ErrNotFound, id)
	case !ok:
		return fmt.Errorf("%w: instance %d is %s", ErrNotCancellable, id, *status)
	}
	e.log.Info("gendurable: instance cancelled", "id", id, "reason", reason)
	e.cancelSteps([]int64{id})
	return nil
}

// cancelSteps cancels this engine's running steps of instances just
// cancelled (ErrInstanceCancelled, an ErrLeaseLost), and drops their claims
// waiting for a slot: without it such a step ran on until the next heartbeat found its
// lease gone — 20 s at the defaults (a River user's probe).
func (e *Engine) cancelSteps(ids []int64) {
	if len(ids) == 0 {
		return
	}
	e.mu.Lock()
	scheds := e.scheds
	e.mu.Unlock()
	if scheds == nil {
		return
	}
	set := make(map[int64]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	for _, s := range scheds {
		s.CancelSteps(set, ErrInstanceCancelled)
	}
}

// QueueStats are one queue's instance counts.
type QueueStats struct {
	Queue    string           `json:"queue"`
	Paused   bool             `json:"paused"`
	ByStatus map[Status]int64 `json:"by_status"`
	Total    int64            `json:"total"`
}

// Queues counts instances by queue and status (a full count: cheap on a
// pruned table, slower on a huge one), with each queue's pause flag.
func (e *Engine) Queues(ctx context.Context) ([]QueueStats, error) {
	if err := e.usable(ctx, "Queues"); err != nil {
		return nil, err
	}
	rows, err := e.q.QueueCounts(ctx, e.pool)
	if err != nil {
		return nil, e.dbErr(ctx, err, "queue counts")
	}
	byName := map[string]*QueueStats{}
	for _, r := range rows {
		qs := byName[r.Queue]
		if qs == nil {
			qs = &QueueStats{Queue: r.Queue, ByStatus: map[Status]int64{}}
			byName[r.Queue] = qs
		}
		qs.Paused = qs.Paused || r.Paused
		if r.Status != "" {
			qs.ByStatus[Status(r.Status)] = r.Count
			qs.Total += r.Count
		}
	}
	res := make([]QueueStats, 0, len(byName))
	for _, name := range sortedQueueNames(byName) {
		res = append(res, *byName[name])
	}
	return res, nil
}

func sortedQueueNames(m map[string]*QueueStats) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ErrUnknownQueue: a queue has neither a row (from an earlier pause or
// resume) nor any instance, and the call did not ask to create it: pausing a
// misspelt name would otherwise leave a phantom queue behind.
var ErrUnknownQueue = errors.New("gendurable: unknown queue")

// ErrQueueNotEmpty: [Engine.RemoveQueue] refuses a queue that still has
// instances (finished ones count until they are pruned).
var ErrQueueNotEmpty = errors.New("gendurable: queue has instances")

// QueueOpts tune [Engine.SetPaused].
type QueueOpts struct {
	// Create pauses or resumes a queue that is not known yet, creating its
	// row. Default false: an unknown queue is refused with ErrUnknownQueue.
	Create bool
}

// Pause stops every process from picking queue and from handing a key's
// slot on to the key's next row (steps already running finish). Rows a
// process claimed ahead of its free slots before the pause (up to the
// queue's Prefetch per process) still start, as slots free. It does not
// stop a chain: an instance whose step returns a Next without delay goes on
// with its next step in the same worker, up to QueueConfig.ChainSteps steps
// in a row, before it goes back to the (paused) queue. The state is stored
// in the database. The queue must be known:
// it has a row, an instance, or is in this engine's Config.Queues; else
// [ErrUnknownQueue] (see [Engine.SetPaused] to create one).
func (e *Engine) Pause(ctx context.Context, queue string) error {
	if err := e.usable(ctx, "Pause"); err != nil {
		return err
	}
	return e.SetPaused(ctx, queue, true, nil)
}

// Resume lets processes pick queue again; an unknown queue is refused as
// by [Engine.Pause].
func (e *Engine) Resume(ctx context.Context, queue string) error {
	if err := e.usable(ctx, "Resume"); err != nil {
		return err
	}
	return e.SetPaused(ctx, queue, false, nil)
}

// SetPaused pauses or resumes queue in every process. A queue is known if
// it has a row in the queues table, any instance (live or finished), or is
// configured in this engine's Config.Queues; an unknown queue is refused
// with [ErrUnknownQueue] and nothing is written, unless opts.Create. Each
// change is logged at Info on the engine's Logger.
func (e *Engine) SetPaused(ctx context.Context, queue string, paused bool, opts *QueueOpts) error {
	if err := e.usable(ctx, "SetPaused"); err != nil {
		return err
	}
	check := checkName
	if opts != nil && opts.Create {
		check = createName
	}
	if err := check("queue name", queue); err != nil {
		return err
	}
	action := map[bool]string{true: "pause", false: "resume"}[paused]
	_, ours := e.cfg.Queues[queue]
	create := ours || (opts != nil && opts.Create)
	known, err := e.q.SetPaused(ctx, e.pool, queue, paused, create)
	if err != nil {
		return e.dbErr(ctx, err, fmt.Sprintf("%s %q", action, queue))
	}
	if !known {
		return fmt.Errorf("%w %q: it has no instance and no row", ErrUnknownQueue, queue)
	}
	e.log.Info("gendurable: queue "+action+"d", "queue", queue)
	if !paused {
		e.kickQueue(queue)
	}
	return nil
}

// RemoveQueue deletes queue's row (its pause flag) so it no longer shows in
// [Engine.Queues]: for a queue that was paused or resumed by mistake. It
// refuses a queue that has instances, finished ones included, with
// [ErrQueueNotEmpty], and a queue without a row with [ErrUnknownQueue].
// Removing a paused queue's row resumes it. The removal is logged at Info
// on the engine's Logger. An insert into the queue that has not committed
// when the removal looks is not seen: the queue then has an instance and
// no row (unpaused), as if the insert had come after the removal.
func (e *Engine) RemoveQueue(ctx context.Context, queue string) error {
	if err := e.usable(ctx, "RemoveQueue"); err != nil {
		return err
	}
	if err := checkName("queue name", queue); err != nil {
		return err
	}
	hadRow, busy, removed, err := e.q.RemoveQueue(ctx, e.pool, queue)
	switch {
	case err != nil:
		return e.dbErr(ctx, err, fmt.Sprintf("remove queue %q", queue))
	case busy:
		return fmt.Errorf("%w: queue %q (finished instances count until they are pruned)", ErrQueueNotEmpty, queue)
	case !hadRow || !removed:
		return fmt.Errorf("%w %q: it has no row to remove", ErrUnknownQueue, queue)
	}
	e.log.Info("gendurable: queue removed", "queue", queue)
	return nil
}

// PruneBatch is how many rows one prune batch (a transaction) deletes at most.
const PruneBatch = 1000

// Prune deletes finished (done or failed) instances that finished more
// than retention ago, with their signals, in batches of PruneBatch, oldest
// first, each starting where the last ended, until a batch comes back short
// (a finished child whose parent is still live is kept, for the parent's
// next step reads it, and a finished parent while a child of it is live, for
// [Engine.CancelTree] of it to reach them — a child retried while the prune
// runs included: a batch looks at each row again once it holds the row's
// lock — and the newest slot of each periodic schedule, so that an engine
// started again does not run that slot a second time: one row per schedule,
// a schedule since removed included). What a call passes by — a child whose parent it prunes after it, a
// row locked by another transaction — goes in a later call; progress, if
// not nil, is called after each batch with the running total. It returns
// the number deleted; on error, the number deleted before it (each batch
// commits on its own). The prune is logged at Info on the engine's Logger
// with that number, also when it stopped part way (unless it deleted
// nothing). Each batch runs under 10 × Config.MaintenanceTimeout as well as
// ctx: one past it is rolled back. A negative retention is
// [ErrInvalidInput], nothing deleted. Then, if that prune succeeded,
// whatever the retention, it deletes the rate buckets of keys whose
// [KeyPolicy] in this engine has a Rate and that have been full for a
// minute, or for LeaseDuration if longer (the pick counts a missing bucket
// as a full one, so no start changes); their number is logged, not
// returned.
func (e *Engine) Prune(ctx context.Context, retention time.Duration, progress func(deleted int64)) (int64, error) {
	if err := e.usable(ctx, "Prune"); err != nil {
		return 0, err
	}
	if retention < 0 {
		return 0, errorf(ErrInvalidInput, "prune: negative retention %s", retention)
	}
	p := e.pruner()
	n, err := p.RunOnce(ctx, retention, progress)
	if err == nil {
		nb, errb := p.RunBuckets(ctx)
		p.LogBuckets(ctx, nb, errb)
	}
	if err != nil && notMigrated(err) {
		err = e.dbErr(ctx, err, "prune")
	}
	switch {
	case err == nil:
		e.log.Info("gendurable: pruned", "deleted", n, "retention", retention.String())
	case n > 0:
		e.log.Info("gendurable: pruned", "deleted", n, "retention", retention.String(), "err", err)
	}
	return n, err
}

// Machines lists the machines registered in this engine (name → versions);
// [Engine.ListMachines] lists those stored in the database too.
func (e *Engine) Machines() map[string][]int {
	out := map[string][]int{}
	if e == nil {
		return out
	}
	for k := range e.registry {
		out[k.name] = append(out[k.name], k.version)
	}
	for _, v := range out {
		sort.Ints(v)
	}
	return out
}
