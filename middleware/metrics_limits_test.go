package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/middleware"
	"github.com/tidequeue/tide/tidetest"
)

// points returns the attribute sets of every data point of the metric name.
func points(rm metricdata.ResourceMetrics, name string) []attribute.Set {
	m, ok := find(rm, name)
	if !ok {
		return nil
	}
	var sets []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	}
	return sets
}

// values returns the distinct values of key among the points of name.
func values(rm metricdata.ResourceMetrics, name string, key attribute.Key) map[string]bool {
	got := map[string]bool{}
	for _, set := range points(rm, name) {
		if v, ok := set.Value(key); ok {
			got[v.AsString()] = true
		}
	}
	return got
}

func TestMetricsCapTaskTypes(t *testing.T) {
	t.Parallel()
	const tasks = 1000
	cases := []struct {
		name  string
		opts  []middleware.OTelOption
		limit int
	}{
		{"default", nil, middleware.DefaultMaxMetricTypes},
		{"WithMetricLimits", []middleware.OTelOption{middleware.WithMetricLimits(10, 0)}, 10},
		{"WithMetricLimits 0 keeps the default", []middleware.OTelOption{middleware.WithMetricLimits(0, 0)}, middleware.DefaultMaxMetricTypes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := newMetrics(t)
			m.opts = append(m.opts, c.opts...)
			h := m.middleware()(tide.HandlerFunc(func(context.Context, *tide.Task) error { return errBoom }))
			// 1,000 distinct types from 8 goroutines: the cap is shared.
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Go(func() {
					for i := w; i < tasks; i += 8 {
						_ = h.ProcessTask(context.Background(), tide.NewTask(fmt.Sprintf("type-%d", i), nil))
					}
				})
			}
			wg.Wait()
			rm := m.collect()

			for _, name := range []string{middleware.MetricProcessed, middleware.MetricFailed, middleware.MetricActive, middleware.MetricDuration} {
				sets := points(rm, name)
				if len(sets) != c.limit+1 {
					t.Errorf("%s: %d series, want %d (the limit and %q)", name, len(sets), c.limit+1, middleware.OtherValue)
				}
				if vs := values(rm, name, middleware.AttrTaskType); !vs[middleware.OtherValue] || len(vs) != c.limit+1 {
					t.Errorf("%s: %d type values (other: %v), want %d and other", name, len(vs), vs[middleware.OtherValue], c.limit+1)
				}
			}
			other := middleware.AttrTaskType.String(middleware.OtherValue)
			if n := sum(rm, middleware.MetricProcessed, other); n != int64(tasks-c.limit) {
				t.Errorf("processed{type=other} = %d, want %d", n, tasks-c.limit)
			}
			if n := sum(rm, middleware.MetricProcessed); n != tasks {
				t.Errorf("processed = %d, want every attempt counted (%d)", n, tasks)
			}
		})
	}
}

func TestMetricsTypeKeepsItsSeries(t *testing.T) {
	t.Parallel()
	m := newMetrics(t)
	m.opts = append(m.opts, middleware.WithMetricLimits(2, 0))
	h := m.middleware()(tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
	for _, typ := range []string{"a", "other", "b", "c", "a", "d", "b"} {
		_ = h.ProcessTask(context.Background(), tide.NewTask(typ, nil))
	}
	rm := m.collect()
	// "other" takes no place: a and b get theirs; other, c and d share one.
	for typ, want := range map[string]int64{"a": 2, "b": 2, middleware.OtherValue: 3, "c": 0, "d": 0} {
		if got := sum(rm, middleware.MetricProcessed, middleware.AttrTaskType.String(typ)); got != want {
			t.Errorf("processed{type=%s} = %d, want %d", typ, got, want)
		}
	}
}

func TestMetricsCapQueues(t *testing.T) {
	t.Parallel()
	m := newMetrics(t)
	m.opts = append(m.opts, middleware.WithMetricLimits(0, 3), middleware.WithShortMetricAttributes())
	mux := tide.NewServeMux()
	mux.Use(m.middleware())
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { return nil })
	queues := map[string]int{}
	for i := range 8 {
		queues[fmt.Sprintf("q%d", i)] = 1
	}
	h := tidetest.New(t, mux, tidetest.Options{Queues: queues})
	for q := range queues {
		h.Enqueue(tide.NewTask("t", nil), tide.Queue(q))
	}
	h.Settle()
	rm := m.collect()
	vs := values(rm, middleware.MetricProcessed, middleware.MetricAttrQueue)
	if len(vs) != 4 || !vs[middleware.OtherValue] {
		t.Errorf("queue values %v, want 3 queues and %q", vs, middleware.OtherValue)
	}
	if n := sum(rm, middleware.MetricProcessed, middleware.MetricAttrQueue.String(middleware.OtherValue)); n != 5 {
		t.Errorf("processed{queue=other} = %d, want 5", n)
	}
}

