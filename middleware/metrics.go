package middleware

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
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

// Limits on the distinct values of the type and queue attributes of the
// metrics (see Metrics and WithMetricLimits).
const (
	// DefaultMaxMetricTypes is how many task types get series of their own
	// by default.
	DefaultMaxMetricTypes = 100
	// DefaultMaxMetricQueues is how many queues get series of their own by
	// default.
	DefaultMaxMetricQueues = 50
	// OtherValue is the value of the type or queue attribute that stands
	// for every type or queue past the limit.
	OtherValue = "other"
)

// WithMetricLimits sets how many distinct task types and queues Metrics and
// RegisterQueueGauges report under their own names; the later ones are
// reported as OtherValue. Default (or a value of 0 or less):
// DefaultMaxMetricTypes (100) and DefaultMaxMetricQueues (50). Each series
// costs memory in the SDK and in the metrics backend, and task types and
// queues can come from outside (gateway clients choose them), so raise the
// limits only as far as the types and queues you run.
func WithMetricLimits(types, queues int) OTelOption {
	return otelOptionFunc(func(c *otelConfig) { c.maxTypes, c.maxQueues = types, queues })
}

// WithShortMetricAttributes makes Metrics and RegisterQueueGauges use the
// short attribute keys MetricAttrType ("type"), MetricAttrQueue ("queue"),
// MetricAttrOutcome ("outcome") and MetricAttrState ("state") instead of
// AttrTaskType, messaging.destination.name, AttrOutcome and AttrTaskState:
// in the Prometheus format, tide_tasks_failed_total{type="email:send",
// queue="mail",outcome="retried"} rather than messaging_tide_task_type and
// messaging_destination_name labels. It changes the series' labels, so
// dashboards and alerts must follow; spans keep the semantic-convention
// keys. Default: the long keys, as in earlier versions.
func WithShortMetricAttributes() OTelOption {
	return otelOptionFunc(func(c *otelConfig) { c.shortAttrs = true })
}

// metricKeys are the attribute keys of the metrics.
type metricKeys struct {
	typ, queue, outcome, state attribute.Key
}

func (c *otelConfig) metricKeys() metricKeys {
	if c.shortAttrs {
		return metricKeys{MetricAttrType, MetricAttrQueue, MetricAttrOutcome, MetricAttrState}
	}
	return metricKeys{AttrTaskType, semconv.MessagingDestinationNameKey, AttrOutcome, AttrTaskState}
}

// valueCap lets the first max distinct values of an attribute through and
// folds the rest into OtherValue. It never forgets a value, so a type keeps
// its series for the life of the process. It is safe for concurrent use.
type valueCap struct {
	max  int
	mu   sync.RWMutex
	seen map[string]struct{}
}

func newValueCap(limit int) *valueCap {
	return &valueCap{max: limit, seen: make(map[string]struct{})}
}

