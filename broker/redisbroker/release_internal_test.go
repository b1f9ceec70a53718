package redisbroker

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A repartition releases an old partition's rate tokens while rebalances
// elsewhere move tokens too: one may give the old partition a token to
// back its starts between two reads of releaseSlots, as each hook here
// does (the token comes from the bank, as a completed transfer would). The
// release must wait for them to settle rather than give up after three
// reads back to back (the flow-control model, seed 95: "the slots of an
// old partition would not move" in 44 ms), and must not retire a partition
// that got a token after it gave its own away: that token would be lost
// to the queue for good.
func TestReleaseSlotsWhileRebalancesGiveTokens(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// give reports whether the hook gives the old partition a token
		// after the attempt-th read, which found it holding r tokens.
		give func(attempt int, r int64) bool
	}{
		{"each of the first four reads", func(attempt int, _ int64) bool { return attempt < 4 }},
		{"once it holds none", func(_ int, r int64) bool { return r == 0 }},
	} {
		t.Run(c.name, func(t *testing.T) { // not parallel: one hook
			addr, prefix := redistest.Addr(t), redistest.Prefix(t)
			b := slotBroker(t, addr, prefix, 2)
			ctx := context.Background()
			q := "release-" + c.name[:4]
			startFour(t, b, q)
			var mu sync.Mutex
			given := map[string]int{}
			h := func(o part, attempt int) {
				if o.queue != q {
					return
				}
				r, err := b.rdb.HGet(ctx, o.k("lim"), "r").Int64()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if given[o.base] >= 4 || !c.give(attempt, r) {
					return
				}
				given[o.base]++
				bankTokenTo(t, b, o)
			}
			repartitionWithHook(t, b, q, &releaseRead, h)
			mu.Lock()
			if len(given) == 0 {
				t.Fatal("no old partition was given a token while it was released")
			}
			mu.Unlock()
			wantSixTokensFourStarts(t, b, q)
		})
	}
}

// repartitionWithHook repartitions queue q of b to 3 partitions with hook
// h set in p for the call.
func repartitionWithHook[H any](t *testing.T, b *Broker, q string, p *atomic.Pointer[H], h H) {
	t.Helper()
	p.Store(&h)
	err := b.Repartition(context.Background(), q, 3, nil)
	p.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
}

// startFour sets a Rate of 6 per minute on queue q of b (2 partitions) and
// starts 4 tasks, 2 in each partition.
func startFour(t *testing.T, b *Broker, q string) {
	t.Helper()
	if err := b.SetQueueLimits(context.Background(), q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 6, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 2), idsIn("b", 1, 2, 2)...))
	if n := leaseSettle(t, b, q, 3); n != 4 {
		t.Fatalf("leased %d tasks under 6 per minute, want 4", n)
	}
}

// bankTokenTo moves a rate token of o's queue from the bank to partition
// o, as a completed transfer of a rebalance would.
func bankTokenTo(t *testing.T, b *Broker, o part) {
	t.Helper()
	ctx := context.Background()
	pipe := b.rdb.TxPipeline()
	pipe.HIncrBy(ctx, b.bankKey(o.queue), "r", -1)
	pipe.HIncrBy(ctx, o.k("lim"), "r", 1)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Error(err)
	}
}

// wantSixTokensFourStarts checks queue q after its repartition to 3
// partitions (startFour): its nodes hold the 6 tokens, and the 4 starts
// still count in the new span, so 2 more start.
func wantSixTokensFourStarts(t *testing.T, b *Broker, q string) {
	t.Helper()
	wantHeldThenStarting(t, b, q, 'r', 6, 2)
}

