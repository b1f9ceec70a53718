package middleware

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidequeue/tide"
)

// ScopeName is the instrumentation scope (tracer and meter name) under which
// Tracing, TracingClient, Metrics and RegisterQueueGauges report.
const ScopeName = "github.com/tidequeue/tide/middleware"

// MessagingSystem is the value of the messaging.system attribute on tide's
// spans.
const MessagingSystem = "tide"

// Attribute keys that tide adds to spans and metrics beyond the messaging
// semantic conventions (system-specific attributes live under
// messaging.<system>, here messaging.tide). The queue is reported as
// messaging.destination.name and the task ID as messaging.message.id.
const (
	// AttrTaskType is the task type ("email:send").
	AttrTaskType = attribute.Key("messaging.tide.task.type")
	// AttrRetryCount is how many times the task was retried before the
	// attempt a consumer span covers (0 on the first attempt).
	AttrRetryCount = attribute.Key("messaging.tide.retry_count")
	// AttrTaskState is the task state ("pending", "scheduled", ...) on the
	// queue-size gauge of RegisterQueueGauges.
	AttrTaskState = attribute.Key("messaging.tide.task.state")
	// AttrOutcome is what the server does with the task after a failed
	// attempt, OutcomeRetried or OutcomeArchived, on MetricFailed (see
	// Metrics for how it is decided).
	AttrOutcome = attribute.Key("messaging.tide.outcome")
)

// Short attribute keys that Metrics and RegisterQueueGauges use instead of
// the ones above under WithShortMetricAttributes. In the Prometheus format
// they become the labels type, queue, outcome and state.
const (
	// MetricAttrType replaces AttrTaskType.
	MetricAttrType = attribute.Key("type")
	// MetricAttrQueue replaces messaging.destination.name.
	MetricAttrQueue = attribute.Key("queue")
	// MetricAttrOutcome replaces AttrOutcome.
	MetricAttrOutcome = attribute.Key("outcome")
	// MetricAttrState replaces AttrTaskState.
	MetricAttrState = attribute.Key("state")
)

// Values of AttrOutcome (MetricAttrOutcome).
const (
	// OutcomeRetried: the failed task will run again.
	OutcomeRetried = "retried"
	// OutcomeArchived: the failed task is archived and will not run again
	// unless someone runs it by hand.
	OutcomeArchived = "archived"
	// OutcomeDeferred: the handler returned tide.RetryAfter; the task runs
	// again later without using a retry.
	OutcomeDeferred = "deferred"
)

// Span names: the messaging semantic conventions name a span
// "{operation} {destination}", so by default a producer span is
// "send <queue>" and a consumer span "process <queue>".
const (
	// OperationSend is the operation of the producer span that TracingClient
	// starts around an Enqueue (messaging.operation.type "send", which the
	// conventions called "publish" before v1.26).
	OperationSend = "send"
	// OperationProcess is the operation of the consumer span that Tracing
	// starts around each attempt.
	OperationProcess = "process"
)

// SpanNameFunc names a span from its operation (OperationSend or
// OperationProcess), the queue and the task type. queue is empty when it is
// not known (an Enqueue that failed before a queue was chosen, or a handler
// called outside a tide.Server).
type SpanNameFunc func(operation, queue, taskType string) string

// DefaultSpanName is the default SpanNameFunc: "<operation> <queue>", or the
// operation alone when the queue is unknown, as the messaging semantic
// conventions recommend. Task types are left out to keep span names of low
// cardinality; they are on the span as AttrTaskType.
func DefaultSpanName(operation, queue, _ string) string {
	if queue == "" {
		return operation
	}
	return operation + " " + queue
}

// OTelOption configures Tracing, TracingClient, InjectTrace, ExtractTrace,
// Metrics and RegisterQueueGauges. Each takes only the options that concern
// it and ignores the others. An OTelOption is immutable and safe to share.
type OTelOption interface {
	apply(*otelConfig)
}

type otelOptionFunc func(*otelConfig)

func (f otelOptionFunc) apply(c *otelConfig) { f(c) }

type otelConfig struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	prop     propagation.TextMapPropagator
	spanName SpanNameFunc

	maxTypes, maxQueues int
	shortAttrs          bool
}

func newOTelConfig(opts []OTelOption) *otelConfig {
	c := &otelConfig{}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
	}
	if c.spanName == nil {
		c.spanName = DefaultSpanName
	}
	if c.maxTypes <= 0 {
		c.maxTypes = DefaultMaxMetricTypes
	}
	if c.maxQueues <= 0 {
		c.maxQueues = DefaultMaxMetricQueues
	}
	return c
}

func (c *otelConfig) tracer() trace.Tracer {
	return c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
}

func (c *otelConfig) meter() metric.Meter {
	return c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
}

// WithTracerProvider sets the TracerProvider that creates spans. Default (or
// nil): the global provider, otel.GetTracerProvider(), which follows a later
// otel.SetTracerProvider.
func WithTracerProvider(tp trace.TracerProvider) OTelOption {
	return otelOptionFunc(func(c *otelConfig) { c.tp = tp })
}

// WithMeterProvider sets the MeterProvider that creates instruments. Default
// (or nil): the global provider, otel.GetMeterProvider(), which follows a
// later otel.SetMeterProvider.
func WithMeterProvider(mp metric.MeterProvider) OTelOption {
	return otelOptionFunc(func(c *otelConfig) { c.mp = mp })
}

// WithPropagator sets the propagator that writes the trace context into task
// headers and reads it back. Producer and consumer must agree on it. Default
// (or nil): the global propagator, otel.GetTextMapPropagator(), which follows
// a later otel.SetTextMapPropagator. Note that the global propagator
// propagates nothing until one is set; set it (for example to
// propagation.TraceContext{}) or pass one here.
func WithPropagator(p propagation.TextMapPropagator) OTelOption {
	return otelOptionFunc(func(c *otelConfig) { c.prop = p })
}

// WithSpanNameFunc sets how spans are named. Default (or nil):
// DefaultSpanName. For example, to name spans by task type:
//
//	middleware.WithSpanNameFunc(func(op, _, typ string) string { return op + " " + typ })
func WithSpanNameFunc(f SpanNameFunc) OTelOption {
	return otelOptionFunc(func(c *otelConfig) { c.spanName = f })
}

// taskAttrs is what a handler's context tells about its task; the ok flags
// are false when the handler runs outside a tide.Server (mux.ProcessTask
// called directly), in which case the attributes are left out.
type taskAttrs struct {
	typ                         string
	id, queue                   string
	retried                     int
	hasID, hasQueue, hasRetried bool
}

func attrsOf(ctx context.Context, t *tide.Task) taskAttrs {
	a := taskAttrs{typ: t.Type()}
	a.id, a.hasID = tide.GetTaskID(ctx)
	a.queue, a.hasQueue = tide.GetQueueName(ctx)
	a.retried, a.hasRetried = tide.GetRetryCount(ctx)
	return a
}
