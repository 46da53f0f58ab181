package gdotel_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	gdotel "github.com/gendurable/gendurable/otel"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func step(id int64, stepName, outcome string, d time.Duration, err error) *gendurable.StepEvent {
	return &gendurable.StepEvent{
		Queue: "q", Machine: "order", Version: 3, InstanceID: id, Step: stepName,
		Attempt: 1, Outcome: outcome, Err: err, Duration: d,
	}
}

func TestStepMetrics(t *testing.T) {
	r := newRig(t, gdotel.Options{})
	ctx := context.Background()
	r.hook.OnEvent(ctx, step(1, "charge", "next", 100*time.Millisecond, nil))
	r.hook.OnEvent(ctx, step(1, "ship", "done", 200*time.Millisecond, nil))
	r.hook.OnEvent(ctx, step(2, "charge", "replay", 50*time.Millisecond, errors.New("card declined")))
	r.hook.OnEvent(ctx, &gendurable.StepEvent{Queue: "q", Machine: "order", Step: "ship", InstanceID: 2, Outcome: "done", Fenced: true})
	r.hook.OnEvent(ctx, &gendurable.StepEvent{Queue: "q", Machine: "order", Step: "ship", InstanceID: 2, Outcome: "done", CommitErr: errors.New("conn reset")})
	// A step a Stop interrupted: it runs again, no failure.
	r.hook.OnEvent(ctx, &gendurable.StepEvent{Queue: "q", Machine: "order", Step: "pack", InstanceID: 3, Outcome: "replay",
		Err: gendurable.ErrEngineStopped, Interrupted: true})

	rm := r.collect(t)
	steps := mustMetric(t, rm, gdotel.MetricSteps)
	if steps.Unit != "{step}" {
		t.Errorf("steps unit = %q", steps.Unit)
	}
	if n, _ := intSum(t, steps); n != 6 {
		t.Errorf("steps total = %d, want 6", n)
	}
	if got, _ := intSum(t, steps, gdotel.AttrStep.String("pack"), gdotel.AttrError.Bool(false)); got != 1 {
		t.Errorf("steps{pack, error=false} = %d, want 1 (an interrupted step is no error)", got)
	}
	q, m := gdotel.AttrQueue.String("q"), gdotel.AttrMachine.String("order")
	for _, c := range []struct {
		want  int64
		attrs []attribute.KeyValue
	}{
		{1, []attribute.KeyValue{q, m, gdotel.AttrStep.String("charge"), gdotel.AttrOutcome.String("next"), gdotel.AttrError.Bool(false), gdotel.AttrFenced.Bool(false)}},
		{1, []attribute.KeyValue{q, m, gdotel.AttrStep.String("ship"), gdotel.AttrOutcome.String("done"), gdotel.AttrError.Bool(false), gdotel.AttrFenced.Bool(false), gdotel.AttrCommitError.Bool(false)}},
		{1, []attribute.KeyValue{q, m, gdotel.AttrStep.String("charge"), gdotel.AttrOutcome.String("replay"), gdotel.AttrError.Bool(true)}},
		{1, []attribute.KeyValue{gdotel.AttrOutcome.String("done"), gdotel.AttrFenced.Bool(true)}},
		{1, []attribute.KeyValue{gdotel.AttrOutcome.String("done"), gdotel.AttrCommitError.Bool(true)}},
		{3, []attribute.KeyValue{gdotel.AttrOutcome.String("done")}},
		{5, []attribute.KeyValue{gdotel.AttrError.Bool(false)}},
	} {
		if got, _ := intSum(t, steps, c.attrs...); got != c.want {
			t.Errorf("steps%v = %d, want %d", c.attrs, got, c.want)
		}
	}

	dur := mustMetric(t, rm, gdotel.MetricStepDuration)
	if dur.Unit != "s" {
		t.Errorf("step.duration unit = %q", dur.Unit)
	}
	count, sum := histCount(t, dur)
	if count != 6 || math.Abs(sum-0.35) > 1e-9 {
		t.Errorf("step.duration count=%d sum=%v, want 6, 0.35", count, sum)
	}
	if c, s := histCount(t, dur, gdotel.AttrStep.String("ship"), gdotel.AttrFenced.Bool(false), gdotel.AttrCommitError.Bool(false)); c != 1 || math.Abs(s-0.2) > 1e-9 {
		t.Errorf("step.duration{ship} count=%d sum=%v, want 1, 0.2", c, s)
	}
}