// fold returns v if it has, or can still get, a series of its own, and
// OtherValue otherwise. v == OtherValue takes no place: it shares the
// overflow series.
func (c *valueCap) fold(v string) string {
	if v == OtherValue {
		return v
	}
	c.mu.RLock()
	_, ok := c.seen[v]
	full := len(c.seen) >= c.max
	c.mu.RUnlock()
	if ok {
		return v
	}
	if full {
		return OtherValue
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[v]; ok {
		return v
	}
	if len(c.seen) >= c.max {
		return OtherValue
	}
	c.seen[v] = struct{}{}
	return v
}

// outcome guesses what the server does with a task whose attempt failed
// with err (nil for a panic): the middleware runs before the server
// decides, so it applies the server's rule to what the context tells.
func outcome(ctx context.Context, err error) string {
	if errors.Is(err, tide.SkipRetry) || errors.Is(context.Cause(ctx), tide.ErrTaskCanceled) {
		return OutcomeArchived
	}
	if ra := (*tide.RetryAfterError)(nil); errors.As(err, &ra) {
		return OutcomeDeferred
	}
	retried, ok1 := tide.GetRetryCount(ctx)
	maxRetry, ok2 := tide.GetMaxRetry(ctx)
	if ok1 && ok2 && retried >= maxRetry {
		return OutcomeArchived
	}
	return OutcomeRetried
}

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
// lateness is then not recorded because the due time is unknown), or "type"
// and "queue" with WithShortMetricAttributes. A panic that passes through is
// counted as a failure and re-raised.
//
// MetricFailed also carries AttrOutcome ("outcome"): OutcomeArchived,
// OutcomeDeferred or OutcomeRetried. The middleware runs before the server
// decides, so it applies the server's rule: archived when the error wraps
// tide.SkipRetry or when the task was cancelled (the context's cause is
// tide.ErrTaskCanceled); deferred when the error wraps a
// tide.RetryAfterError; archived when tide.GetRetryCount is at least
// tide.GetMaxRetry (no retries left); retried otherwise. Outside a server only the first two apply. Not
// foreseen, and so counted as retried: a task past its tide.Deadline
// (archived), an attempt cut off by shutdown (requeued) or whose lease was
// lost (recovered).
//
// Only the first DefaultMaxMetricTypes (100) task types and
// DefaultMaxMetricQueues (50) queues seen by this middleware get series of
// their own; the attribute of later ones is OtherValue ("other"), so tasks
// of new types (which clients of the HTTP gateway can make up) cannot grow
// the number of series without bound. A type or queue keeps its series
// once it has one; a type named "other" shares the overflow series. Each
// middleware returned by Metrics counts on its own. WithMetricLimits
// changes the limits.
//
// Options: WithMeterProvider, WithMetricLimits, WithShortMetricAttributes.
// The error reports instruments the provider could not create; the
// middleware is usable even then (the SDK hands out working instruments
// along with such errors). The returned middleware is safe for concurrent
// use.
func Metrics(opts ...OTelOption) (tide.MiddlewareFunc, error) {
	cfg := newOTelConfig(opts)
	meter := cfg.meter()
	keys := cfg.metricKeys()
	types, queues := newValueCap(cfg.maxTypes), newValueCap(cfg.maxQueues)
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
			a := attrsOf(ctx, t)
			kvs := make([]attribute.KeyValue, 0, 3)
			kvs = append(kvs, keys.typ.String(types.fold(a.typ)))
			if a.hasQueue {
				kvs = append(kvs, keys.queue.String(queues.fold(a.queue)))
			}
			withSet := metric.WithAttributeSet(attribute.NewSet(kvs...))
			if due, ok := tide.GetDueTime(ctx); ok && !due.IsZero() {
				lateness.Record(ctx, max(start.Sub(due), 0).Seconds(), withSet)
			}
			active.Add(ctx, 1, withSet)
			panicked := true
			defer func() {
				active.Add(ctx, -1, withSet)
				duration.Record(ctx, time.Since(start).Seconds(), withSet)
				if err != nil || panicked {
					failed.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
						append(kvs, keys.outcome.String(outcome(ctx, err)))...)))
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
// queue) and AttrTaskState (the state name), or "queue" and "state" with
// WithShortMetricAttributes. It is a hook for a source of queue sizes, such
// as the Inspector, that the middleware does not depend on; fn must be safe
// for concurrent use and should be quick, as it runs inside the collection.
// An error from fn is passed to the SDK (which reports it through
// otel.Handle) and the sizes it returned are still observed.
//
// As with Metrics, only the first DefaultMaxMetricQueues (50) queues get
// series of their own (in name order among those first seen in the same
// collection); the sizes of later ones are added up, per state, under the
// queue OtherValue ("other").
//
// Options: WithMeterProvider, WithMetricLimits (its queue limit),
// WithShortMetricAttributes. Call Unregister on the returned registration
// to stop observing. RegisterQueueGauges panics if fn is nil.
func RegisterQueueGauges(fn QueueSizesFunc, opts ...OTelOption) (metric.Registration, error) {
	if fn == nil {
		panic("tide: middleware.RegisterQueueGauges: nil QueueSizesFunc")
	}
	cfg := newOTelConfig(opts)
	meter := cfg.meter()
	keys := cfg.metricKeys()
	queues := newValueCap(cfg.maxQueues)
	gauge, err := meter.Int64ObservableGauge(MetricQueueSize, metric.WithUnit("{task}"),
		metric.WithDescription("Tasks per queue and state."))
	if err != nil {
		return nil, fmt.Errorf("tide: middleware.RegisterQueueGauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		sizes, err := fn(ctx)
		type series struct {
			queue string
			state tide.TaskState
		}
		// Folded queues share a series: add them up, as a gauge keeps one
		// value per series and collection.
		folded := make(map[series]int64)
		for _, queue := range slices.Sorted(maps.Keys(sizes)) {
			q := queues.fold(queue)
			for state, n := range sizes[queue] {
				folded[series{q, state}] += n
			}
		}
		for s, n := range folded {
			o.ObserveInt64(gauge, n, metric.WithAttributeSet(attribute.NewSet(
				keys.queue.String(s.queue), keys.state.String(s.state.String()))))
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
