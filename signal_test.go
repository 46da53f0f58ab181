package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type waitState struct {
	Got      []string `json:"got,omitempty"`
	TimedOut bool     `json:"timed_out,omitempty"`
	Rounds   int      `json:"rounds,omitempty"`
	Need     int      `json:"need,omitempty"` // collect: signals to accumulate before going on
}

type payment struct {
	Amount int `json:"amount"`
}

// awaiter parks on "pay" (or "cancel"), then records what it received.
func awaiter(timeout time.Duration) *gendurable.Machine[waitState] {
	return &gendurable.Machine[waitState]{
		Name: "awaiter", Start: "park",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"park": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("woken", r.State, "pay", "cancel").Timeout(timeout), nil
			},
			"woken": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				s := r.State
				s.Rounds++
				if len(r.Awaited) == 0 {
					s.TimedOut = true
				}
				for _, sig := range r.Awaited {
					s.Got = append(s.Got, sig.Name)
				}
				if len(s.Got) < s.Need && !s.TimedOut {
					return r.Await("woken", s, "pay", "cancel"), nil // accumulate: consumes nothing
				}
				return r.Next("finish", s), nil // consumes exactly r.Awaited
			},
			"finish": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return gendurable.Done(r.State), nil
			},
		},
	}
}

func TestAwaitThenSignalWakes(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))
	b.waitStatus(id, "awaiting_signal", 10*time.Second)
	w, err := b.eng.WaitReason(ctx, id)
	require.NoError(t, err)
	require.Equal(t, []string{"pay", "cancel"}, w.Signals)
	require.Nil(t, w.Deadline)
	require.Equal(t, "awaiting signal pay or cancel", w.Summary)

	// A signal it does not await is stored but does not wake it.
	res, err := b.eng.Signal(ctx, id, "note", map[string]string{"x": "y"}, nil)
	require.NoError(t, err)
	require.False(t, res.Woke)
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, "awaiting_signal", b.row(id).Status)

	res, err = b.eng.Signal(ctx, id, "pay", payment{Amount: 42}, nil)
	require.NoError(t, err)
	require.True(t, res.Woke)
	require.NotZero(t, res.ID)
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"got":["pay"],"rounds":1}`, string(r.Result))
	// Consumed by the Next: only "pay"; the unrelated "note" was swept by Done.
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NULL`, id))
	require.Equal(t, 2, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1`, id), "consumed signals are kept, marked")
}

// TestASignalSentWithoutAPayloadReachesTheStepAsNull: Signal.Payload is
// "null" for a signal sent without one (nil, a nil RawMessage, JSON null,
// a nil pointer), as documented and as Describe shows it; the step got an
// empty Payload, and Decode failed ("unexpected end of JSON input"), so the
// step failed on every attempt (a probe; the CLI's signal without
// --payload sends none).
func TestASignalSentWithoutAPayloadReachesTheStepAsNull(t *testing.T) {
	t.Parallel()
	type got struct {
		Payloads []string `json:"payloads"`
		Decoded  int      `json:"decoded"`
	}
	m := &gendurable.Machine[got]{
		Name: "nullpayload", Start: "park",
		Steps: map[string]gendurable.StepFunc[got]{
			"park": func(ctx context.Context, r *gendurable.Run[got]) (gendurable.Outcome, error) {
				return r.Await("woken", r.State, "x"), nil
			},
			"woken": func(ctx context.Context, r *gendurable.Run[got]) (gendurable.Outcome, error) {
				s := r.State
				for _, sig := range r.Inbox {
					s.Payloads = append(s.Payloads, string(sig.Payload))
					var v *int
					if err := sig.Decode(&v); err != nil {
						return gendurable.Outcome{}, gendurable.JobCancel(err)
					}
					s.Decoded++
				}
				return gendurable.Done(s), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	for _, payload := range []any{nil, json.RawMessage(nil), json.RawMessage("null"), (*int)(nil)} {
		id := b.insert(m.New(got{}))
		b.waitStatus(id, "awaiting_signal", 10*time.Second)
		_, err := b.eng.Signal(ctx, id, "x", payload, nil)
		require.NoError(t, err)
		r := b.waitStatus(id, "done", 10*time.Second)
		require.JSONEq(t, `{"payloads":["null"],"decoded":1}`, string(r.Result), "%#v", payload)
	}
}

func TestSignalBeforeAwaitDoesNotPark(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))
	// The signal arrives while the instance has not even run its first step:
	// it woke nothing.
	res, err := b.eng.Signal(ctx, id, "cancel", nil, nil)
	require.NoError(t, err)
	require.False(t, res.Woke)
	// Nor does a signal sent in the transaction that inserts its target:
	// the row is runnable and eligible at the transaction's now(), which
	// the statement used to read as just woken.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }() // a failed check must not leave it open
	ins, err := b.eng.InsertTx(ctx, tx, m.New(waitState{}))
	require.NoError(t, err)
	res, err = b.eng.SignalTx(ctx, tx, ins.ID, "pay", payment{Amount: 1}, nil)
	require.NoError(t, err)
	require.False(t, res.Woke, "a signal to a runnable instance wakes nothing")
	require.NoError(t, tx.Commit(ctx))
	b.start()
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"got":["cancel"],"rounds":1}`, string(r.Result))
}

// A machine that reads its whole inbox still wakes at once on a signal
// that arrived before it awaited; after a wake on one name, a pre-arrived
// signal of another awaited name wakes it at once too.
func TestAwaitSeesPreArrivedSignalsItHasNotReceived(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	m := &gendurable.Machine[waitState]{
		Name: "prearrived", Start: "a", Inbox: true,
		Steps: map[string]gendurable.StepFunc[waitState]{
			"a": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("b", r.State, "pay"), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("c", r.State, "addr"), nil
			},
			"c": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				got.Store(len(r.Awaited))
				return gendurable.Done(nil), nil
			},
		},
	}
	b := setup(t, nil, m)
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))
	for _, name := range []string{"addr", "pay"} {
		_, err := b.eng.Signal(ctx, id, name, nil, nil)
		require.NoError(t, err)
	}
	b.start()
	b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 1, got.Load())
}