func TestStepSpans(t *testing.T) {
	r := newRig(t, gdotel.Options{})
	ctx := context.Background()
	before := time.Now()
	r.hook.OnEvent(ctx, step(42, "charge", "next", 300*time.Millisecond, nil))
	r.hook.OnEvent(ctx, step(42, "ship", "replay", 10*time.Millisecond, errors.New("carrier down")))
	r.hook.OnEvent(ctx, step(43, "charge", "done", time.Millisecond, nil))
	after := time.Now()

	spans := r.spans.Ended()
	if len(spans) != 3 {
		t.Fatalf("got %d spans, want 3", len(spans))
	}
	a, b, c := spans[0], spans[1], spans[2]
	if a.Name() != "gendurable.step order.charge" || b.Name() != "gendurable.step order.ship" {
		t.Errorf("span names %q, %q", a.Name(), b.Name())
	}
	if a.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span kind = %v", a.SpanKind())
	}

	// The two steps of instance 42 share one trace, whose synthetic root is
	// their parent; instance 43 has a trace of its own.
	root := r.hook.InstanceSpanContext(42)
	if a.SpanContext().TraceID() != b.SpanContext().TraceID() {
		t.Errorf("steps of one instance in different traces: %s, %s", a.SpanContext().TraceID(), b.SpanContext().TraceID())
	}
	if a.SpanContext().TraceID() != root.TraceID() {
		t.Errorf("trace id %s, want the instance's %s", a.SpanContext().TraceID(), root.TraceID())
	}
	if c.SpanContext().TraceID() == a.SpanContext().TraceID() {
		t.Errorf("two instances share trace %s", c.SpanContext().TraceID())
	}
	for _, s := range []sdktrace.ReadOnlySpan{a, b} {
		if s.Parent().SpanID() != root.SpanID() || !s.Parent().IsRemote() {
			t.Errorf("%s: parent %v, want remote %s", s.Name(), s.Parent(), root.SpanID())
		}
		if s.SpanContext().SpanID() == root.SpanID() {
			t.Errorf("%s reuses the root span id", s.Name())
		}
	}
	if a.SpanContext().SpanID() == b.SpanContext().SpanID() {
		t.Error("two steps share a span id")
	}

	// Attributes.
	for k, want := range map[attribute.Key]attribute.Value{
		gdotel.AttrInstanceID:     attribute.Int64Value(42),
		gdotel.AttrQueue:          attribute.StringValue("q"),
		gdotel.AttrMachine:        attribute.StringValue("order"),
		gdotel.AttrMachineVersion: attribute.IntValue(3),
		gdotel.AttrStep:           attribute.StringValue("charge"),
		gdotel.AttrAttempt:        attribute.IntValue(1),
		gdotel.AttrOutcome:        attribute.StringValue("next"),
	} {
		if got, ok := spanAttr(a, k); !ok || got != want {
			t.Errorf("attribute %s = %v (present %v), want %v", k, got.String(), ok, want.String())
		}
	}

	// Timing: the span covers the step's duration, ending when the event arrived.
	if d := a.EndTime().Sub(a.StartTime()); d != 300*time.Millisecond {
		t.Errorf("span duration %v, want 300ms", d)
	}
	if a.EndTime().Before(before) || a.EndTime().After(after) {
		t.Errorf("span end %v outside [%v, %v]", a.EndTime(), before, after)
	}

	// Status.
	if a.Status().Code != codes.Unset {
		t.Errorf("ok step status = %v", a.Status())
	}
	if b.Status().Code != codes.Error || b.Status().Description != "carrier down" {
		t.Errorf("failed step status = %+v", b.Status())
	}
	var recorded bool
	for _, e := range b.Events() {
		if e.Name == "exception" {
			recorded = true
		}
	}
	if !recorded {
		t.Error("the step's error was not recorded as an exception event")
	}
}

