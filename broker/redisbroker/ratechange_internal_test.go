package redisbroker

import (
	"context"
	"strconv"
	"strings"
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
	stale := setLimitsReadingSlots(t, b, q, lowered)
	// The other rebalance goes on from what it read.
	if _, err := b.dropUnbacked(ctx, q, stale, lowered); err != nil {
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

// The same for a Rate switched on: 12 starts without a rate, 2 s old,
// then a Rate of 9 per 3 s. The 3 excess starts are forgotten once, by
// one of two overlapping rebalances, so nothing starts while the 9 other
// starts are in the period.
func TestRateSwitchedOnOverlappingRebalances(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-on-overlapping"
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 1); n != 12 {
		t.Fatalf("leased %d tasks without limits, want 12", n)
	}
	ageStarts(t, b, q, 0, 2*time.Second)
	ageStarts(t, b, q, 1, 2*time.Second)
	on := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: 3 * time.Second}}
	stale := setLimitsReadingSlots(t, b, q, on)
	if _, err := b.dropUnbacked(ctx, q, stale, on); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("c", 0, 2, 6), idsIn("d", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 5); n != 0 {
		t.Fatalf("%d tasks started with 12 starts in the last 3s, under a Rate of 9 per 3s", n)
	}
}

// One rebalance at a time forgets: while another holds the queue's forget
// lock, a rebalance that finds starts in excess forgets none of them.
func TestForgetLockHeldForgetsNothing(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-forget-lock"
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 1); n != 12 {
		t.Fatalf("leased %d tasks without limits, want 12", n)
	}
	on := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: 3 * time.Second}}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	ns := b.slotNodes(q, l)
	lock := b.slotCall(q, ns[0], "lock", "other", int64(60000))
	if err := b.runAll(ctx, "lock", []*call{lock}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := lock.cmd.Int64(); ok != 1 {
		t.Fatal("the free lock was not taken")
	}
	if err := b.SetQueueLimits(ctx, q, on); err != nil {
		t.Fatal(err)
	}
	if err := b.readSlots(ctx, q, ns, on); err != nil {
		t.Fatal(err)
	}
	if u := ns[1].used + ns[2].used; u != 12 {
		t.Fatalf("%d starts counted with the lock held elsewhere, want all 12", u)
	}
	if err := b.runAll(ctx, "unlock", []*call{b.slotCall(q, ns[0], "unlock", "other")}); err != nil {
		t.Fatal(err)
	}
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := b.readSlots(ctx, q, ns, on); err != nil {
		t.Fatal(err)
	}
	if u := ns[1].used + ns[2].used; u != 9 {
		t.Fatalf("%d starts counted once the lock is free, want 9", u)
	}
}

// setLimitsReadingSlots sets lim on queue q and returns the queue's slots
// as a rebalance read them while SetQueueLimits ran: after the limits were
// recorded, before the partitions got their settings.
func setLimitsReadingSlots(t *testing.T, b *Broker, q string, lim tidetype.QueueLimits) []*slotNode {
	t.Helper()
	ctx := context.Background()
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
		if err := b.readSlots(ctx, q, stale, lim); err != nil {
			t.Error(err)
		}
	})
	defer SetLimitsRecorded(nil)
	if err := b.SetQueueLimits(ctx, q, lim); err != nil {
		t.Fatal(err)
	}
	if stale == nil {
		t.Fatal("the slots were not read while the limits changed")
	}
	return stale
}

// A forget lock left by a rebalance that died holding it stops forgetting
// only until it runs out: with the lock of a dead process past its time,
// the next rebalance forgets the excess starts.
func TestForgetLockOfADeadRebalanceRunsOut(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-forget-lock-dead"
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 1); n != 12 {
		t.Fatalf("leased %d tasks without limits, want 12", n)
	}
	on := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: time.Minute}}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	ns := b.slotNodes(q, l)
	// The dead process's lock, taken for a minute...
	if err := b.runAll(ctx, "lock", []*call{b.slotCall(q, ns[0], "lock", "dead", int64(60000))}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetQueueLimits(ctx, q, on); err != nil {
		t.Fatal(err)
	}
	if err := b.readSlots(ctx, q, ns, on); err != nil {
		t.Fatal(err)
	}
	if u := ns[1].used + ns[2].used; u != 12 {
		t.Fatalf("%d starts counted with the dead process's lock in force, want all 12", u)
	}
	// ... and a minute later (its time moved back).
	fl, err := b.rdb.HGet(ctx, b.bankKey(q), "fl").Result()
	if err != nil || !strings.HasPrefix(fl, "dead:") {
		t.Fatalf("forget lock %q (%v), want the dead process's", fl, err)
	}
	until, err := strconv.ParseInt(strings.TrimPrefix(fl, "dead:"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.HSet(ctx, b.bankKey(q), "fl", "dead:"+strconv.FormatInt(until-61000, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := b.readSlots(ctx, q, ns, on); err != nil {
		t.Fatal(err)
	}
	if u := ns[1].used + ns[2].used; u != 9 {
		t.Fatalf("%d starts counted once the dead process's lock ran out, want 9", u)
	}
}
