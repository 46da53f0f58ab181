package gendurable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// InsertParams is one instance to insert: build it with [Machine.New] or
// [Job.New], optionally adjusted with [InsertParams.With].
type InsertParams struct {
	def   Definition
	state any
	opts  InsertOpts
	// slot: a Periodic's slot, whose UniqueKey is in the namespace
	// reserved for slots (slotKeyPrefix).
	slot bool
}

// With returns a copy of p with the given options. They replace p's options
// as a whole, not field by field: in p.With(a).With(b) only b counts (a's
// UniqueKey, say, is dropped without a word). Build one InsertOpts and pass
// it once.
func (p InsertParams) With(opts InsertOpts) InsertParams {
	p.opts = opts
	return p
}

// InsertOpts are per-instance insert options. The zero value uses the
// machine's defaults.
type InsertOpts struct {
	// Queue overrides the machine's queue. It is not checked against the
	// queues any engine works: an instance of a queue no engine serves
	// stays runnable ("waiting for a worker") until one does.
	Queue string
	// Priority orders runnable instances of a queue: lower runs first.
	// Range -32768..32767; default 0.
	Priority int
	// RunAt makes the instance eligible at this time (compared with the
	// database clock), from 0001-01-02 to 9999-12-31 00:00 UTC (so that its
	// year has four digits in every time zone). Mutually exclusive with RunIn.
	RunAt time.Time
	// RunIn makes the instance eligible this long after the insert, measured
	// on the database clock. Mutually exclusive with RunAt.
	RunIn time.Duration
	// MaxAttempts overrides the machine's attempt budget.
	MaxAttempts int
	// PartitionKey: at most the key's limit of instances sharing the key run
	// a step at the same time, across every process — one at a time unless
	// KeyLimit or a [Config.KeyPolicies] entry says more (docs/design.md §6).
	// Instances without a key pay nothing. A key's instances are claimed
	// in (Priority, eligible time) order; inserted one after the other (one
	// InsertMany in the order given, or several inserts) they do not tie —
	// the nth instance of a key in one InsertMany is eligible n-1
	// microseconds after its time (RunAt included) — so at a limit of 1
	// they run in their insert order (README, "Keys and limits").
	PartitionKey string
	// KeyLimit overrides the key's limit from [Config.KeyPolicies] for this
	// instance: it is claimed only while its key holds fewer than KeyLimit
	// slots (it then takes one). The limit is checked when the instance is
	// claimed, not for as long as it runs: a Next that goes straight on keeps
	// its slot, so when instances of one key carry different limits, a
	// KeyLimit 1 instance's later steps may run beside instances with a
	// larger limit claimed after it. Give every instance of a key the same
	// limit (a KeyPolicy does) to hold the key to it. 0: the policy's
	// (default 1); at most 1<<20. Needs a PartitionKey.
	KeyLimit int
	// UniqueKey: while an instance with this key is in one of UniqueScope's
	// statuses, inserting another with the same key inserts nothing and
	// returns the existing instance's id with Duplicate set. Enforced by a
	// unique index, so it holds across processes and within one InsertMany.
	// One namespace for the whole schema: the key is not scoped by machine
	// or queue (unlike River's per-kind uniqueness) — an insert of another
	// machine with the same key is a duplicate of the holder; put the
	// machine's name in the key (say "invoice:42") to scope it.
	// At most 1000 bytes of valid UTF-8 without control characters or
	// bidirectional controls, neither starting nor ending with white space,
	// like PartitionKey (so that an operator can search for it, and it
	// shows as it is stored).
	UniqueKey string
	// UniqueScope lists the statuses in which the key is held. It must
	// include every live status (runnable, executing, awaiting_signal,
	// awaiting_children); add StatusDone and/or StatusFailed to keep the key
	// after the instance finishes. Default: the live statuses.
	UniqueScope []Status
	// UniqueByArgs derives the unique key from the machine's name (not its
	// version) and the instance's state as encoding/json writes it (a
	// struct's fields in their order, a map's keys sorted, a RawMessage
	// compacted but its keys in its own order): "args:" + name + ":" + the
	// SHA-256 of the JSON, in hex. So a second insert of the same job with
	// the same arguments, while the first is in UniqueScope, is a
	// Duplicate — River's UniqueOpts.ByArgs, but not its default ByState:
	// River's holds the key after the job completed, this one (UniqueLive)
	// only while the instance is live, so a second insert after the first
	// is done runs the job again; for River's default set UniqueScope to
	// the live statuses plus StatusDone (River's cancelled and discarded
	// jobs, which its default leaves out, are both StatusFailed here:
	// UniqueForever, which holds failed instances too, is not River's
	// default). States equal as jsonb but
	// written otherwise (keys of a RawMessage in another order, -0 and 0)
	// are different keys. Not with a UniqueKey; a UniqueKey of your own
	// starting "args:" or "period:" shares their namespace.
	UniqueByArgs bool
	// UniquePeriod makes the unique key hold within one period: the start
	// of the period the instance is to run in (RunAt, else now plus RunIn,
	// on this process's clock, in UTC, with time.Time's Truncate: periods
	// counted from the zero time, so an hour or a day starts on the hour or
	// at midnight UTC), and the period's length, are added to the key — to
	// UniqueKey, to the one UniqueByArgs derives, or, with neither, to
	// "period:" + the machine's name: one instance of the machine per
	// period (River's UniqueOpts.ByPeriod). With it, UniqueScope defaults
	// to UniqueForever (a finished instance holds its period too, as
	// River's does), not UniqueLive — until the prune deletes it: keep
	// [Config].Retention longer than the period, or a finished instance's
	// period is free again after the retention (a probe: a month's period,
	// the default retention of 7 days). At least a second.
	UniquePeriod time.Duration
}

