package redisbroker

import (
	"context"
	"testing"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A partition that gives slots away gets its cap of the same plan too.
// Under Concurrency 4 with nothing to run, each of two partitions holds 2
// slots; then 1 task comes to partition 0 and 4 to partition 1: demand
// exceeds the limit, and the plan gives partition 1 one of partition 0's
// slots and caps partition 0 at 1, its share. The cap was checked against
// the slots read before the give, which ran first, so it was refused and
// partition 0 kept no cap: a slot it freed later with nothing to run
// would have told no server.
func TestRebalanceCapsAPartitionThatGives(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "cap-giver"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	ns := readNodes(t, b, q)
	if ns[1].c != 2 || ns[2].c != 2 {
		t.Fatalf("partitions hold %d and %d slots, want the 4 spread", ns[1].c, ns[2].c)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 1), idsIn("b", 1, 2, 4)...))
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	ns = readNodes(t, b, q)
	if ns[1].c != 1 || ns[2].c != 3 {
		t.Fatalf("after the rebalance partitions hold %d and %d slots, want 1 and 3", ns[1].c, ns[2].c)
	}
	if !ns[1].hasCt || ns[1].ct != 1 {
		t.Errorf("partition 0 gave a slot and has cap %d (set: %v), want 1", ns[1].ct, ns[1].hasCt)
	}
	if !ns[2].hasCt || ns[2].ct != 3 {
		t.Errorf("partition 1 has cap %d (set: %v), want 3", ns[2].ct, ns[2].hasCt)
	}
}

// A cap refused because another rebalance changed the node between this
// one's read and its cap (here: wrote a cap of its own) leaves the node a
// cap and fair-share flags from an older plan. A partition capped at its
// share that frees a slot with nothing to run then tells no server, while
// the partition where tasks wait, told it holds its fair share, does not
// ask: the slot idled until the next sweep, seconds later (the
// flow-control model's idle waits). The rebalance plans again.
func TestRebalancePlansAgainAfterARefusedCap(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "cap-refused"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 1), idsIn("b", 1, 2, 4)...))
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	p0 := b.partAt(q, l, 0)
	done := false
	h := func(queue string) {
		if queue != q || done {
			return
		}
		done = true
		// Another process's plan, made a moment earlier, caps
		// partition 0 at 2.
		if err := b.rdb.HSet(ctx, p0.k("lim"), "ct", 2).Err(); err != nil {
			t.Error(err)
		}
	}
	rebalanceRead.Store(&h)
	err = b.rebalance(ctx, q)
	rebalanceRead.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatal("the hook did not run")
	}
	ns := readNodes(t, b, q)
	if ns[1].c != 1 || ns[2].c != 3 {
		t.Fatalf("after the rebalance partitions hold %d and %d slots, want 1 and 3", ns[1].c, ns[2].c)
	}
	if !ns[1].hasCt || ns[1].ct != 1 {
		t.Errorf("partition 0 has cap %d (set: %v), want 1: the cap refused was not planned again", ns[1].ct, ns[1].hasCt)
	}
	if !ns[2].hasCt || ns[2].ct != 3 {
		t.Errorf("partition 1 has cap %d (set: %v), want 3", ns[2].ct, ns[2].hasCt)
	}
}
