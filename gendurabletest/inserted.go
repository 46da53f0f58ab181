package gendurabletest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/internal/testlink"
	"github.com/jackc/pgx/v5"
)

// Typed is a machine or job whose state (arguments) is S: a
// *gendurable.Machine[S] or a *gendurable.Job[S]. It lets the helpers infer
// S from the definition they are given.
type Typed[S any] interface {
	gendurable.Definition
	New(state S) gendurable.InsertParams
}

// MaxInspected is how many instances of a machine the Require*Inserted
// assertions look at: the newest, by id. A failure message says when there
// were more.
const MaxInspected = 1000

// maxListed bounds the instances a failure message lists.
const maxListed = 10

// InsertedOpts narrow which instances of the machine match. Zero fields
// do not narrow.
type InsertedOpts[S any] struct {
	Queue    string
	Priority *int   // e.g. new(5); nil: any priority
	Step     string // the step the instance is at now
	Status   gendurable.Status
	// State, if set, must return true for the instance's decoded state.
	State func(S) bool
}

// Inserted is an instance that matched: the row as [gendurable.Engine.Instance]
// reads it, with its state decoded. State shadows the embedded
// Instance.State, which keeps the JSON.
type Inserted[S any] struct {
	gendurable.Instance
	State S
}

// RequireInserted fails the test unless exactly one instance of def's
// machine (at def's version) matches opts in eng's schema, and returns it.
// It reads through eng's pool, so it sees what was committed; use
// [RequireInsertedTx] for an insert inside a transaction. The failure
// message lists what was inserted for the machine (at most 10 instances).
//
//	got := gendurabletest.RequireInserted(ctx, t, eng, Order, &gendurabletest.InsertedOpts[OrderState]{
//		Queue: "billing",
//		State: func(s OrderState) bool { return s.Item == "book" },
//	})
func RequireInserted[S any](ctx context.Context, tb testing.TB, eng *gendurable.Engine, def Typed[S], opts *InsertedOpts[S]) *Inserted[S] {
	tb.Helper()
	if ctx == nil {
		tb.Fatalf("gendurabletest: RequireInserted: nil context (use t.Context())")
	}
	return requireOne(ctx, tb, eng, nil, def, opts)
}

// RequireInsertedTx is [RequireInserted] reading through tx, so it sees
// what tx inserted and has not committed.
func RequireInsertedTx[S any](ctx context.Context, tb testing.TB, eng *gendurable.Engine, tx pgx.Tx, def Typed[S], opts *InsertedOpts[S]) *Inserted[S] {
	tb.Helper()
	if ctx == nil {
		tb.Fatalf("gendurabletest: RequireInsertedTx: nil context (use t.Context())")
	}
	if tx == nil {
		tb.Fatalf("gendurabletest: RequireInsertedTx: nil tx")
	}
	return requireOne(ctx, tb, eng, tx, def, opts)
}

// RequireNotInserted fails the test if any instance of def's machine
// matches opts, listing those that do.
func RequireNotInserted[S any](ctx context.Context, tb testing.TB, eng *gendurable.Engine, def Typed[S], opts *InsertedOpts[S]) {
	tb.Helper()
	if ctx == nil {
		tb.Fatalf("gendurabletest: RequireNotInserted: nil context (use t.Context())")
	}
	f := find(ctx, tb, eng, nil, def, opts)
	if len(f.matched) > 0 {
		tb.Fatalf("gendurabletest: want no instance of %s%s, found %d:\n%s", f.what, f.opts, len(f.matched), listing(f.matched, f.truncated))
	}
}

