package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/middleware"
)

// tracing is a TracerProvider recording into a SpanRecorder, with the W3C
// propagator, as options for the middleware.
type tracing struct {
	sr   *tracetest.SpanRecorder
	tp   *sdktrace.TracerProvider
	opts []middleware.OTelOption
}

func newTracing(t *testing.T) *tracing {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracing{sr: sr, tp: tp, opts: []middleware.OTelOption{
		middleware.WithTracerProvider(tp),
		middleware.WithPropagator(propagation.TraceContext{}),
	}}
}

// ended returns the ended spans of the given kind.
func (tr *tracing) ended(kind trace.SpanKind) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.sr.Ended() {
		if s.SpanKind() == kind {
			out = append(out, s)
		}
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttrs checks string and int attributes of a span.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[attribute.Key]any) {
	t.Helper()
	for k, w := range want {
		v, ok := attrOf(s, k)
		if !ok {
			t.Errorf("span %q: attribute %s missing", s.Name(), k)
			continue
		}
		if got := v.AsInterface(); got != w {
			t.Errorf("span %q: %s = %v (%T), want %v (%T)", s.Name(), k, got, got, w, w)
		}
	}
}

func noAttrs(t *testing.T, s sdktrace.ReadOnlySpan, keys ...attribute.Key) {
	t.Helper()
	for _, k := range keys {
		if v, ok := attrOf(s, k); ok {
			t.Errorf("span %q: unexpected attribute %s = %v", s.Name(), k, v.AsInterface())
		}
	}
}

// The key test: a trace goes from the producer, through Redis, to one
// consumer span per attempt.
func TestTracingAcrossRedis(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tr := newTracing(t)

	var calls atomic.Int32
	var sawSpan atomic.Bool
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(tr.opts...))
	mux.HandleFunc("order:charge", func(ctx context.Context, task *tide.Task) error {
		if trace.SpanFromContext(ctx).SpanContext().IsValid() {
			sawSpan.Store(true)
		}
		return failOnce(&calls)(ctx, task)
	})
	e.server(tide.Config{Queues: map[string]int{"orders": 1}}, mux)

	client := middleware.NewTracingClient(e.c, tr.opts...)
	ctx, parent := tr.tp.Tracer("test").Start(context.Background(), "checkout")
	task := tide.NewTask("order:charge", []byte(`{"order":42}`))
	info, err := client.Enqueue(ctx, task, tide.Queue("orders"))
	parent.End()
	if err != nil {
		t.Fatal(err)
	}
	if task.Headers()["traceparent"] == "" {
		t.Fatalf("task headers %v carry no traceparent", task.Headers())
	}

	testwait.For(t, 15*time.Second, "two consumer spans", func() bool { return len(tr.ended(trace.SpanKindConsumer)) == 2 })

	producers := tr.ended(trace.SpanKindProducer)
	if len(producers) != 1 {
		t.Fatalf("%d producer spans, want 1", len(producers))
	}
	prod := producers[0]
	if prod.Name() != "send orders" {
		t.Errorf("producer span name %q, want %q", prod.Name(), "send orders")
	}
	if prod.Parent().SpanID() != parent.SpanContext().SpanID() || prod.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("producer span is not a child of the caller's span")
	}
	if prod.Status().Code != codes.Unset {
		t.Errorf("producer status %v, want Unset", prod.Status())
	}
	wantAttrs(t, prod, map[attribute.Key]any{
		"messaging.system":            "tide",
		"messaging.operation.type":    "send",
		"messaging.operation.name":    "send",
		"messaging.destination.name":  "orders",
		"messaging.message.id":        info.ID,
		"messaging.message.body.size": int64(12),
		middleware.AttrTaskType:       "order:charge",
	})

	consumers := tr.ended(trace.SpanKindConsumer)
	for i, c := range consumers {
		if c.SpanContext().TraceID() != prod.SpanContext().TraceID() {
			t.Errorf("consumer span %d: trace %s, want the producer's %s", i, c.SpanContext().TraceID(), prod.SpanContext().TraceID())
		}
		if !c.Parent().IsRemote() || c.Parent().SpanID() != prod.SpanContext().SpanID() {
			t.Errorf("consumer span %d: parent %s (remote %v), want the producer span %s", i, c.Parent().SpanID(), c.Parent().IsRemote(), prod.SpanContext().SpanID())
		}
		if c.Name() != "process orders" {
			t.Errorf("consumer span %d name %q, want %q", i, c.Name(), "process orders")
		}
		wantAttrs(t, c, map[attribute.Key]any{
			"messaging.system":            "tide",
			"messaging.operation.type":    "process",
			"messaging.operation.name":    "process",
			"messaging.destination.name":  "orders",
			"messaging.message.id":        info.ID,
			"messaging.message.body.size": int64(12),
			middleware.AttrTaskType:       "order:charge",
			middleware.AttrRetryCount:     int64(i),
		})
	}
	first, second := consumers[0], consumers[1]
	if first.Status().Code != codes.Error || first.Status().Description != "boom" {
		t.Errorf("first attempt status %+v, want Error \"boom\"", first.Status())
	}
	if ev := first.Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("first attempt events %+v, want one exception", ev)
	}
	wantAttrs(t, first, map[attribute.Key]any{"error.type": "github.com/tidequeue/tide/middleware_test.boomError"})
	if second.Status().Code != codes.Unset || len(second.Events()) != 0 {
		t.Errorf("second attempt status %+v events %v, want Unset and none", second.Status(), second.Events())
	}
	noAttrs(t, second, "error.type")
	if !sawSpan.Load() {
		t.Error("the handler's context carried no span")
	}
}

