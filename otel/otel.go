// Package gdotel exports gendurable's telemetry to OpenTelemetry: metrics for
// steps, picks, the reaper, leases and partitions, an optional queue-depth
// gauge read from the database, and a span per step.
//
// It is a module of its own (github.com/gendurable/gendurable/otel) so that
// the OpenTelemetry SDK never enters the dependency graph of programs that use
// gendurable without it. Wire it in as one of the engine's hooks:
//
//	h, err := gdotel.New(gdotel.Options{Pool: pool, Schema: "public"})
//	if err != nil { ... }
//	defer h.Close()
//	eng, err := gendurable.New(pool, &gendurable.Config{Hooks: []gendurable.Hook{h}, ...})
//
// Configuring a hook is what makes the engine build a [gendurable.StepEvent]
// for every step; without one it builds them only for failures.
//
// # Traces of an instance
//
// The engine carries no trace context from step to step (nothing is stored in
// the row), yet every step of an instance lands in one trace. The trick: the
// trace ID and a root span ID are derived deterministically from the instance
// id (SHA-256 of Options.TraceSalt, a zero byte and the id), and every step
// span is started with that synthetic, remote, sampled span context as its
// parent — in any process, on any host, at any time. The root span itself is
// never emitted (the tracing API cannot choose span IDs), so a tracing backend
// shows the steps as children of a parent it never received ("missing root
// span"/"root span not yet received"). Two consequences to know:
//
//   - Instances with the same id in two databases (staging and production
//     sending to one backend) share trace IDs unless their hooks use different
//     salts: set TraceSalt per database/schema when that matters.
//   - The parent is marked sampled, so a ParentBased sampler (the SDK's
//     default) records every step. To sample by instance, give the
//     TracerProvider sdktrace.ParentBased(root,
//     sdktrace.WithRemoteParentSampled(sdktrace.TraceIDRatioBased(r))): the
//     trace ID is the same for all steps of an instance, so an instance is
//     kept or dropped whole.
//
// Use [Hook.InstanceContext] inside a step to put the step's own spans into
// the instance's trace.
package gdotel

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and tracer.
const ScopeName = "github.com/gendurable/gendurable/otel"

// DefaultTraceSalt is the default Options.TraceSalt.
const DefaultTraceSalt = "gendurable"

// DefaultDepthTimeout bounds one queue-depth query.
const DefaultDepthTimeout = 5 * time.Second

// Attribute keys used on metrics and spans.
const (
	AttrQueue          = attribute.Key("gendurable.queue")
	AttrMachine        = attribute.Key("gendurable.machine")
	AttrMachineVersion = attribute.Key("gendurable.machine.version")
	AttrStep           = attribute.Key("gendurable.step")
	AttrOutcome        = attribute.Key("gendurable.outcome")
	AttrError          = attribute.Key("gendurable.error")        // bool: the step (or pick) returned an error (not for a step the engine interrupted: StepEvent.Interrupted, nor a JobSnooze replayed)
	AttrFenced         = attribute.Key("gendurable.fenced")       // bool: the outcome was fenced out (lease lost)
	AttrCommitError    = attribute.Key("gendurable.commit_error") // bool: the outcome could not be written
	AttrInstanceID     = attribute.Key("gendurable.instance.id")
	AttrAttempt        = attribute.Key("gendurable.attempt")
	AttrStatus         = attribute.Key("gendurable.status")
	AttrFailed         = attribute.Key("gendurable.failed") // bool: reaped rows that failed for good
	// AttrUncharged (bool): reaped rows returned without an attempt
	// charged (prefetched claims whose steps never started, claims no
	// heartbeat confirmed: StepError.Uncharged).
	AttrUncharged = attribute.Key("gendurable.uncharged")
	// AttrUnstarted (bool): lost leases of claims that waited in the
	// prefetch buffer (no step ran, none was cancelled).
	AttrUnstarted = attribute.Key("gendurable.unstarted")
	// AttrKeyPolicy is the prefix of the KeyPolicy a partition key fell
	// under, or "(default)" for keys no policy matches.
	AttrKeyPolicy = attribute.Key("gendurable.key_policy")
)

