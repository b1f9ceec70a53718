package middleware

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidequeue/tide"
)

// Tracing returns middleware that runs every attempt of a task in an
// OpenTelemetry CONSUMER span. The span's parent is the trace context found
// in the task's headers (written there by TracingClient or InjectTrace, read
// with the configured propagator); without one, it is whatever span ctx
// already carries. Each attempt runs the middleware again, so a task retried
// twice shows three consumer spans, all children of its producer span.
//
// The span is named by the SpanNameFunc ("process <queue>" by default) and
// has the attributes messaging.system ("tide"), messaging.operation.type and
// messaging.operation.name ("process"), messaging.destination.name (the
// queue), messaging.message.id (the task ID), messaging.message.body.size,
// AttrTaskType and AttrRetryCount. Attributes that only a tide.Server knows
// (queue, ID, retry count) are left out when the handler is called directly,
// as with ServeMux.ProcessTask outside a server. An attempt that returns an
// error gets the error recorded as an event, the error.type attribute and
// status Error; a panic that passes through is recorded the same way and then
// re-raised. The handler's context carries the span, so handlers can start
// child spans from it. Each tide.Step of a durable handler gets an INTERNAL
// child span "step <name>" with AttrStepName and AttrStepReplayed, marked
// failed when fn or the store fails.
//
// Options: WithTracerProvider, WithPropagator, WithSpanNameFunc. The returned
// middleware is safe for concurrent use.
func Tracing(opts ...OTelOption) tide.MiddlewareFunc {
	cfg := newOTelConfig(opts)
	tracer := cfg.tracer()
	return func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) (err error) {
			a := attrsOf(ctx, t)
			ctx = cfg.prop.Extract(ctx, propagation.MapCarrier(t.Headers()))
			attrs := make([]attribute.KeyValue, 0, 8)
			attrs = append(attrs,
				semconv.MessagingSystemKey.String(MessagingSystem),
				semconv.MessagingOperationTypeProcess,
				semconv.MessagingOperationName(OperationProcess),
				AttrTaskType.String(a.typ),
				semconv.MessagingMessageBodySize(len(t.Payload())),
			)
			if a.hasQueue {
				attrs = append(attrs, semconv.MessagingDestinationName(a.queue))
			}
			if a.hasID {
				attrs = append(attrs, semconv.MessagingMessageID(a.id))
			}
			if a.hasRetried {
				attrs = append(attrs, AttrRetryCount.Int(a.retried))
			}
			ctx, span := tracer.Start(ctx, cfg.spanName(OperationProcess, a.queue, a.typ),
				trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
			defer func() {
				if r := recover(); r != nil {
					recordError(span, &tide.PanicError{Value: r, Stack: debug.Stack()})
					span.End()
					panic(r)
				}
				if err != nil {
					recordError(span, err)
				}
				span.End()
			}()
			return next.ProcessTask(tide.WithStepObserver(ctx, stepSpans(tracer)), t)
		})
	}
}

// AttrStepName is the name of a durable handler's step (tide.Step) on its
// span; AttrStepReplayed tells that its result came from storage and fn
// did not run.
const (
	AttrStepName     = attribute.Key("messaging.tide.step.name")
	AttrStepReplayed = attribute.Key("messaging.tide.step.replayed")
)

// stepSpans is the tide.StepObserver of Tracing: one internal span per
// durable step, a child of the task's span, named "step <name>".
func stepSpans(tracer trace.Tracer) tide.StepObserver {
	return func(ctx context.Context, name string, replayed bool) (context.Context, func(error)) {
		ctx, span := tracer.Start(ctx, "step "+name, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(AttrStepName.String(name), AttrStepReplayed.Bool(replayed)))
		return ctx, func(err error) {
			if err != nil {
				recordError(span, err)
			}
			span.End()
		}
	}
}

// recordError marks span as failed with err.
func recordError(span trace.Span, err error) {
	span.RecordError(err)
	span.SetAttributes(semconv.ErrorType(err))
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i] // a PanicError's stack stays in the event, not the status
	}
	span.SetStatus(codes.Error, msg)
}

// InjectTrace writes the trace context of ctx (its current span, and baggage
// when the propagator carries it) into t.Headers() with the configured
// propagator, replacing what an earlier injection wrote. It starts no span:
// use TracingClient for a producer span around the Enqueue. It does nothing
// for a nil task. Options: WithPropagator. Like every change to a Task, it
// must not run concurrently with other uses of t.
func InjectTrace(ctx context.Context, t *tide.Task, opts ...OTelOption) {
	if t == nil {
		return
	}
	inject(newOTelConfig(opts).prop, ctx, t)
}

func inject(p propagation.TextMapPropagator, ctx context.Context, t *tide.Task) {
	h := t.Headers()
	for _, f := range p.Fields() {
		delete(h, f)
	}
	p.Inject(ctx, propagation.MapCarrier(h))
}

