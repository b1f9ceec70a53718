// Command otel shows one OpenTelemetry trace following a tide task from
// Enqueue, through Redis, to its processing, including a retry: the handler
// fails its first attempt and succeeds on the second. See README.md.
//
//	go run ./examples/otel          # a compact summary of the trace
//	go run ./examples/otel -raw     # and every span as JSON (stdout exporter)
//
// It needs a Redis at TIDE_REDIS_ADDR (default 127.0.0.1:6379) and exits
// once the task has succeeded.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/middleware"
)

func main() {
	raw := flag.Bool("raw", false, "also print every span as JSON with the OpenTelemetry stdout exporter")
	flag.Parse()
	if err := run(*raw); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(raw bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	addr := os.Getenv("TIDE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	pingCtx, cancelPing := context.WithTimeout(ctx, 5*time.Second)
	defer cancelPing()
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		return fmt.Errorf("tide: no Redis at %s (start one, or set TIDE_REDIS_ADDR): %w", addr, err)
	}

	// OpenTelemetry: the stdout exporter (JSON, shown with -raw) and a
	// collector for the summary printed at the end. The middleware uses the
	// global provider and propagator.
	jsonOut := io.Discard
	if raw {
		jsonOut = os.Stdout
	}
	stdout, err := stdouttrace.New(stdouttrace.WithWriter(jsonOut), stdouttrace.WithPrettyPrint())
	if err != nil {
		return fmt.Errorf("tide: stdout exporter: %w", err)
	}
	spans := &collector{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(stdout), sdktrace.WithSyncer(spans))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	tracer := otel.Tracer("example/otel")

	b := redisbroker.New(rdb, redisbroker.WithPrefix("tide-example-otel"))
	defer b.Close()

	// The server: tracing outermost, then one log line per attempt.
	done := make(chan struct{}, 1)
	mux := tide.NewServeMux()
	mux.Use(
		middleware.Tracing(),
		middleware.Logging(slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: dropTime}))),
		middleware.Recover(),
	)
	mux.HandleFunc("order:charge", func(ctx context.Context, t *tide.Task) error {
		// The handler's context carries the attempt's span.
		_, span := tracer.Start(ctx, "charge card")
		defer span.End()
		if n, _ := tide.GetRetryCount(ctx); n == 0 {
			err := errors.New("payment gateway timeout")
			span.SetStatus(codes.Error, err.Error())
			return err
		}
		select {
		case done <- struct{}{}:
		default:
		}
		return nil
	})
	srv := tide.NewServer(b, tide.Config{
		RetryDelayFunc: tide.RetrySchedule(time.Second),
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("tide: start server: %w", err)
	}
	defer srv.Shutdown()

	// The client: the caller's span, then the producer span around Enqueue.
	client := middleware.NewTracingClient(tide.NewClient(b))
	appCtx, checkout := tracer.Start(ctx, "checkout")
	info, err := client.Enqueue(appCtx, tide.NewTask("order:charge", []byte(`{"order":42,"cents":1999}`)), tide.MaxRetry(3))
	checkout.End()
	if err != nil {
		return fmt.Errorf("tide: enqueue: %w", err)
	}
	traceID := checkout.SpanContext().TraceID()
	fmt.Printf("enqueued task %s in queue %s, trace %s\n", info.ID, info.Queue, traceID)

	select {
	case <-done:
	case <-ctx.Done():
		return errors.New("tide: the task did not succeed within 30s")
	}
	srv.Shutdown() // waits for the handler and its spans to finish
	if err := tp.Shutdown(context.Background()); err != nil {
		return fmt.Errorf("tide: flush spans: %w", err)
	}
	fmt.Println()
	spans.print(os.Stdout, traceID)
	return nil
}

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// collector is a SpanExporter that keeps the spans for the summary.
type collector struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

func (c *collector) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spans = append(c.spans, spans...)
	return nil
}

func (c *collector) Shutdown(context.Context) error { return nil }

// print writes the spans of one trace as a tree, children in start order.
func (c *collector) print(w io.Writer, id trace.TraceID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var spans []sdktrace.ReadOnlySpan
	known := map[trace.SpanID]bool{}
	for _, s := range c.spans {
		if s.SpanContext().TraceID() == id {
			spans = append(spans, s)
			known[s.SpanContext().SpanID()] = true
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].StartTime().Before(spans[j].StartTime()) })
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent().SpanID(); known[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	if len(roots) == 0 {
		fmt.Fprintln(w, "no spans recorded")
		return
	}
	t0 := roots[0].StartTime()
	fmt.Fprintf(w, "trace %s: %d spans\n", id, len(spans))
	fmt.Fprintf(w, "%-34s %-9s %-17s %9s %9s  %s\n", "SPAN", "KIND", "SPAN ID", "START", "TOOK", "DETAILS")
	var walk func(s sdktrace.ReadOnlySpan, prefix, branch string)
	walk = func(s sdktrace.ReadOnlySpan, prefix, branch string) {
		fmt.Fprintf(w, "%-34s %-9s %-17s %9s %9s  %s\n", prefix+branch+s.Name(), s.SpanKind(),
			s.SpanContext().SpanID(), "+"+ms(s.StartTime().Sub(t0)), ms(s.EndTime().Sub(s.StartTime())), details(s))
		kids := children[s.SpanContext().SpanID()]
		next := prefix
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		for i, k := range kids {
			b := "├─ "
			if i == len(kids)-1 {
				b = "└─ "
			}
			walk(k, next, b)
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
}

// details lists what tells the spans apart: the task, the attempt, the
// outcome.
func details(s sdktrace.ReadOnlySpan) string {
	var parts []string
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	if v, ok := attrs["messaging.message.id"]; ok {
		parts = append(parts, "task="+v.AsString())
	}
	if v, ok := attrs[middleware.AttrRetryCount]; ok {
		parts = append(parts, fmt.Sprintf("attempt=%d", v.AsInt64()+1))
	}
	if s.Parent().IsRemote() {
		parts = append(parts, "parent="+s.Parent().SpanID().String()+"(from task headers)")
	}
	if st := s.Status(); st.Code == codes.Error {
		parts = append(parts, fmt.Sprintf("ERROR %q", st.Description))
	}
	return strings.Join(parts, " ")
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
}