// Metric names.
const (
	MetricSteps              = "gendurable.steps"
	MetricStepDuration       = "gendurable.step.duration"
	MetricPickDuration       = "gendurable.pick.duration"
	MetricPickRows           = "gendurable.pick.rows"
	MetricQueueDepth         = "gendurable.queue.depth" // instances by queue and status, exact (see Options.Pool)
	MetricReaped             = "gendurable.reaped"
	MetricPartitionContended = "gendurable.partition.contended"
	MetricKeyRateLimited     = "gendurable.key.rate_limited"
	MetricLeaseLost          = "gendurable.lease.lost"
	MetricStepsAbandoned     = "gendurable.steps.abandoned"
	MetricUnknownVersion     = "gendurable.unknown_version"
	MetricInFlight           = "gendurable.scheduler.in_flight"
	MetricBuffered           = "gendurable.scheduler.buffered"
)

// durationBuckets (seconds) span sub-millisecond picks to multi-minute steps.
// Override them with an SDK View if they do not fit.
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Options configure New. The zero value uses the global providers and
// reports no queue depth.
type Options struct {
	// MeterProvider for the metrics. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider for the step spans. Default otel.GetTracerProvider().
	// Pass a noop.NewTracerProvider() for metrics only.
	TracerProvider trace.TracerProvider

	// Pool enables the gendurable.queue.depth gauge: the instances of
	// Schema in each queue and status at the collection, counted exactly —
	// runnable includes rows scheduled for later as well as those a pick
	// could claim now, and done and failed hold finished rows until the
	// pruner deletes them. One GROUP BY query per collection reads the
	// whole instances table (no index covers a count of every status): on
	// very large tables, mind the collection interval. Optional.
	Pool *pgxpool.Pool
	// Schema holding gendurable's tables (a plain identifier). Default
	// "public"; only used with Pool.
	Schema string
	// DepthTimeout bounds one queue-depth query. Default 5s.
	DepthTimeout time.Duration

	// TraceSalt is mixed into the trace IDs derived from instance ids; hooks
	// of different databases sending to one tracing backend should use
	// different salts. Default "gendurable".
	TraceSalt string
}

// Hook is a [gendurable.Hook] that records OpenTelemetry metrics and spans.
// Create it with New; it is safe for concurrent use.
type Hook struct {
	tracer trace.Tracer
	salt   string

	steps        metric.Int64Counter
	stepDuration metric.Float64Histogram
	pickDuration metric.Float64Histogram
	pickRows     metric.Int64Counter
	rateLimited  metric.Int64Counter
	reaped       metric.Int64Counter
	contended    metric.Int64Counter
	leaseLost    metric.Int64Counter
	abandoned    metric.Int64Counter
	unknownVer   metric.Int64Counter
	inFlight     metric.Int64Gauge
	buffered     metric.Int64Gauge
	depthGauge   metric.Int64ObservableGauge
	depthQuery   string
	depthTimeout time.Duration
	pool         *pgxpool.Pool
	depthMu      sync.Mutex          // one depth query at a time
	depthSeen    map[string]struct{} // queues reported before: zero-filled once empty
	registration metric.Registration
	closeOnce    sync.Once
	closeErr     error
	stepAttrs    attrCache[stepKey]
	pickAttrs    attrCache[pickKey]
	queueAttrs   attrCache[string]
}

var _ gendurable.Hook = (*Hook)(nil)

