package tide_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
)

// In a batch handler each task is durable through its own context
// (Task.Context): its steps run once across a sleep that parks it alone,
// while the batch's own context, which holds no single task, is refused.
func TestDurableInBatch(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		const n = 3
		var mu sync.Mutex
		runs := map[string]int{} // "<task> <step>" -> fn runs
		var batchErr error
		mux := tide.NewServeMux()
		mux.HandleBatch("row", tide.BatchHandlerFunc(func(ctx context.Context, ts []*tide.Task) []error {
			_, err := tide.Step(ctx, "whole", func(context.Context) (int, error) { return 1, nil })
			mu.Lock()
			if batchErr == nil {
				batchErr = err
				if err == nil {
					batchErr = errors.New("a Step on the batch's context was accepted")
				}
			}
			mu.Unlock()
			errs := make([]error, len(ts))
			for i, task := range ts {
				tctx := task.Context()
				id, _ := tide.GetTaskID(tctx)
				step := func(name string) error {
					_, err := tide.Step(tctx, name, func(context.Context) (string, error) {
						mu.Lock()
						runs[id+" "+name]++
						mu.Unlock()
						return name, nil
					})
					return err
				}
				if errs[i] = step("a"); errs[i] != nil {
					continue
				}
				if errs[i] = tide.Sleep(tctx, "nap", 100*time.Millisecond); errs[i] != nil {
					continue
				}
				errs[i] = step("b")
			}
			return errs
		}), tide.BatchSize(n), tide.BatchWait(200*time.Millisecond))
		serve(tide.Config{Concurrency: n}, mux)
		for i := range n {
			if _, err := c.Enqueue(t.Context(), tide.NewTask("row", nil), tide.TaskID(fmt.Sprint("row", i)), tide.Retention(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			awaitTaskState(t, b, "default", fmt.Sprint("row", i), tide.StateCompleted)
		}
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(batchErr, tide.ErrNotDurable) {
			t.Fatalf("Step on the batch's context: %v, want ErrNotDurable", batchErr)
		}
		for i := range n {
			for _, s := range []string{"a", "b"} {
				if got := runs[fmt.Sprint("row", i, " ", s)]; got != 1 {
					t.Errorf("row%d step %s ran %d times, want 1", i, s, got)
				}
			}
		}
	})
}
