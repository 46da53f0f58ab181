package gdotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	gdotel "github.com/gendurable/gendurable/otel"
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