// wantHeldThenStarting checks queue q after its repartition to 3
// partitions: its nodes hold held concurrency slots (kind 'c') or rate
// tokens ('r'), and of 6 tasks enqueued then, start start.
func wantHeldThenStarting(t *testing.T, b *Broker, q string, kind byte, held int64, start int) {
	t.Helper()
	c, r := slotTotals(t, b, q)
	what, got := "rate tokens", r
	if kind == 'c' {
		what, got = "concurrency slots", c
	}
	if got != held {
		t.Fatalf("after the repartition the queue's nodes hold %d %s, want %d", got, what, held)
	}
	fillQueue(t, b, q, idsIn("c", 0, 3, 6))
	if n := leaseAll(t, b, q, 3); n != start {
		t.Fatalf("%d tasks of 6 started after the repartition, want %d", n, start)
	}
}

// A token that reaches an old partition after the release's last look
// (a rebalance gives it one) must not be lost when the partition is
// retired: the retire refuses while the partition holds any, and the
// release runs again. The hook gives the token just before the retire;
// before the check, the queue was left with 4 of its 6 tokens (the hook
// gives one before each of the first two retires).
func TestRetireRefusesAPartitionGivenATokenLate(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	q := "retire-late"
	startFour(t, b, q)
	var mu sync.Mutex
	given, refusedOnce := 0, false
	h := func(o part, retired bool) {
		if o.queue != q || retired {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if given >= 2 {
			return
		}
		given++
		bankTokenTo(t, b, o)
		refusedOnce = true
	}
	repartitionWithHook(t, b, q, &retireStep, h)
	mu.Lock()
	if !refusedOnce {
		t.Fatal("no old partition was given a token before its retire")
	}
	mu.Unlock()
	wantSixTokensFourStarts(t, b, q)
}

// A rebalance plans no token for an old partition of a running
// repartition, even one whose starts in the period outnumber its tokens:
// they count against what the current span shares whether backed or not,
// and a plan read before the old partition's starts moved away would give
// it a token after the release's last look.
func TestPlanGivesOldPartitionsNoToken(t *testing.T) {
	t.Parallel()
	bank := &slotNode{bank: true, id: "B", hasR: true, r: 8, re: "1"}
	cur := &slotNode{id: "0", meta: "L", hasR: true, re: "1", r: 2, used: 2, waiting: 3, frees: -1}
	old := &slotNode{id: "0@1", old: true, meta: "L>M", hasR: true, re: "1", r: 0, used: 3, frees: -1}
	gives, _, _ := planSlots([]*slotNode{bank, cur, old}, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 10, Per: time.Minute}})
	var toCur int64
	for src, gs := range gives {
		for _, g := range gs {
			if g.dest == old {
				t.Fatalf("the plan gives the old partition %d tokens from %s", g.dr, src.id)
			}
			if g.dest == cur {
				toCur += g.dr
			}
		}
	}
	// 10 tokens, 3 used by the old partition's starts and 2 by the
	// current one's: the 5 free ones go to the only current partition.
	if toCur != 5 {
		t.Fatalf("the plan gives the current partition %d tokens, want 5", toCur)
	}
}

