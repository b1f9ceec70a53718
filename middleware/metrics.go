package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tidequeue/tide"
)

// Names of the instruments that Metrics and RegisterQueueGauges create.
const (
	// MetricProcessed counts finished attempts, successful or not
	// (Int64Counter, unit {task}).
	MetricProcessed = "tide.tasks.processed"
	// MetricFailed counts attempts that returned an error or panicked
	// (Int64Counter, unit {task}). Successful attempts are
	// MetricProcessed minus MetricFailed.
	MetricFailed = "tide.tasks.failed"
	// MetricActive is the number of attempts in progress
	// (Int64UpDownCounter, unit {task}).
	MetricActive = "tide.tasks.active"
	// MetricDuration is how long each attempt took, in seconds
	// (Float64Histogram, unit s).
	MetricDuration = "tide.task.duration"
	// MetricLateness is how late each attempt started: the moment the
	// handler chain was entered minus the time the task was due (its
	// ProcessAt, retry time, or enqueue time), in seconds; an early start
	// (clock skew between machines) counts as 0 (Float64Histogram, unit s).
	MetricLateness = "tide.task.lateness"
	// MetricQueueSize is the number of tasks per queue and state
	// (Int64ObservableGauge, unit {task}); see RegisterQueueGauges.
	MetricQueueSize = "tide.queue.size"
)

// Bucket boundaries, in seconds, of the two histograms. Both reach an hour,
// as tasks are often much slower (and later) than RPCs.
var (
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 300, 900, 3600}
	latenessBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// Metrics returns middleware that records OpenTelemetry metrics for every
// attempt: MetricProcessed, MetricFailed, MetricActive, MetricDuration and
// MetricLateness. Each carries the attributes AttrTaskType and
// messaging.destination.name (the queue; left out when the handler runs
// outside a tide.Server, as with ServeMux.ProcessTask called directly, and
// lateness is then not recorded because the due time is unknown). A panic
// that passes through is counted as a failure and re-raised.
//
// Options: WithMeterProvider. The error reports instruments the provider
// could not create; the middleware is usable even then (the SDK hands out
// working instruments along with such errors). The returned middleware is
// safe for concurrent use.
func Metrics(opts ...OTelOption) (tide.MiddlewareFunc, error) {
	meter := newOTelConfig(opts).meter()
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	processed, err := meter.Int64Counter(MetricProcessed, metric.WithUnit("{task}"),
		metric.WithDescription("Task attempts that finished, successfully or not."))
	check(err)
	failed, err := meter.Int64Counter(MetricFailed, metric.WithUnit("{task}"),
		metric.WithDescription("Task attempts that returned an error or panicked."))
	check(err)
	active, err := meter.Int64UpDownCounter(MetricActive, metric.WithUnit("{task}"),
		metric.WithDescription("Task attempts in progress."))
	check(err)
	duration, err := meter.Float64Histogram(MetricDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of task attempts."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	check(err)
	lateness, err := meter.Float64Histogram(MetricLateness, metric.WithUnit("s"),
		metric.WithDescription("How long after its due time a task attempt started."),
		metric.WithExplicitBucketBoundaries(latenessBuckets...))
	check(err)
	var setupErr error
	if len(errs) > 0 {
		setupErr = fmt.Errorf("tide: middleware.Metrics: %w", errors.Join(errs...))
	}

	mw := func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) (err error) {
			start := time.Now()
			set := attrsOf(ctx, t).metricSet()
			withSet := metric.WithAttributeSet(set)
			if due, ok := tide.GetDueTime(ctx); ok && !due.IsZero() {
				lateness.Record(ctx, max(start.Sub(due), 0).Seconds(), withSet)
			}
			active.Add(ctx, 1, withSet)
			panicked := true
			defer func() {
				active.Add(ctx, -1, withSet)
				duration.Record(ctx, time.Since(start).Seconds(), withSet)
				if err != nil || panicked {
					failed.Add(ctx, 1, withSet)
				}
				processed.Add(ctx, 1, withSet) // last, so tests can wait for it
			}()
			err = next.ProcessTask(ctx, t)
			panicked = false
			return err
		})
	}
	return mw, setupErr
}

// QueueSizesFunc reports how many tasks each queue holds in each state:
// sizes[queue][state]. RegisterQueueGauges calls it on every metrics
// collection, with the collection's context.
type QueueSizesFunc func(ctx context.Context) (sizes map[string]map[tide.TaskState]int64, err error)

// RegisterQueueGauges registers the observable gauge MetricQueueSize, fed by
// fn on every collection, with the attributes messaging.destination.name (the
// queue) and AttrTaskState (the state name). It is a hook for a source of
// queue sizes, such as the Inspector, that the middleware does not depend on;
// fn must be safe for concurrent use and should be quick, as it runs inside
// the collection. An error from fn is passed to the SDK (which reports it
// through otel.Handle) and the sizes it returned are still observed.
//
// Options: WithMeterProvider. Call Unregister on the returned registration
// to stop observing. RegisterQueueGauges panics if fn is nil.
func RegisterQueueGauges(fn QueueSizesFunc, opts ...OTelOption) (metric.Registration, error) {
	if fn == nil {
		panic("tide: middleware.RegisterQueueGauges: nil QueueSizesFunc")
	}
	meter := newOTelConfig(opts).meter()
	gauge, err := meter.Int64ObservableGauge(MetricQueueSize, metric.WithUnit("{task}"),
		metric.WithDescription("Tasks per queue and state."))
	if err != nil {
		return nil, fmt.Errorf("tide: middleware.RegisterQueueGauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		sizes, err := fn(ctx)
		for queue, states := range sizes {
			for state, n := range states {
				o.ObserveInt64(gauge, n, metric.WithAttributeSet(attribute.NewSet(
					semconv.MessagingDestinationName(queue), AttrTaskState.String(state.String()))))
			}
		}
		if err != nil {
			return fmt.Errorf("tide: queue sizes: %w", err)
		}
		return nil
	}, gauge)
	if err != nil {
		return nil, fmt.Errorf("tide: middleware.RegisterQueueGauges: %w", err)
	}
	return reg, nil
}
