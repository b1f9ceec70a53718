package middleware_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/middleware"
)

type metrics struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	opts   []middleware.OTelOption
}

func newMetrics(t *testing.T) *metrics {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &metrics{t: t, reader: r, opts: []middleware.OTelOption{middleware.WithMeterProvider(mp)}}
}

func (m *metrics) middleware() tide.MiddlewareFunc {
	mw, err := middleware.Metrics(m.opts...)
	if err != nil {
		m.t.Fatal(err)
	}
	return mw
}

func (m *metrics) collect() metricdata.ResourceMetrics {
	m.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		m.t.Fatalf("Collect: %v", err)
	}
	return rm
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// matches reports whether set has every attribute of want.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds the int64 sum points of name whose attributes include want.
func sum(rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	m, ok := find(rm, name)
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if matches(dp.Attributes, want) {
			n += dp.Value
		}
	}
	return n
}

// histogram adds the counts of the histogram points of name whose
// attributes include want, and returns the smallest minimum.
func histogram(rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) (count uint64, minimum float64) {
	m, ok := find(rm, name)
	if !ok {
		return 0, 0
	}
	minimum = 1e18
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		if matches(dp.Attributes, want) {
			count += dp.Count
			if v, ok := dp.Min.Value(); ok {
				minimum = min(minimum, v)
			}
		}
	}
	return count, minimum
}

var (
	typeA  = middleware.AttrTaskType.String("a")
	typeB  = middleware.AttrTaskType.String("b")
	queueQ = attribute.String("messaging.destination.name", "jobs")
)

func TestMetricsAcrossRedis(t *testing.T) {
	t.Parallel()
	e := setup(t)
	m := newMetrics(t)
	var calls atomic.Int32
	mux := tide.NewServeMux()
	mux.Use(m.middleware())
	mux.Handle("a", failOnce(&calls))
	mux.HandleFunc("b", func(context.Context, *tide.Task) error { return nil })
	e.server(tide.Config{Queues: map[string]int{"jobs": 1}}, mux)

	ctx := context.Background()
	for _, typ := range []string{"a", "b"} {
		if _, err := e.c.Enqueue(ctx, tide.NewTask(typ, nil), tide.Queue("jobs")); err != nil {
			t.Fatal(err)
		}
	}
	// MetricProcessed is recorded last, so the other instruments are
	// complete once it reaches 3.
	testwait.For(t, 15*time.Second, "3 processed attempts", func() bool { return sum(m.collect(), middleware.MetricProcessed) == 3 })
	rm := m.collect()

	for _, c := range []struct {
		name string
		want []attribute.KeyValue
		n    int64
	}{
		{middleware.MetricProcessed, []attribute.KeyValue{typeA, queueQ}, 2},
		{middleware.MetricProcessed, []attribute.KeyValue{typeB, queueQ}, 1},
		{middleware.MetricFailed, []attribute.KeyValue{typeA, queueQ}, 1},
		{middleware.MetricFailed, []attribute.KeyValue{typeB}, 0},
		{middleware.MetricActive, nil, 0},
	} {
		if got := sum(rm, c.name, c.want...); got != c.n {
			t.Errorf("%s%v = %d, want %d", c.name, c.want, got, c.n)
		}
	}
	if n, _ := histogram(rm, middleware.MetricDuration, typeA, queueQ); n != 2 {
		t.Errorf("%s count for a = %d, want 2", middleware.MetricDuration, n)
	}
	if n, _ := histogram(rm, middleware.MetricDuration); n != 3 {
		t.Errorf("%s count = %d, want 3", middleware.MetricDuration, n)
	}
	if n, lo := histogram(rm, middleware.MetricLateness, queueQ); n != 3 || lo < 0 {
		t.Errorf("%s count = %d min = %v, want 3 and >= 0", middleware.MetricLateness, n, lo)
	}
	dur, _ := find(rm, middleware.MetricDuration)
	if dur.Unit != "s" {
		t.Errorf("%s unit %q, want s", middleware.MetricDuration, dur.Unit)
	}
}