func TestAwaitTimeout(t *testing.T) {
	t.Parallel()
	m := awaiter(300 * time.Millisecond)
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(waitState{}))
	b.waitStatus(id, "awaiting_signal", 10*time.Second)
	w, err := b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.NotNil(t, w.Deadline)
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"timed_out":true,"rounds":1}`, string(r.Result), "woken at the next step with nothing awaited")
}

// A timeout after an earlier wake still shows an empty Awaited.
func TestTimeoutAfterAWakeShowsEmptyAwaited(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[waitState]{
		Name: "retimeout", Start: "a",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"a": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("b", r.State, "pay"), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				s := r.State
				s.Rounds++
				if s.Rounds == 1 {
					return r.Await("b", s, "pay").Timeout(200 * time.Millisecond), nil
				}
				s.TimedOut = len(r.Awaited) == 0
				s.Need = len(r.Inbox)
				return gendurable.Done(s), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(waitState{}))
	b.waitStatus(id, "awaiting_signal", 10*time.Second)
	_, err := b.eng.Signal(context.Background(), id, "pay", nil, nil)
	require.NoError(t, err)
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"timed_out":true,"rounds":2,"need":1}`, string(r.Result), "timed out; the earlier signal is still in the inbox")
}

// TestReawaitAfterATimeoutParksOnWhatTheParkingStepSaw: a step woken by a
// signal re-awaits with a timeout and times out (Awaited empty, the signal
// in Inbox). Awaiting again from it parks: the step that parked had
// received that signal (schema version 18; before, it ran on at once with
// the same signal in Awaited again — a "remind until approved" loop saw
// one approval twice). A second timeout keeps it so. A signal sent after
// that wake, before the step re-awaits, is new: the re-await runs on at
// once and sees both. After a Next consumed them, a re-await parks until
// its timeout.
func TestReawaitAfterATimeoutParksOnWhatTheParkingStepSaw(t *testing.T) {
	t.Parallel()
	type round struct {
		Awaited int `json:"awaited"`
		Inbox   int `json:"inbox"`
	}
	type st struct {
		Rounds []round `json:"rounds"`
	}
	reached, sent := make(chan struct{}, 1), make(chan struct{})
	m := &gendurable.Machine[st]{
		Name: "remind", Start: "a",
		Steps: map[string]gendurable.StepFunc[st]{
			"a": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				return r.Await("b", r.State, "pay"), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				s := r.State
				s.Rounds = append(s.Rounds, round{Awaited: len(r.Awaited), Inbox: len(r.Inbox)})
				switch len(s.Rounds) {
				case 3:
					// The second timeout: the test sends another pay now,
					// after the wake, before this step re-awaits.
					reached <- struct{}{}
					select {
					case <-sent:
					case <-ctx.Done():
						return gendurable.Outcome{}, ctx.Err()
					}
					return r.Await("b", s, "pay").Timeout(time.Minute), nil
				case 4:
					return r.Next("consumed", s), nil // consumes both
				}
				return r.Await("b", s, "pay").Timeout(300 * time.Millisecond), nil
			},
			"consumed": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				return r.Await("end", r.State, "pay").Timeout(300 * time.Millisecond), nil
			},
			"end": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				s := r.State
				s.Rounds = append(s.Rounds, round{Awaited: len(r.Awaited), Inbox: len(r.Inbox)})
				return gendurable.Done(s), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	id := b.insert(m.New(st{}))
	b.waitStatus(id, "awaiting_signal", 10*time.Second)
	_, err := b.eng.Signal(ctx, id, "pay", nil, nil)
	require.NoError(t, err)
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the step never reached its third round")
	}
	_, err = b.eng.Signal(ctx, id, "pay", nil, nil)
	require.NoError(t, err)
	close(sent)
	r := b.waitStatus(id, "done", 10*time.Second)
	var got st
	require.NoError(t, json.Unmarshal(r.Result, &got))
	require.Equal(t, []round{
		{Awaited: 1, Inbox: 1}, // the signal
		{Awaited: 0, Inbox: 1}, // the timeout
		{Awaited: 0, Inbox: 1}, // the timeout again: the re-await parked
		{Awaited: 2, Inbox: 2}, // at once: the pay sent after the wake, and the first
		{Awaited: 0, Inbox: 0}, // after a Next consumed them: the timeout
	}, got.Rounds)
}

func TestReawaitAccumulatesAndConsumesOnlyWhatItReceived(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	id := b.insert(m.New(waitState{Need: 3}))
	for i := 0; i < 2; i++ {
		b.waitStatus(id, "awaiting_signal", 10*time.Second)
		_, err := b.eng.Signal(ctx, id, "pay", payment{Amount: i}, nil)
		require.NoError(t, err)
	}
	r := b.waitStatus(id, "done", 10*time.Second)
	// Wake 1 saw one pay and re-awaited, consuming nothing; wake 2 saw both
	// (1 + 2 = 3 names recorded) and went on with a Next that consumed both.
	require.JSONEq(t, `{"got":["pay","pay","pay"],"rounds":2,"need":3}`, string(r.Result))
	require.Equal(t, 2, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NOT NULL`, id))
}

func TestSignalDedupAndErrors(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))

	first, err := b.eng.Signal(ctx, id, "note", 1, &gendurable.SignalOpts{DedupKey: "evt-7"})
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	again, err := b.eng.Signal(ctx, id, "note", 2, &gendurable.SignalOpts{DedupKey: "evt-7"})
	require.NoError(t, err)
	require.True(t, again.Duplicate, "a duplicate is a no-op that says so")
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`))

	_, err = b.eng.Signal(ctx, 99999999, "pay", nil, nil)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
	for _, bad := range []string{"", string(make([]byte, 300)), "a\x00b", "bad\xff", "pay\u200b", "\ufeffpay", "pa\u00ady", "sig\u206f", "pay\u3164", "pay\ufe0f"} {
		_, err = b.eng.Signal(ctx, id, bad, nil, nil)
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "%q", bad)
	}
	for _, bad := range []string{" evt-1", "evt-1 ", "evt\x00"} {
		_, err = b.eng.Signal(ctx, id, "note", nil, &gendurable.SignalOpts{DedupKey: bad})
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "dedup key %q", bad)
	}
	_, err = b.eng.Signal(ctx, id, "pay", func() {}, nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidSignal)
	_, err = b.eng.Signal(ctx, id, "pay", "nul\x00inside", nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidSignal)
	// A payload whose MarshalJSON panics is an error, not a panic in the caller.
	_, err = b.eng.Signal(ctx, id, "pay", panicMarshaler{}, nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidSignal)
	require.ErrorContains(t, err, "marshal boom")

	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'done' WHERE id = $1`, id)
	_, err = b.eng.Signal(ctx, id, "pay", nil, nil)
	require.ErrorIs(t, err, gendurable.ErrInstanceFinished)
	_, err = b.eng.Signal(ctx, id, "pay", nil, &gendurable.SignalOpts{DedupKey: "evt-8"})
	require.ErrorIs(t, err, gendurable.ErrInstanceFinished)
	// A sender retrying a delivery that already succeeded learns so, even
	// after the signal woke the instance and it finished (the dedup key
	// holds for the instance's whole life).
	again, err = b.eng.Signal(ctx, id, "note", 3, &gendurable.SignalOpts{DedupKey: "evt-7"})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "rejected signals write nothing")
}

// TestSignalDedupHoldsAfterARealFinish: a signal that woke its instance
// and was consumed by a step that finished it is still found by its dedup
// key (the Duplicate answer a sender's retry needs), as is one sent before
// an operator's cancel; a new key is ErrInstanceFinished and writes nothing.
func TestSignalDedupHoldsAfterARealFinish(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()

	done := b.insert(m.New(waitState{Need: 1}))
	b.waitStatus(done, "awaiting_signal", 10*time.Second)
	first, err := b.eng.Signal(ctx, done, "pay", 1, &gendurable.SignalOpts{DedupKey: "evt-1"})
	require.NoError(t, err)
	r := b.waitStatus(done, "done", 10*time.Second)
	var res waitState
	require.NoError(t, json.Unmarshal(r.Result, &res))
	require.Equal(t, []string{"pay"}, res.Got, "the signal was consumed by the step that finished")

	cancelled := b.insert(m.New(waitState{Need: 2}))
	b.waitStatus(cancelled, "awaiting_signal", 10*time.Second)
	early, err := b.eng.Signal(ctx, cancelled, "pay", 1, &gendurable.SignalOpts{DedupKey: "evt-1"})
	require.NoError(t, err)
	require.NoError(t, b.eng.Cancel(ctx, cancelled, "test"))
	b.waitStatus(cancelled, "failed", 10*time.Second)

	signals := b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`)
	for _, c := range []struct {
		id    int64
		first gendurable.SignalResult
	}{{done, first}, {cancelled, early}} {
		again, err := b.eng.Signal(ctx, c.id, "pay", 2, &gendurable.SignalOpts{DedupKey: "evt-1"})
		require.NoError(t, err)
		require.True(t, again.Duplicate, "instance %d: a retry of a delivered signal", c.id)
		require.Equal(t, c.first.ID, again.ID)
		_, err = b.eng.Signal(ctx, c.id, "pay", 3, &gendurable.SignalOpts{DedupKey: "evt-2"})
		require.ErrorIs(t, err, gendurable.ErrInstanceFinished)
	}
	require.Equal(t, signals, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "nothing written after the finish")
}

