package tide_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

// A handler that returns RetryAfter runs again after the wait without
// using a retry (the task has none), and neither ErrorHandler nor
// RetryDelayFunc is called for the deferral.
func TestRetryAfterUsesNoRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var runs, errorHandler, retryDelay atomic.Int32
	deferred := make(chan struct{})
	e.server(tide.Config{
		ErrorHandler: func(context.Context, *tide.Task, error) { errorHandler.Add(1) },
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration {
			retryDelay.Add(1)
			return time.Hour
		},
	}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		switch runs.Add(1) {
		case 1:
			return fmt.Errorf("the API answered 429: %w", tide.RetryAfter(300*time.Millisecond))
		case 2:
			<-deferred // the test has looked at the deferred task
		}
		return nil
	}))
	info, err := e.c.Enqueue(ctx, tide.NewTask("call-api", nil), tide.MaxRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	got := e.waitState("default", info.ID, tide.StateRetry)
	if got.Retried != 0 || got.LastErr != "the API answered 429: tide: retry after 300ms" {
		t.Fatalf("deferred task: retried %d, last error %q", got.Retried, got.LastErr)
	}
	if n := len(got.Attempts); n != 1 || got.Attempts[0].Outcome != "deferred" {
		t.Fatalf("attempts %+v, want one deferred", got.Attempts)
	}
	close(deferred)
	e.waitGone("default", info.ID)
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", runs.Load())
	}
	if errorHandler.Load() != 0 || retryDelay.Load() != 0 {
		t.Fatalf("ErrorHandler called %d times, RetryDelayFunc %d times; want 0", errorHandler.Load(), retryDelay.Load())
	}
}

func TestRetryAfterError(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("wrapped: %w", tide.RetryAfter(-time.Second))
	var ra *tide.RetryAfterError
	if !errors.As(err, &ra) || ra.Delay != 0 {
		t.Fatalf("errors.As: %v %+v", errors.As(err, &ra), ra)
	}
	if d := tide.RetryAfter(365 * 24 * time.Hour).(*tide.RetryAfterError).Delay; d != tide.MaxRetryAfter {
		t.Fatalf("a year was cut to %v, want MaxRetryAfter", d)
	}
}
