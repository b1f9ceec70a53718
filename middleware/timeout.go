package middleware

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide"
)

// Timeout returns middleware that bounds every attempt by d: the handler's
// context is cancelled d after the attempt enters the middleware, or earlier
// when the task's own Timeout or Deadline (or the server) says so, whichever
// comes first. When d is what cancels it, context.Cause(ctx) is an error
// that names the timeout and wraps context.DeadlineExceeded. A handler must
// honour its context for the bound to take effect; the error it returns is
// passed on unchanged, and is retried like any failure.
//
// Timeout panics if d <= 0. The returned middleware is safe for concurrent
// use.
func Timeout(d time.Duration) tide.MiddlewareFunc {
	if d <= 0 {
		panic(fmt.Sprintf("tide: middleware.Timeout(%v): duration must be positive", d))
	}
	cause := fmt.Errorf("tide: task attempt exceeded the %v middleware timeout: %w", d, context.DeadlineExceeded)
	return func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
			ctx, cancel := context.WithTimeoutCause(ctx, d, cause)
			defer cancel()
			return next.ProcessTask(ctx, t)
		})
	}
}
