package redisbroker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// slotTotals reads every node of queue and returns the concurrency slots
// and rate tokens they hold plus those in outstanding transfers (not yet
// applied where they go): what the limits must add up to.
func slotTotals(t *testing.T, b *Broker, queue string) (c, r int64) {
	t.Helper()
	ctx := context.Background()
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	_, lim, _, err := b.readLimits(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	ns := b.slotNodes(queue, l)
	if err := b.readSlots(ctx, queue, ns, lim); err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		c += n.c
		r += n.r
	}
	ts, err := outstanding(ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range ts {
		for _, p := range tr.parts {
			d := b.destNode(queue, ns, p.dest)
			last, err := b.rdb.HGet(ctx, b.nodeKey(queue, d), "xi:"+tr.src.id).Result()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			if last != tr.seq { // not applied there yet
				c += p.dc
				r += p.dr
			}
		}
	}
	return c, r
}

// nodeKey names the hash that holds node n's slots.
func (b *Broker) nodeKey(queue string, n *slotNode) string {
	if n.bank {
		return b.bankKey(queue)
	}
	return n.p.k("lim")
}

func slotBroker(t *testing.T, addr, prefix string, parts int) *Broker {
	b := New(redistest.Client(t, addr), WithPrefix(prefix), WithPartitions(parts))
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func fillQueue(t *testing.T, b *Broker, queue string, ids []string) {
	t.Helper()
	now := time.Now()
	var ms []*tidetype.TaskInfo
	for _, id := range ids {
		ms = append(ms, &tidetype.TaskInfo{ID: id, Queue: queue, Type: "t", State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now})
	}
	errs, err := b.Enqueue(context.Background(), ms, broker.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		if e != nil {
			t.Fatal(e)
		}
	}
}

// A process that dies halfway through moving slots neither loses nor
// doubles one: after the give (slots off the source, the transfer
// outstanding) the slots count nowhere but in the transfer, so nothing can
// start on them; after an apply that was not cleared the next rebalance
// applies nothing twice; a transfer applied over and over counts once.
func TestSlotsTransferSurvivesCrash(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 3)
	ctx := context.Background()
	const q, limit = "crash", 6
	var ids []string
	for i := range 30 {
		ids = append(ids, fmt.Sprint("t", i))
	}
	fillQueue(t, b, q, ids)
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: limit, Rate: tidetype.Rate{Limit: 9, Per: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if c, r := slotTotals(t, b, q); c != limit || r != 9 {
		t.Fatalf("after SetQueueLimits the nodes hold %d slots and %d tokens, want %d and 9", c, r, limit)
	}
	l, _ := b.layoutOf(ctx, q)
	ns := b.slotNodes(q, l)
	// The "crashed" process gives two slots and a token from partition 0
	// to partition 1, and stops there.
	give := b.slotCall(q, ns[1], "give", ns[1].id, ns[2].id, 2, 1, "")
	b.run(ctx, []*call{give})
	v, err := give.cmd.Slice()
	if err != nil || v[0] != "ok" {
		t.Fatalf("give: %v %v", v, err)
	}
	tr, err := parseTransfer(ns[1], v[1].(string))
	if err != nil {
		t.Fatal(err)
	}
	if c, r := slotTotals(t, b, q); c != limit || r != 9 {
		t.Fatalf("with a transfer outstanding the nodes and the transfer hold %d slots and %d tokens, want %d and 9", c, r, limit)
	}
	// Whatever starts meanwhile stays within what the nodes hold.
	var held []*broker.Delivery
	for range 5 {
		ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ds...)
	}
	if len(held) > limit-2 {
		t.Fatalf("%d tasks started while 2 of %d slots were in an outstanding transfer", len(held), limit)
	}
	// It comes back to life, applies to partition 1, twice (a re-sent
	// request), and dies again before clearing.
	for range 2 {
		p := tr.parts[0]
		ap := b.slotCall(q, ns[2], "apply", tr.src.id, tr.seq, tr.ce, tr.re, p.dc, p.dr, p.ages, b.channel(q), "")
		b.run(ctx, []*call{ap})
		if ap.err != nil {
			t.Fatal(ap.err)
		}
	}
	if c, r := slotTotals(t, b, q); c != limit || r != 9 {
		t.Fatalf("after an apply sent twice the nodes hold %d slots and %d tokens, want %d and 9", c, r, limit)
	}
	// Any process's rebalance finishes the transfer, once.
	other := slotBroker(t, addr, prefix, 3)
	for range 2 {
		if err := other.rebalance(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if c, r := slotTotals(t, b, q); c != limit || r != 9 {
		t.Fatalf("after the transfer was finished the nodes hold %d slots and %d tokens, want %d and 9", c, r, limit)
	}
	if xo, _ := b.rdb.HGet(ctx, ns[1].p.k("lim"), "xo").Result(); xo != "" {
		t.Fatalf("the transfer is still outstanding after a rebalance: %q", xo)
	}
	for _, d := range held {
		if _, err := b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone}}); err != nil {
			t.Fatal(err)
		}
	}
}

