package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// leaseAfterForget makes the first rebalance of queue q that forgets
// starts lease, right after the forget and before any slot moves, what a
// server would: it fills the queue with more and stores in *got how many
// tasks that lease started. It returns a func that unsets the hook.
func leaseAfterForget(t *testing.T, b *Broker, q string, more []string, got *int) func() {
	t.Helper()
	*got = -1
	h := func(queue string) {
		if queue != q || *got >= 0 {
			return
		}
		fillQueue(t, b, q, more)
		ds, err := b.Dequeue(context.Background(), []string{q}, 50, time.Minute)
		if err != nil {
			t.Error(err)
			return
		}
		*got = len(ds)
	}
	rebalanceForgot.Store(&h)
	return func() { rebalanceForgot.Store(nil) }
}

// A lowered Rate whose tokens are all in use leaves the bank in debt, and
// the starts over the new limit are forgotten; forgetting them must not
// leave room in the partition that made them before the debt is paid: 9
// starts under 9 per 10 s, then 7 per 10 s, and a lease between the forget
// and the rest of the rebalance starts nothing (the flow-control model,
// seed 12, saw two tasks start there, 11 in the period).
func TestRateLoweredForgetLeavesNoRoom(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-lowered-forget"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 5); n != 9 {
		t.Fatalf("leased %d tasks under 9 per 10s, want 9", n)
	}
	wantNoRoomAfterForget(t, b, q, 7, 9, append(idsIn("c", 0, 2, 6), idsIn("d", 1, 2, 6)...))
}

// A lengthened period counts older starts again: a partition may then
// count more starts than it holds tokens while another, whose starts are
// the queue's oldest, counts no more than it holds. Forgetting those oldest
// starts must not give that other partition room before the tokens move to
// the partition over its tokens. Under 6 per 2 s both partitions hold 3
// tokens and start 3 tasks, which leave the period (2.8 s ago in partition
// 1, 2.5 s in partition 0); partition 0 starts 3 more; then 6 per 10 s
// counts 9 starts and forgets partition 1's 3, and a lease right after
// starts nothing.
func TestRateLengthenedForgetLeavesNoRoom(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-lengthened-forget"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 6, Per: 2 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 3), idsIn("b", 1, 2, 3)...))
	if n := leaseAll(t, b, q, 5); n != 6 {
		t.Fatalf("leased %d tasks under 6 per 2s, want 6", n)
	}
	ns := readNodes(t, b, q)
	if ns[1].r != 3 || ns[2].r != 3 {
		t.Fatalf("the partitions hold %d and %d tokens, want 3 each", ns[1].r, ns[2].r)
	}
	ageStarts(t, b, q, 0, 2500*time.Millisecond)
	ageStarts(t, b, q, 1, 2800*time.Millisecond)
	// Partition 0 starts 3 more on its own tokens (no rebalance, so none
	// move).
	fillQueue(t, b, q, idsIn("c", 0, 2, 3))
	ds, err := b.Dequeue(ctx, []string{q}, 50, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 3 {
		t.Fatalf("leased %d tasks in partition 0 with its starts out of the period, want 3", len(ds))
	}
	wantNoRoomAfterForget(t, b, q, 6, 9, append(idsIn("d", 0, 2, 6), idsIn("e", 1, 2, 6)...))
}

// wantNoRoomAfterForget sets a Rate of limit per 10 s on q with a lease
// hooked in right after its rebalance forgets (leaseAfterForget, which
// fills the queue with more first), and checks that neither that lease nor
// later ones start a task while the period holds starts starts, and that
// the nodes hold limit tokens.
func wantNoRoomAfterForget(t *testing.T, b *Broker, q string, limit, starts int, more []string) {
	t.Helper()
	var got int
	defer leaseAfterForget(t, b, q, more, &got)()
	if err := b.SetQueueLimits(context.Background(), q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: limit, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if got != 0 {
		t.Fatalf("%d tasks started after the forget (-1: nothing was forgotten), with %d starts in the last 10s under a Rate of %d per 10s", got, starts, limit)
	}
	if n := leaseAll(t, b, q, 3); n != 0 {
		t.Fatalf("%d tasks started after the change, with %d starts in the last 10s under a Rate of %d per 10s", n, starts, limit)
	}
	if _, r := slotTotals(t, b, q); r != int64(limit) {
		t.Fatalf("the nodes hold %d rate tokens, want %d", r, limit)
	}
}

// readNodes returns queue's slot nodes as a rebalance reads them, under the
// queue's recorded limits.
func readNodes(t *testing.T, b *Broker, q string) []*slotNode {
	t.Helper()
	ctx := context.Background()
	_, lim, _, err := b.readLimits(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	ns := b.slotNodes(q, l)
	if err := b.readSlots(ctx, q, ns, lim); err != nil {
		t.Fatal(err)
	}
	return ns
}

// Forgotten starts are real starts: a limit raised while they are in the
// period adds only the tokens they leave free. 12 tasks start with no
// rate; a Rate of 9 per 10 s then counts them and forgets the 3 oldest;
// raised to 12 per 10 s it still has 12 starts in the period and starts
// nothing (the flow-control model, seed 22: 9 per 3 s switched on over 10
// starts, raised to 15 per 3 s, let a 16th start); raised to 14, two.
func TestRateRaisedAfterAForgetCountsTheForgotten(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-raised-after-forget"
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 1); n != 12 {
		t.Fatalf("leased %d tasks without limits, want 12", n)
	}
	ageStarts(t, b, q, 0, time.Second) // partition 0's are the oldest
	fillQueue(t, b, q, append(idsIn("c", 0, 2, 6), idsIn("d", 1, 2, 6)...))
	for _, c := range []struct{ limit, want int }{{9, 0}, {12, 0}, {14, 2}, {14, 0}} {
		if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: c.limit, Per: 10 * time.Second}}); err != nil {
			t.Fatal(err)
		}
		if n := leaseAll(t, b, q, 3); n != c.want {
			t.Fatalf("under a Rate of %d per 10s, %d tasks started, want %d", c.limit, n, c.want)
		}
		if _, r := slotTotals(t, b, q); r != int64(c.limit) {
			t.Fatalf("under a Rate of %d per 10s the nodes hold %d rate tokens", c.limit, r)
		}
	}
}

