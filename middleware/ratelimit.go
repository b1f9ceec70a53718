package middleware

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/tidequeue/tide"
)

// RateLimit returns middleware that lets at most perSecond tasks start per
// second on average, with bursts of up to burst, across every handler it
// wraps in this process. A task over the limit waits for its turn (it keeps
// its lease while it waits); if its context ends first, the attempt fails
// with the context's error and is retried like any failure. Use it to stay
// under a downstream API's quota. RateLimit panics unless perSecond > 0 and
// burst >= 1. The returned middleware is safe for concurrent use.
func RateLimit(perSecond float64, burst int) tide.MiddlewareFunc {
	if !(perSecond > 0) || math.IsInf(perSecond, 0) || burst < 1 {
		panic(fmt.Sprintf("tide: middleware.RateLimit(%v, %d): need perSecond > 0 and burst >= 1", perSecond, burst))
	}
	b := &bucket{rate: perSecond, burst: float64(burst), tokens: float64(burst), last: time.Now()}
	return func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
			if err := b.wait(ctx); err != nil {
				return fmt.Errorf("tide: rate limit: %w", err)
			}
			return next.ProcessTask(ctx, t)
		})
	}
}

// bucket is a token bucket. Waiters reserve a token at once (the count may
// go negative) and sleep until it is theirs, so they are served in order.
type bucket struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
}

func (b *bucket) wait(ctx context.Context) error {
	b.mu.Lock()
	now := time.Now()
	b.tokens = math.Min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens--
	deficit := -b.tokens
	b.mu.Unlock()
	if deficit <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(deficit / b.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		b.tokens++ // give the reservation back
		b.mu.Unlock()
		return context.Cause(ctx)
	}
}