// TestAChainedStepSeesASignalThatCommittedWhileItsClaimWaited: a step
// chained by its predecessor's outcome gets every signal committed before
// its claim, one whose transaction held the row while the outcome statement
// waited for it included (that statement's snapshot is older than the
// signal; the row's counts, read under the lock, are not). Before schema
// version 20 the step saw an empty Inbox, and its outcome consumed the
// signal unseen.
func TestAChainedStepSeesASignalThatCommittedWhileItsClaimWaited(t *testing.T) {
	t.Parallel()
	t.Run("next", func(t *testing.T) { t.Parallel(); chainRacingASignal(t, false) })
	// s1 follows an Await of "pay", and its Next consumes that signal in the
	// statement that chains s2: s2 sees the racing signal, not the one its
	// predecessor consumed.
	t.Run("next consuming the awaited signal", func(t *testing.T) { t.Parallel(); chainRacingASignal(t, true) })
}

func chainRacingASignal(t *testing.T, await bool) {
	running, proceed := make(chan struct{}, 1), make(chan struct{})
	type st struct {
		Seen []string `json:"seen"`
	}
	m := &gendurable.Machine[st]{
		Name: "chained", Start: map[bool]string{false: "s1", true: "park"}[await], Inbox: true,
		Steps: map[string]gendurable.StepFunc[st]{
			"park": func(_ context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				return r.Await("s1", r.State, "pay"), nil
			},
			"s1": func(_ context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				running <- struct{}{}
				<-proceed
				return r.Next("s2", r.State), nil
			},
			"s2": func(_ context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				s := st{Seen: []string{}}
				for _, sig := range r.Inbox {
					s.Seen = append(s.Seen, sig.Name)
				}
				return gendurable.Done(s), nil
			},
		},
	}
	db := gendurabletest.NewDB(t, nil)
	cfg := fastConfig(db.Schema, m)
	// A lease of 8 s gives the outcome statement a lock wait of 1 s (the
	// committer's default, lease/8 up to 1 s), longer than the hold below:
	// the statement waits for the signal rather than being sent again.
	cfg.LeaseDuration, cfg.HeartbeatInterval = 8*time.Second, 2*time.Second
	b := bundleOn(t, db.Pool, db.Schema, cfg, m)
	ctx := context.Background()
	id := b.insert(m.New(st{}))
	if await {
		_, err := b.eng.Signal(ctx, id, "pay", 1, nil)
		require.NoError(t, err)
	}
	// The signal's transaction takes the row while s1 runs and keeps it
	// past s1's return, so the outcome statement that chains s2 waits for it.
	b.start()
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("s1 never ran")
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = b.eng.SignalTx(ctx, tx, id, "note", 1, nil)
	require.NoError(t, err)
	close(proceed)
	time.Sleep(400 * time.Millisecond) // the outcome statement waits on the row meanwhile
	require.NoError(t, tx.Commit(ctx))
	r := b.waitStatus(id, "done", 10*time.Second)
	var got st
	require.NoError(t, json.Unmarshal(r.Result, &got))
	require.Equal(t, []string{"note"}, got.Seen, "s2's Inbox")
}

func TestSignalTxCommitsWithTheCaller(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))
	b.waitStatus(id, "awaiting_signal", 10*time.Second)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.eng.SignalTx(ctx, tx, id, "pay", nil, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, "awaiting_signal", b.row(id).Status, "rolled back: not delivered")

	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := b.eng.SignalTx(ctx, tx, id, "pay", nil, nil)
	require.NoError(t, err)
	require.True(t, res.Woke)
	require.NoError(t, tx.Commit(ctx))
	b.waitStatus(id, "done", 10*time.Second)
}