func TestCommitErrorSpan(t *testing.T) {
	r := newRig(t, gdotel.Options{})
	r.hook.OnEvent(context.Background(), &gendurable.StepEvent{Machine: "m", Step: "s", InstanceID: 7, Outcome: "done", CommitErr: errors.New("conn reset")})
	r.hook.OnEvent(context.Background(), &gendurable.StepEvent{Machine: "m", Step: "s", InstanceID: 7, Outcome: "done", Fenced: true})
	spans := r.spans.Ended()
	if len(spans) != 2 {
		t.Fatalf("got %d spans", len(spans))
	}
	if st := spans[0].Status(); st.Code != codes.Error || !strings.Contains(st.Description, "conn reset") {
		t.Errorf("commit error status = %+v", st)
	}
	if v, ok := spanAttr(spans[0], gdotel.AttrCommitError); !ok || !v.AsBool() {
		t.Error("commit_error attribute missing")
	}
	if v, ok := spanAttr(spans[1], gdotel.AttrFenced); !ok || !v.AsBool() {
		t.Error("fenced attribute missing")
	}
}

func TestTraceIDDeterministicAndSalted(t *testing.T) {
	h1, err := gdotel.New(gdotel.Options{MeterProvider: noop.NewMeterProvider()})
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := gdotel.New(gdotel.Options{MeterProvider: noop.NewMeterProvider(), TraceSalt: gdotel.DefaultTraceSalt})
	h3, _ := gdotel.New(gdotel.Options{MeterProvider: noop.NewMeterProvider(), TraceSalt: "staging"})
	a, b, c := h1.InstanceSpanContext(99), h2.InstanceSpanContext(99), h3.InstanceSpanContext(99)
	if !a.Equal(b) {
		t.Errorf("same salt, different span contexts: %v, %v", a, b)
	}
	if a.TraceID() == c.TraceID() {
		t.Error("different salts give the same trace id")
	}
	if !a.IsValid() || !a.IsSampled() || !a.IsRemote() {
		t.Errorf("root span context %v: want valid, sampled, remote", a)
	}
	if h1.InstanceSpanContext(100).TraceID() == a.TraceID() {
		t.Error("instances 99 and 100 share a trace id")
	}
	if got := trace.SpanContextFromContext(h1.InstanceContext(context.Background(), 99)); !got.Equal(a) {
		t.Errorf("InstanceContext carries %v", got)
	}
}

// With a trace-id ratio sampler for remote parents, an instance is sampled
// whole or not at all, since all its steps share the trace id.
func TestSamplingPerInstance(t *testing.T) {
	r := newRig(t, gdotel.Options{}, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample(),
		sdktrace.WithRemoteParentSampled(sdktrace.TraceIDRatioBased(0.5)))))
	const instances = 200
	for id := int64(1); id <= instances; id++ {
		for _, s := range []string{"a", "b", "c"} {
			r.hook.OnEvent(context.Background(), step(id, s, "next", time.Millisecond, nil))
		}
	}
	per := map[trace.TraceID]int{}
	for _, s := range r.spans.Ended() {
		per[s.SpanContext().TraceID()]++
	}
	for tid, n := range per {
		if n != 3 {
			t.Errorf("trace %s has %d of 3 steps", tid, n)
		}
	}
	if len(per) == 0 || len(per) == instances {
		t.Errorf("%d of %d instances sampled at ratio 0.5", len(per), instances)
	}
	// Metrics are not sampled.
	if n, _ := intSum(t, mustMetric(t, r.collect(t), gdotel.MetricSteps)); n != 3*instances {
		t.Errorf("steps = %d, want %d", n, 3*instances)
	}
}

