package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A partition that holds a free concurrency slot under a cap while nothing
// waits there asks for a rebalance even when it has no free rate token:
// refused for want of tokens, the lease call returned nothing and asked
// for nothing, so the slot stayed where nothing could use it, and the
// partition where a task waited, at its fair share of the contended
// Concurrency, did not ask either. The task waited for a sweep, seconds
// later (the flow-control model, seed 106: a slot free for 0.8–0.95 s
// with a token free elsewhere).
//
// Concurrency 1 and a Rate of 2 per minute over two partitions: task a
// runs in partition 0 on its token, task b waits in partition 1, which
// holds the other token; a ends. With the old script no lease call ever
// started b here (no Maintain runs to sweep).
func TestFreeSlotWithoutTokenAsksForARebalance(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "slot-no-token"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 1, Rate: tidetype.Rate{Limit: 2, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	a := idsIn("a", 0, 2, 1)
	fillQueue(t, b, q, a)
	var running []*broker.Delivery
	for range 5 {
		if err := b.rebalance(ctx, q); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Dequeue(ctx, []string{q}, 5, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if running = append(running, ds...); len(running) > 0 {
			break
		}
	}
	if len(running) != 1 || running[0].Task.ID != a[0] {
		t.Fatalf("leased %d tasks, want task %s", len(running), a[0])
	}
	fillQueue(t, b, q, idsIn("b", 1, 2, 1))
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	ns := readNodes(t, b, q)
	if ns[1].c != 1 || !ns[1].hasCt || ns[1].ct != 1 || !ns[2].cs {
		t.Fatalf("after the rebalance partition 0 holds %d slots (cap %d, set %v) and partition 1 fair share %v; want the slot capped at 1 in partition 0, partition 1 at its fair share",
			ns[1].c, ns[1].ct, ns[1].hasCt, ns[2].cs)
	}
	// The tokens as the model met them: partition 0 holds only the one
	// its start uses, the free one is elsewhere.
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	pipe := b.rdb.TxPipeline()
	pipe.HSet(ctx, b.bankKey(q), "r", 0)
	pipe.HSet(ctx, b.partAt(q, l, 0).k("lim"), "r", 1)
	pipe.HSet(ctx, b.partAt(q, l, 1).k("lim"), "r", 1)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	settleAll(t, b, running)
	for range 40 {
		ds, err := b.Dequeue(ctx, []string{q}, 5, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			if ds[0].Task.ID[:1] != "b" {
				t.Fatalf("leased %s, want the task waiting in partition 1", ds[0].Task.ID)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	ns = readNodes(t, b, q)
	t.Fatalf("the task waiting in partition 1 never started: partition 0 holds %d slots and %d tokens (%d used), partition 1 %d slots and %d tokens",
		ns[1].c, ns[1].r, ns[1].used, ns[2].c, ns[2].r)
}