func requireOne[S any](ctx context.Context, tb testing.TB, eng *gendurable.Engine, db sqlq.DB, def Typed[S], opts *InsertedOpts[S]) *Inserted[S] {
	tb.Helper()
	f := find(ctx, tb, eng, db, def, opts)
	switch {
	case len(f.matched) == 1:
		return f.matched[0]
	case len(f.matched) > 1:
		tb.Fatalf("gendurabletest: want one instance of %s%s, found %d (narrow it with InsertedOpts):\n%s",
			f.what, f.opts, len(f.matched), listing(f.matched, f.truncated))
	case len(f.all) == 0:
		tb.Fatalf("gendurabletest: want one instance of %s%s, found none: no instance of %s was inserted", f.what, f.opts, f.what)
	default:
		tb.Fatalf("gendurabletest: want one instance of %s%s, found none; inserted were %d:\n%s",
			f.what, f.opts, len(f.all), listing(f.all, f.truncated))
	}
	return nil
}

type found[S any] struct {
	what      string // machine "name" version n
	opts      string // the options, for messages
	all       []*Inserted[S]
	matched   []*Inserted[S]
	truncated bool // there were more than MaxInspected
}

func find[S any](ctx context.Context, tb testing.TB, eng *gendurable.Engine, db sqlq.DB, def Typed[S], opts *InsertedOpts[S]) found[S] {
	tb.Helper()
	if eng == nil {
		tb.Fatalf("gendurabletest: nil engine")
	}
	d, err := testlink.Describe(def)
	if err != nil {
		tb.Fatalf("gendurabletest: %v", err)
	}
	if opts == nil {
		opts = &InsertedOpts[S]{}
	}
	rows, err := testlink.Instances(ctx, eng, db, def, MaxInspected+1)
	if err != nil {
		tb.Fatalf("gendurabletest: %v", err)
	}
	f := found[S]{what: fmt.Sprintf("machine %q version %d", d.Name, d.Version), opts: describeOpts(opts)}
	if len(rows) > MaxInspected {
		rows, f.truncated = rows[1:], true // ascending: drop the oldest
	}
	for _, r := range rows {
		in := &Inserted[S]{Instance: *r.(*gendurable.Instance)}
		decodeErr := json.Unmarshal(in.Instance.State, &in.State)
		f.all = append(f.all, in)
		switch {
		case opts.Queue != "" && in.Queue != opts.Queue,
			opts.Priority != nil && in.Priority != *opts.Priority,
			opts.Step != "" && in.Step != opts.Step,
			opts.Status != "" && in.Status != opts.Status:
			continue
		case opts.State != nil && decodeErr != nil:
			tb.Logf("gendurabletest: instance %d: state %s does not decode into %T: %v", in.ID, in.Instance.State, in.State, decodeErr)
			continue
		case opts.State != nil && !opts.State(in.State):
			continue
		}
		f.matched = append(f.matched, in)
	}
	return f
}

func describeOpts[S any](o *InsertedOpts[S]) string {
	var parts []string
	if o.Queue != "" {
		parts = append(parts, fmt.Sprintf("queue %q", o.Queue))
	}
	if o.Priority != nil {
		parts = append(parts, fmt.Sprintf("priority %d", *o.Priority))
	}
	if o.Step != "" {
		parts = append(parts, fmt.Sprintf("step %q", o.Step))
	}
	if o.Status != "" {
		parts = append(parts, fmt.Sprintf("status %s", o.Status))
	}
	if o.State != nil {
		parts = append(parts, "a state matching the predicate")
	}
	if len(parts) == 0 {
		return ""
	}
	return " with " + strings.Join(parts, ", ")
}

// listing shows instances one a line, the first maxListed of them.
func listing[S any](ins []*Inserted[S], truncated bool) string {
	var b strings.Builder
	for i, in := range ins {
		if i == maxListed {
			fmt.Fprintf(&b, "    … and %d more\n", len(ins)-maxListed)
			break
		}
		fmt.Fprintf(&b, "    id %d: queue %q, priority %d, step %q, %s, state %s\n",
			in.ID, in.Queue, in.Priority, in.Step, in.Status, clip(string(in.Instance.State), 200))
	}
	if truncated {
		fmt.Fprintf(&b, "    (only the newest %d instances were looked at)\n", MaxInspected)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// clip shortens s to at most n bytes, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