func TestOtherEvents(t *testing.T) {
	r := newRig(t, gdotel.Options{})
	ctx := context.Background()
	h := r.hook
	h.OnEvent(ctx, &gendurable.PickEvent{Queue: "q", Count: 4, Demand: 10, Duration: 2 * time.Millisecond})
	h.OnEvent(ctx, &gendurable.PickEvent{Queue: "q", Count: 0, Demand: 10, Duration: 3 * time.Millisecond})
	h.OnEvent(ctx, &gendurable.PickEvent{Queue: "q", Demand: 10, Duration: time.Millisecond, Err: errors.New("boom")})
	h.OnEvent(ctx, &gendurable.PickEvent{Queue: "other", Count: 1, Demand: 1, Duration: time.Millisecond})
	h.OnEvent(ctx, &gendurable.PickEvent{Queue: "kq", Demand: 5, Duration: time.Millisecond, Throttled: []gendurable.KeyThrottle{
		{Default: true, Full: 2}, {Prefix: "acct:", Full: 1, RateLimited: 4}}})
	h.OnEvent(ctx, &gendurable.SaturationEvent{Queue: "q", InFlight: 7, Buffered: 2, Concurrency: 10, Prefetch: 10})
	h.OnEvent(ctx, &gendurable.ReapEvent{Count: 4, Failed: 1, Uncharged: 1, IDs: []int64{11, 12, 13, 16}, Duration: time.Millisecond})
	h.OnEvent(ctx, &gendurable.LeaseLostEvent{Queue: "q", InstanceID: 11})
	h.OnEvent(ctx, &gendurable.LeaseLostEvent{Queue: "q", InstanceID: 17, Unstarted: true})
	h.OnEvent(ctx, &gendurable.StepAbandonedEvent{Queue: "q", Machine: "m", InstanceID: 15, Step: "s", Outcome: "replay", AbandonedSlots: 1})
	h.OnEvent(ctx, &gendurable.UnknownVersionEvent{Queue: "q", Machine: "m", Version: 9, InstanceID: 14})
	h.OnEvent(ctx, &gendurable.DrainEvent{Queue: "q"}) // no metric; must not panic

	rm := r.collect(t)
	q := gdotel.AttrQueue.String("q")
	pd := mustMetric(t, rm, gdotel.MetricPickDuration)
	if c, s := histCount(t, pd, q, gdotel.AttrError.Bool(false)); c != 2 || math.Abs(s-0.005) > 1e-9 {
		t.Errorf("pick.duration{q,ok} = %d, %v", c, s)
	}
	if c, _ := histCount(t, pd, q, gdotel.AttrError.Bool(true)); c != 1 {
		t.Errorf("pick.duration{q,error} = %d", c)
	}
	rows := mustMetric(t, rm, gdotel.MetricPickRows)
	if rows.Unit != "{row}" {
		t.Errorf("pick.rows unit %q", rows.Unit)
	}
	if n, _ := intSum(t, rows, q); n != 4 {
		t.Errorf("pick.rows{q} = %d", n)
	}
	if n, _ := intSum(t, rows, gdotel.AttrQueue.String("other")); n != 1 {
		t.Errorf("pick.rows{other} = %d", n)
	}
	if n, _ := intSum(t, mustMetric(t, rm, gdotel.MetricInFlight), q); n != 7 {
		t.Errorf("in_flight = %d", n)
	}
	if n, _ := intSum(t, mustMetric(t, rm, gdotel.MetricBuffered), q); n != 2 {
		t.Errorf("buffered = %d", n)
	}
	reaped := mustMetric(t, rm, gdotel.MetricReaped)
	if n, _ := intSum(t, reaped, gdotel.AttrFailed.Bool(false)); n != 3 {
		t.Errorf("reaped{failed=false} = %d", n)
	}
	if n, _ := intSum(t, reaped, gdotel.AttrUncharged.Bool(true)); n != 1 {
		t.Errorf("reaped{uncharged=true} = %d", n)
	}
	if n, _ := intSum(t, reaped, gdotel.AttrFailed.Bool(true)); n != 1 {
		t.Errorf("reaped{failed=true} = %d", n)
	}
	lost := mustMetric(t, rm, gdotel.MetricLeaseLost)
	if n, _ := intSum(t, lost, q, gdotel.AttrUnstarted.Bool(false)); n != 1 {
		t.Errorf("lease.lost{unstarted=false} = %d", n)
	}
	if n, _ := intSum(t, lost, q, gdotel.AttrUnstarted.Bool(true)); n != 1 {
		t.Errorf("lease.lost{unstarted=true} = %d", n)
	}
	if n, _ := intSum(t, mustMetric(t, rm, gdotel.MetricStepsAbandoned), q, gdotel.AttrMachine.String("m")); n != 1 {
		t.Errorf("steps.abandoned = %d", n)
	}
	contended := mustMetric(t, rm, gdotel.MetricPartitionContended)
	kq := gdotel.AttrQueue.String("kq")
	if n, _ := intSum(t, contended, kq, gdotel.AttrKeyPolicy.String("(default)")); n != 2 {
		t.Errorf("partition.contended{(default)} = %d", n)
	}
	if n, _ := intSum(t, contended, kq, gdotel.AttrKeyPolicy.String("acct:")); n != 1 {
		t.Errorf("partition.contended{acct:} = %d", n)
	}
	if n, _ := intSum(t, mustMetric(t, rm, gdotel.MetricKeyRateLimited), kq, gdotel.AttrKeyPolicy.String("acct:")); n != 4 {
		t.Errorf("key.rate_limited{acct:} = %d", n)
	}
	if n, _ := intSum(t, mustMetric(t, rm, gdotel.MetricUnknownVersion), q, gdotel.AttrMachine.String("m"), gdotel.AttrMachineVersion.Int(9)); n != 1 {
		t.Errorf("unknown_version = %d", n)
	}
	if _, ok := findMetric(rm, gdotel.MetricQueueDepth); ok {
		t.Error("queue.depth reported without a pool")
	}

	// Reaped, lease-lost and abandoned instances get a marker span in their trace.
	names := map[string][]int64{}
	for _, s := range r.spans.Ended() {
		v, _ := spanAttr(s, gdotel.AttrInstanceID)
		names[s.Name()] = append(names[s.Name()], v.AsInt64())
		if s.Name() == "gendurable.lease_lost" {
			if u, ok := spanAttr(s, gdotel.AttrUnstarted); !ok || u.AsBool() != (v.AsInt64() == 17) {
				t.Errorf("lease_lost span of %d: unstarted %v (set: %v)", v.AsInt64(), u.AsBool(), ok)
			}
		}
		if s.SpanContext().TraceID() != h.InstanceSpanContext(v.AsInt64()).TraceID() {
			t.Errorf("%s span of %d outside the instance's trace", s.Name(), v.AsInt64())
		}
	}
	if len(names["gendurable.reaped"]) != 4 || len(names["gendurable.lease_lost"]) != 2 ||
		len(names["gendurable.step_abandoned"]) != 1 || len(names) != 3 {
		t.Errorf("marker spans: %v", names)
	}
}

