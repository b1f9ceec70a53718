package tide_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestGroupRateHoldWithoutSlots: a queue of two partitions with
// Concurrency 1 and a GroupRate (with Ordered or GroupConcurrency) drains.
// Found by the limit model (internal/chaos, TestLimitModel): groups of the
// partition that held no concurrency slot, held back by their GroupRate,
// never started again once their window had passed, because the
// partition's dequeue was refused for want of slots before it put the
// groups whose hold ended back in the rotation, and the rebalance it asked
// for (slots.lua) counts only the rotation's groups as waiting. The refused
// dequeue now puts them back first.
func TestGroupRateHoldWithoutSlots(t *testing.T) {
	t.Parallel()
	for i, lim := range []tide.QueueLimits{
		{Concurrency: 1, GroupRate: tide.Rate{Limit: 3, Per: 2 * time.Second}, Ordered: true},
		{Concurrency: 1, GroupRate: tide.Rate{Limit: 3, Per: 2 * time.Second}, GroupConcurrency: 1},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(2))
			ctx := context.Background()
			in := tide.NewInspector(e.b)
			if err := in.SetQueueLimits(ctx, "st", lim); err != nil {
				t.Fatal(err)
			}
			h := tide.HandlerFunc(func(context.Context, *tide.Task) error {
				time.Sleep(50 * time.Millisecond)
				return nil
			})
			for range 2 {
				e.server(tide.Config{Concurrency: 6, Queues: map[string]int{"st": 1}}, h)
			}
			for i := range 32 {
				if _, err := e.c.Enqueue(ctx, tide.NewTask("x", nil), tide.Queue("st"), tide.Group(fmt.Sprint("g", i%4))); err != nil {
					t.Fatal(err)
				}
			}
			// 8 tasks per group at 3 per 2 s: about 5 s; 40 s is generous.
			testwait.For(t, 40*time.Second, "the queue to drain", func() bool {
				qi, err := in.QueueInfo(ctx, "st")
				return err == nil && qi.Pending+qi.Active+qi.Retry+qi.Scheduled == 0
			})
		})
	}
}
