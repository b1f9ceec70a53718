package tide

import "context"

// StepObserver watches the steps of durable handlers (Step), for tracing
// and metrics: it is called when a Step begins, with the step's name and
// whether its result is replayed from storage (fn does not run), and
// returns the context fn runs with and a function that Step calls with the
// step's error (nil on success) when it ends. middleware.Tracing installs
// one that starts a span per step. An observer must be safe for concurrent
// use; it must not panic.
type StepObserver func(ctx context.Context, name string, replayed bool) (context.Context, func(err error))

type stepObserverKey struct{}

// WithStepObserver returns a copy of ctx whose durable steps o observes,
// after any observer ctx already has (they nest: the outer one first).
// A nil o returns ctx unchanged.
func WithStepObserver(ctx context.Context, o StepObserver) context.Context {
	if o == nil {
		return ctx
	}
	if outer, ok := ctx.Value(stepObserverKey{}).(StepObserver); ok {
		inner := o
		o = func(ctx context.Context, name string, replayed bool) (context.Context, func(error)) {
			ctx, endOuter := outer(ctx, name, replayed)
			ctx, endInner := inner(ctx, name, replayed)
			return ctx, func(err error) { endInner(err); endOuter(err) }
		}
	}
	return context.WithValue(ctx, stepObserverKey{}, o)
}

// observeStep starts the observation of a step: the context to run it with
// and the function to call with its error when it ends.
func observeStep(ctx context.Context, name string, replayed bool) (context.Context, func(error)) {
	o, ok := ctx.Value(stepObserverKey{}).(StepObserver)
	if !ok {
		return ctx, func(error) {}
	}
	return o(ctx, name, replayed)
}
