package middleware

import (
	"context"
	"runtime/debug"

	"github.com/tidequeue/tide"
)

// Recover returns middleware that turns a panic in the handlers it wraps into
// an error of type *tide.PanicError, holding the panic value and the stack
// of the panicking goroutine, so the attempt fails and the task is retried
// like after any other error. The server recovers panics too; Recover is for
// middleware registered before it (Logging, Tracing, Metrics), which then see
// the failure as an ordinary error. Register it after them:
//
//	mux.Use(middleware.Tracing(), middleware.Logging(logger), middleware.Recover())
//
// The returned middleware is safe for concurrent use.
func Recover() tide.MiddlewareFunc {
	return func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = &tide.PanicError{Value: r, Stack: debug.Stack()}
				}
			}()
			return next.ProcessTask(ctx, t)
		})
	}
}
