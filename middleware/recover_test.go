package middleware_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/middleware"
)

func TestRecover(t *testing.T) {
	t.Parallel()
	mux := tide.NewServeMux()
	mux.Use(middleware.Recover())
	mux.HandleFunc("panic", func(context.Context, *tide.Task) error { panicHere(); return nil })
	mux.HandleFunc("err", func(context.Context, *tide.Task) error { return errBoom })
	mux.HandleFunc("ok", func(context.Context, *tide.Task) error { return nil })

	err := mux.ProcessTask(context.Background(), tide.NewTask("panic", nil))
	var pe *tide.PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v (%T), want *tide.PanicError", err, err)
	}
	if pe.Value != "kaboom" || !strings.Contains(string(pe.Stack), "panicHere") {
		t.Errorf("PanicError value %v, stack without the panicking function:\n%s", pe.Value, pe.Stack)
	}
	if errors.Is(err, tide.SkipRetry) {
		t.Error("a recovered panic must be retried, not skipped")
	}
	if err := mux.ProcessTask(context.Background(), tide.NewTask("err", nil)); err != errBoom {
		t.Errorf("err = %v, want the handler's error unchanged", err)
	}
	if err := mux.ProcessTask(context.Background(), tide.NewTask("ok", nil)); err != nil {
		t.Errorf("err = %v", err)
	}
}

func panicHere() { panic("kaboom") }

// Logging registered before Recover logs the panic as an error, and a real
// server retries the task.
func TestRecoverAcrossRedis(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var buf testlog.Buffer
	var calls atomic.Int32
	var errs atomic.Int32
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(jsonLogger(&buf)), middleware.Recover())
	mux.HandleFunc("t", func(context.Context, *tide.Task) error {
		if calls.Add(1) == 1 {
			panicHere()
		}
		return nil
	})
	e.server(tide.Config{ErrorHandler: func(_ context.Context, _ *tide.Task, err error) {
		var pe *tide.PanicError
		if errors.As(err, &pe) {
			errs.Add(1)
		}
	}}, mux)
	if _, err := e.c.Enqueue(context.Background(), tide.NewTask("t", nil)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, "two log lines", func() bool { return strings.Count(buf.String(), "\n") >= 2 })
	ls := lines(t, buf.String())
	if e, _ := ls[0]["err"].(string); ls[0]["outcome"] != "error" || !strings.HasPrefix(e, "tide: handler panic: kaboom") {
		t.Errorf("first line %v, want the panic as an error", ls[0])
	}
	if ls[1]["outcome"] != "ok" || ls[1]["attempt"] != float64(2) {
		t.Errorf("second line %v, want attempt 2 ok", ls[1])
	}
	if errs.Load() != 1 {
		t.Errorf("ErrorHandler saw %d PanicErrors, want 1", errs.Load())
	}
}
