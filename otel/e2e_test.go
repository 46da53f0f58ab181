package gdotel_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	gdotel "github.com/gendurable/gendurable/otel"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"
)

func TestEndToEnd(t *testing.T) {
	pool, schema := dbtest.NewSchema(t, nil)
	r := newRig(t, gdotel.Options{Pool: pool, Schema: schema})

	type args struct{ N int }
	job := &gendurable.Job[args]{
		Name:    "otel_e2e",
		Queue:   "otel",
		Perform: func(ctx context.Context, j *gendurable.Run[args]) error { return nil },
	}
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Definition{job},
		Queues:   map[string]gendurable.QueueConfig{"otel": {Concurrency: 2, PollInterval: 50 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond}},
		Hooks:    []gendurable.Hook{r.hook},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			if err := eng.Stop(context.Background()); err != nil {
				t.Errorf("Stop: %v", err)
			}
		}
	}
	defer stop()

	const n = 5
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = job.New(args{N: i})
	}
	res, err := eng.InsertMany(ctx, ps)
	if err != nil {
		t.Fatal(err)
	}
	for _, ir := range res {
		for {
			in, err := eng.Instance(ctx, ir.ID)
			if err != nil {
				t.Fatalf("instance %d: %v", ir.ID, err)
			}
			if in.Status == gendurable.StatusDone {
				break
			}
			if in.Status.Terminal() {
				t.Fatalf("instance %d ended %s", ir.ID, in.Status)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("instance %d still %s", ir.ID, in.Status)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	stop()

	rm := r.collect(t)
	steps := mustMetric(t, rm, gdotel.MetricSteps)
	if got, _ := intSum(t, steps, gdotel.AttrQueue.String("otel"), gdotel.AttrMachine.String("otel_e2e"),
		gdotel.AttrStep.String(gendurable.JobStep), gdotel.AttrOutcome.String("done"), gdotel.AttrError.Bool(false)); got != n {
		t.Errorf("steps{done} = %d, want %d", got, n)
	}
	if got, _ := intSum(t, steps); got != n {
		t.Errorf("steps = %d, want %d", got, n)
	}
	if c, _ := histCount(t, mustMetric(t, rm, gdotel.MetricStepDuration)); c != n {
		t.Errorf("step.duration count = %d, want %d", c, n)
	}
	if got, _ := intSum(t, mustMetric(t, rm, gdotel.MetricPickRows), gdotel.AttrQueue.String("otel")); got < n {
		t.Errorf("pick.rows = %d, want >= %d", got, n)
	}
	if c, _ := histCount(t, mustMetric(t, rm, gdotel.MetricPickDuration)); c == 0 {
		t.Error("no pick.duration recorded")
	}

	depth := mustMetric(t, rm, gdotel.MetricQueueDepth)
	if depth.Unit != "{instance}" {
		t.Errorf("queue.depth unit %q", depth.Unit)
	}
	q := gdotel.AttrQueue.String("otel")
	if got, pts := intSum(t, depth, q, gdotel.AttrStatus.String("done")); got != n || pts != 1 {
		t.Errorf("queue.depth{otel,done} = %d (%d points), want %d", got, pts, n)
	}
	if got, pts := intSum(t, depth, q, gdotel.AttrStatus.String("runnable")); got != 0 || pts != 1 {
		t.Errorf("queue.depth{otel,runnable} = %d (%d points), want a 0", got, pts)
	}
	if _, pts := intSum(t, depth); pts != 6 {
		t.Errorf("queue.depth has %d points, want 6 (one queue x 6 statuses)", pts)
	}

	// One span per job, each in its instance's trace.
	byTrace := map[string]int64{}
	for _, ir := range res {
		byTrace[r.hook.InstanceSpanContext(ir.ID).TraceID().String()] = ir.ID
	}
	spans := r.spans.Ended()
	if len(spans) != n {
		t.Errorf("got %d spans, want %d", len(spans), n)
	}
	for _, s := range spans {
		if s.Name() != "gendurable.step otel_e2e.perform" {
			t.Errorf("span %q", s.Name())
		}
		id, ok := byTrace[s.SpanContext().TraceID().String()]
		v, _ := spanAttr(s, gdotel.AttrInstanceID)
		if !ok || v.AsInt64() != id {
			t.Errorf("span of instance %d in trace %s", v.AsInt64(), s.SpanContext().TraceID())
		}
	}

	// After Close the database is no longer queried.
	if err := r.hook.Close(); err != nil {
		t.Fatal(err)
	}
	if m, ok := findMetric(r.collect(t), gdotel.MetricQueueDepth); ok {
		if _, pts := intSum(t, m); pts != 0 {
			t.Errorf("queue.depth still reported after Close: %d points", pts)
		}
	}
}

// TestQueueDepthIsAnExactCountByQueueAndStatus: the gauge counts every row of
// each queue and status at collection — runnable rows scheduled for later
// and finished rows included — not only what a pick could claim now (a
// bounded count of eligible runnable rows, such as the long-horizon bench's
// QueueDepth, would read 2 here rather than 5, and report no done rows).
func TestQueueDepthIsAnExactCountByQueueAndStatus(t *testing.T) {
	pool, schema := dbtest.NewSchema(t, nil)
	r := newRig(t, gdotel.Options{Pool: pool, Schema: schema})
	type args struct{ N int }
	jobA := &gendurable.Job[args]{Name: "depth_a", Queue: "a", Perform: func(context.Context, *gendurable.Run[args]) error { return nil }}
	jobB := &gendurable.Job[args]{Name: "depth_b", Queue: "b", Perform: func(context.Context, *gendurable.Run[args]) error { return nil }}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{jobA, jobB}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	later := gendurable.InsertOpts{RunIn: time.Hour}
	ps := []gendurable.InsertParams{jobA.New(args{1}), jobA.New(args{2}), jobA.New(args{3}).With(later),
		jobA.New(args{4}).With(later), jobA.New(args{5}).With(later), jobB.New(args{6})}
	res, err := eng.InsertMany(ctx, ps)
	if err != nil {
		t.Fatal(err)
	}
	// One of b's rows finished, as an operator's cancel leaves it.
	if err := eng.Cancel(ctx, res[5].ID, "done with it"); err != nil {
		t.Fatal(err)
	}
	in, err := eng.Instance(ctx, res[5].ID)
	if err != nil {
		t.Fatal(err)
	}

	depth := mustMetric(t, r.collect(t), gdotel.MetricQueueDepth)
	want := map[[2]string]int64{{"a", "runnable"}: 5, {"b", string(in.Status)}: 1}
	for _, q := range []string{"a", "b"} {
		for _, s := range []gendurable.Status{gendurable.StatusRunnable, gendurable.StatusExecuting, gendurable.StatusAwaitingSignal,
			gendurable.StatusAwaitingChildren, gendurable.StatusDone, gendurable.StatusFailed} {
			got, pts := intSum(t, depth, gdotel.AttrQueue.String(q), gdotel.AttrStatus.String(string(s)))
			if w := want[[2]string{q, string(s)}]; got != w || pts != 1 {
				t.Errorf("queue.depth{%s,%s} = %d (%d points), want %d", q, s, got, pts, w)
			}
		}
	}
}

// TestASnoozeIsNoStepError: a machine step that returns JobSnooze, which
// its default Handle replays after the delay without counting an attempt,
// does not fail: its step is counted with error=false and its span's status
// stays unset, as a Job's snooze is (no error at all). Both said error, so
// a step that polls by snoozing read as a steady rate of failures (an
// observability probe: 3 snoozes, 3 steps{error=true}, 3 error spans).
func TestASnoozeIsNoStepError(t *testing.T) {
	pool, schema := dbtest.NewSchema(t, nil)
	r := newRig(t, gdotel.Options{})
	type st struct{ N int }
	var snoozed sync.Map
	m := &gendurable.Machine[st]{
		Name: "otel_snooze", Queue: "otel", Start: "poll",
		Steps: map[string]gendurable.StepFunc[st]{
			"poll": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				if _, again := snoozed.LoadOrStore(r.ID, true); !again {
					return gendurable.Outcome{}, gendurable.JobSnooze(10 * time.Millisecond)
				}
				return gendurable.Done(nil), nil
			},
		},
	}
	eng, ctx := startSnoozer(t, pool, schema, m, r.hook)
	var ids []int64
	for i := 0; i < 3; i++ {
		res, err := eng.Insert(ctx, m.New(st{N: i}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	for _, id := range ids {
		if _, err := gendurable.WaitResult[any](ctx, eng, id); err != nil {
			t.Fatalf("instance %d: %v", id, err)
		}
		if in, err := eng.Instance(ctx, id); err != nil || in.Attempt != 0 {
			t.Fatalf("instance %d: attempt %v (%v), want 0: a snooze counts none", id, in, err)
		}
	}
	if err := eng.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	steps := mustMetric(t, r.collect(t), gdotel.MetricSteps)
	if n, _ := intSum(t, steps, gdotel.AttrOutcome.String("replay")); n != 3 {
		t.Fatalf("steps{outcome=replay} = %d, want the 3 snoozes", n)
	}
	if n, _ := intSum(t, steps, gdotel.AttrError.Bool(true)); n != 0 {
		t.Errorf("steps{error=true} = %d, want 0: a snooze is no failure", n)
	}
	for _, s := range r.spans.Ended() {
		if s.Status().Code == codes.Error {
			t.Errorf("span %s has status Error (%s): a snooze is no failure", s.Name(), s.Status().Description)
		}
	}
}

// TestASnoozeAHandleRetriesIsAStepError: a machine whose own Handle retries
// every error (r.Replay, an attempt counted) does not honour a JobSnooze
// its step returns — the default Handle does. Its retry is a failure like
// any other: steps{error=true} and an Error span. gdotel took every replay
// of a *SnoozeError for a snooze, and counted it as no error while the
// engine charged an attempt for it.
func TestASnoozeAHandleRetriesIsAStepError(t *testing.T) {
	pool, schema := dbtest.NewSchema(t, nil)
	r := newRig(t, gdotel.Options{})
	type st struct{ N int }
	m := &gendurable.Machine[st]{
		Name: "otel_snooze_retried", Queue: "otel", Start: "poll",
		Steps: map[string]gendurable.StepFunc[st]{
			"poll": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				if r.Attempt == 0 {
					return gendurable.Outcome{}, gendurable.JobSnooze(10 * time.Millisecond)
				}
				return gendurable.Done(nil), nil
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[st], err error) (gendurable.Outcome, error) {
			return r.Replay(r.State, 10*time.Millisecond), nil // a retry, whatever the error
		},
	}
	eng, ctx := startSnoozer(t, pool, schema, m, r.hook)
	res, err := eng.Insert(ctx, m.New(st{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gendurable.WaitResult[any](ctx, eng, res.ID); err != nil {
		t.Fatal(err)
	}
	if in, err := eng.Instance(ctx, res.ID); err != nil || in.Attempt != 1 {
		t.Fatalf("attempt %v (%v), want 1: the Handle's retry counts one", in, err)
	}
	if err := eng.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	steps := mustMetric(t, r.collect(t), gdotel.MetricSteps)
	if n, _ := intSum(t, steps, gdotel.AttrError.Bool(true)); n != 1 {
		t.Errorf("steps{error=true} = %d, want 1: the Handle retried the snooze as a failure, an attempt counted", n)
	}
	errored := 0
	for _, s := range r.spans.Ended() {
		if s.Status().Code == codes.Error {
			errored++
		}
	}
	if errored != 1 {
		t.Errorf("%d spans with status Error, want 1", errored)
	}
}

// startSnoozer starts an engine on schema working queue "otel" (2 slots,
// a quick poll) for the snooze tests' machine m, with hook; it is stopped
// when the test ends, and ctx bounds the test to a minute.
func startSnoozer(t *testing.T, pool *pgxpool.Pool, schema string, m gendurable.Definition, hook gendurable.Hook) (*gendurable.Engine, context.Context) {
	t.Helper()
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Definition{m},
		Queues:   map[string]gendurable.QueueConfig{"otel": {Concurrency: 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}},
		Hooks:    []gendurable.Hook{hook},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Stop(context.Background()) })
	return eng, ctx
}