func TestTracingOutsideServer(t *testing.T) {
	t.Parallel()
	tr := newTracing(t)
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(tr.opts...))
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { return nil })
	if err := mux.ProcessTask(context.Background(), tide.NewTask("t", nil)); err != nil {
		t.Fatal(err)
	}
	spans := tr.ended(trace.SpanKindConsumer)
	if len(spans) != 1 {
		t.Fatalf("%d consumer spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Name() != "process" || s.Parent().IsValid() {
		t.Errorf("span %q parent %v, want a root span named %q", s.Name(), s.Parent(), "process")
	}
	wantAttrs(t, s, map[attribute.Key]any{"messaging.system": "tide", middleware.AttrTaskType: "t"})
	noAttrs(t, s, "messaging.destination.name", "messaging.message.id", middleware.AttrRetryCount)
}

// Without headers, the consumer span continues the span already in ctx.
func TestTracingParentFromContext(t *testing.T) {
	t.Parallel()
	tr := newTracing(t)
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(tr.opts...))
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { return nil })
	ctx, outer := tr.tp.Tracer("test").Start(context.Background(), "outer")
	if err := mux.ProcessTask(ctx, tide.NewTask("t", nil)); err != nil {
		t.Fatal(err)
	}
	outer.End()
	s := tr.ended(trace.SpanKindConsumer)[0]
	if s.Parent().SpanID() != outer.SpanContext().SpanID() {
		t.Errorf("parent %s, want the span in ctx %s", s.Parent().SpanID(), outer.SpanContext().SpanID())
	}
}

func TestTracingPanicPassesThrough(t *testing.T) {
	t.Parallel()
	tr := newTracing(t)
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(tr.opts...))
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { panic("kaboom") })
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want the handler's panic re-raised", r)
			}
		}()
		_ = mux.ProcessTask(context.Background(), tide.NewTask("t", nil))
	}()
	spans := tr.ended(trace.SpanKindConsumer)
	if len(spans) != 1 {
		t.Fatalf("%d ended consumer spans, want 1", len(spans))
	}
	if st := spans[0].Status(); st.Code != codes.Error || st.Description != "tide: handler panic: kaboom" {
		t.Errorf("status %+v, want Error with the panic's first line", st)
	}
}

func TestTracingRecoverInside(t *testing.T) {
	t.Parallel()
	tr := newTracing(t)
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(tr.opts...), middleware.Recover())
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { panic("kaboom") })
	err := mux.ProcessTask(context.Background(), tide.NewTask("t", nil))
	var pe *tide.PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want a *tide.PanicError", err)
	}
	if st := tr.ended(trace.SpanKindConsumer)[0].Status(); st.Code != codes.Error {
		t.Errorf("status %+v, want Error", st)
	}
}

