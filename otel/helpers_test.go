package gdotel_test

import (
	"context"
	"testing"

	gdotel "github.com/gendurable/gendurable/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// rig is a hook wired to in-memory metric and span readers.
type rig struct {
	hook   *gdotel.Hook
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
}

func newRig(t *testing.T, opts gdotel.Options, topts ...sdktrace.TracerProviderOption) *rig {
	t.Helper()
	r := &rig{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(r.spans)}, topts...)...)
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	opts.MeterProvider, opts.TracerProvider = mp, tp
	h, err := gdotel.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = h.Close() })
	r.hook = h
	return r
}

func (r *rig) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func mustMetric(t *testing.T, rm metricdata.ResourceMetrics, name string) metricdata.Metrics {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		t.Fatalf("metric %s not collected", name)
	}
	return m
}

// matches reports whether set has every attribute of want.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// intSum adds up the data points of an int64 sum or gauge whose attributes
// include want, and says how many points matched.
func intSum(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) (total int64, points int) {
	t.Helper()
	var dps []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		dps = d.DataPoints
	case metricdata.Gauge[int64]:
		dps = d.DataPoints
	default:
		t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
	}
	for _, dp := range dps {
		if matches(dp.Attributes, want) {
			total += dp.Value
			points++
		}
	}
	return total, points
}

// histCount adds up the counts and sums of a float64 histogram's points whose
// attributes include want.
func histCount(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) (count uint64, sum float64) {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
	}
	for _, dp := range h.DataPoints {
		if matches(dp.Attributes, want) {
			count += dp.Count
			sum += dp.Sum
		}
	}
	return count, sum
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}