// UniqueLive is the default unique scope: the key is free again once the
// instance is done or failed.
var UniqueLive = []Status{StatusRunnable, StatusExecuting, StatusAwaitingSignal, StatusAwaitingChildren}

// UniqueForever keeps the key for as long as the row exists (until pruned).
var UniqueForever = []Status{StatusRunnable, StatusExecuting, StatusAwaitingSignal, StatusAwaitingChildren, StatusDone, StatusFailed}

// statusOrder is the order of the gendurable_status enum; bit k of a scope
// mask stands for statusOrder[k].
var statusOrder = []Status{StatusRunnable, StatusExecuting, StatusAwaitingSignal, StatusAwaitingChildren, StatusDone, StatusFailed}

// scopeMask validates a unique scope and encodes it as a bit mask.
func scopeMask(scope []Status) (int32, error) {
	if len(scope) == 0 {
		scope = UniqueLive
	}
	var mask int32
	for _, st := range scope {
		k := slices.Index(statusOrder, st)
		if k < 0 {
			return 0, errorf(ErrInvalidInsert, "unknown status %q in UniqueScope", st)
		}
		mask |= 1 << k
	}
	for k, st := range statusOrder[:4] {
		if mask&(1<<k) == 0 {
			return 0, errorf(ErrInvalidInsert, "UniqueScope must include every live status; %q is missing (a live instance moves through all of them)", st)
		}
	}
	return mask, nil
}

// InsertResult is what an insert produced.
//
// A duplicate's ID is read by a second statement after the insert: if the
// instance holding the key left the key's scope in between (it finished,
// under the default UniqueLive), ID is 0 — nothing was inserted, and the
// key is free again, so inserting once more creates a new instance. That
// read is not cancelled with the caller's context (the insert has
// returned: outside a transaction its rows are committed); if it fails all
// the same (a lost connection), Insert and InsertMany still succeed, log a
// warning, and the duplicates' IDs are 0 with the key possibly still held.
// InsertTx and InsertManyTx return that failure: the caller's transaction
// cannot commit after it.
type InsertResult struct {
	ID        int64 // the new instance's id, or for a duplicate the existing one's (0: see above)
	Duplicate bool  // the unique key was held (by an instance in a status of its UniqueScope, of any machine): nothing was inserted
}

