//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/gendurable/gendurable"
)

// FlowState is the state of the "flow" machine: start → (await "go") →
// fanout (children) → join → done.
type FlowState struct {
	Seq     int  `json:"seq"`
	Await   bool `json:"await,omitempty"`    // park at start until a "go" signal
	Kids    int  `json:"kids,omitempty"`     // children scheduled by fanout
	Depth   int  `json:"depth,omitempty"`    // > 1: the children are flows themselves (nested fan-out)
	KidKeys int  `json:"kid_keys,omitempty"` // > 0: children get one of this many partition keys
	SleepMs int  `json:"sleep_ms,omitempty"` // each step works up to this long
}

// LeafState is the state of the one-step "leaf" machine.
type LeafState struct {
	Seq     int `json:"seq"`
	SleepMs int `json:"sleep_ms,omitempty"`
	// Fence: a keyed leaf writes its key's fenced resource (chaos_fenced)
	// with its claim token when its work starts and when it ends.
	Fence bool `json:"fence,omitempty"`
	// IgnoreCtx: the leaf ignores its context (it works to the end and
	// writes the fenced resource whatever happens): the checker leaves its
	// runs out of the partition overlaps, which promise nothing for them.
	IgnoreCtx bool `json:"ignore_ctx,omitempty"`
	// TxHoldMs: a keyed leaf updates its key's row of chaos_key_tx in its
	// WithTx outcome and then holds the transaction open, idle, this long.
	TxHoldMs int `json:"tx_hold_ms,omitempty"`
	// Exact: work exactly SleepMs, not a random part of it.
	Exact bool `json:"exact,omitempty"`
}

// WaiterState is the state of the "waiter" machine: it awaits "pay"
// signals until it has received Rounds of them.
type WaiterState struct {
	Seq     int `json:"seq"`
	Round   int `json:"round"`
	Rounds  int `json:"rounds"`
	SleepMs int `json:"sleep_ms,omitempty"`
}

// DecodeState is the state of "poison_decode"; the harness corrupts the
// stored JSON so that it no longer decodes into it.
type DecodeState struct {
	N int `json:"n"`
}

// EncodeState is the state of "poison_encode", whose step returns a state
// that cannot be encoded (NaN).
type EncodeState struct {
	F float64 `json:"f"`
}

// BlobState is a state holding anything (NUL strings, deep nesting).
type BlobState struct {
	Seq int `json:"seq"`
	V   any `json:"v,omitempty"`
}

// Machines holds the harness's machine definitions, typed, for inserting.
type Machines struct {
	Flow   *gendurable.Machine[FlowState]
	Leaf   *gendurable.Machine[LeafState]
	Waiter *gendurable.Machine[WaiterState]

	// Plain is a leaf without the oracle: its outcome is an ordinary
	// group-committed one (no WithTx). Bystander of the poison scenario.
	Plain *gendurable.Machine[LeafState]

	PoisonPanic     *gendurable.Machine[LeafState]
	PoisonLoop      *gendurable.Machine[LeafState]
	PoisonDecode    *gendurable.Machine[DecodeState]
	PoisonEncode    *gendurable.Machine[EncodeState]
	PoisonHandle    *gendurable.Machine[LeafState]
	PoisonNUL       *gendurable.Machine[BlobState]
	PoisonDeep      *gendurable.Machine[BlobState] // deep state in a WithTx outcome
	PoisonDeepPlain *gendurable.Machine[BlobState] // deep state in a group-committed outcome

	ClockSleep *gendurable.Machine[LeafState] // Next(...).After(d)
	ClockAwait *gendurable.Machine[LeafState] // Await(...).Timeout(d)
	ClockLong  *gendurable.Machine[LeafState] // a step longer than the lease
	ClockHang  *gendurable.Machine[LeafState] // hangs in a hanging worker (killed), quick elsewhere

	All []gendurable.Definition
}

// Knobs are per-process switches of the machines.
type Knobs struct {
	Hang        bool          // ClockHang hangs (this worker gets killed)
	ClockSleep  time.Duration // the durable sleep of ClockSleep and timeout of ClockAwait
	LongStep    time.Duration // how long ClockLong works
	DeepNesting int           // nesting depth of the poison deep states
}

// chaosBackoff retries quickly: the harness wants recoveries, not waits.
func chaosBackoff(int) time.Duration { return 50*time.Millisecond + rand.N(100*time.Millisecond) }

