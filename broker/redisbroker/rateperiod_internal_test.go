package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A Rate changed to a shorter period must not count the old limit's tokens
// over it: the partitions hold them until the rebalance takes the lowered
// limit's back, and counted over the shorter period they would start as
// many again while the longer one still holds the first starts (the
// flow-control model, seed 92: 13 per 3 s changed to 6 per 2 s started a
// 14th task in 3 s during the change). 13 tasks start under 13 per 10 s
// and age 6 s; a lease between the new settings and the rebalance of 6
// per 5 s starts nothing; once the call returns, the 6 the new rate allows
// start (the first 13 are out of its period), and no more.
func TestRateShortenedPeriodWaitsForTheTokens(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-shortened-period"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 13, Per: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 8), idsIn("b", 1, 2, 8)...))
	if n := leaseAll(t, b, q, 5); n != 13 {
		t.Fatalf("leased %d tasks under 13 per 10s, want 13", n)
	}
	ageStarts(t, b, q, 0, 6*time.Second)
	ageStarts(t, b, q, 1, 6*time.Second)
	got := -1
	h := func(queue string) {
		if queue != q {
			return
		}
		ds, err := b.Dequeue(context.Background(), []string{q}, 50, time.Minute)
		if err != nil {
			t.Error(err)
			return
		}
		got = len(ds)
	}
	fillQueue(t, b, q, append(idsIn("c", 0, 2, 8), idsIn("d", 1, 2, 8)...))
	limitsShared.Store(&h)
	err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 6, Per: 5 * time.Second}})
	limitsShared.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got != 0 {
		t.Fatalf("%d tasks started while the partitions held the tokens of 13 per 10s with 13 starts in the last 10s, on the way to 6 per 5s", got)
	}
	for _, n := range readNodes(t, b, q)[1:] {
		if n.pn != "" {
			t.Errorf("partition %s still waits for a period of %s ms after the change", n.id, n.pn)
		}
	}
	if n := leaseAll(t, b, q, 3); n != 6 {
		t.Fatalf("%d tasks started under 6 per 5s with no start in the last 5s, want 6", n)
	}
	if _, r := slotTotals(t, b, q); r != 6 {
		t.Fatalf("the nodes hold %d rate tokens, want 6", r)
	}
}

// A partition new to the rate, as a repartition's new partitions are,
// counts over the longest period the queue's partitions count: it may be
// given tokens of a limit whose shorter period has not come in yet.
func TestRateNewPartitionCountsTheLongestPeriod(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 1)
	ctx := context.Background()
	const q = "rate-new-partition-period"
	fillQueue(t, b, q, []string{"x"})
	res, err := b.s.limits.Run(ctx, b.rdb, []string{b.limitsKey(), b.bankKey(q)}, q, "0:6:5000:0:0:0:0").Slice()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := res[0].(int64)
	re, _ := res[2].(string)
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	lim := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 6, Per: 5 * time.Second}}
	p := b.partAt(q, l, 0)
	for _, c := range []struct {
		longest time.Duration
		per, pn string
	}{{10 * time.Second, "10000", "5000"}, {0, "10000", "5000"}, {20 * time.Second, "10000", "5000"}} {
		if err := b.runAll(ctx, "share", []*call{b.shareCall(p, v, "", re, lim.Rate.Per, groupLimits(lim, false), c.longest)}); err != nil {
			t.Fatal(err)
		}
		f, err := b.rdb.HMGet(ctx, p.k("lim"), "per", "pn").Result()
		if err != nil {
			t.Fatal(err)
		}
		if f[0] != c.per || f[1] != c.pn {
			t.Fatalf("with the longest period %v the partition counts over %v ms, %v waiting; want %s, %s", c.longest, f[0], f[1], c.per, c.pn)
		}
	}
	// The bank holds the limit's 6 tokens: the shorter period comes in.
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	f, err := b.rdb.HMGet(ctx, p.k("lim"), "per", "pn").Result()
	if err != nil {
		t.Fatal(err)
	}
	if f[0] != "5000" || f[1] != nil {
		t.Fatalf("after a rebalance with no debt the partition counts over %v ms, %v waiting; want 5000 and none", f[0], f[1])
	}
}