func TestMetricsOutcome(t *testing.T) {
	t.Parallel()
	m := newMetrics(t)
	mux := tide.NewServeMux()
	mux.Use(m.middleware())
	mux.HandleFunc("flaky", func(context.Context, *tide.Task) error { return errBoom })
	mux.HandleFunc("poison", func(context.Context, *tide.Task) error { return fmt.Errorf("bad payload: %w", tide.SkipRetry) })
	mux.HandleFunc("panicky", func(context.Context, *tide.Task) error { panic("kaboom") })
	h := tidetest.New(t, mux, tidetest.Options{RetryDelayFunc: tide.RetrySchedule(time.Second)})
	h.Enqueue(tide.NewTask("flaky", nil), tide.MaxRetry(1))   // retried, then archived
	h.Enqueue(tide.NewTask("poison", nil), tide.MaxRetry(5))  // archived at once
	h.Enqueue(tide.NewTask("panicky", nil), tide.MaxRetry(0)) // no retries left
	h.Settle()
	h.Advance(time.Second) // the retry of flaky
	rm := m.collect()

	retried := middleware.AttrOutcome.String(middleware.OutcomeRetried)
	archived := middleware.AttrOutcome.String(middleware.OutcomeArchived)
	for _, c := range []struct {
		typ     string
		outcome attribute.KeyValue
		want    int64
	}{
		{"flaky", retried, 1}, {"flaky", archived, 1},
		{"poison", retried, 0}, {"poison", archived, 1},
		{"panicky", retried, 0}, {"panicky", archived, 1},
	} {
		if got := sum(rm, middleware.MetricFailed, middleware.AttrTaskType.String(c.typ), c.outcome); got != c.want {
			t.Errorf("failed{type=%s,%s} = %d, want %d", c.typ, c.outcome.Value.AsString(), got, c.want)
		}
	}
	// The server agrees: what the metric called archived is archived.
	if got, want := len(h.Tasks(tide.DefaultQueue, tide.StateArchived)), sum(rm, middleware.MetricFailed, archived); int64(got) != want {
		t.Errorf("%d archived tasks, but failed{outcome=archived} = %d", got, want)
	}
	for _, set := range points(rm, middleware.MetricProcessed) {
		if _, ok := set.Value(middleware.AttrOutcome); ok {
			t.Errorf("processed has an outcome: %v", set.ToSlice())
		}
	}
}

func TestMetricsOutcomeOutsideServer(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancelCause(context.Background())
	cancel(tide.ErrTaskCanceled)
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"error", context.Background(), errBoom, middleware.OutcomeRetried},
		{"SkipRetry", context.Background(), fmt.Errorf("no: %w", tide.SkipRetry), middleware.OutcomeArchived},
		{"cancelled", cancelled, context.Canceled, middleware.OutcomeArchived},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := newMetrics(t)
			h := m.middleware()(tide.HandlerFunc(func(context.Context, *tide.Task) error { return c.err }))
			if err := h.ProcessTask(c.ctx, tide.NewTask("a", nil)); !errors.Is(err, c.err) {
				t.Fatalf("ProcessTask = %v, want %v", err, c.err)
			}
			rm := m.collect()
			if got := sum(rm, middleware.MetricFailed, middleware.AttrOutcome.String(c.want)); got != 1 {
				t.Errorf("failed{outcome=%s} = %d, want 1", c.want, got)
			}
		})
	}
}