// TestNoLostWakeUpUnderConcurrency races signals against await outcomes:
// every instance awaits, and one signal per instance is sent before, during
// or after its park, from many goroutines. Afterwards no instance may be
// parked while a matching signal sits unconsumed in its inbox, and every
// signal was consumed exactly once. (The cross-process, longer form is in
// the stress test.)
func TestNoLostWakeUpUnderConcurrency(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	cfg := fastConfig("", m)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 20, PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	ctx := context.Background()
	const n = 300
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = m.New(waitState{})
	}
	res, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	b.start()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				if i%3 == 0 {
					time.Sleep(time.Millisecond)
				}
				_, err := b.eng.Signal(ctx, res[i].ID, "pay", i, nil)
				require.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	eventually(t, 30*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`) == n
	}, "not every instance finished: %d parked with a matching signal",
		b.count(`SELECT count(*) FROM {{s}}.gendurable_instances i WHERE status = 'awaiting_signal'
		         AND EXISTS (SELECT 1 FROM {{s}}.gendurable_signals s WHERE s.target_id = i.id AND s.consumed_at IS NULL)`))
	require.Equal(t, n, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE consumed_at IS NOT NULL`))
	require.Equal(t, n, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE result->'got' = '["pay"]'`),
		"each instance received its one signal exactly once")
}

func TestWaitShowsThePartitionHolder(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan int64, 2)
	job := &gendurable.Job[spanArgs]{Name: "holder", Perform: func(ctx context.Context, j *gendurable.Run[spanArgs]) error {
		started <- j.ID
		<-release
		return nil
	}}
	b := setup(t, nil, job)
	b.start()
	ctx := context.Background()
	opts := gendurable.InsertOpts{PartitionKey: "acct-1"}
	first := b.insert(job.New(spanArgs{}).With(opts))
	require.Equal(t, first, <-started)
	second := b.insert(job.New(spanArgs{}).With(opts))
	w, err := b.eng.WaitReason(ctx, second)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusRunnable, w.Status)
	require.Equal(t, first, w.PartitionHeldBy)
	require.Equal(t, fmt.Sprintf(`waiting for partition key "acct-1" (1 of 1 slots held by instance %d)`, first), w.Summary)
	require.Equal(t, []int64{first}, w.KeyHolders)
	require.Equal(t, 1, w.KeyLimit)
	// A process that works no queue and has no KeyPolicies (the CLI's)
	// cannot know the key's limit: it names the holders and says so,
	// rather than "1 of 1" (an operator probe saw "3 of 1 slots" where the
	// workers' policy gave the key 3).
	admin, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema})
	require.NoError(t, err)
	w, err = admin.WaitReason(ctx, second)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf(`partition key "acct-1": 1 slot held by instance %d; it waits for one if that is the key's limit `+
		`(1, unless a KeyPolicy of the processes that work queue "default" says more: this process has none)`, first), w.Summary)
	require.Equal(t, []int64{first}, w.KeyHolders)
	require.Zero(t, w.KeyLimit)
	select {
	case id := <-started:
		t.Fatalf("instance %d started while its key was held", id)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	b.waitStatus(second, "done", 10*time.Second)

	w, err = b.eng.WaitReason(ctx, second)
	require.NoError(t, err)
	require.Equal(t, "finished (done)", w.Summary)
	_, err = b.eng.WaitReason(ctx, 424242)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
}

// TestConcurrentDuplicatesReportTheOriginal: senders racing with one dedup
// key write one signal, and every duplicate reports its id, as
// SignalResult.ID promises (a sender that waited for the instance's row
// lock behind the original's commit reported ID 0: its statement's
// snapshot could not see the original).
func TestConcurrentDuplicatesReportTheOriginal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for range 10 {
		id := b.seedRow(`status`, `'awaiting_signal'`)
		results := make([]gendurable.SignalResult, 8)
		var wg sync.WaitGroup
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				results[i], err = b.eng.Signal(ctx, id, "go", nil, &gendurable.SignalOpts{DedupKey: "k"})
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		var original int64
		require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(
			`SELECT id FROM {{s}}.gendurable_signals WHERE target_id = $1 AND dedup_key = 'k'`, b.schema), id).Scan(&original))
		fresh := 0
		for _, r := range results {
			require.Equal(t, original, r.ID, "%+v", r)
			if !r.Duplicate {
				fresh++
			}
		}
		require.Equal(t, 1, fresh)
	}
}

// TestSignalNamesAndDedupKeysRefuseControlCharacters: a signal name is
// checked by the rule of queue, machine and step names, and a dedup key by
// that of partition and unique keys — no NUL or other control character
// (C0, DEL, C1), valid UTF-8, bounded — in Signal, SignalTx and Await
// alike, as ErrInvalidSignal (ErrInvalidOutcome for Await) before any SQL:
// a name an instance awaits is one an operator can type in the CLI or the
// dashboard, and what either prints is what was sent.
func TestSignalNamesAndDedupKeysRefuseControlCharacters(t *testing.T) {
	t.Parallel()
	bad := []string{"a\x01b", "\x1b[2J", "tab\there", "line\nbreak", "del\x7f", "c1\u009b", "bell\a"}
	m := &gendurable.Machine[waitState]{
		Name: "ctlawait", Start: "park", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[waitState]{
			"park": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("park", r.State, "ok", bad[r.State.Rounds]), nil
			},
		},
	}
	live := awaiter(0)
	b := setup(t, nil, m, live)
	ctx := context.Background()
	id := b.insert(live.New(waitState{}))
	for _, name := range bad {
		_, err := b.eng.Signal(ctx, id, name, nil, nil)
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "name %q", name)
		require.ErrorContains(t, err, "control character")
		_, err = b.eng.Signal(ctx, id, "pay", nil, &gendurable.SignalOpts{DedupKey: name})
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "dedup key %q", name)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = b.eng.SignalTx(ctx, tx, id, name, nil, nil)
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "SignalTx name %q", name)
		require.NoError(t, tx.Rollback(ctx))
	}
	_, err := b.eng.Signal(ctx, id, "pay", nil, &gendurable.SignalOpts{DedupKey: strings.Repeat("k", 1001)})
	require.ErrorIs(t, err, gendurable.ErrInvalidSignal)
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "nothing was sent")

	// What is still accepted: any printable text, spaces included, at the bounds.
	for _, ok := range []string{"pay", "päy ✓", "with space", strings.Repeat("n", 200)} {
		_, err := b.eng.Signal(ctx, id, ok, nil, &gendurable.SignalOpts{DedupKey: ok + strings.Repeat("k", 1000-len(ok))})
		require.NoError(t, err, "name %q", ok)
	}

	// Awaiting such a name is an invalid outcome, handed to Handle: the
	// instance fails with it instead of parking on a name nobody can type.
	b.start()
	for i := range bad {
		aid := b.insert(m.New(waitState{Rounds: i}))
		r := b.waitStatus(aid, "failed", 10*time.Second)
		require.Contains(t, r.Errors[0]["error"], "invalid outcome", "Await %q", bad[i])
		require.Contains(t, r.Errors[0]["error"], "control character")
	}
}