func poisonBackoff(int) time.Duration { return 30 * time.Millisecond }

func jitter(ms int) time.Duration {
	if ms <= 0 {
		return 0
	}
	return time.Duration(rand.IntN(ms)+1) * time.Millisecond
}

// NewMachines builds every machine of the harness on rt (rt.Pool may be nil
// when the machines are only used for inserting).
func NewMachines(rt *Runtime, k Knobs) *Machines {
	if k.ClockSleep == 0 {
		k.ClockSleep = 1500 * time.Millisecond
	}
	if k.DeepNesting == 0 {
		k.DeepNesting = 5000 // over Config.MaxJSONDepth, and cheap to encode
	}
	m := &Machines{}
	m.Leaf = &gendurable.Machine[LeafState]{
		Name: "leaf", Start: "work", MaxAttempts: 25, Backoff: chaosBackoff,
		Steps: map[string]gendurable.StepFunc[LeafState]{
			"work": func(ctx context.Context, r *gendurable.Run[LeafState]) (gendurable.Outcome, error) {
				d := jitter(r.State.SleepMs)
				if r.State.Exact {
					d = ms(r.State.SleepMs)
				}
				run, err := beginFenced(ctx, rt, r, r.State.Seq, d, r.State.Fence, r.State.IgnoreCtx)
				if err != nil {
					return gendurable.Outcome{}, err
				}
				return run.commitHolding(gendurable.Done(map[string]int{"seq": r.State.Seq}), nil, ms(r.State.TxHoldMs)), nil
			},
		},
	}
	m.Flow = &gendurable.Machine[FlowState]{
		Name: "flow", Start: "start", MaxAttempts: 25, Backoff: chaosBackoff,
		Steps: map[string]gendurable.StepFunc[FlowState]{
			"start": func(ctx context.Context, r *gendurable.Run[FlowState]) (gendurable.Outcome, error) {
				run, err := beginWork(ctx, rt, r, r.State.Seq, jitter(r.State.SleepMs))
				if err != nil {
					return gendurable.Outcome{}, err
				}
				s := r.State
				s.Seq++
				if s.Await {
					return run.commit(r.Await("fanout", s, "go"), nil), nil
				}
				return run.commit(r.Next("fanout", s), nil), nil
			},
			"fanout": func(ctx context.Context, r *gendurable.Run[FlowState]) (gendurable.Outcome, error) {
				run, err := beginWork(ctx, rt, r, r.State.Seq, jitter(r.State.SleepMs))
				if err != nil {
					return gendurable.Outcome{}, err
				}
				s := r.State
				s.Seq++
				note := map[string]int{"awaited": len(r.Awaited), "scheduled": s.Kids}
				if s.Kids == 0 {
					return run.commit(r.Next("join", s), note), nil
				}
				kids := make([]gendurable.InsertParams, s.Kids)
				for i := range kids {
					var p gendurable.InsertParams
					if s.Depth > 1 {
						p = m.Flow.New(FlowState{Kids: s.Kids, Depth: s.Depth - 1, KidKeys: s.KidKeys, SleepMs: s.SleepMs})
					} else {
						p = m.Leaf.New(LeafState{SleepMs: s.SleepMs})
					}
					if s.KidKeys > 0 {
						p = p.With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("kid-%d", rand.IntN(s.KidKeys))})
					}
					kids[i] = p
				}
				return run.commit(r.ScheduleChildren("join", s, kids...), note), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[FlowState]) (gendurable.Outcome, error) {
				run, err := beginWork(ctx, rt, r, r.State.Seq, jitter(r.State.SleepMs))
				if err != nil {
					return gendurable.Outcome{}, err
				}
				terminal := 0
				for _, c := range r.Children {
					if c.Status.Terminal() {
						terminal++
					}
				}
				note := map[string]int{"children": len(r.Children), "terminal": terminal}
				return run.commit(gendurable.Done(map[string]int{"seq": r.State.Seq, "children": len(r.Children)}), note), nil
			},
		},
	}
	m.Waiter = &gendurable.Machine[WaiterState]{
		Name: "waiter", Start: "wait", MaxAttempts: 25, Backoff: chaosBackoff,
		Steps: map[string]gendurable.StepFunc[WaiterState]{
			"wait": func(ctx context.Context, r *gendurable.Run[WaiterState]) (gendurable.Outcome, error) {
				run, err := beginWork(ctx, rt, r, r.State.Seq, jitter(r.State.SleepMs))
				if err != nil {
					return gendurable.Outcome{}, err
				}
				s := r.State
				s.Seq++
				return run.commit(r.Await("got", s, "pay"), nil), nil
			},
			"got": func(ctx context.Context, r *gendurable.Run[WaiterState]) (gendurable.Outcome, error) {
				run, err := beginWork(ctx, rt, r, r.State.Seq, jitter(r.State.SleepMs))
				if err != nil {
					return gendurable.Outcome{}, err
				}
				s := r.State
				s.Round += len(r.Awaited)
				note := map[string]int{"awaited": len(r.Awaited), "round": s.Round}
				if s.Round >= s.Rounds {
					return run.commit(gendurable.Done(map[string]int{"seq": r.State.Seq, "rounds": s.Round}), note), nil
				}
				s.Seq++
				return run.commit(r.Next("wait", s), note), nil
			},
		},
	}
	m.Plain = &gendurable.Machine[LeafState]{
		Name: "plain", Start: "work", MaxAttempts: 25, Backoff: chaosBackoff,
		Steps: map[string]gendurable.StepFunc[LeafState]{
			"work": func(ctx context.Context, r *gendurable.Run[LeafState]) (gendurable.Outcome, error) {
				if _, err := beginWork(ctx, rt, r, r.State.Seq, jitter(r.State.SleepMs)); err != nil {
					return gendurable.Outcome{}, err
				}
				return gendurable.Done(map[string]int{"seq": r.State.Seq}), nil // group-committed, no oracle
			},
		},
	}

	// --- poison steps -------------------------------------------------------
	m.PoisonPanic = &gendurable.Machine[LeafState]{
		Name: "poison_panic", Start: "boom", MaxAttempts: 3, Backoff: poisonBackoff,
		Steps: map[string]gendurable.StepFunc[LeafState]{
			"boom": func(ctx context.Context, r *gendurable.Run[LeafState]) (gendurable.Outcome, error) {
				run, err := begin(ctx, rt, r, r.State.Seq)
				if err != nil {
					return gendurable.Outcome{}, err
				}
				run.end()
				panic("chaos: poison step panics")
			},
		},
	}
	m.PoisonLoop = &gendurable.Machine[LeafState]{
		Name: "poison_loop", Start: "spin", MaxAttempts: 3, Backoff: poisonBackoff, StepTimeout: 300 * time.Millisecond,
		Steps: map[string]gendurable.StepFunc[LeafState]{
			"spin": func(ctx context.Context, r *gendurable.Run[LeafState]) (gendurable.Outcome, error) {
				if _, err := begin(ctx, rt, r, r.State.Seq); err != nil {
					return gendurable.Outcome{}, err
				}
				for { // ignores its context, forever
					time.Sleep(5 * time.Millisecond)
				}
			},
		},
	}
	m.PoisonDecode = &gendurable.Machine[DecodeState]{
		Name: "poison_decode", Start: "read", MaxAttempts: 3, Backoff: poisonBackoff,
		Steps: map[string]gendurable.StepFunc[DecodeState]{
			"read": func(ctx context.Context, r *gendurable.Run[DecodeState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil // never reached: the state does not decode
			},
		},
	}
	m.PoisonEncode = &gendurable.Machine[EncodeState]{
		Name: "poison_encode", Start: "a", MaxAttempts: 3, Backoff: poisonBackoff,
		Steps: map[string]gendurable.StepFunc[EncodeState]{
			"a": func(ctx context.Context, r *gendurable.Run[EncodeState]) (gendurable.Outcome, error) {
				return r.Next("b", EncodeState{F: math.NaN()}), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[EncodeState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	m.PoisonHandle = &gendurable.Machine[LeafState]{
		Name: "poison_handle", Start: "fail", MaxAttempts: 3, Backoff: poisonBackoff,
		Steps: map[string]gendurable.StepFunc[LeafState]{
			"fail": func(ctx context.Context, r *gendurable.Run[LeafState]) (gendurable.Outcome, error) {
				return gendurable.Outcome{}, errors.New("chaos: step fails")
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[LeafState], err error) (gendurable.Outcome, error) {
			panic("chaos: Handle panics too")
		},
	}
	m.PoisonNUL = &gendurable.Machine[BlobState]{
		Name: "poison_nul", Start: "a", MaxAttempts: 3, Backoff: poisonBackoff,
		Steps: map[string]gendurable.StepFunc[BlobState]{
			"a": func(ctx context.Context, r *gendurable.Run[BlobState]) (gendurable.Outcome, error) {
				run, err := begin(ctx, rt, r, r.State.Seq)
				if err != nil {
					return gendurable.Outcome{}, err
				}
				return run.commit(r.Next("b", BlobState{Seq: r.State.Seq + 1, V: "nul \x00 byte"}), nil), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[BlobState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	deep := func(plain bool) map[string]gendurable.StepFunc[BlobState] {
		return map[string]gendurable.StepFunc[BlobState]{
			"a": func(ctx context.Context, r *gendurable.Run[BlobState]) (gendurable.Outcome, error) {
				run, err := begin(ctx, rt, r, r.State.Seq)
				if err != nil {
					return gendurable.Outcome{}, err
				}
				out := r.Next("b", BlobState{Seq: r.State.Seq + 1, V: Nested(k.DeepNesting)})
				if plain {
					run.end()
					return out, nil
				}
				return run.commit(out, nil), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[BlobState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		}
	}
	m.PoisonDeep = &gendurable.Machine[BlobState]{Name: "poison_deep", Start: "a", MaxAttempts: 3, Backoff: poisonBackoff, Steps: deep(false)}
	m.PoisonDeepPlain = &gendurable.Machine[BlobState]{Name: "poison_deep_plain", Start: "a", MaxAttempts: 3, Backoff: poisonBackoff, Steps: deep(true)}

	// --- clock ----------------------------------------------------------------
	simple := func(name string, first func(r *gendurable.Run[LeafState], s LeafState) gendurable.Outcome, work func() time.Duration) *gendurable.Machine[LeafState] {
		return &gendurable.Machine[LeafState]{
			Name: name, Start: "a", MaxAttempts: 25, Backoff: chaosBackoff,
			Steps: map[string]gendurable.StepFunc[LeafState]{
				"a": func(ctx context.Context, r *gendurable.Run[LeafState]) (gendurable.Outcome, error) {
					run, err := beginWork(ctx, rt, r, r.State.Seq, work())
					if err != nil {
						return gendurable.Outcome{}, err
					}
					s := r.State
					s.Seq++
					return run.commit(first(r, s), nil), nil
				},
				"b": func(ctx context.Context, r *gendurable.Run[LeafState]) (gendurable.Outcome, error) {
					run, err := begin(ctx, rt, r, r.State.Seq)
					if err != nil {
						return gendurable.Outcome{}, err
					}
					run.end()
					return run.commit(gendurable.Done(map[string]int{"seq": r.State.Seq, "awaited": len(r.Awaited)}), nil), nil
				},
			},
		}
	}
	noWork := func() time.Duration { return 0 }
	m.ClockSleep = simple("clock_sleep", func(r *gendurable.Run[LeafState], s LeafState) gendurable.Outcome {
		return r.Next("b", s).After(k.ClockSleep)
	}, noWork)
	m.ClockAwait = simple("clock_await", func(r *gendurable.Run[LeafState], s LeafState) gendurable.Outcome {
		return r.Await("b", s, "never").Timeout(k.ClockSleep)
	}, noWork)
	m.ClockLong = simple("clock_long", func(r *gendurable.Run[LeafState], s LeafState) gendurable.Outcome {
		return r.Next("b", s)
	}, func() time.Duration { return k.LongStep })
	m.ClockHang = simple("clock_hang", func(r *gendurable.Run[LeafState], s LeafState) gendurable.Outcome {
		return r.Next("b", s)
	}, func() time.Duration {
		if k.Hang {
			return time.Hour // until this worker is killed
		}
		return 0
	})

	m.All = []gendurable.Definition{m.Flow, m.Leaf, m.Waiter, m.Plain,
		m.PoisonPanic, m.PoisonLoop, m.PoisonDecode, m.PoisonEncode, m.PoisonHandle, m.PoisonNUL, m.PoisonDeep, m.PoisonDeepPlain,
		m.ClockSleep, m.ClockAwait, m.ClockLong, m.ClockHang}
	return m
}

// Nested returns a value that encodes to depth nested JSON arrays holding 1.
func Nested(depth int) any {
	var v any = 1
	for i := 0; i < depth; i++ {
		v = []any{v}
	}
	return v
}
