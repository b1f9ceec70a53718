package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/middleware"
)

func TestTimeout(t *testing.T) {
	t.Parallel()
	const d = 20 * time.Millisecond
	var cause error
	var left time.Duration
	mux := tide.NewServeMux()
	mux.Use(middleware.Timeout(d))
	mux.HandleFunc("slow", func(ctx context.Context, _ *tide.Task) error {
		dl, _ := ctx.Deadline()
		left = time.Until(dl)
		<-ctx.Done()
		cause = context.Cause(ctx)
		return ctx.Err()
	})
	mux.HandleFunc("fast", func(context.Context, *tide.Task) error { return nil })

	start := time.Now()
	err := mux.ProcessTask(context.Background(), tide.NewTask("slow", nil))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el < d {
		t.Errorf("returned after %v, before the %v timeout", el, d)
	}
	if left > d {
		t.Errorf("deadline %v away, want at most %v", left, d)
	}
	if !errors.Is(cause, context.DeadlineExceeded) || !strings.Contains(cause.Error(), "20ms middleware timeout") {
		t.Errorf("cause = %v, want one naming the middleware timeout", cause)
	}
	if err := mux.ProcessTask(context.Background(), tide.NewTask("fast", nil)); err != nil {
		t.Errorf("fast handler: %v", err)
	}
}

// An earlier deadline (the task's own Timeout, say) still wins.
func TestTimeoutKeepsEarlierDeadline(t *testing.T) {
	t.Parallel()
	mux := tide.NewServeMux()
	mux.Use(middleware.Timeout(time.Hour))
	var got time.Time
	mux.HandleFunc("t", func(ctx context.Context, _ *tide.Task) error {
		got, _ = ctx.Deadline()
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want, _ := ctx.Deadline()
	_ = mux.ProcessTask(ctx, tide.NewTask("t", nil))
	if !got.Equal(want) {
		t.Errorf("deadline %v, want the caller's %v", got, want)
	}
}

func TestTimeoutPanicsOnNonPositive(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, -time.Second} {
		func() {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.HasPrefix(s, "tide: middleware.Timeout") {
					t.Errorf("Timeout(%v) panic = %v", d, r)
				}
			}()
			middleware.Timeout(d)
		}()
	}
}