// ExtractTrace returns ctx with the trace context read from t's headers with
// the configured propagator, for code that processes tasks without the
// Tracing middleware. It returns ctx unchanged when the headers carry no
// trace context or t is nil. Options: WithPropagator.
func ExtractTrace(ctx context.Context, t *tide.Task, opts ...OTelOption) context.Context {
	if t == nil {
		return ctx
	}
	return newOTelConfig(opts).prop.Extract(ctx, propagation.MapCarrier(t.Headers()))
}

// TracingClient is a tide.Client whose Enqueue and EnqueueMany run in an
// OpenTelemetry PRODUCER span and carry that span's trace context in the task
// headers, so that the Tracing middleware on the server continues the trace.
// Every other method (Delete, Close) is the embedded Client's.
//
// The producer span is named by the SpanNameFunc ("send <queue>" by default,
// or "send" when the task was rejected before a queue was chosen) and has the
// attributes messaging.system ("tide"), messaging.operation.type and
// messaging.operation.name ("send"), messaging.destination.name (the queue),
// messaging.message.id (the task ID, once known), messaging.message.body.size
// and AttrTaskType. A failed Enqueue is recorded on the span (error event,
// error.type, status Error).
//
// A TracingClient is safe for concurrent use, but Enqueue writes the trace
// headers into the Task it is given, so one Task must not be enqueued from
// several goroutines at once.
type TracingClient struct {
	*tide.Client
	cfg    *otelConfig
	tracer trace.Tracer
}

// NewTracingClient wraps c. Options: WithTracerProvider, WithPropagator,
// WithSpanNameFunc. It panics if c is nil.
func NewTracingClient(c *tide.Client, opts ...OTelOption) *TracingClient {
	if c == nil {
		panic("tide: middleware.NewTracingClient: nil client")
	}
	cfg := newOTelConfig(opts)
	return &TracingClient{Client: c, cfg: cfg, tracer: cfg.tracer()}
}

// Enqueue starts a producer span as a child of ctx's span, injects its trace
// context into t.Headers(), calls the Client's Enqueue and ends the span. It
// returns what Client.Enqueue returns.
func (tc *TracingClient) Enqueue(ctx context.Context, t *tide.Task, opts ...tide.Option) (*tide.TaskInfo, error) {
	if t == nil {
		return tc.Client.Enqueue(ctx, t, opts...)
	}
	span := tc.start(ctx, t)
	info, err := tc.Client.Enqueue(trace.ContextWithSpan(ctx, span), t, opts...)
	tc.finish(span, t, info, err)
	return info, err
}

// EnqueueMany is Client.EnqueueMany with one producer span per task, each
// injected into its own task, so that every task's processing continues its
// own span. A task that was not stored gets its error recorded on its span.
// It returns what Client.EnqueueMany returns.
func (tc *TracingClient) EnqueueMany(ctx context.Context, ts []*tide.Task, opts ...tide.Option) ([]*tide.TaskInfo, error) {
	spans := make([]trace.Span, len(ts))
	for i, t := range ts {
		if t != nil {
			spans[i] = tc.start(ctx, t)
		}
	}
	infos, err := tc.Client.EnqueueMany(ctx, ts, opts...)
	for i, span := range spans {
		if span == nil {
			continue
		}
		var info *tide.TaskInfo
		if infos != nil {
			info = infos[i]
		}
		var terr error
		if info == nil {
			terr = taskError(err, i)
		}
		tc.finish(span, ts[i], info, terr)
	}
	return infos, err
}

// start starts the producer span for t and injects it into t's headers.
func (tc *TracingClient) start(ctx context.Context, t *tide.Task) trace.Span {
	ctx, span := tc.tracer.Start(ctx, tc.cfg.spanName(OperationSend, "", t.Type()),
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(MessagingSystem),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName(OperationSend),
			AttrTaskType.String(t.Type()),
			semconv.MessagingMessageBodySize(len(t.Payload())),
		))
	inject(tc.cfg.prop, ctx, t)
	return span
}

// finish names the span after the queue, records the outcome and ends it.
func (tc *TracingClient) finish(span trace.Span, t *tide.Task, info *tide.TaskInfo, err error) {
	if info != nil {
		span.SetName(tc.cfg.spanName(OperationSend, info.Queue, t.Type()))
		span.SetAttributes(semconv.MessagingDestinationName(info.Queue), semconv.MessagingMessageID(info.ID))
	}
	if err != nil {
		recordError(span, err)
	} else if info == nil {
		recordError(span, errors.New("tide: task not enqueued"))
	}
	span.End()
}

// taskError picks the error of task i out of EnqueueMany's joined error,
// whose parts start "task <i>" (see tide.Client.EnqueueMany), falling back
// to the whole error.
func taskError(err error, i int) error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		prefix := fmt.Sprintf("task %d", i)
		for _, e := range j.Unwrap() {
			msg := e.Error()
			if strings.HasPrefix(msg, prefix) && len(msg) > len(prefix) && (msg[len(prefix)] == ':' || msg[len(prefix)] == ' ') {
				return e
			}
		}
	}
	return err
}