// New builds a Hook and creates its instruments.
func New(opts Options) (*Hook, error) {
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	h := &Hook{
		tracer:       tp.Tracer(ScopeName),
		salt:         opts.TraceSalt,
		depthTimeout: opts.DepthTimeout,
		pool:         opts.Pool,
	}
	if h.salt == "" {
		h.salt = DefaultTraceSalt
	}
	if h.depthTimeout <= 0 {
		h.depthTimeout = DefaultDepthTimeout
	}
	if opts.Pool == nil && opts.Schema != "" {
		return nil, errors.New("gdotel: Options.Schema is set but Options.Pool is not")
	}
	if opts.Pool != nil {
		schema := opts.Schema
		if schema == "" {
			schema = gendurable.DefaultSchema
		}
		if !identRE.MatchString(schema) {
			return nil, fmt.Errorf("gdotel: schema %q is not a plain identifier ([A-Za-z_][A-Za-z0-9_]{0,62})", schema)
		}
		h.depthQuery = `SELECT queue, status::text, count(*) FROM "` + schema + `".gendurable_instances GROUP BY 1, 2`
		h.depthSeen = map[string]struct{}{}
	}

	m := mp.Meter(ScopeName)
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	h.steps, err = m.Int64Counter(MetricSteps, metric.WithUnit("{step}"),
		metric.WithDescription("Steps finished, by queue, machine, step and outcome."))
	check(err)
	h.stepDuration, err = m.Float64Histogram(MetricStepDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of a step: user code plus outcome commit."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	check(err)
	h.pickDuration, err = m.Float64Histogram(MetricPickDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of one pick statement."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	check(err)
	h.pickRows, err = m.Int64Counter(MetricPickRows, metric.WithUnit("{row}"),
		metric.WithDescription("Rows claimed by pick statements."))
	check(err)
	h.reaped, err = m.Int64Counter(MetricReaped, metric.WithUnit("{instance}"),
		metric.WithDescription("Instances whose expired lease the reaper recovered; failed=true: attempts exhausted; uncharged=true: returned without an attempt charged (a prefetched claim whose step never started, or a claim no heartbeat confirmed)."))
	check(err)
	h.contended, err = m.Int64Counter(MetricPartitionContended, metric.WithUnit("{key}"),
		metric.WithDescription("Partition keys with runnable rows a pick passed over because every slot of the key was held, by key policy."))
	check(err)
	h.rateLimited, err = m.Int64Counter(MetricKeyRateLimited, metric.WithUnit("{key}"),
		metric.WithDescription("Partition keys with runnable rows a pick passed over because their rate left no start, by key policy."))
	check(err)
	h.leaseLost, err = m.Int64Counter(MetricLeaseLost, metric.WithUnit("{lease}"),
		metric.WithDescription("Held leases found lost or no longer confirmed in time; the step's context was cancelled (unstarted=true: a claim waiting in the prefetch buffer, no step ran)."))
	check(err)
	h.abandoned, err = m.Int64Counter(MetricStepsAbandoned, metric.WithUnit("{step}"),
		metric.WithDescription("Steps that ignored their context past StepTimeout and were abandoned (each still holds a slot until it returns)."))
	check(err)
	h.unknownVer, err = m.Int64Counter(MetricUnknownVersion, metric.WithUnit("{instance}"),
		metric.WithDescription("Claimed rows released because their machine or version is not registered here."))
	check(err)
	h.inFlight, err = m.Int64Gauge(MetricInFlight, metric.WithUnit("{step}"),
		metric.WithDescription("Steps running in this process after the last pick (or when the queue's feeder stopped)."))
	check(err)
	h.buffered, err = m.Int64Gauge(MetricBuffered, metric.WithUnit("{instance}"),
		metric.WithDescription("Claimed rows prefetched and waiting for a worker after the last pick (0 once the queue's feeder stopped)."))
	check(err)
	if h.pool != nil {
		h.depthGauge, err = m.Int64ObservableGauge(MetricQueueDepth, metric.WithUnit("{instance}"),
			metric.WithDescription("Instances in the database, by queue and status."))
		check(err)
		if err == nil {
			h.registration, err = m.RegisterCallback(h.observeDepth, h.depthGauge)
			check(err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("gdotel: creating instruments: %w", err)
	}
	return h, nil
}

// Close unregisters the queue-depth callback. It does not close the pool.
// Calling it more than once is harmless.
func (h *Hook) Close() error {
	h.closeOnce.Do(func() {
		if h.registration != nil {
			h.closeErr = h.registration.Unregister()
		}
	})
	return h.closeErr
}

// OnEvent records ev. It never blocks on I/O and retains nothing of ev.
func (h *Hook) OnEvent(ctx context.Context, ev gendurable.Event) {
	switch e := ev.(type) {
	case *gendurable.StepEvent:
		h.onStep(ctx, e)
	case *gendurable.PickEvent:
		h.pickDuration.Record(ctx, e.Duration.Seconds(), h.pickOpt(e.Queue, e.Err != nil))
		if e.Count > 0 {
			h.pickRows.Add(ctx, int64(e.Count), h.queueOpt(e.Queue))
		}
		for _, t := range e.Throttled {
			policy := t.Prefix
			if t.Default {
				policy = "(default)"
			}
			o := metric.WithAttributes(AttrQueue.String(e.Queue), AttrKeyPolicy.String(policy))
			if t.Full > 0 {
				h.contended.Add(ctx, int64(t.Full), o)
			}
			if t.RateLimited > 0 {
				h.rateLimited.Add(ctx, int64(t.RateLimited), o)
			}
		}
	case *gendurable.SaturationEvent:
		o := h.queueOpt(e.Queue)
		h.inFlight.Record(ctx, int64(e.InFlight), o)
		h.buffered.Record(ctx, int64(e.Buffered), o)
	case *gendurable.ReapEvent:
		if ok := e.Count - e.Failed - e.Uncharged; ok > 0 {
			h.reaped.Add(ctx, int64(ok), metric.WithAttributes(AttrFailed.Bool(false), AttrUncharged.Bool(false)))
		}
		if e.Uncharged > 0 {
			h.reaped.Add(ctx, int64(e.Uncharged), metric.WithAttributes(AttrFailed.Bool(false), AttrUncharged.Bool(true)))
		}
		if e.Failed > 0 {
			h.reaped.Add(ctx, int64(e.Failed), metric.WithAttributes(AttrFailed.Bool(true), AttrUncharged.Bool(false)))
		}
		for _, id := range e.IDs {
			h.instantSpan(ctx, id, "gendurable.reaped", "the reaper recovered this instance's expired lease")
		}
	case *gendurable.LeaseLostEvent:
		h.leaseLost.Add(ctx, 1, metric.WithAttributes(AttrQueue.String(e.Queue), AttrUnstarted.Bool(e.Unstarted)))
		what := "the step's lease was lost; its context was cancelled"
		if e.Unstarted {
			what = "the lease of a claim waiting in the prefetch buffer was lost; no step ran"
		}
		h.instantSpan(ctx, e.InstanceID, "gendurable.lease_lost", what, AttrQueue.String(e.Queue), AttrUnstarted.Bool(e.Unstarted))
	case *gendurable.StepAbandonedEvent:
		h.abandoned.Add(ctx, 1, metric.WithAttributes(AttrQueue.String(e.Queue), AttrMachine.String(e.Machine)))
		h.instantSpan(ctx, e.InstanceID, "gendurable.step_abandoned", "the step ignored its context past its StepTimeout and was abandoned",
			AttrQueue.String(e.Queue), AttrStep.String(e.Step))
	case *gendurable.UnknownVersionEvent:
		h.unknownVer.Add(ctx, 1, metric.WithAttributes(AttrQueue.String(e.Queue), AttrMachine.String(e.Machine),
			AttrMachineVersion.Int(e.Version)))
	}
}

func (h *Hook) onStep(ctx context.Context, e *gendurable.StepEvent) {
	end := time.Now()
	opt := h.stepOpt(e)
	h.steps.Add(ctx, 1, opt)
	h.stepDuration.Record(ctx, e.Duration.Seconds(), opt)

	parent := trace.ContextWithRemoteSpanContext(ctx, h.InstanceSpanContext(e.InstanceID))
	_, span := h.tracer.Start(parent, "gendurable.step "+e.Machine+"."+e.Step,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithAttributes(
			AttrInstanceID.Int64(e.InstanceID),
			AttrQueue.String(e.Queue),
			AttrMachine.String(e.Machine),
			AttrMachineVersion.Int(e.Version),
			AttrStep.String(e.Step),
			AttrAttempt.Int(e.Attempt),
			AttrOutcome.String(e.Outcome),
		))
	if span.IsRecording() {
		if e.Fenced {
			span.SetAttributes(AttrFenced.Bool(true))
		}
		if e.Err != nil {
			span.RecordError(e.Err)
		}
		if e.CommitErr != nil {
			span.SetAttributes(AttrCommitError.Bool(true))
			span.RecordError(fmt.Errorf("outcome not committed: %w", e.CommitErr))
		}
		switch {
		case stepFailed(e): // an interruption or a snooze is no failure: it runs again
			span.SetStatus(codes.Error, e.Err.Error())
		case e.CommitErr != nil:
			span.SetStatus(codes.Error, "outcome not committed: "+e.CommitErr.Error())
		}
	}
	span.End(trace.WithTimestamp(end))
}

// instantSpan records a zero-length span in instance id's trace.
func (h *Hook) instantSpan(ctx context.Context, id int64, name, desc string, attrs ...attribute.KeyValue) {
	now := time.Now()
	parent := trace.ContextWithRemoteSpanContext(ctx, h.InstanceSpanContext(id))
	_, span := h.tracer.Start(parent, name, trace.WithTimestamp(now),
		trace.WithAttributes(append(attrs, AttrInstanceID.Int64(id))...))
	span.SetStatus(codes.Error, desc)
	span.End(trace.WithTimestamp(now))
}

// InstanceSpanContext returns the synthetic root span context of instance
// id: its trace ID and span ID are derived from the id and Options.TraceSalt,
// so every process computes the same one. It is remote and sampled. Its
// TraceID() finds the instance's trace in a tracing backend.
func (h *Hook) InstanceSpanContext(id int64) trace.SpanContext {
	buf := make([]byte, 0, len(h.salt)+9)
	buf = append(buf, h.salt...)
	buf = append(buf, 0)
	buf = binary.BigEndian.AppendUint64(buf, uint64(id))
	sum := sha256.Sum256(buf)
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], sum[0:16])
	copy(sid[:], sum[16:24])
	if !tid.IsValid() { // all zero: astronomically unlikely, but stay valid
		tid[15] = 1
	}
	if !sid.IsValid() {
		sid[7] = 1
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    tid,
		SpanID:     sid,
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
}

// InstanceContext returns ctx with instance id's synthetic root span as its
// remote parent. Spans a step starts from it join the instance's trace (as
// siblings of the step spans, which are recorded when the step finishes):
//
//	ctx = hook.InstanceContext(ctx, r.ID)
//	ctx, span := tracer.Start(ctx, "charge card")
func (h *Hook) InstanceContext(ctx context.Context, id int64) context.Context {
	return trace.ContextWithRemoteSpanContext(ctx, h.InstanceSpanContext(id))
}

// observeDepth is the queue-depth gauge's callback: one query per collection.
func (h *Hook) observeDepth(ctx context.Context, o metric.Observer) error {
	h.depthMu.Lock()
	defer h.depthMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, h.depthTimeout)
	defer cancel()
	rows, err := h.pool.Query(ctx, h.depthQuery)
	if err != nil {
		return fmt.Errorf("gdotel: queue depth: %w", err)
	}
	type qs struct{ queue, status string }
	counts := map[qs]int64{}
	for rows.Next() {
		var k qs
		var n int64
		if err := rows.Scan(&k.queue, &k.status, &n); err != nil {
			rows.Close()
			return fmt.Errorf("gdotel: queue depth: %w", err)
		}
		counts[k] = n
		h.depthSeen[k.queue] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("gdotel: queue depth: %w", err)
	}
	// Every status of every queue seen so far is reported, zero included, so
	// that a count that drops to nothing reads 0 rather than going stale.
	for q := range h.depthSeen {
		for _, s := range allStatuses {
			k := qs{q, string(s)}
			o.ObserveInt64(h.depthGauge, counts[k], metric.WithAttributes(AttrQueue.String(q), AttrStatus.String(k.status)))
			delete(counts, k)
		}
	}
	for k, n := range counts { // a status this version of the library does not know
		o.ObserveInt64(h.depthGauge, n, metric.WithAttributes(AttrQueue.String(k.queue), AttrStatus.String(k.status)))
	}
	return nil
}

var allStatuses = []gendurable.Status{
	gendurable.StatusRunnable, gendurable.StatusExecuting, gendurable.StatusAwaitingSignal,
	gendurable.StatusAwaitingChildren, gendurable.StatusDone, gendurable.StatusFailed,
}

// Attribute sets are cached per distinct combination so that the hot path
// does not rebuild (sort, dedupe, allocate) them for every event.

type stepKey struct {
	queue, machine, step, outcome string
	err, fenced, commitErr        bool
}

type pickKey struct {
	queue string
	err   bool
}

// maxCached bounds each cache; past it, sets are built per event.
const maxCached = 4096

type attrCache[K comparable] struct {
	mu sync.RWMutex
	m  map[K]metric.MeasurementOption
}

func (c *attrCache[K]) get(k K, build func() attribute.Set) metric.MeasurementOption {
	c.mu.RLock()
	o, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return o
	}
	o = metric.WithAttributeSet(build())
	c.mu.Lock()
	if c.m == nil {
		c.m = map[K]metric.MeasurementOption{}
	}
	if len(c.m) < maxCached {
		c.m[k] = o
	}
	c.mu.Unlock()
	return o
}

func (h *Hook) stepOpt(e *gendurable.StepEvent) metric.MeasurementOption {
	k := stepKey{e.Queue, e.Machine, e.Step, e.Outcome, stepFailed(e), e.Fenced, e.CommitErr != nil}
	return h.stepAttrs.get(k, func() attribute.Set {
		return attribute.NewSet(
			AttrQueue.String(k.queue),
			AttrMachine.String(k.machine),
			AttrStep.String(k.step),
			AttrOutcome.String(k.outcome),
			AttrError.Bool(k.err),
			AttrFenced.Bool(k.fenced),
			AttrCommitError.Bool(k.commitErr),
		)
	})
}

// stepFailed: the step failed — it returned an error (or panicked) that is
// not an interruption by the engine ([gendurable.StepEvent].Interrupted)
// nor a [gendurable.JobSnooze] its Handle honoured (a replay after the
// delay, no attempt counted: a job asking to run later, not failing; an
// error counted each snooze of a job that polls that way as a failure).
func stepFailed(e *gendurable.StepEvent) bool {
	// Snoozed, not a *SnoozeError replayed: a Handle of the machine's own
	// may retry a snooze as a failure, an attempt counted.
	return e.Err != nil && !e.Interrupted && !e.Snoozed
}

func (h *Hook) pickOpt(queue string, err bool) metric.MeasurementOption {
	return h.pickAttrs.get(pickKey{queue, err}, func() attribute.Set {
		return attribute.NewSet(AttrQueue.String(queue), AttrError.Bool(err))
	})
}

func (h *Hook) queueOpt(queue string) metric.MeasurementOption {
	return h.queueAttrs.get(queue, func() attribute.Set {
		return attribute.NewSet(AttrQueue.String(queue))
	})
}