// TestSignalTxRefusesWhatPostgreSQLWouldBeforeSQL: a payload jsonb cannot
// hold (\u0000, a lone surrogate escape, invalid UTF-8 in a raw payload) is ErrInvalidSignal before any
// SQL, so a SignalTx caller's transaction goes on; before, the database's
// refusal aborted it.
func TestSignalTxRefusesWhatPostgreSQLWouldBeforeSQL(t *testing.T) {
	t.Parallel()
	m := awaiter(0)
	b := setup(t, nil, m)
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))
	for _, payload := range []any{"nul\x00inside", json.RawMessage(`{"a":"\u0000"}`), json.RawMessage(`"\udbff"`), json.RawMessage(`["\udfff"]`), json.RawMessage("\"x\xffy\"")} {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }() // on a failure: the schema's drop would wait for it
		_, err = b.eng.SignalTx(ctx, tx, id, "note", payload, nil)
		require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "%s", payload)
		require.NotContains(t, err.Error(), "SQLSTATE", "refused before any SQL")
		_, err = b.eng.SignalTx(ctx, tx, id, "note", "fine", nil)
		require.NoError(t, err, "the caller's transaction goes on after %s", payload)
		require.NoError(t, tx.Commit(ctx))
	}
	require.Equal(t, 5, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals`))
	_, err := b.eng.SignalTx(ctx, nil, id, "note", nil, nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidSignal, "a nil transaction")
}

// TestSignalCommittedWhileAFinishWaitsIsSwept: a signal whose transaction
// holds the instance row while the step's Done outcome (or an operator's
// Cancel) waits for that row commits before the finish does, so it was
// delivered to a live instance; the finish must still consume it, as it
// consumes every signal of the inbox. The finishing statement's snapshot
// was taken before the signal committed: sweeping by that snapshot left the
// signal unconsumed on a finished instance (inbox counts cleared, its
// consumed_at still NULL), shown as pending forever by Describe.
func TestSignalCommittedWhileAFinishWaitsIsSwept(t *testing.T) {
	t.Parallel()
	entered, release := make(chan int64, 4), make(chan struct{}, 1)
	m := &gendurable.Machine[waitState]{
		Name: "finisher", Start: "work",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"work": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				if r.State.Need == 1 { // the Cancel case: never finishes by itself
					entered <- r.ID
					<-ctx.Done()
					return gendurable.Outcome{}, ctx.Err()
				}
				entered <- r.ID
				<-release
				if r.State.Need == 2 { // its own transaction: the executor's path
					return gendurable.Done(nil).WithTx(func(context.Context, pgx.Tx) error { return nil }), nil
				}
				return gendurable.Done(nil), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()

	// waitBlocked waits until a statement waits for the lock tx holds.
	waitBlocked := func(t *testing.T, tx pgx.Tx, what string) {
		t.Helper()
		var pid int
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		eventually(t, 10*time.Second, func() bool { return b.blockedBy(pid, "") > 0 }, "%s does not wait for the instance row", what)
	}
	unconsumed := func(id int64) int {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NULL`, id)
	}

	for _, c := range []struct {
		name string
		need int
	}{{"Done", 0}, {"DoneWithTx", 2}} {
		t.Run(c.name, func(t *testing.T) {
			id := b.insert(m.New(waitState{Need: c.need}))
			require.Equal(t, id, <-entered)
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			res, err := b.eng.SignalTx(ctx, tx, id, "late", nil, nil)
			require.NoError(t, err)
			require.NotZero(t, res.ID)
			release <- struct{}{} // the step returns Done: its outcome waits for the row
			waitBlocked(t, tx, "the Done outcome")
			require.NoError(t, tx.Commit(ctx))
			b.waitStatus(id, "done", 10*time.Second)
			// A group-committed outcome is committed before its second sweep
			// runs: allow that statement its moment.
			eventually(t, 2*time.Second, func() bool { return unconsumed(id) == 0 },
				"a signal delivered before the Done stays unconsumed on the done instance")
			info, err := b.eng.Describe(ctx, id)
			require.NoError(t, err)
			for _, s := range info.Signals {
				require.NotNil(t, s.ConsumedAt, "Describe shows signal %d pending on a done instance", s.ID)
			}
		})
	}

	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Cancel", true: "CancelMany"}[many], func(t *testing.T) {
			id := b.insert(m.New(waitState{Need: 1}))
			require.Equal(t, id, <-entered)
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = b.eng.SignalTx(ctx, tx, id, "late", nil, nil)
			require.NoError(t, err)
			cancelled := make(chan error, 1)
			go func() {
				if many {
					_, err := b.eng.CancelMany(ctx, []int64{id}, "operator")
					cancelled <- err
					return
				}
				cancelled <- b.eng.Cancel(ctx, id, "operator")
			}()
			waitBlocked(t, tx, "the cancel")
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, <-cancelled)
			b.waitStatus(id, "failed", 10*time.Second)
			require.Equal(t, 0, unconsumed(id), "a signal delivered before the cancel stays unconsumed on the cancelled instance")
		})
	}
}

// sweepGate is a pgx tracer that holds a statement sweeping inboxes
// (sqlq.SweepInboxes) at its start until released.
type sweepGate struct {
	held    chan struct{}
	release chan struct{}
}

func (g *sweepGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "gendurable_signals") && strings.Contains(d.SQL, "unnest($1::bigint[]) AS u(id)") &&
		strings.HasPrefix(strings.TrimSpace(d.SQL), "UPDATE") {
		g.held <- struct{}{}
		<-g.release
	}
	return ctx
}