// Insert inserts one instance and, when this engine works its queue, wakes
// the local feeder at once.
//
// An error is not always proof that nothing was written: if the context
// ends or the connection is lost while the statement is in flight, the
// server may have committed it before the answer came back (the error then
// is the context's or the connection's, never ErrInvalidInsert). To retry
// such an insert safely, give it an [InsertOpts].UniqueKey: a retry that
// finds it committed reports Duplicate with its id. The same holds for
// [Engine.InsertMany] (all or none of its rows) and [Engine.Signal] (give
// it a DedupKey).
func (e *Engine) Insert(ctx context.Context, p InsertParams) (InsertResult, error) {
	if err := e.usable(ctx, "Insert"); err != nil {
		return InsertResult{}, err
	}
	res, err := e.insert(ctx, e.pool, []InsertParams{p})
	if err != nil {
		return InsertResult{}, err
	}
	e.wake([]InsertParams{p}, false)
	return res[0], nil
}

// InsertMany inserts all instances in one statement: all or none are inserted.
// Results are in the order of ps; an invalid one is [ErrInvalidInsert] (or
// [ErrUnknownMachine]) naming its index in ps ("insert #3: …"), before any
// SQL. Batches whose unique keys overlap may run at once from any number of
// processes, each in its own order: the rows with unique keys go in in key
// order, so no two such statements — nor such a statement and a fan-out's
// children ([Run.ScheduleChildren]) — wait for each other in a cycle (ids follow that
// order, not ps's; rows of one partition key still run in ps's order,
// their eligible times spaced a microsecond apart, and other rows that tie
// on priority and eligible time run in no promised order). One statement holds its new rows' unique keys until it
// commits: a batch of 100,000 is a few seconds of a single statement.
func (e *Engine) InsertMany(ctx context.Context, ps []InsertParams) ([]InsertResult, error) {
	if err := e.usable(ctx, "InsertMany"); err != nil {
		return nil, err
	}
	res, err := e.insert(ctx, e.pool, ps)
	if err != nil {
		return nil, err
	}
	e.wake(ps, false)
	return res, nil
}

// encodeForInsert encodes an insert's state, a panic of its MarshalJSON
// included: that is ErrStateEncode here, as a step's is its kind "panic"
// (a hostile probe's panicking MarshalJSON reached the inserting caller).
func encodeForInsert(core *machineCore, state any) (s string, err error) {
	defer func() {
		if v := recover(); v != nil {
			s, err = "", fmt.Errorf("%w: its MarshalJSON panicked: %v", ErrStateEncode, v)
		}
	}()
	return core.encode(state)
}

// InsertTx inserts one instance inside the caller's transaction, so it
// commits or rolls back with the caller's own writes. Workers find it by
// polling once the transaction commits; this engine's own feeder of the
// queue polls again from its busy interval (QueueConfig.BusyPollInterval),
// doubling while it finds nothing, so a transaction that commits d after
// the insert has its row picked within about 2d plus that interval.
// Other processes find it by their own polls. Invalid input — options out of
// range, a state that does not encode to JSON (also [ErrStateEncode]), one
// over the limits or one PostgreSQL cannot store (a NUL character, a lone
// UTF-16 surrogate escape), a RunAt outside its timestamps — is
// [ErrInvalidInsert] before any SQL runs, so the transaction is left usable.
func (e *Engine) InsertTx(ctx context.Context, tx pgx.Tx, p InsertParams) (InsertResult, error) {
	if err := e.usable(ctx, "InsertTx"); err != nil {
		return InsertResult{}, err
	}
	if tx == nil {
		return InsertResult{}, errorf(ErrInvalidInsert, "InsertTx: nil transaction")
	}
	res, err := e.insert(ctx, tx, []InsertParams{p})
	if err != nil {
		return InsertResult{}, err
	}
	e.wake([]InsertParams{p}, true)
	return res[0], nil
}