func TestMetricsOutsideServer(t *testing.T) {
	t.Parallel()
	m := newMetrics(t)
	mux := tide.NewServeMux()
	mux.Use(m.middleware())
	mux.HandleFunc("a", func(context.Context, *tide.Task) error { return errors.New("no") })
	_ = mux.ProcessTask(context.Background(), tide.NewTask("a", nil))
	rm := m.collect()
	if got := sum(rm, middleware.MetricFailed, typeA); got != 1 {
		t.Errorf("failed = %d, want 1", got)
	}
	pm, _ := find(rm, middleware.MetricProcessed)
	for _, dp := range pm.Data.(metricdata.Sum[int64]).DataPoints {
		if dp.Attributes.Len() != 1 {
			t.Errorf("attributes %v, want the type alone", dp.Attributes.ToSlice())
		}
	}
	if n, _ := histogram(rm, middleware.MetricLateness); n != 0 {
		t.Errorf("lateness recorded %d times without a due time", n)
	}
}

func TestMetricsPanic(t *testing.T) {
	t.Parallel()
	m := newMetrics(t)
	mux := tide.NewServeMux()
	mux.Use(m.middleware())
	mux.HandleFunc("a", func(context.Context, *tide.Task) error { panic("kaboom") })
	func() {
		defer func() { _ = recover() }()
		_ = mux.ProcessTask(context.Background(), tide.NewTask("a", nil))
		t.Error("the panic did not pass through")
	}()
	rm := m.collect()
	if f, a := sum(rm, middleware.MetricFailed), sum(rm, middleware.MetricActive); f != 1 || a != 0 {
		t.Errorf("failed = %d active = %d, want 1 and 0", f, a)
	}
}

func TestRegisterQueueGauges(t *testing.T) {
	t.Parallel()
	m := newMetrics(t)
	var fail atomic.Bool
	reg, err := middleware.RegisterQueueGauges(func(context.Context) (map[string]map[tide.TaskState]int64, error) {
		sizes := map[string]map[tide.TaskState]int64{
			"default": {tide.StatePending: 3, tide.StateScheduled: 7},
			"mail":    {tide.StateRetry: 1},
		}
		if fail.Load() {
			return sizes, errors.New("inspector down")
		}
		return sizes, nil
	}, m.opts...)
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(rm metricdata.ResourceMetrics) map[string]int64 {
		got := map[string]int64{}
		g, ok := find(rm, middleware.MetricQueueSize)
		if !ok {
			return got
		}
		for _, dp := range g.Data.(metricdata.Gauge[int64]).DataPoints {
			q, _ := dp.Attributes.Value("messaging.destination.name")
			s, _ := dp.Attributes.Value(middleware.AttrTaskState)
			got[q.AsString()+"/"+s.AsString()] = dp.Value
		}
		return got
	}
	want := map[string]int64{"default/pending": 3, "default/scheduled": 7, "mail/retry": 1}
	if got := gauge(m.collect()); len(got) != 3 || got["default/pending"] != 3 || got["default/scheduled"] != 7 || got["mail/retry"] != 1 {
		t.Errorf("gauge = %v, want %v", got, want)
	}

	// A failing callback's error reaches the reader; what it returned is
	// still observed.
	fail.Store(true)
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err == nil {
		t.Error("Collect reported no error from the failing callback")
	}
	if got := gauge(rm); len(got) != 3 {
		t.Errorf("gauge after a failing callback = %v, want %v", got, want)
	}

	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if got := gauge(m.collect()); len(got) != 0 {
		t.Errorf("gauge after Unregister = %v, want nothing", got)
	}
}

func TestRegisterQueueGaugesNil(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("RegisterQueueGauges(nil) did not panic")
		}
	}()
	_, _ = middleware.RegisterQueueGauges(nil)
}