func TestInjectExtractTrace(t *testing.T) {
	t.Parallel()
	tr := newTracing(t)
	prop := middleware.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)
	ctx := baggage.ContextWithBaggage(context.Background(), bag)
	ctx, span := tr.tp.Tracer("test").Start(ctx, "parent")
	defer span.End()

	task := tide.NewTask("t", nil)
	middleware.InjectTrace(ctx, task, prop)
	if task.Headers()["traceparent"] == "" || task.Headers()["baggage"] != "tenant=acme" {
		t.Fatalf("headers %v, want traceparent and baggage", task.Headers())
	}
	got := middleware.ExtractTrace(context.Background(), task, prop)
	if sc := trace.SpanContextFromContext(got); sc.SpanID() != span.SpanContext().SpanID() || !sc.IsRemote() {
		t.Errorf("extracted span context %v, want the injected span", sc)
	}
	if v := baggage.FromContext(got).Member("tenant").Value(); v != "acme" {
		t.Errorf("extracted baggage tenant=%q, want acme", v)
	}

	// Injecting again replaces what the first injection wrote.
	middleware.InjectTrace(context.Background(), task, prop)
	if len(task.Headers()) != 0 {
		t.Errorf("headers after injecting an empty context: %v, want none", task.Headers())
	}
	if got := middleware.ExtractTrace(context.Background(), task, prop); trace.SpanContextFromContext(got).IsValid() {
		t.Error("extracted a span context from empty headers")
	}
	// nil tasks are ignored.
	middleware.InjectTrace(ctx, nil, prop)
	if got := middleware.ExtractTrace(ctx, nil, prop); got != ctx {
		t.Error("ExtractTrace(nil task) changed the context")
	}
}

func TestTracingClientEnqueueMany(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tr := newTracing(t)
	client := middleware.NewTracingClient(e.c, tr.opts...)
	ctx := context.Background()

	if _, err := e.c.Enqueue(ctx, tide.NewTask("t", nil), tide.TaskID("taken")); err != nil {
		t.Fatal(err)
	}
	tasks := []*tide.Task{
		tide.NewTask("t", nil, tide.TaskID("taken")),
		tide.NewTask("t", []byte("x")),
	}
	infos, err := client.EnqueueMany(ctx, tasks, tide.Queue("default"))
	if !errors.Is(err, tide.ErrTaskIDConflict) || infos == nil || infos[0] != nil || infos[1] == nil {
		t.Fatalf("EnqueueMany = %v, %v; want the first task refused", infos, err)
	}
	spans := tr.ended(trace.SpanKindProducer)
	if len(spans) != 2 {
		t.Fatalf("%d producer spans, want 2", len(spans))
	}
	// The spans end in task order.
	bad, good := spans[0], spans[1]
	if st := bad.Status(); st.Code != codes.Error || !strings.HasPrefix(st.Description, "task 0 (taken)") {
		t.Errorf("refused task's span status %+v, want Error naming task 0", st)
	}
	if good.Status().Code != codes.Unset || good.Name() != "send default" {
		t.Errorf("stored task's span %q status %+v", good.Name(), good.Status())
	}
	wantAttrs(t, good, map[attribute.Key]any{"messaging.message.id": infos[1].ID, "messaging.destination.name": "default"})
	for i, s := range spans {
		ctx := middleware.ExtractTrace(context.Background(), tasks[i], tr.opts...)
		if trace.SpanContextFromContext(ctx).SpanID() != s.SpanContext().SpanID() {
			t.Errorf("task %d carries span %s, want its own producer span %s", i, trace.SpanContextFromContext(ctx).SpanID(), s.SpanContext().SpanID())
		}
	}

	// An invalid task stores nothing: every span fails, the invalid one
	// with its own error.
	tr.sr.Reset()
	_, err = client.EnqueueMany(ctx, []*tide.Task{tide.NewTask("t", nil), tide.NewTask("", nil)})
	if !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("err = %v, want ErrInvalidTask", err)
	}
	spans = tr.ended(trace.SpanKindProducer)
	if len(spans) != 2 || spans[0].Status().Code != codes.Error || spans[0].Name() != "send" {
		t.Fatalf("spans %v, want two failed spans named %q", spans, "send")
	}
	if d := spans[1].Status().Description; !strings.HasPrefix(d, "task 1:") {
		t.Errorf("invalid task's status %q, want its own error", d)
	}
}