func TestNewValidation(t *testing.T) {
	if _, err := gdotel.New(gdotel.Options{Schema: "public"}); err == nil {
		t.Error("Schema without Pool accepted")
	}
	// A pool that is never used: pgxpool connects lazily.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, s := range []string{`bad"name`, "1abc", "a b", "x; DROP TABLE y", strings.Repeat("a", 64)} {
		if _, err := gdotel.New(gdotel.Options{Pool: pool, Schema: s}); err == nil {
			t.Errorf("schema %q accepted", s)
		}
	}
	for _, s := range []string{"", "public", "_x", "My_Schema9", strings.Repeat("a", 63)} {
		h, err := gdotel.New(gdotel.Options{Pool: pool, Schema: s})
		if err != nil {
			t.Errorf("schema %q rejected: %v", s, err)
			continue
		}
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := h.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
}

// The depth query failing (no server) is an error of the collection, not a
// panic, and the other metrics are still collected.
func TestQueueDepthErrorIsReported(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r := newRig(t, gdotel.Options{Pool: pool, DepthTimeout: 2 * time.Second})
	r.hook.OnEvent(context.Background(), step(1, "s", "done", time.Millisecond, nil))
	var rm metricdata.ResourceMetrics
	err = r.reader.Collect(context.Background(), &rm)
	if err == nil || !strings.Contains(err.Error(), "gdotel: queue depth") {
		t.Errorf("collect error = %v, want the depth query's", err)
	}
	if n, _ := intSum(t, mustMetric(t, rm, gdotel.MetricSteps)); n != 1 {
		t.Errorf("steps = %d", n)
	}
	if m, ok := findMetric(rm, gdotel.MetricQueueDepth); ok {
		if _, pts := intSum(t, m); pts != 0 {
			t.Errorf("queue.depth has %d points without a database", pts)
		}
	}
}

// OnEvent is called from many engine goroutines at once.
func TestConcurrentEvents(t *testing.T) {
	r := newRig(t, gdotel.Options{})
	var wg sync.WaitGroup
	const goroutines, each = 8, 200
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r.hook.OnEvent(context.Background(), step(int64(g*each+i), []string{"a", "b"}[i%2], "next", time.Microsecond, nil))
				r.hook.OnEvent(context.Background(), &gendurable.PickEvent{Queue: "q", Count: 1, Demand: 1})
			}
		}()
	}
	done := make(chan struct{})
	go func() { // collections race with recording
		for {
			select {
			case <-done:
				return
			default:
				r.collect(t)
			}
		}
	}()
	wg.Wait()
	close(done)
	if n, _ := intSum(t, mustMetric(t, r.collect(t), gdotel.MetricSteps)); n != goroutines*each {
		t.Errorf("steps = %d, want %d", n, goroutines*each)
	}
	if got := len(r.spans.Ended()); got != goroutines*each {
		t.Errorf("spans = %d, want %d", got, goroutines*each)
	}
}
