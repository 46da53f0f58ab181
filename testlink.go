package gendurable

import (
	"context"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/internal/testlink"
)

// The functions package gendurabletest reaches through internal/testlink:
// they run the engine's own code, so what a test sees is what the engine
// would do.
func init() {
	testlink.Describe = describeForTest
	testlink.RunStep = runStepForTest
	testlink.Instances = instancesForTest
}

func coreOf(def any) (*machineCore, error) {
	d, ok := def.(Definition)
	if !ok || d == nil {
		return nil, errorf(ErrInvalidConfig, "%T is not a *Machine or *Job", def)
	}
	return d.definition()
}

func describeForTest(def any) (testlink.Def, error) {
	core, err := coreOf(def)
	if err != nil {
		return testlink.Def{}, err
	}
	return testlink.Def{Name: core.name, Version: core.version, Queue: core.queue, Steps: sortedKeys(core.steps),
		MaxAttempts: core.maxAttempts, ReadsInbox: core.readsInbox}, nil
}

// runStepForTest runs one step the way the executor does (executor.run.step
// and runStep): under the StepTimeout, with the inbox only after an await
// or for a machine that reads it, the children after a fan-out — and with
// the default limits of Config.
func runStepForTest(ctx context.Context, def any, in testlink.StepInput) (testlink.StepOutput, error) {
	core, err := coreOf(def)
	if err != nil {
		return testlink.StepOutput{}, err
	}
	var registry map[machineKey]*machineCore
	if in.Registered != nil {
		registry = map[machineKey]*machineCore{{core.name, core.version}: core}
		for _, d := range in.Registered {
			c, err := coreOf(d)
			if err != nil {
				return testlink.StepOutput{}, err
			}
			registry[machineKey{c.name, c.version}] = c
		}
	}
	for _, s := range in.Claim.Inbox {
		// A signal no engine could hold (an empty name, say) is the test's
		// mistake: as Signal refuses it (a misuse probe's RunStep took one).
		if err := validateSignalName(s.Name); err != nil {
			return testlink.StepOutput{}, fmt.Errorf("%w: StepOpts.Inbox signal %d: %v", ErrInvalidSignal, s.ID, err)
		}
	}
	limits := jsonLimits{maxBytes: DefaultMaxStateBytes, bytesName: "MaxStateBytes", maxDepth: DefaultMaxJSONDepth}
	x := &execInput{
		Input:    &executor.Input{Claim: &in.Claim, Queue: in.Queue},
		limits:   limits,
		newChild: func(p InsertParams) (sqlq.NewInstance, error) { return newInstance(registry, limits, p) },
		direct:   true,
	}
	if in.Claim.Awaits != nil || core.readsInbox {
		x.Inbox = in.Claim.Inbox
	}
	if len(in.Children) > 0 {
		x.Children = in.Children
	}
	run := func(fn func(ctx context.Context) executor.Result) testlink.StepOutput {
		if core.stepTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, core.stepTimeout, ErrStepTimeout)
			defer cancel()
		}
		res := fn(ctx)
		return testlink.StepOutput{Out: res.Out, StepErr: res.StepErr, TxFn: res.TxFn, Rejected: outcomeRejected(&res.Out)}
	}
	out := run(func(ctx context.Context) executor.Result { return core.exec(ctx, x) })
	out.Handle = func(ctx context.Context, err error) testlink.StepOutput {
		return run(func(ctx context.Context) executor.Result { return core.handleErr(ctx, x, err) })
	}
	return out, nil
}

func instancesForTest(ctx context.Context, eng any, db sqlq.DB, def any, limit int) ([]any, error) {
	e, ok := eng.(*Engine)
	if !ok || e == nil {
		return nil, fmt.Errorf("%w: nil engine", ErrInvalidConfig)
	}
	core, err := coreOf(def)
	if err != nil {
		return nil, err
	}
	if db == nil {
		db = e.pool
	}
	rows, err := e.q.InstancesOf(ctx, db, core.name, int32(core.version), limit)
	if err != nil {
		return nil, fmt.Errorf("gendurable: reading instances of %q: %w", core.name, err)
	}
	out := make([]any, 0, len(rows))
	for _, r := range rows {
		in, err := instanceFromRow(r)
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].(*Instance).ID < out[j].(*Instance).ID })
	return out, nil
}

// outcomeRejected says why PostgreSQL would refuse the encoded outcome o,
// or "": a state or Done result that jsonb cannot store (a NUL, a lone
// surrogate, invalid UTF-8). The engine checks an outcome's size, depth
// and numbers before it writes it (checkJSON), not these: its statement's
// refusal fails the instance (sqlq.RejectedStop), and RunStep says so.
func outcomeRejected(o *sqlq.Outcome) string {
	for _, d := range []struct {
		what string
		doc  *string
	}{{"state", o.State}, {"Done result", o.Result}} {
		switch {
		case d.doc == nil:
		case jsonbProblem(*d.doc) != "":
			return d.what + " " + jsonbProblem(*d.doc)
		case !utf8.ValidString(*d.doc):
			return d.what + " is not valid UTF-8"
		}
	}
	return ""
}