// Forgotten starts survive a repartition: the old partitions' go to the
// new ones with the starts they kept. 12 tasks start over 2 partitions
// with no rate, a Rate of 9 per minute forgets 3 of them, the queue moves
// to 3 partitions, and a Rate raised to 12 per minute still starts nothing;
// raised to 14, two.
func TestRateRaisedAfterARepartitionCountsTheForgotten(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-forgot-repartition"
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 6)...))
	if n := leaseSettle(t, b, q, 1); n != 12 {
		t.Fatalf("leased %d tasks without limits, want 12", n)
	}
	rate := func(limit int) {
		t.Helper()
		if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: limit, Per: time.Minute}}); err != nil {
			t.Fatal(err)
		}
	}
	rate(9)
	var forgot int64
	for _, n := range readNodes(t, b, q)[1:] {
		forgot += n.forgot
	}
	if forgot != 3 {
		t.Fatalf("%d starts forgotten under a Rate of 9 per minute after 12 starts, want 3", forgot)
	}
	if err := b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	b.forgetLayout(q)
	var more []string
	for p := range 3 {
		more = append(more, idsIn("c", p, 3, 4)...)
	}
	fillQueue(t, b, q, more)
	for _, c := range []struct{ limit, want int }{{12, 0}, {14, 2}} {
		rate(c.limit)
		if n := leaseSettle(t, b, q, 3); n != c.want {
			t.Fatalf("under a Rate of %d per minute after a repartition, %d tasks started, want %d", c.limit, n, c.want)
		}
	}
}