func (g *sweepGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestFinishersSecondSweepSparesARetriedInstancesSignals: the second sweep
// of a finish (a cancel's here, sent because a signal committed while the
// cancel waited for the row; ApplyOutcomes' and the reaper's are the same
// statement) runs after the finish committed. An operator's Retry may come
// in between, and a signal sent to the retried, live instance then: the
// sweep must leave that signal for the instance's steps. It swept every
// unconsumed signal of the ids, "no signal can follow: the rows are
// failed", and consumed it, while the inbox counts still held it: a step
// awaiting it woke at once and saw nothing, for ever.
func TestFinishersSecondSweepSparesARetriedInstancesSignals(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[waitState]{
		Name: "sparer", Start: "work",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"work": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	b := setup(t, nil, m) // not started: the instance stays runnable
	ctx := context.Background()
	gate := &sweepGate{held: make(chan struct{}), release: make(chan struct{})}
	pc := b.pool.Config().Copy()
	pc.ConnConfig.Tracer = gate
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pool.Close()
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{m}, Logger: testLogger(t)})
	require.NoError(t, err)

	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Cancel", true: "CancelMany"}[many], func(t *testing.T) {
			id := b.insert(m.New(waitState{}))
			// A signal that holds the row while the cancel waits for it,
			// and commits: the cancel's own sweep misses it.
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = b.eng.SignalTx(ctx, tx, id, "late", nil, nil)
			require.NoError(t, err)
			var pid int
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
			cancelled := make(chan error, 1)
			go func() {
				if many {
					_, err := eng.CancelMany(ctx, []int64{id}, "operator")
					cancelled <- err
					return
				}
				cancelled <- eng.Cancel(ctx, id, "operator")
			}()
			eventually(t, 10*time.Second, func() bool { return b.blockedBy(pid, "") > 0 }, "the cancel does not wait for the row")
			require.NoError(t, tx.Commit(ctx))
			select {
			case <-gate.held: // the cancel committed; its second sweep waits
			case err := <-cancelled:
				t.Fatalf("the cancel returned (%v) without a second sweep", err)
			}
			require.NoError(t, b.eng.Retry(ctx, id))
			res, err := b.eng.Signal(ctx, id, "later", nil, nil)
			require.NoError(t, err)
			require.NotZero(t, res.ID)
			close(gate.release)
			require.NoError(t, <-cancelled)
			gate.release = make(chan struct{})
			require.Equal(t, "runnable", b.row(id).Status)
			require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NULL`, id),
				"the cancel's second sweep consumed a signal sent to the instance after it was retried")
		})
	}
}

// sweepCounter is a pgx tracer that counts the statements sweeping inboxes
// a second time (sqlq.SweepInboxes).
type sweepCounter struct{ n atomic.Int64 }

func (c *sweepCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "gendurable_signals") && strings.Contains(d.SQL, "unnest($1::bigint[]) AS u(id)") &&
		strings.HasPrefix(strings.TrimSpace(d.SQL), "UPDATE") {
		c.n.Add(1)
	}
	return ctx
}

func (c *sweepCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestSignalsRacingCancelsLeaveNoneUnconsumed: senders signal instances in
// transactions that hold the row a moment, while Cancel (or CancelMany, a
// batch at a time) fails them. A cancel sweeps the inbox on its snapshot and
// sweeps again only for the rows it reports (a signal committed while it
// waited for the row, seen in the locked inbox counts but not in its
// snapshot): no signal may stay unconsumed on a cancelled instance. The
// count of second sweeps shows the race was run.
func TestSignalsRacingCancelsLeaveNoneUnconsumed(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[waitState]{
		Name: "raced", Start: "work",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"work": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			},
		},
	}
	sweeps := &sweepCounter{}
	b := setupTraced(t, sweeps, nil, m) // not started: the instances stay live until cancelled
	ctx := context.Background()

	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Cancel", true: "CancelMany"}[many], func(t *testing.T) {
			const rounds, batch, senders = 40, 4, 3
			before := sweeps.n.Load()
			var all []int64
			var sent atomic.Int64
			for round := range rounds {
				ids := make([]int64, batch)
				for i := range ids {
					ids[i] = b.insert(m.New(waitState{}))
				}
				all = append(all, ids...)
				var wg sync.WaitGroup
				for s := range senders * batch {
					wg.Add(1)
					go func(id int64) {
						defer wg.Done()
						for {
							tx, err := b.pool.Begin(ctx)
							if err != nil {
								t.Error(err)
								return
							}
							_, err = b.eng.SignalTx(ctx, tx, id, "note", nil, nil)
							if err != nil {
								_ = tx.Rollback(ctx)
								if !errors.Is(err, gendurable.ErrInstanceFinished) {
									t.Error(err)
								}
								return
							}
							time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond) // holds the row
							if err := tx.Commit(ctx); err != nil {
								t.Error(err)
								return
							}
							sent.Add(1)
						}
					}(ids[s%batch])
				}
				time.Sleep(time.Duration(1+round%5) * time.Millisecond)
				if many {
					res, err := b.eng.CancelMany(ctx, ids, "operator")
					require.NoError(t, err)
					require.EqualValues(t, batch, res.Changed)
				} else {
					for _, id := range ids {
						require.NoError(t, b.eng.Cancel(ctx, id, "operator"))
					}
				}
				wg.Wait()
			}
			require.NotZero(t, sent.Load())
			require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals AS s
				JOIN {{s}}.gendurable_instances AS i ON i.id = s.target_id
				WHERE s.consumed_at IS NULL AND i.status = 'failed' AND i.id = ANY ($1)`, all),
				"signals left unconsumed on cancelled instances")
			require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = ANY ($1)
				AND (status <> 'failed' OR inbox <> '{}')`, all))
			t.Logf("%d signals sent to %d instances; %d second sweeps", sent.Load(), len(all), sweeps.n.Load()-before)
			require.NotZero(t, sweeps.n.Load()-before, "no cancel waited for a signal: the race was not run")
		})
	}
}

// TestAGroupCommittedAwaitBehindALockIsSweptOnTime: an Await outcome
// (group-committed, not WithTx) whose statement waits for the row lock of
// an open SignalTx longer than its timeout plus 10 s commits a deadline
// that passed long before. The sweep's floor lies a lease plus 10 s before
// its now(), longer than a group-committed statement may run, so the poke
// of the outcome (or the next sweep) wakes it at once. With a floor 10 s
// back it was below the floor, and only the next full sweep — ten intervals
// later — woke it (8.1 s in a reviewer's run).
func TestAGroupCommittedAwaitBehindALockIsSweptOnTime(t *testing.T) {
	t.Parallel()
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	m := &gendurable.Machine[struct{}]{
		Name: "lockwait", Start: "a",
		Steps: map[string]gendurable.StepFunc[struct{}]{
			"a": func(ctx context.Context, r *gendurable.Run[struct{}]) (gendurable.Outcome, error) {
				started <- struct{}{}
				<-gate
				return r.Await("b", r.State, "pay").Timeout(100 * time.Millisecond), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[struct{}]) (gendurable.Outcome, error) {
				return gendurable.Done(len(r.Awaited)), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.AwaitTimeoutInterval = 30*time.Second, 0, time.Second
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	id := b.insert(m.New(struct{}{}))
	<-started
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = b.eng.SignalTx(ctx, tx, id, "note", nil, nil) // a name the await does not wait for
	require.NoError(t, err)
	close(gate) // the outcome statement now waits for the row lock
	time.Sleep(11 * time.Second)
	require.NoError(t, tx.Commit(ctx))
	committed := time.Now()
	for st := b.row(id).Status; st == "executing" || st == "awaiting_signal"; st = b.row(id).Status {
		require.Less(t, time.Since(committed), 30*time.Second)
		time.Sleep(20 * time.Millisecond)
	}
	late := time.Since(committed)
	t.Logf("woken %v after its outcome committed (its deadline passed ~11 s before)", late)
	require.Less(t, late, 2*time.Second, "swept at its poke or within an AwaitTimeoutInterval, not at the next full sweep")
}

// TestRetryOfACancelledAwaitParksItAgain: an instance cancelled while
// parked in an Await, then retried, awaits again what it awaited (its
// signals were consumed by the cancel: it waits for new ones), with the
// same deadline — one that passed meanwhile wakes it as a timeout. Before,
// the retry made it runnable: the step after the await ran at once with an
// empty Awaited, though the await had no timeout (a probe's "shipped with
// 0 payments"). A parent parked on its children is covered by
// TestRetryOfAParentCancelledMidFanOutWaitsForItsChildren.
func TestRetryOfACancelledAwaitParksItAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("no timeout", func(t *testing.T) {
		t.Parallel()
		m := awaiter(0)
		b := setup(t, nil, m)
		b.start()
		id := b.insert(m.New(waitState{Need: 1}))
		b.waitStatus(id, "awaiting_signal", 10*time.Second)
		_, err := b.eng.Signal(ctx, id, "note", nil, nil) // not awaited: consumed by the cancel
		require.NoError(t, err)
		require.NoError(t, b.eng.Cancel(ctx, id, "operator"))
		require.NoError(t, b.eng.Retry(ctx, id))
		w, err := b.eng.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, gendurable.StatusAwaitingSignal, w.Status, "parked again: %s", w.Summary)
		require.Equal(t, []string{"pay", "cancel"}, w.Signals)
		require.Nil(t, w.Deadline)
		time.Sleep(300 * time.Millisecond)
		require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND status = 'awaiting_signal'`, id),
			"the step after the await did not run")
		_, err = b.eng.Signal(ctx, id, "pay", nil, nil)
		require.NoError(t, err)
		r := b.waitStatus(id, "done", 10*time.Second)
		require.JSONEq(t, `{"got":["pay"],"rounds":1,"need":1}`, string(r.Result), "woken by the new signal")
	})
	t.Run("a deadline that passed", func(t *testing.T) {
		t.Parallel()
		m := awaiter(400 * time.Millisecond)
		cfg := fastConfig("", m)
		cfg.AwaitTimeoutInterval = 100 * time.Millisecond
		b := setup(t, cfg)
		b.start()
		id := b.insert(m.New(waitState{Need: 1}))
		b.waitStatus(id, "awaiting_signal", 10*time.Second)
		require.NoError(t, b.eng.Cancel(ctx, id, "operator"))
		time.Sleep(600 * time.Millisecond) // past the deadline
		require.NoError(t, b.eng.Retry(ctx, id))
		r := b.waitStatus(id, "done", 10*time.Second)
		require.JSONEq(t, `{"timed_out":true,"rounds":1,"need":1}`, string(r.Result), "woken by its timeout")
	})
}

