package middleware_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/middleware"
)

func TestRateLimit(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	h := middleware.RateLimit(20, 5)(tide.HandlerFunc(func(context.Context, *tide.Task) error {
		ran.Add(1)
		return nil
	}))
	ctx := context.Background()
	// The burst goes through at once.
	for range 5 {
		if err := h.ProcessTask(ctx, tide.NewTask("t", nil)); err != nil {
			t.Fatal(err)
		}
	}
	// Beyond it, tasks wait their turn: 10 more at 20/s take about half a
	// second, never less than the tokens allow.
	start := time.Now()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { _ = h.ProcessTask(ctx, tide.NewTask("t", nil)) })
	}
	wg.Wait()
	if ran.Load() != 15 {
		t.Fatalf("ran %d", ran.Load())
	}
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Fatalf("10 tasks over the burst ran in %v; the limit of 20/s allows no less than ~500ms", el)
	}
	// A waiter whose context ends fails with the context's error and gives
	// its reservation back.
	cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	var queued sync.WaitGroup
	for range 3 {
		queued.Go(func() { _ = h.ProcessTask(ctx, tide.NewTask("t", nil)) })
	}
	err := h.ProcessTask(cctx, tide.NewTask("t", nil))
	queued.Wait()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

func TestRateLimitPanics(t *testing.T) {
	t.Parallel()
	for _, args := range [][2]float64{{0, 1}, {-1, 1}, {1, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RateLimit(%v, %v) did not panic", args[0], args[1])
				}
			}()
			middleware.RateLimit(args[0], int(args[1]))
		}()
	}
}
