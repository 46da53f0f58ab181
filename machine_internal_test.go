package gendurable

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/sqlq"
)

type benchState struct {
	Order string   `json:"order"`
	Items []string `json:"items"`
	Paid  int      `json:"paid"`
}

func benchMachine() *Machine[benchState] {
	m := &Machine[benchState]{
		Name: "bench", Start: "a",
		Steps: map[string]StepFunc[benchState]{
			"a": func(ctx context.Context, r *Run[benchState]) (Outcome, error) {
				s := r.State
				s.Paid++
				return r.Next("b", s), nil
			},
			"b": func(ctx context.Context, r *Run[benchState]) (Outcome, error) { return Done(nil), nil },
		},
	}
	if _, err := m.definition(); err != nil {
		panic(err)
	}
	return m
}

// BenchmarkStepExec measures the engine's non-SQL work for one step: decode
// the state, run a trivial step, validate and encode its Next outcome.
func BenchmarkStepExec(b *testing.B) {
	m := benchMachine()
	in := &execInput{
		Input: &executor.Input{Claim: &sqlq.Claimed{ID: 1, Token: 2, FSM: "bench", Version: 1, Step: "a", MaxAttempts: 20,
			State: []byte(`{"order":"A-1","items":["book","lamp","pen"],"paid":0}`), InsertedAt: time.Now()},
			Queue: "default"},
		limits: jsonLimits{maxBytes: DefaultMaxStateBytes, maxDepth: DefaultMaxJSONDepth},
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res := m.exec(ctx, in)
		if res.Out.Kind != sqlq.KindNext {
			b.Fatal(res.Out.Kind)
		}
	}
}

// TestEncodeTypedTakesANilInterfaceState (an API probe): a machine whose
// state type is an interface (Machine[any]) refused New(nil) — "state is
// <nil>, the machine's state type is <nil>" — though nil is its zero value
// and encodes to null. A nil state of a concrete type is still refused.
func TestEncodeTypedTakesANilInterfaceState(t *testing.T) {
	t.Parallel()
	s, err := encodeTyped[any](nil)
	if err != nil || s != "null" {
		t.Fatalf("encodeTyped[any](nil) = %q, %v; want null", s, err)
	}
	s, err = encodeTyped[error](nil)
	if err != nil || s != "null" {
		t.Fatalf("encodeTyped[error](nil) = %q, %v; want null", s, err)
	}
	if _, err := encodeTyped[benchState](nil); err == nil {
		t.Fatal("encodeTyped[benchState](nil): no error")
	}
	if s, err := encodeTyped[*benchState]((*benchState)(nil)); err != nil || s != "null" {
		t.Fatalf("encodeTyped[*benchState](nil pointer) = %q, %v", s, err)
	}
}

// BenchmarkCallStep is what running a step contained costs (a goroutine
// per call, so that runtime.Goexit ends only that goroutine), which only a
// test binary pays (inTest), against the plain recovered call:
//
//	go test . -run X -bench CallStep
func BenchmarkCallStep(b *testing.B) {
	fn := func() (Outcome, error) { return Outcome{}, nil }
	b.Run("contained", func(b *testing.B) {
		for b.Loop() {
			_, _ = callStep(false, fn)
		}
	})
	b.Run("recovered", func(b *testing.B) {
		for b.Loop() {
			_, _ = callRecovered(fn)
		}
	})
}
