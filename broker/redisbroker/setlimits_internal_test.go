package redisbroker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// SetQueueLimits while another process repartitions the queue: the
// partitions got their settings under the old layout, and the rebalance
// that follows, with the layout this process had cached, was refused by
// the partitions the repartition had marked since. The call returned that
// refusal ("partition layout mismatch") although the limits were recorded
// and given (the flow-control model, seed 132: a raised Rate then in
// force was checked as if the call had changed nothing). The rebalance
// now reads the layout again, as the settings step does.
func TestSetQueueLimitsWhileAnotherProcessRepartitions(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	other := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "limits-repartition"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 2, Rate: tidetype.Rate{Limit: 6, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	hold := idsIn("hold", 0, 2, 1)
	fillQueue(t, b, q, hold)
	var held []*broker.Delivery
	testwait.For(t, 10*time.Second, "the old span's task to start", func() bool {
		if err := b.rebalance(ctx, q); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ds...)
		return len(held) > 0
	})
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 4), idsIn("b", 1, 2, 4)...))
	done := make(chan error, 1)
	started := false
	h := func(queue string) {
		if queue != q || started {
			return
		}
		started = true
		// Another process starts a repartition now; it waits for the
		// held task, so it stays under way.
		go func() { done <- other.Repartition(ctx, q, 3, nil) }()
		testwait.For(t, 10*time.Second, "the repartition to record both spans", func() bool {
			v, err := b.rdb.HGet(ctx, b.prefix+":partitions", q).Result()
			if err != nil {
				t.Fatal(err)
			}
			return strings.Contains(v, "<")
		})
		testwait.For(t, 10*time.Second, "the old partitions to learn the repartition's layout", func() bool {
			l, err := other.freshLayout(ctx, q)
			return err == nil && l.old != nil
		})
	}
	limitsShared.Store(&h)
	err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 4, Rate: tidetype.Rate{Limit: 12, Per: time.Minute}})
	limitsShared.Store(nil)
	settleAll(t, b, held)
	if started {
		if rerr := <-done; rerr != nil {
			t.Fatal(rerr)
		}
	}
	if !started {
		t.Fatal("the hook did not run")
	}
	if err != nil {
		t.Fatalf("SetQueueLimits while another process repartitioned: %v", err)
	}
	got, err := b.QueueLimits(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if got.Concurrency != 4 || got.Rate.Limit != 12 {
		t.Fatalf("limits %+v after the change, want Concurrency 4 and 12 per minute", got)
	}
}