// A rebalance that read the slots before another forgot starts does not
// plan the rate tokens from what it read: its counts hold the forgotten
// starts, and it would give a partition tokens for starts it no longer
// counts (the flow-control model, seed 39: a partition got 5 tokens for 4
// counted starts, with 40 in the queue's period). 12 tasks start with no
// rate, 6 in each partition, partition 0's first; SetQueueLimits switches
// on 9 per 10 s, and after its rebalance read the slots another process's
// rebalance forgets the 3 oldest (partition 0's) and plans, and a third
// holds the forget lock; then a lease starts nothing.
func TestStaleRebalanceDoesNotPlanTokensOfForgottenStarts(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	other := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-stale-plan"
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 6), idsIn("b", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 1); n != 12 {
		t.Fatalf("leased %d tasks without limits, want 12", n)
	}
	ageStarts(t, b, q, 0, time.Second)
	fillQueue(t, b, q, append(idsIn("c", 0, 2, 6), idsIn("d", 1, 2, 6)...))
	done := false
	h := func(queue string) {
		if queue != q || done {
			return
		}
		done = true
		if err := other.rebalance(ctx, q); err != nil {
			t.Error(err)
		}
		l, err := b.layoutOf(ctx, q)
		if err != nil {
			t.Error(err)
			return
		}
		lock := b.slotCall(q, b.slotNodes(q, l)[0], "lock", "third", int64(60000))
		if err := b.runAll(ctx, "lock", []*call{lock}); err != nil {
			t.Error(err)
		}
	}
	rebalanceRead.Store(&h)
	defer rebalanceRead.Store(nil)
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatal("SetQueueLimits' rebalance did not run")
	}
	var forgot int64
	for _, n := range readNodes(t, b, q)[1:] {
		forgot += n.forgot
	}
	if forgot != 3 {
		t.Fatalf("%d starts forgotten, want 3", forgot)
	}
	ds, err := b.Dequeue(ctx, []string{q}, 50, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 0 {
		t.Fatalf("%d tasks started with 12 starts in the last 10s under a Rate of 9 per 10s", len(ds))
	}
}

// A lowered Rate whose starts in the period are over the new limit takes
// back every free token too: the starts forgotten are real, and the bank
// keeps a token for each while they are in the period. 13 tasks start
// under 13 per 10 s, partition 1's 6 first, and one of those leaves the
// period (a token free there); lowered to 7 per 10 s, partition 1's 5
// other starts are forgotten, the lowered limit's debt is paid, and
// nothing starts (the flow-control model, seed 77: 13 per 2 s lowered to
// 7 per 3 s, and the free token of the partition whose starts were
// forgotten started a 13th task).
func TestRateLoweredTakesFreeTokensForForgottenStarts(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-lowered-free-token"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 13, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 7), idsIn("b", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 3); n != 13 {
		t.Fatalf("leased %d tasks under 13 per 10s, want 13", n)
	}
	ns := readNodes(t, b, q)
	if ns[1].r != 7 || ns[2].r != 6 {
		t.Fatalf("partitions hold %d and %d tokens, want 7 and 6", ns[1].r, ns[2].r)
	}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	key := b.partAt(q, l, 1).k("starts")
	zs, err := b.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil || len(zs) != 6 {
		t.Fatalf("partition 1 keeps %d starts (%v), want 6", len(zs), err)
	}
	for i, z := range zs {
		age := time.Second // the oldest of the queue
		if i == 0 {
			age = 11 * time.Second // out of the period
		}
		if err := b.rdb.ZAdd(ctx, key, redis.Z{Member: z.Member, Score: z.Score - float64(age.Milliseconds())}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 7, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("c", 0, 2, 6), idsIn("d", 1, 2, 6)...))
	if n := leaseAll(t, b, q, 3); n != 0 {
		t.Fatalf("%d tasks started with 12 starts in the last 10s under a Rate of 7 per 10s", n)
	}
	if _, r := slotTotals(t, b, q); r != 7 {
		t.Fatalf("the nodes hold %d rate tokens, want 7", r)
	}
}