// TestARetriedStepPastAnAwaitIsShownItsInbox: a step that a signal woke,
// failed before it finished — cancelled before it ran, stopped by its own
// Stop, or reaped with no attempt left — runs again on a Retry as after a
// timeout: Awaited empty, and its Inbox holds the signals sent since the
// retry. Before, the failure cleared what the row had awaited, the retried
// step was not shown its inbox at all, and its Done consumed a signal sent
// after the retry unseen (a probe: Cancel and Retry of a woken instance,
// then a signal; a timeout's wake showed it).
func TestARetriedStepPastAnAwaitIsShownItsInbox(t *testing.T) {
	t.Parallel()
	type seen struct {
		Inbox   []string `json:"inbox"`
		Awaited []string `json:"awaited"`
	}
	for _, how := range []string{"cancelled before it ran", "stopped by its step", "reaped with no attempt left"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			m := &gendurable.Machine[waitState]{
				Name: "retrywake", Start: "park",
				Steps: map[string]gendurable.StepFunc[waitState]{
					"park": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
						return r.Await("woken", r.State, "x"), nil
					},
					"woken": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
						if runs.Add(1) == 1 && how == "stopped by its step" {
							return gendurable.Stop("the first run stops"), nil
						}
						s := seen{Inbox: []string{}, Awaited: []string{}}
						for _, sig := range r.Inbox {
							s.Inbox = append(s.Inbox, sig.Name)
						}
						for _, sig := range r.Awaited {
							s.Awaited = append(s.Awaited, sig.Name)
						}
						return gendurable.Done(s), nil
					},
				},
			}
			b := setup(t, nil, m)
			b.start()
			ctx := context.Background()
			res, err := b.eng.Insert(ctx, m.New(waitState{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
			require.NoError(t, err)
			id := res.ID
			b.waitStatus(id, "awaiting_signal", 10*time.Second)
			if how != "stopped by its step" {
				require.NoError(t, b.eng.Pause(ctx, gendurable.DefaultQueue))
			}
			_, err = b.eng.Signal(ctx, id, "x", nil, nil)
			require.NoError(t, err)
			switch how {
			case "cancelled before it ran":
				b.waitStatus(id, "runnable", 10*time.Second)
				require.NoError(t, b.eng.Cancel(ctx, id, "operator"))
			case "stopped by its step":
				b.waitStatus(id, "failed", 10*time.Second)
				require.NoError(t, b.eng.Pause(ctx, gendurable.DefaultQueue))
			case "reaped with no attempt left":
				// Claimed by a worker that vanished mid-step (a heartbeat had
				// confirmed the step): its lease ran out.
				b.waitStatus(id, "runnable", 10*time.Second)
				b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', claim_token = 99, unstarted_token = NULL,
				        lease_expires_at = now() - interval '1 second' WHERE id = $1 AND status = 'runnable'`, id)
				_, err := b.eng.Reap(ctx)
				require.NoError(t, err)
				b.waitStatus(id, "failed", time.Second)
			}
			require.NoError(t, b.eng.Retry(ctx, id))
			_, err = b.eng.Signal(ctx, id, "y", nil, nil)
			require.NoError(t, err)
			require.NoError(t, b.eng.Resume(ctx, gendurable.DefaultQueue))
			r := b.waitStatus(id, "done", 10*time.Second)
			require.JSONEq(t, `{"inbox":["y"],"awaited":[]}`, string(r.Result),
				"the retried step runs as after a timeout, shown the signal sent since the retry")
			require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NULL`, id))
		})
	}
}