func TestTracingClientEnqueueError(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tr := newTracing(t)
	client := middleware.NewTracingClient(e.c, tr.opts...)
	if _, err := client.Enqueue(context.Background(), tide.NewTask("t", nil), tide.Queue("bad queue")); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("err = %v, want ErrInvalidTask", err)
	}
	if _, err := client.Enqueue(context.Background(), nil); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("nil task: err = %v, want ErrInvalidTask", err)
	}
	spans := tr.ended(trace.SpanKindProducer)
	if len(spans) != 1 || spans[0].Status().Code != codes.Error || spans[0].Name() != "send" {
		t.Fatalf("spans %v, want one failed span named %q", spans, "send")
	}
	noAttrs(t, spans[0], "messaging.message.id", "messaging.destination.name")
}

func TestNewTracingClientNil(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("NewTracingClient(nil) did not panic")
		}
	}()
	middleware.NewTracingClient(nil)
}

func TestSpanNameFunc(t *testing.T) {
	t.Parallel()
	tr := newTracing(t)
	opts := append(tr.opts, middleware.WithSpanNameFunc(func(op, _, typ string) string { return op + " " + typ }))
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(opts...))
	mux.HandleFunc("email:send", func(context.Context, *tide.Task) error { return nil })
	if err := mux.ProcessTask(context.Background(), tide.NewTask("email:send", nil)); err != nil {
		t.Fatal(err)
	}
	if n := tr.ended(trace.SpanKindConsumer)[0].Name(); n != "process email:send" {
		t.Errorf("span name %q", n)
	}
}

// Each Step of a durable handler gets a span, a child of the attempt's
// consumer span: a step that runs fn is not replayed, the same step in the
// next attempt is, and a failing fn marks its span failed.
func TestTracingDurableSteps(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tr := newTracing(t)
	var attempts atomic.Int32
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(tr.opts...))
	mux.HandleFunc("order:flow", func(ctx context.Context, task *tide.Task) error {
		if _, err := tide.Step(ctx, "reserve", func(ctx context.Context) (int, error) {
			if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
				return 0, errors.New("fn runs without a span")
			}
			return 7, nil
		}); err != nil {
			return err
		}
		_, err := tide.Step(ctx, "charge", func(context.Context) (string, error) {
			if attempts.Add(1) == 1 {
				return "", errors.New("card declined")
			}
			return "ok", nil
		})
		return err
	})
	e.server(tide.Config{Queues: map[string]int{"orders": 1}, RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 10 * time.Millisecond }}, mux)
	if _, err := e.c.Enqueue(context.Background(), tide.NewTask("order:flow", nil), tide.Queue("orders")); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, "two consumer spans", func() bool { return len(tr.ended(trace.SpanKindConsumer)) == 2 })

	consumers := tr.ended(trace.SpanKindConsumer)
	parentOf := map[trace.SpanID]int{consumers[0].SpanContext().SpanID(): 0, consumers[1].SpanContext().SpanID(): 1}
	var got []string
	for _, s := range tr.ended(trace.SpanKindInternal) {
		a, ok := parentOf[s.Parent().SpanID()]
		if !ok {
			t.Errorf("step span %q is not a child of a consumer span", s.Name())
			continue
		}
		name, _ := attrOf(s, middleware.AttrStepName)
		replayed, _ := attrOf(s, middleware.AttrStepReplayed)
		got = append(got, fmt.Sprintf("%d %s %s replayed=%v failed=%v", a, s.Name(), name.AsString(), replayed.AsBool(), s.Status().Code == codes.Error))
	}
	slices.Sort(got)
	want := []string{
		"0 step charge charge replayed=false failed=true",
		"0 step reserve reserve replayed=false failed=false",
		"1 step charge charge replayed=false failed=false",
		"1 step reserve reserve replayed=true failed=false",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("step spans:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