// InsertManyTx inserts all instances in one statement inside the caller's
// transaction, as [Engine.InsertMany] does; invalid input is
// [ErrInvalidInsert] before any SQL, so the transaction is left usable, as
// with [Engine.InsertTx].
func (e *Engine) InsertManyTx(ctx context.Context, tx pgx.Tx, ps []InsertParams) ([]InsertResult, error) {
	if err := e.usable(ctx, "InsertManyTx"); err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, errorf(ErrInvalidInsert, "InsertManyTx: nil transaction")
	}
	res, err := e.insert(ctx, tx, ps)
	if err != nil {
		return nil, err
	}
	e.wake(ps, true)
	return res, nil
}

func (e *Engine) insert(ctx context.Context, db sqlq.DB, ps []InsertParams) ([]InsertResult, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	rows := make([]sqlq.NewInstance, len(ps))
	for i, p := range ps {
		r, err := e.newInstance(p)
		if err != nil {
			if len(ps) > 1 {
				return nil, fmt.Errorf("insert #%d: %w", i, err)
			}
			return nil, err
		}
		rows[i] = r
	}
	got, err := e.q.InsertMany(ctx, db, rows)
	if lerr := (*sqlq.LookupError)(nil); errors.As(err, &lerr) && db == sqlq.DB(e.pool) {
		// The rows were inserted (committed, outside a transaction): the
		// call succeeded; only the duplicates' holders are unknown (ID 0).
		// In the caller's transaction the failed lookup has doomed it: the
		// error is returned (InsertTx, InsertManyTx).
		e.log.Warn("gendurable: inserted; the ids of the instances holding duplicate unique keys could not be read (their results have ID 0)",
			sqlq.ErrAttrs(lerr.Err)...)
		err = nil
	}
	if err != nil {
		if sqlq.Rejected(err) {
			// E.g. a JSON string holding \u0000, which jsonb cannot store.
			return nil, fmt.Errorf("%w: the database rejected the values: %w", ErrInvalidInsert, err)
		}
		return nil, e.dbErr(ctx, err, "insert")
	}
	out := make([]InsertResult, len(got))
	for i, g := range got {
		out[i] = InsertResult{ID: g.ID, Duplicate: g.Duplicate}
	}
	return out, nil
}

// newInstance validates one insert and encodes it for the database.
func (e *Engine) newInstance(p InsertParams) (sqlq.NewInstance, error) {
	return newInstance(e.registry, e.stateLimits, p)
}