// TestWaitReasonOfAnAwaitPastItsDeadline: an await whose deadline has
// passed and that the timeout sweep has not woken yet says so ("in -1s"
// before).
func TestWaitReasonOfAnAwaitPastItsDeadline(t *testing.T) {
	t.Parallel()
	m := awaiter(time.Hour)
	b := setup(t, nil, m)
	id := b.insert(m.New(waitState{}))
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'awaiting_signal', awaits = '{pay}',
		await_deadline = now() - interval '2 seconds' WHERE id = $1`, id)
	w, err := b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.Regexp(t, `^awaiting signal pay \(timed out 2(\.\d+)?s ago; the await-timeout sweep wakes it\)$`, w.Summary)
}

// TestWaitReasonOfAPrefetchedClaim: with one running slot, a second claim
// waits in the worker's prefetch buffer; once a heartbeat has marked it not
// started, its wait reason says so, not "running step" (an operator looking
// at an executing row that never starts). The running one says running.
func TestWaitReasonOfAPrefetchedClaim(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	job := &gendurable.Job[orderArgs]{Name: "prefetched", Perform: func(ctx context.Context, r *gendurable.Run[orderArgs]) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}}
	cfg := fastConfig("", job)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 1, PollInterval: 20 * time.Millisecond}}
	cfg.HeartbeatInterval = 100 * time.Millisecond
	b := setup(t, cfg)
	ctx := context.Background()
	first := b.insert(job.New(orderArgs{I: 1}))
	second := b.insert(job.New(orderArgs{I: 2}))
	b.start()
	defer close(release)
	var running, waiting int64
	eventually(t, 5*time.Second, func() bool {
		w1, err := b.eng.WaitReason(ctx, first)
		require.NoError(t, err)
		w2, err := b.eng.WaitReason(ctx, second)
		require.NoError(t, err)
		switch {
		case w1.Unstarted && w2.Status == gendurable.StatusExecuting && !w2.Unstarted:
			running, waiting = second, first
		case w2.Unstarted && w1.Status == gendurable.StatusExecuting && !w1.Unstarted:
			running, waiting = first, second
		default:
			return false
		}
		return true
	}, "no claim was marked not started while the other ran")
	w, err := b.eng.WaitReason(ctx, waiting)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusExecuting, w.Status)
	require.Contains(t, w.Summary, "(prefetched), step perform not started as of its last heartbeat")
	require.NotNil(t, w.LeaseExpiresAt)
	w, err = b.eng.WaitReason(ctx, running)
	require.NoError(t, err)
	require.Equal(t, "running step perform", w.Summary)
	require.False(t, w.Unstarted)
}

// TestWaitReasonOfAnExpiredLease (a crash probe): a worker process holding
// one running step and eight prefetched claims is killed, and no engine of
// the schema runs a reaper. Once the leases have run out on the database's
// clock, the wait reasons say so, not "running step work" and "not started
// as of its last heartbeat", which read as if a worker were still at them.
func TestWaitReasonOfAnExpiredLease(t *testing.T) {
	t.Parallel()
	b, _, kill := prefetchingHelper(t)
	kill()
	ctx := context.Background()
	rows, err := b.pool.Query(ctx, replaceSchema(`SELECT id FROM {{s}}.gendurable_instances ORDER BY id`, b.schema))
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, 9)
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE lease_expires_at < now()`) == 9
	}, "the killed worker's leases did not run out")
	var running, prefetched int
	for _, id := range ids {
		w, err := b.eng.WaitReason(ctx, id)
		require.NoError(t, err)
		require.Equal(t, gendurable.StatusExecuting, w.Status)
		require.NotNil(t, w.LeaseExpiresAt)
		require.Contains(t, w.Summary, "ago with no outcome (no heartbeat renewed it: its worker crashed, stopped or was cut off, "+
			"or another transaction holds the row locked): waiting for the reaper of a running engine of this schema to make it runnable again")
		require.NotContains(t, w.Summary, "running step")
		if w.Unstarted {
			prefetched++
			require.Contains(t, w.Summary, "lease of prefetched step work (not started as of its last heartbeat) expired ")
		} else {
			running++
			require.Contains(t, w.Summary, "lease of step work expired ")
			require.Contains(t, w.Summary, "(or failed, if that run was its last attempt)")
		}
	}
	require.Equal(t, 1, running)
	require.Equal(t, 8, prefetched)
}

// TestASignalSentWhileAWokenClaimWaitsForASlotIsInItsInbox (a probe): a
// row its await's timeout woke is claimed ahead of a free slot (the
// prefetch buffer) while a long step holds the only one; a matching signal
// sent then, before the woken step starts, must be in its Inbox. The
// claim read the inbox, and the step saw it as of then: empty, and its
// Done consumed the signal no step had seen (a payment lost as a timeout).
func TestASignalSentWhileAWokenClaimWaitsForASlotIsInItsInbox(t *testing.T) {
	t.Parallel()
	type seen struct {
		Awaited, Inbox []string
	}
	got := make(chan seen, 1)
	m := &gendurable.Machine[waitState]{Name: "bufwait", Start: "park",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"park": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("woken", r.State, "pay").Timeout(200 * time.Millisecond), nil
			},
			"woken": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				var s seen
				for _, sig := range r.Awaited {
					s.Awaited = append(s.Awaited, sig.Name)
				}
				for _, sig := range r.Inbox {
					s.Inbox = append(s.Inbox, sig.Name)
				}
				got <- s
				return gendurable.Done(nil), nil
			},
		}}
	release := make(chan struct{})
	blocker := slotHog("slothog", release)
	cfg := fastConfig("", m, blocker)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	id := b.insert(m.New(waitState{}))
	eventually(t, 10*time.Second, func() bool { return b.row(id).Status == "awaiting_signal" }, "the instance did not park")
	b.insert(blocker.New(leafArgs{}))
	// The timeout wakes it, and the feeder claims it ahead of the busy slot.
	eventually(t, 10*time.Second, func() bool {
		r := b.row(id)
		return r.Status == "executing" && r.Step == "woken"
	}, "the woken instance was not claimed ahead")
	res, err := b.eng.Signal(ctx, id, "pay", payment{Amount: 1}, nil)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	time.Sleep(50 * time.Millisecond)
	close(release)
	select {
	case s := <-got:
		require.Empty(t, s.Awaited, "woken by its timeout")
		require.Equal(t, []string{"pay"}, s.Inbox, "the signal sent while its claim waited for a slot")
	case <-time.After(15 * time.Second):
		t.Fatal("the woken step did not run")
	}
}
