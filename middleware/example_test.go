package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/middleware"
)

// A text logger without the time and the duration, so the output is stable.
func exampleLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "duration" {
				return slog.Attr{}
			}
			return a
		},
	}))
}

func ExampleLogging() {
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(exampleLogger()))
	mux.HandleFunc("email:send", func(_ context.Context, t *tide.Task) error {
		if string(t.Payload()) == "bounce@example.com" {
			return errors.New("smtp: 550 no such user")
		}
		return nil
	})

	// Outside a server there is no queue, ID or attempt to log; under a
	// tide.Server each line has them too.
	ctx := context.Background()
	_ = mux.ProcessTask(ctx, tide.NewTask("email:send", []byte("ann@example.com")))
	_ = mux.ProcessTask(ctx, tide.NewTask("email:send", []byte("bounce@example.com")))
	// Output:
	// level=INFO msg="tide: task attempt" type=email:send outcome=ok
	// level=WARN msg="tide: task attempt" type=email:send outcome=error err="smtp: 550 no such user"
}

func ExampleWithPayload() {
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(exampleLogger(), middleware.WithPayload()))
	mux.HandleFunc("email:send", func(context.Context, *tide.Task) error { return nil })
	_ = mux.ProcessTask(context.Background(), tide.NewTask("email:send", []byte(`{"to":"ann@example.com"}`)))
	// Output:
	// level=INFO msg="tide: task attempt" type=email:send outcome=ok payload="{\"to\":\"ann@example.com\"}"
}

func ExampleRecover() {
	mux := tide.NewServeMux()
	mux.Use(middleware.Recover())
	mux.HandleFunc("report:build", func(context.Context, *tide.Task) error {
		var m map[string]int
		//lint:ignore SA5000 the example panics on purpose
		m["rows"]++ // nil map: panics
		return nil
	})
	err := mux.ProcessTask(context.Background(), tide.NewTask("report:build", nil))
	var pe *tide.PanicError
	fmt.Println(errors.As(err, &pe))
	fmt.Println(strings.SplitN(err.Error(), "\n", 2)[0])
	// Output:
	// true
	// tide: handler panic: assignment to entry in nil map
}

func ExampleTimeout() {
	mux := tide.NewServeMux()
	mux.Use(middleware.Timeout(10 * time.Millisecond))
	mux.HandleFunc("video:encode", func(ctx context.Context, _ *tide.Task) error {
		select {
		case <-time.After(time.Minute): // the work
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	err := mux.ProcessTask(context.Background(), tide.NewTask("video:encode", nil))
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	fmt.Println(err)
	// Output:
	// true
	// tide: task attempt exceeded the 10ms middleware timeout: context deadline exceeded
}

func ExampleTracing() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	opts := []middleware.OTelOption{
		middleware.WithTracerProvider(tp),
		middleware.WithPropagator(propagation.TraceContext{}),
	}

	// The producer side: TracingClient.Enqueue does this, and enqueues.
	ctx, span := tp.Tracer("shop").Start(context.Background(), "checkout")
	task := tide.NewTask("order:charge", nil)
	middleware.InjectTrace(ctx, task, opts...)
	span.End()

	// The consumer side.
	mux := tide.NewServeMux()
	mux.Use(middleware.Tracing(opts...))
	mux.HandleFunc("order:charge", func(context.Context, *tide.Task) error { return errors.New("card declined") })
	_ = mux.ProcessTask(context.Background(), task)

	for _, s := range rec.Ended() {
		fmt.Printf("%s (%s) status=%s child-of-checkout=%v\n", s.Name(), s.SpanKind(), s.Status().Code,
			s.Parent().SpanID() == span.SpanContext().SpanID())
	}
	// Output:
	// checkout (internal) status=Unset child-of-checkout=false
	// process (consumer) status=Error child-of-checkout=true
}

func ExampleMetrics() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	mw, err := middleware.Metrics(middleware.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	mux := tide.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("ok", func(context.Context, *tide.Task) error { return nil })
	mux.HandleFunc("fail", func(context.Context, *tide.Task) error { return errors.New("no") })
	ctx := context.Background()
	for _, typ := range []string{"ok", "ok", "fail"} {
		_ = mux.ProcessTask(ctx, tide.NewTask(typ, nil))
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name != middleware.MetricActive {
			total := int64(0)
			for _, dp := range s.DataPoints {
				total += dp.Value
			}
			fmt.Println(m.Name, total)
		}
	}
	// Output:
	// tide.tasks.processed 3
	// tide.tasks.failed 1
}

func ExampleRegisterQueueGauges() {
	// A source of queue sizes; an Inspector-backed one in a real program.
	sizes := func(context.Context) (map[string]map[tide.TaskState]int64, error) {
		return map[string]map[tide.TaskState]int64{
			"default": {tide.StatePending: 12, tide.StateScheduled: 3400},
		}, nil
	}
	reg, err := middleware.RegisterQueueGauges(sizes) // the global MeterProvider
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
}

func ExampleNewTracingClient() {
	otel.SetTextMapPropagator(propagation.TraceContext{}) // and otel.SetTracerProvider(...)

	b := redisbroker.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	client := middleware.NewTracingClient(tide.NewClient(b))
	defer client.Close()

	// ctx carries the caller's span; the task's processing continues it.
	ctx := context.Background()
	info, err := client.Enqueue(ctx, tide.NewTask("order:cancel", []byte(`{"order":42}`)),
		tide.ProcessIn(15*time.Minute), tide.TaskID("cancel:42"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.ID)
}
