package tide_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
)

// Observers of durable steps nest (the outer one begins first and ends
// last), see whether a step is replayed, get the step's error, and hand fn
// the context they return.
func TestStepObserver(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		type ctxKey struct{}
		var mu sync.Mutex
		var log []string
		add := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
		observer := func(tag string) tide.StepObserver {
			return func(ctx context.Context, name string, replayed bool) (context.Context, func(error)) {
				add(tag + " begin " + name + map[bool]string{true: " replayed", false: ""}[replayed])
				return context.WithValue(ctx, ctxKey{}, tag), func(err error) {
					e := "ok"
					if err != nil {
						e = err.Error()
					}
					add(tag + " end " + name + " " + e)
				}
			}
		}
		var attempt int
		mux := tide.NewServeMux()
		mux.HandleFunc("obs", func(ctx context.Context, _ *tide.Task) error {
			ctx = tide.WithStepObserver(tide.WithStepObserver(ctx, observer("outer")), observer("inner"))
			mu.Lock()
			attempt++
			first := attempt == 1
			mu.Unlock()
			if _, err := tide.Step(ctx, "a", func(ctx context.Context) (int, error) {
				add("fn a sees " + ctx.Value(ctxKey{}).(string))
				return 1, nil
			}); err != nil {
				return err
			}
			_, err := tide.Step(ctx, "b", func(context.Context) (int, error) {
				if first {
					return 0, errors.New("boom")
				}
				return 2, nil
			})
			return err
		})
		serve(tide.Config{RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 10 * time.Millisecond }}, mux)
		if _, err := c.Enqueue(t.Context(), tide.NewTask("obs", nil)); err != nil {
			t.Fatal(err)
		}
		want := []string{
			"outer begin a", "inner begin a", "fn a sees inner", "inner end a ok", "outer end a ok",
			"outer begin b", "inner begin b", "inner end b boom", "outer end b boom",
			"outer begin a replayed", "inner begin a replayed", "inner end a ok", "outer end a ok",
			"outer begin b", "inner begin b", "inner end b ok", "outer end b ok",
		}
		testwait.For(t, 15*time.Second, "both attempts' steps", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(log) >= len(want)
		})
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(log, want) {
			t.Fatalf("observed %q\nwant %q", log, want)
		}
	})
}
