package redisbroker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// idsIn returns n task IDs of partition p of parts, named after prefix.
func idsIn(prefix string, p, parts, n int) []string {
	var ids []string
	for i := 0; len(ids) < n; i++ {
		if id := fmt.Sprint(prefix, i); broker.Partition(id, parts) == p {
			ids = append(ids, id)
		}
	}
	return ids
}

// leaseAll rebalances queue and leases what it can, rounds times, and
// returns how many tasks it leased.
func leaseAll(t *testing.T, b *Broker, queue string, rounds int) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for range rounds {
		if err := b.rebalance(ctx, queue); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Dequeue(ctx, []string{queue}, 50, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		n += len(ds)
	}
	return n
}

// ageStarts makes the starts partition i of queue recorded (and those it
// forgot) d older, as if d had passed for them.
func ageStarts(t *testing.T, b *Broker, queue string, i int, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range b.partAt(queue, l, i).keys("starts", "forgot") {
		zs, err := b.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range zs {
			if err := b.rdb.ZAddXX(ctx, key, redis.Z{Member: z.Member, Score: z.Score - float64(d.Milliseconds())}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A Rate switched on counts the starts made before it in every partition:
// six tasks started in partition 0 without a rate leave no room under a
// Rate of 5 per minute, so the tasks waiting in partition 1 do not start
// on tokens the queue's other partition has used already.
func TestRateSwitchedOnCountsEveryPartitionsStarts(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-on"
	fillQueue(t, b, q, idsIn("a", 0, 2, 6))
	if n := leaseAll(t, b, q, 1); n != 6 {
		t.Fatalf("leased %d tasks without limits, want 6", n)
	}
	fillQueue(t, b, q, idsIn("b", 1, 2, 5))
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 5, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if n := leaseAll(t, b, q, 5); n != 0 {
		t.Fatalf("%d tasks started after 6 starts in the minute, under a Rate of 5 per minute", n)
	}
	if _, r := slotTotals(t, b, q); r != 5 {
		t.Fatalf("the nodes hold %d rate tokens, want 5", r)
	}
}

// A lowered Rate keeps counting the starts of the period in every
// partition: 10 starts under 10 per minute, 5 in each partition (those of
// partition 0 40 seconds older), then the limit is lowered to 8. Once
// partition 0's starts have left the minute, partition 1's 5 are still in
// it, so 3 tasks may start, not the 4 tokens partition 0 would hold if the
// lowered limit had been taken from both partitions' starts alike.
func TestRateLoweredCountsEveryPartitionsStarts(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-lowered"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 10, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 5), idsIn("b", 1, 2, 5)...))
	if n := leaseAll(t, b, q, 5); n != 10 {
		t.Fatalf("leased %d tasks under 10 per minute, want 10", n)
	}
	ageStarts(t, b, q, 0, 50*time.Second)
	ageStarts(t, b, q, 1, 10*time.Second)
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 8, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	// 11 seconds later: partition 0's starts are out of the minute.
	ageStarts(t, b, q, 0, 11*time.Second)
	ageStarts(t, b, q, 1, 11*time.Second)
	fillQueue(t, b, q, append(idsIn("c", 0, 2, 5), idsIn("d", 1, 2, 5)...))
	if n := leaseAll(t, b, q, 5); n != 3 {
		t.Fatalf("%d tasks started with 5 starts in the minute under a Rate of 8 per minute, want 3", n)
	}
	if _, r := slotTotals(t, b, q); r != 8 {
		t.Fatalf("the nodes hold %d rate tokens, want 8", r)
	}
}

// advance makes d pass for queue's rate windows: every partition's starts
// and the moments its rate share goes stale (field ru) move d back.
func advance(t *testing.T, b *Broker, queue string, parts int, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	for i := range parts {
		ageStarts(t, b, queue, i, d)
		key := b.partAt(queue, l, i).k("lim")
		ru, err := b.rdb.HGet(ctx, key, "ru").Int64()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := b.rdb.HSet(ctx, key, "ru", ru-d.Milliseconds()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Rate tokens follow the backlog also when a partition holds its fair
// share: partitions 0 and 1 share 10 tokens a minute, 5 each, while 20
// tasks wait in 0 and 5 in 1. When partition 1's starts have left the
// minute its 5 tokens are free, and nothing waits there: partition 0,
// refused for want of tokens, asks for them again and gets them, without
// a rebalance from anywhere else (the servers' sweep, seconds later).
func TestRateTokensFollowBacklogFromFairShare(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-fair"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 10, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 20), idsIn("b", 1, 2, 5)...))
	if n := leaseAll(t, b, q, 5); n != 10 {
		t.Fatalf("leased %d tasks under 10 per minute, want 10", n)
	}
	ageStarts(t, b, q, 1, 30*time.Second)
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	advance(t, b, q, 2, 31*time.Second)
	leased := 0
	testwait.For(t, 10*time.Second, "partition 0 to start tasks on partition 1's free tokens", func() bool {
		ds, err := b.Dequeue(ctx, []string{q}, 50, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		leased += len(ds)
		return leased >= 5
	})
	time.Sleep(50 * time.Millisecond)
	ds, err := b.Dequeue(ctx, []string{q}, 50, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if leased += len(ds); leased != 5 {
		t.Fatalf("%d tasks started with 5 starts in the minute under a Rate of 10 per minute, want 5", leased)
	}
}

// A repartition keeps the starts of the old partitions: six tasks started
// in a queue of one partition without a rate, which is then repartitioned
// to two, leave no room under a Rate of 5 per minute set afterwards.
func TestRepartitionKeepsStartsForALaterRate(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 1)
	ctx := context.Background()
	const q = "rate-repart"
	fillQueue(t, b, q, idsIn("a", 0, 1, 6))
	ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
	if err != nil || len(ds) != 6 {
		t.Fatalf("Dequeue = %d tasks, %v; want 6", len(ds), err)
	}
	var ss []broker.Settlement
	for _, d := range ds {
		ss = append(ss, broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task})
	}
	if errs, err := b.Settle(ctx, ss); err != nil || errs[0] != nil {
		t.Fatalf("Settle = %v, %v", errs, err)
	}
	if err := b.Repartition(ctx, q, 2, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 5, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("b", 0, 2, 3), idsIn("c", 1, 2, 3)...))
	if n := leaseAll(t, b, q, 5); n != 0 {
		t.Fatalf("%d tasks started after 6 starts in the minute, under a Rate of 5 per minute", n)
	}
}

// A rate switched on reaches the partitions one by one (SetQueueLimits
// records it, then tells each partition); a rebalance that runs in between
// counts the starts of the partitions not told yet: partition 0, told,
// gets no token while partition 1's six starts fill the minute's five.
func TestRateSwitchedOnCountsPartitionsNotToldYet(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-half"
	fillQueue(t, b, q, idsIn("a", 1, 2, 6))
	if n := leaseAll(t, b, q, 1); n != 6 {
		t.Fatalf("leased %d tasks without limits, want 6", n)
	}
	fillQueue(t, b, q, idsIn("b", 0, 2, 5))
	lim := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 5, Per: time.Minute}}
	res, err := b.s.limits.Run(ctx, b.rdb, []string{b.limitsKey(), b.bankKey(q)}, q, "0:5:60000:0:0:0:0").Slice()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := res[0].(int64)
	re, _ := res[2].(string)
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.runAll(ctx, "share", []*call{b.shareCall(b.partAt(q, l, 0), v, "", re, lim.Rate.Per, groupLimits(lim, false), 0)}); err != nil {
		t.Fatal(err)
	}
	if n := leaseAll(t, b, q, 3); n != 0 {
		t.Fatalf("%d tasks started after 6 starts in the minute, under a Rate of 5 per minute", n)
	}
}

// Rate tokens go where tasks can start on them: under Concurrency 2 and a
// Rate of 10 a minute over two partitions, partition 0 runs a long task on
// its one slot, so its tasks waiting cannot start; partition 1, whose
// tasks end at once, gets the tokens partition 0 would hold idle.
func TestRateTokensGoWhereSlotsAre(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-slots"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 2, Rate: tidetype.Rate{Limit: 10, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 5), idsIn("b", 1, 2, 20)...))
	started := map[int]int{}
	for range 40 {
		if err := b.rebalance(ctx, q); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var ss []broker.Settlement
		for _, d := range ds {
			p := broker.Partition(d.Task.ID, 2)
			started[p]++
			if p == 1 { // partition 0's task runs on
				ss = append(ss, broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task})
			}
		}
		if len(ss) > 0 {
			if _, err := b.Settle(ctx, ss); err != nil {
				t.Fatal(err)
			}
		}
	}
	if started[0] != 1 || started[1] != 9 {
		t.Fatalf("started %d tasks in partition 0 and %d in partition 1, want 1 (its slot busy) and 9 (the rest of the 10 tokens)", started[0], started[1])
	}
}