// newInstance validates one insert against registry (nil: any valid
// definition, for gendurabletest.RunStep) and limits, and encodes it.
func newInstance(registry map[machineKey]*machineCore, limits jsonLimits, p InsertParams) (sqlq.NewInstance, error) {
	if p.def == nil {
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "InsertParams has no machine (use Machine.New or Job.New)")
	}
	core, err := p.def.definition()
	if err != nil {
		// An invalid definition (a nil *Machine, a Job without Perform)
		// cannot be in Config.Machines: New refuses it. It was
		// ErrInvalidConfig alone, which code branching on an insert's
		// documented errors missed (a misuse probe).
		return sqlq.NewInstance{}, fmt.Errorf("%w: its definition is invalid, so no engine can have it registered: %w", ErrInvalidInsert, err)
	}
	if reg := registry[machineKey{core.name, core.version}]; registry != nil && reg != core {
		if reg != nil {
			// Registration is by value: the engine runs the steps of the
			// *Machine it was given, and this one may differ from it.
			return sqlq.NewInstance{}, errorf(ErrUnknownMachine, "%q version %d: Config.Machines holds another *Machine "+
				"(or *Job) value of that name and version; insert with the one registered (build it once and share it)",
				core.name, core.version)
		}
		return sqlq.NewInstance{}, errorf(ErrUnknownMachine, "%q version %d (add it to Config.Machines)", core.name, core.version)
	}
	o := p.opts
	switch {
	case o.Priority < math.MinInt16 || o.Priority > math.MaxInt16:
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "Priority %d outside %d..%d", o.Priority, math.MinInt16, math.MaxInt16)
	case o.MaxAttempts < 0 || o.MaxAttempts > math.MaxInt32:
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "MaxAttempts %d outside 1..%d (0 = machine default)", o.MaxAttempts, math.MaxInt32)
	case o.RunIn < 0:
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "negative RunIn %s", o.RunIn)
	case !o.RunAt.IsZero() && o.RunIn != 0:
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "RunAt and RunIn are mutually exclusive")
	case !o.RunAt.IsZero() && (o.RunAt.Before(minRunAt) || o.RunAt.After(maxRunAt)):
		// Refused before SQL: PostgreSQL's refusal of a year it cannot
		// hold would abort an InsertTx caller's transaction, and a year it
		// holds past 9999 could not be written out as RFC 3339.
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "RunAt %s outside %s..%s (a row's times are written out as RFC 3339, with four-digit years, in any time zone)",
			o.RunAt.UTC().Format(time.RFC3339), minRunAt.Format(time.RFC3339), maxRunAt.Format(time.RFC3339))
	case o.Queue != "" && nameProblem(o.Queue) != "":
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "Queue name %s %s", quoted(o.Queue), nameProblem(o.Queue))
	case keyProblem(o.PartitionKey) != "":
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "PartitionKey %s", keyProblem(o.PartitionKey))
	case keyProblem(o.UniqueKey) != "":
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "UniqueKey %s", keyProblem(o.UniqueKey))
	case !p.slot && strings.HasPrefix(o.UniqueKey, slotKeyPrefix):
		// Such a key, held by another instance, would make a Periodic take
		// its slot for run and insert nothing.
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "UniqueKey %q: keys starting with %q are reserved for Periodic slots",
			o.UniqueKey, slotKeyPrefix)
	case o.KeyLimit < 0 || o.KeyLimit > maxKeyLimit:
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "KeyLimit %d outside 1..%d (0: the key's policy)", o.KeyLimit, maxKeyLimit)
	case o.KeyLimit > 0 && o.PartitionKey == "":
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "KeyLimit without a PartitionKey")
	case p.slot && (o.UniqueByArgs || o.UniquePeriod != 0):
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "a Periodic's slot has its own unique key: no UniqueByArgs or UniquePeriod")
	case o.UniqueByArgs && o.UniqueKey != "":
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "UniqueByArgs and a UniqueKey: set one (UniqueByArgs derives the key)")
	case o.UniquePeriod < 0 || o.UniquePeriod > 0 && o.UniquePeriod < time.Second:
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "UniquePeriod %s below a second (0: none)", o.UniquePeriod)
	}
	state, err := encodeForInsert(core, p.state)
	if err != nil {
		// ErrStateEncode, and an insert's refusal like every other: code
		// that branches on ErrInvalidInsert for bad input (InsertTx's
		// doc) missed a NaN or a channel in the state (an API probe).
		return sqlq.NewInstance{}, fmt.Errorf("%w: %w", ErrInvalidInsert, err)
	}
	if err := checkInputJSON(limits, "state", state, ErrInvalidInsert); err != nil {
		return sqlq.NewInstance{}, err
	}
	switch {
	case o.UniqueByArgs:
		sum := sha256.Sum256([]byte(state))
		o.UniqueKey = "args:" + core.name + ":" + hex.EncodeToString(sum[:])
	case o.UniquePeriod > 0 && o.UniqueKey == "":
		o.UniqueKey = "period:" + core.name
	}
	if o.UniquePeriod > 0 {
		at := o.RunAt
		if at.IsZero() {
			at = time.Now().Add(o.RunIn)
		}
		o.UniqueKey += "@" + at.UTC().Truncate(o.UniquePeriod).Format(time.RFC3339) + "/" + o.UniquePeriod.String()
		if len(o.UniqueScope) == 0 {
			o.UniqueScope = UniqueForever
		}
		if p := keyProblem(o.UniqueKey); p != "" {
			return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "UniqueKey with its period %s", p)
		}
	}
	r := sqlq.NewInstance{
		FSM: core.name, Version: int32(core.version), Queue: orDefault(o.Queue, core.queue),
		Step: core.start, State: state, Priority: int16(o.Priority),
		MaxAttempts: int32(orDefault(o.MaxAttempts, core.maxAttempts)), RunIn: o.RunIn, Slot: p.slot,
	}
	if !o.RunAt.IsZero() {
		t := o.RunAt
		r.RunAt = &t
	}
	if o.PartitionKey != "" {
		k := o.PartitionKey
		r.PartitionKey = &k
	}
	if o.KeyLimit > 0 {
		l := int32(o.KeyLimit)
		r.KeyLimit = &l
	}
	if o.UniqueKey != "" {
		mask, err := scopeMask(o.UniqueScope)
		if err != nil {
			return sqlq.NewInstance{}, err
		}
		r.UniqueKey, r.ScopeMask = []byte(o.UniqueKey), mask
	} else if len(o.UniqueScope) > 0 {
		return sqlq.NewInstance{}, errorf(ErrInvalidInsert, "UniqueScope without a UniqueKey")
	}
	return r, nil
}