func TestShortMetricAttributes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		opts      []middleware.OTelOption
		processed []attribute.Key
		failed    []attribute.Key
		gauge     []attribute.Key
	}{
		{
			name:      "default",
			processed: []attribute.Key{middleware.AttrTaskType, "messaging.destination.name"},
			failed:    []attribute.Key{middleware.AttrTaskType, "messaging.destination.name", middleware.AttrOutcome},
			gauge:     []attribute.Key{"messaging.destination.name", middleware.AttrTaskState},
		},
		{
			name:      "short",
			opts:      []middleware.OTelOption{middleware.WithShortMetricAttributes()},
			processed: []attribute.Key{"type", "queue"},
			failed:    []attribute.Key{"type", "queue", "outcome"},
			gauge:     []attribute.Key{"queue", "state"},
		},
	}
	// keyList is the sorted keys of a set, as "a,b,c".
	keyList := func(keys []attribute.Key) string {
		ks := make([]string, len(keys))
		for i, k := range keys {
			ks[i] = string(k)
		}
		slices.Sort(ks)
		return strings.Join(ks, ",")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := newMetrics(t)
			m.opts = append(m.opts, c.opts...)
			mux := tide.NewServeMux()
			mux.Use(m.middleware())
			mux.HandleFunc("a", func(context.Context, *tide.Task) error { return errBoom })
			h := tidetest.New(t, mux)
			h.Enqueue(tide.NewTask("a", nil), tide.MaxRetry(0))
			h.Settle()
			reg, err := middleware.RegisterQueueGauges(func(context.Context) (map[string]map[tide.TaskState]int64, error) {
				return map[string]map[tide.TaskState]int64{"default": {tide.StatePending: 1}}, nil
			}, m.opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = reg.Unregister() })
			rm := m.collect()
			for name, keys := range map[string][]attribute.Key{
				middleware.MetricProcessed: c.processed, middleware.MetricFailed: c.failed, middleware.MetricQueueSize: c.gauge,
			} {
				sets := points(rm, name)
				if len(sets) == 0 {
					t.Errorf("%s: no data points", name)
				}
				for _, set := range sets {
					var got []attribute.Key
					for _, kv := range set.ToSlice() {
						got = append(got, kv.Key)
					}
					if keyList(got) != keyList(keys) {
						t.Errorf("%s attribute keys %s, want %s", name, keyList(got), keyList(keys))
					}
				}
			}
		})
	}
}

func TestRegisterQueueGaugesCapsQueues(t *testing.T) {
	t.Parallel()
	m := newMetrics(t)
	reg, err := middleware.RegisterQueueGauges(func(context.Context) (map[string]map[tide.TaskState]int64, error) {
		sizes := map[string]map[tide.TaskState]int64{}
		for i := range 60 {
			sizes[fmt.Sprintf("q%02d", i)] = map[tide.TaskState]int64{tide.StatePending: 1, tide.StateRetry: 2}
		}
		return sizes, nil
	}, m.opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Unregister() })
	for range 2 { // the second collection must fold the same queues
		rm := m.collect()
		got := map[string]int64{}
		g, _ := find(rm, middleware.MetricQueueSize)
		for _, dp := range g.Data.(metricdata.Gauge[int64]).DataPoints {
			q, _ := dp.Attributes.Value("messaging.destination.name")
			s, _ := dp.Attributes.Value(middleware.AttrTaskState)
			got[q.AsString()+"/"+s.AsString()] = dp.Value
		}
		// q00..q49 (first in name order) keep their names; q50..q59 add up.
		if len(got) != 2*(middleware.DefaultMaxMetricQueues+1) || got["q49/retry"] != 2 || got["q50/pending"] != 0 ||
			got["other/pending"] != 10 || got["other/retry"] != 20 {
			t.Errorf("gauge has %d series: q49/retry=%d q50/pending=%d other/pending=%d other/retry=%d; want %d, 2, 0, 10, 20",
				len(got), got["q49/retry"], got["q50/pending"], got["other/pending"], got["other/retry"], 2*(middleware.DefaultMaxMetricQueues+1))
		}
	}
}