// A concurrency slot given to an old partition after the repartition's
// last look (a plan read while the partition still ran a task no slot
// covered) arrives once the partition is retired: it goes to the bank, not
// nowhere, and a second try of the same transfer (a process that read it
// before it was completed) does not count it twice. The hook gives the
// slot from the bank just after the first old partition is retired and
// leaves the transfer outstanding, as a process that stalls after its give
// would; the other old partition's release or the finish completes it.
// Before, the queue was left with 3 of its 4 slots for good.
func TestSlotGivenToARetiredPartitionGoesToTheBank(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	q := "retired-give"
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var given *transfer
	h := func(o part, retired bool) {
		if o.queue != q || !retired {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if given != nil {
			return
		}
		// The give comes from the first node that holds a slot.
		l, err := b.layoutOf(ctx, q)
		if err != nil {
			t.Error(err)
			return
		}
		_, lim, _, err := b.readLimits(ctx, q)
		if err != nil {
			t.Error(err)
			return
		}
		ns := b.slotNodes(q, l)
		if err := b.readSlots(ctx, q, ns, lim); err != nil {
			t.Error(err)
			return
		}
		var src *slotNode
		for _, n := range ns {
			if !n.old && n.c > 0 && src == nil {
				src = n
			}
		}
		if src == nil {
			t.Error("no node holds a concurrency slot of Concurrency 4")
			return
		}
		c := b.slotCall(q, src, "give", src.id, b.nodeID(o), 1, 0, "")
		b.run(ctx, []*call{c})
		if c.err != nil {
			t.Error(c.err)
			return
		}
		v, _ := c.cmd.Slice()
		if len(v) != 2 || v[0] != "ok" {
			t.Errorf("the give of a free slot of node %s to the retired partition replied %v, want ok", src.id, v)
			return
		}
		tr, err := parseTransfer(src, v[1].(string))
		if err != nil {
			t.Error(err)
			return
		}
		given = &tr
	}
	repartitionWithHook(t, b, q, &retireStep, h)
	mu.Lock()
	tr := given
	mu.Unlock()
	if tr == nil {
		t.Fatal("no slot was given to a retired partition")
	}
	if c, _ := slotTotals(t, b, q); c != 4 {
		t.Fatalf("after the repartition the queue's nodes hold %d concurrency slots, want 4", c)
	}
	// The same transfer tried again, as by a process that read it before
	// it was completed: the retired partition still says it never applied
	// it, and the bank has counted it once.
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	ns := b.slotNodes(q, l)
	for _, n := range ns {
		if n.id == tr.src.id {
			tr.src = n
		}
	}
	if err := b.complete(ctx, q, ns, []transfer{*tr}); err != nil {
		t.Fatal(err)
	}
	// Completed twice, it still counts once: 4 slots, 4 tasks start.
	wantHeldThenStarting(t, b, q, 'c', 4, 4)
}

// The apply step on a retired partition tells a transfer it applied
// before it was retired (dup: nothing more to do) from one it never
// applied (gone: the caller gives it to the bank), and drops a part once
// the partition's limits hash, its record of what it applied, has expired
// (lost: never counted twice).
func TestApplyOnARetiredPartition(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	q := "retired-apply"
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	n := b.slotNodes(q, l)[1]
	t.Cleanup(func() { b.rdb.Del(context.Background(), n.p.k("meta"), n.p.k("lim")) })
	if err := b.rdb.HSet(ctx, n.p.k("lim"), "c", 0, "ce", "1", "xi:B", "5").Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.Set(ctx, n.p.k("meta"), "retired", 0).Err(); err != nil {
		t.Fatal(err)
	}
	apply := func(seq string) string {
		t.Helper()
		c := b.slotCall(q, n, "apply", "B", seq, "1", "0", 1, 0, "", b.channel(q), "")
		b.run(ctx, []*call{c})
		if c.err != nil {
			t.Fatal(c.err)
		}
		v, _ := c.cmd.Text()
		return v
	}
	for _, c := range []struct{ seq, want string }{{"5", "dup"}, {"4", "dup"}, {"6", "gone"}, {"6", "gone"}} {
		if got := apply(c.seq); got != c.want {
			t.Fatalf("apply of record %s on a retired partition that applied up to 5 = %q, want %q", c.seq, got, c.want)
		}
	}
	if c, _ := b.rdb.HGet(ctx, n.p.k("lim"), "c").Int64(); c != 0 {
		t.Fatalf("a retired partition holds %d slots after the applies, want 0", c)
	}
	if err := b.rdb.Del(ctx, n.p.k("lim")).Err(); err != nil {
		t.Fatal(err)
	}
	if got := apply("6"); got != "lost" {
		t.Fatalf("apply on a retired partition whose limits hash expired = %q, want lost", got)
	}
	if ex, _ := b.rdb.Exists(ctx, n.p.k("lim")).Result(); ex != 0 {
		t.Fatal("the apply re-created the expired limits hash of a retired partition")
	}
}