// wake kicks the local feeders of the queues that just received runnable
// work, and asks them to wake when rows inserted for later become eligible.
// inTx: the rows are in the caller's transaction, which commits later (or
// never), so a pick at once may not see them: the feeders are hurried
// (feeder.Hurry), their polls back at the busy interval, rather than only
// kicked. Before, an InsertTx into an idle queue waited for the idle poll
// (a River user's probe: 0.4 to 4 s, where Insert took 3 ms).
func (e *Engine) wake(ps []InsertParams, inTx bool) {
	e.mu.Lock()
	scheds := e.scheds
	e.mu.Unlock()
	if scheds == nil {
		return
	}
	seen := map[string]bool{}
	ofKey := map[string]int{} // the nth row of a key is eligible n-1 µs after its time (sqlq's newRows)
	for _, p := range ps {
		core, _ := p.def.definition()
		q := orDefault(p.opts.Queue, core.queue)
		var spaced time.Duration
		if k := p.opts.PartitionKey; k != "" {
			spaced = time.Duration(ofKey[k]) * time.Microsecond
			ofKey[k]++
		}
		if at := p.opts.RunAt; !at.IsZero() || p.opts.RunIn > 0 {
			// Eligible later: wake the feeder then (RunAt is on the
			// database clock; this process's clock stands in for it). A
			// RunIn counts from now, after the insert's statement read its
			// clock, so it needs no spacing; a RunAt does: a wake at the
			// bare RunAt ran a pick before the row was eligible, and nothing
			// looked again until the idle poll (5 s).
			if at.IsZero() {
				at = time.Now().Add(p.opts.RunIn)
			} else {
				at = at.Add(spaced)
			}
			if s := scheds[q]; s != nil {
				switch {
				case at.After(time.Now()):
					s.KickAt(at)
				case p.opts.PartitionKey == "":
					s.KickBelow(at) // eligible already, maybe below the pick's floor
				case !inTx:
					s.Kick() // keyed rows have no floor
				}
				if inTx {
					// The commit may come after the row's time: the wake
					// at it would find nothing, so the polls are hurried
					// too (a review: a RunIn of 50 ms committed 300 ms
					// later waited for the idle poll).
					s.Hurry()
				}
			}
			continue
		}
		if seen[q] {
			continue
		}
		seen[q] = true
		if s := scheds[q]; s != nil {
			if inTx {
				s.Hurry() // the pick may come before the commit
			} else {
				s.Kick()
			}
		}
	}
}