// Many processes rebalance a queue's slots at once while workers start and
// settle its tasks, whose backlog moves from partition to partition: the
// tasks held at once never exceed the limit, and when all is done the
// nodes hold exactly the limit (no slot lost or doubled). Then the limit is
// lowered and raised while the rebalances go on, and the nodes again hold
// exactly the final limit.
func TestSlotsConcurrentCoordinators(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	const q, parts, limit = "coord", 5, 7
	b := slotBroker(t, addr, prefix, parts)
	ctx := context.Background()
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: limit}); err != nil {
		t.Fatal(err)
	}
	// Waves of tasks, each wave in one or two partitions.
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var total int
	for wave := range 6 {
		ps := []int{rng.IntN(parts), rng.IntN(parts)}
		var ids []string
		for i := 0; len(ids) < 40; i++ {
			id := fmt.Sprintf("w%d-%d", wave, i)
			if p := broker.Partition(id, parts); p == ps[0] || p == ps[1] {
				ids = append(ids, id)
			}
		}
		fillQueue(t, b, q, ids)
		total += len(ids)
	}
	stop := make(chan struct{})
	var coord sync.WaitGroup
	for i := range 4 {
		o := slotBroker(t, addr, prefix, parts)
		coord.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := o.rebalance(ctx, q); err != nil {
					t.Errorf("rebalance %d: %v", i, err)
					return
				}
			}
		})
	}
	var running, done atomic.Int64
	var peak atomic.Int64
	var work sync.WaitGroup
	for range 6 {
		w := slotBroker(t, addr, prefix, parts)
		work.Go(func() {
			deadline := time.Now().Add(30 * time.Second)
			for done.Load() < int64(total) && time.Now().Before(deadline) {
				ds, err := w.Dequeue(ctx, []string{q}, 3, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				for range ds {
					r := running.Add(1)
					for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
					}
				}
				if len(ds) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				for _, d := range ds {
					running.Add(-1)
					if _, err := w.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone}}); err != nil {
						t.Error(err)
						return
					}
					done.Add(1)
				}
			}
		})
	}
	work.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("%d tasks held at once under Concurrency %d", p, limit)
	}
	if done.Load() != int64(total) {
		t.Fatalf("%d of %d tasks done", done.Load(), total)
	}
	// Limits changed while the coordinators go on.
	for _, c := range []int{3, 12, 1, 9} {
		if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: c}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	coord.Wait()
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	if c, _ := slotTotals(t, b, q); c != 9 {
		t.Fatalf("after the coordinators stopped the nodes hold %d slots, want the limit 9", c)
	}
	t.Logf("peak %d under Concurrency %d", peak.Load(), limit)
}

// A give moves only slots that no running task uses, whatever the caller
// asks (its view may be old); only the bank's debt takes used slots, and
// the partition then starts nothing until its tasks are under its slots.
func TestSlotsGiveOnlyFree(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q, limit = "free", 4
	var ids []string
	for i := 0; len(ids) < 8; i++ {
		if id := fmt.Sprint("f", i); broker.Partition(id, 2) == 0 {
			ids = append(ids, id)
		}
	}
	fillQueue(t, b, q, ids)
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: limit}); err != nil {
		t.Fatal(err)
	}
	var held int
	testwait.For(t, 10*time.Second, "the limit's worth of tasks to be leased", func() bool {
		ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held += len(ds)
		return held >= limit
	})
	if held != limit {
		t.Fatalf("%d tasks of one partition run under Concurrency %d", held, limit)
	}
	l, _ := b.layoutOf(ctx, q)
	ns := b.slotNodes(q, l)
	run := func(c *call) []any {
		t.Helper()
		b.run(ctx, []*call{c})
		v, err := c.cmd.Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := run(b.slotCall(q, ns[1], "give", ns[1].id, ns[2].id, 2, 0, "")); v[0] != "none" {
		t.Fatalf("a give of slots that running tasks use: %v", v)
	}
	v := run(b.slotCall(q, ns[1], "give", ns[1].id, "B", 1, 0, "1"))
	if v[0] != "ok" {
		t.Fatalf("a forced give to the bank: %v", v)
	}
	tr, err := parseTransfer(ns[1], v[1].(string))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.complete(ctx, q, ns, []transfer{tr}); err != nil {
		t.Fatal(err)
	}
	if c, _ := slotTotals(t, b, q); c != limit {
		t.Fatalf("the nodes hold %d slots, want %d", c, limit)
	}
	if got, _ := b.rdb.HGet(ctx, ns[1].p.k("lim"), "c").Int(); got != limit-1 {
		t.Fatalf("partition 0 holds %d slots after giving one away, want %d", got, limit-1)
	}
}

