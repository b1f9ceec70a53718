package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// Two rebalances that overlap forget the excess starts of a lowered and
// lengthened Rate once, not twice: 11 starts under 11 per 2 s, 2.2 s old
// (out of the old period, in the new one), then the limit becomes 6 per 3
// s. A rebalance that read the slots before SetQueueLimits' own rebalance
// forgot the 5 excess starts forgets again after it, from what it read
// then: it must not forget 5 more of the 6 starts that back the tokens, or
// 5 tasks start with 11 starts in the last 3 s. (The server's background
// rebalance of another process is such a rebalance.)
func TestRateLoweredAndLengthenedOverlappingRebalances(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-lowered-lengthened"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 11, Per: 2 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 5)...))
	if n := leaseAll(t, b, q, 5); n != 11 {
		t.Fatalf("leased %d tasks under 11 per 2s, want 11", n)
	}
	ageStarts(t, b, q, 0, 2200*time.Millisecond)
	ageStarts(t, b, q, 1, 2200*time.Millisecond)
	lowered := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 6, Per: 3 * time.Second}}
	var stale []*slotNode
	SetLimitsRecorded(func(queue string) {
		if queue != q || stale != nil {
			return
		}
		l, err := b.layoutOf(ctx, q)
		if err != nil {
			t.Error(err)
			return
		}
		stale = b.slotNodes(q, l)
		if err := b.readSlots(ctx, q, stale, lowered); err != nil {
			t.Error(err)
		}
	})
	defer SetLimitsRecorded(nil)
	if err := b.SetQueueLimits(ctx, q, lowered); err != nil {
		t.Fatal(err)
	}
	SetLimitsRecorded(nil)
	if stale == nil {
		t.Fatal("the slots were not read while the limits changed")
	}
	// The other rebalance goes on from what it read.
	if err := b.dropUnbacked(ctx, q, stale, lowered); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("c", 0, 2, 6), idsIn("d", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 5); n != 0 {
		t.Fatalf("%d tasks started with 11 starts in the last 3s, under a Rate of 6 per 3s", n)
	}
	if _, r := slotTotals(t, b, q); r != 6 {
		t.Fatalf("the nodes hold %d rate tokens, want 6", r)
	}
}