// A rebalance that runs after DeleteQueue (kicked by a settle just before,
// or by another process) leaves the deleted queue out of Queues; its kept
// limits stay as they were.
func TestRebalanceLeavesDeletedQueueDeleted(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 3)
	ctx := context.Background()
	const q = "gone"
	lim := tidetype.QueueLimits{Concurrency: 4}
	if err := b.SetQueueLimits(ctx, q, lim); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, []string{"a"})
	if err := b.Delete(ctx, q, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteQueue(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := b.rebalance(ctx, q); err != nil {
		t.Fatal(err)
	}
	qs, err := b.Queues(ctx)
	if err != nil || slices.Contains(qs, q) {
		t.Fatalf("Queues after DeleteQueue and a rebalance = %v, %v", qs, err)
	}
	if got, err := b.QueueLimits(ctx, q); err != nil || got != lim {
		t.Fatalf("QueueLimits = %+v, %v; want %+v", got, err, lim)
	}
}

// A lowered Concurrency, or one set where there was none, starts nothing
// anywhere while the tasks already running are at or over the new limit:
// partition 1 runs two tasks and partition 0, first in the rebalance's
// order, has tasks waiting (and, under the old limit 3, a free slot) when
// the limit becomes 1. Taking partition 1's used slots for the bank's debt
// while partition 0 kept its free one let 3 run under 1; so did giving
// partition 0 a slot of a limit switched on while partition 1's tasks ran
// on none. Then the limit holds while the running tasks end one by one,
// and the waiting ones start, one at a time, once they have.
func TestSlotsLoweredLimitStartsNothingOver(t *testing.T) {
	t.Parallel()
	for _, from := range []int{3, 0} {
		t.Run(fmt.Sprintf("from%d", from), func(t *testing.T) {
			t.Parallel()
			testLoweredLimit(t, from)
		})
	}
}

func testLoweredLimit(t *testing.T, from int) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	const q, parts = "lowered", 2
	b := slotBroker(t, addr, prefix, parts)
	ctx := context.Background()
	idsIn := func(p, n int, tag string) []string {
		var ids []string
		for i := 0; len(ids) < n; i++ {
			if id := fmt.Sprint(tag, i); broker.Partition(id, parts) == p {
				ids = append(ids, id)
			}
		}
		return ids
	}
	fillQueue(t, b, q, idsIn(1, 2, "run"))
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: from}); err != nil {
		t.Fatal(err)
	}
	// A worker of its own, closed before the limit changes, so that no
	// rebalance it asked for runs in the background afterwards.
	w := New(redistest.Client(t, addr), WithPrefix(prefix), WithPartitions(parts))
	var running []*broker.Delivery
	testwait.For(t, 10*time.Second, "partition 1's two tasks to start", func() bool {
		ds, err := w.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		running = append(running, ds...)
		return len(running) >= 2
	})
	_ = w.Close()
	fillQueue(t, b, q, idsIn(0, 3, "wait"))
	l, _ := b.layoutOf(ctx, q)
	ns := b.slotNodes(q, l)
	if from > 0 {
		if err := b.rebalance(ctx, q); err != nil {
			t.Fatal(err)
		}
		if c, _ := b.rdb.HGet(ctx, ns[1].p.k("lim"), "c").Int(); c < 1 {
			t.Fatalf("partition 0 holds %d slots with 3 tasks waiting under Concurrency 3 and 2 running elsewhere, want 1", c)
		}
	}

	o := slotBroker(t, addr, prefix, parts)
	if err := o.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	startsNothing := func(when string) {
		t.Helper()
		for range 3 {
			if err := o.rebalance(ctx, q); err != nil {
				t.Fatal(err)
			}
			ds, err := o.Dequeue(ctx, []string{q}, 10, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) > 0 {
				t.Fatalf("%s: %s started under Concurrency 1", when, ds[0].Task.ID)
			}
		}
	}
	startsNothing("2 running")
	if _, err := o.Settle(ctx, []broker.Settlement{{Lease: running[0].Lease(), Kind: broker.SettleDone}}); err != nil {
		t.Fatal(err)
	}
	startsNothing("1 running")
	if _, err := o.Settle(ctx, []broker.Settlement{{Lease: running[1].Lease(), Kind: broker.SettleDone}}); err != nil {
		t.Fatal(err)
	}
	var next *broker.Delivery
	testwait.For(t, 10*time.Second, "a waiting task to start once none runs", func() bool {
		ds, err := o.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 1 {
			t.Fatalf("%d tasks started at once under Concurrency 1", len(ds))
		}
		if len(ds) == 1 {
			next = ds[0]
		}
		return next != nil
	})
	startsNothing("the next task running")
	if c, _ := slotTotals(t, o, q); c != 1 {
		t.Fatalf("the nodes hold %d slots, want the limit 1", c)
	}
}
