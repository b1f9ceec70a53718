package redisbroker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// The tests of this file drive a Rate switched on (or off and on again)
// around the end of a repartition step by step: the repartition waits for
// a task of the old span that the test holds leased, the test starts tasks
// in the new span meanwhile, then lets the repartition end and changes the
// limits. Their periods are a minute, so no start leaves its window while a
// test runs.

// settleAll settles ds as done.
func settleAll(t *testing.T, b *Broker, ds []*broker.Delivery) {
	t.Helper()
	if len(ds) == 0 {
		return
	}
	var ss []broker.Settlement
	for _, d := range ds {
		ss = append(ss, broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task})
	}
	errs, err := b.Settle(context.Background(), ss)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		if e != nil {
			t.Fatal(e)
		}
	}
}

// leaseSettle rebalances queue and leases what it can, rounds times,
// settling each task at once, and returns how many it leased.
func leaseSettle(t *testing.T, b *Broker, queue string, rounds int) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for range rounds {
		if err := b.rebalance(ctx, queue); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Dequeue(ctx, []string{queue}, 50, time.Minute)
		if errors.Is(err, broker.ErrLayout) {
			// A process's cached layout was stale: it reads the
			// layout again on the next call, as a server would.
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		n += len(ds)
		settleAll(t, b, ds)
	}
	return n
}

// repartitionHeld repartitions queue q of b (of parts partitions) to n
// while a task of the old span runs: it leases task "hold" (enqueued in
// old partition 0), starts the repartition, runs during while the
// repartition waits for that task, settles it and returns when the
// repartition has ended. A broker's cached layout is the one with both
// spans while during runs.
func repartitionHeld(t *testing.T, b *Broker, q string, parts, n int, during func()) {
	t.Helper()
	ctx := context.Background()
	hold := idsIn("hold", 0, parts, 1)
	fillQueue(t, b, q, hold)
	var held []*broker.Delivery
	testwait.For(t, 10*time.Second, "the old span's task to start", func() bool {
		ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ds...)
		return len(held) > 0
	})
	if len(held) != 1 || held[0].Task.ID != hold[0] {
		t.Fatalf("leased %d tasks before the repartition, want %s alone", len(held), hold[0])
	}
	done := make(chan error, 1)
	go func() { done <- b.Repartition(ctx, q, n, nil) }()
	testwait.For(t, 10*time.Second, "the repartition to record both spans", func() bool {
		v, err := b.rdb.HGet(ctx, b.prefix+":partitions", q).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(v, "<")
	})
	// The partitions learn the layout after the queue's record of it:
	// until each has, a fresh read answers ErrUnavailable.
	var l layout
	testwait.For(t, 10*time.Second, "every partition to learn the repartition's layout", func() bool {
		b.forgetLayout(q)
		var err error
		l, err = b.freshLayout(ctx, q)
		if err != nil && !errors.Is(err, broker.ErrUnavailable) {
			t.Fatal(err)
		}
		return err == nil
	})
	if l.old == nil || l.cur.n != n {
		t.Fatalf("layout %q while the repartition runs, want %d partitions next to the old ones", l.tag, n)
	}
	during()
	settleAll(t, b, held)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b.forgetLayout(q)
	if l, err := b.freshLayout(ctx, q); err != nil || l.old != nil || l.cur.n != n {
		t.Fatalf("layout %q (%v) after the repartition, want %d partitions alone", l.tag, err, n)
	}
}

// wantRateFull enqueues ids into q and checks that none starts, the minute
// already holding starts starts under a Rate of limit per minute, and that
// the partitions hold exactly limit rate tokens between them.
func wantRateFull(t *testing.T, b *Broker, q string, ids []string, starts, limit int) {
	t.Helper()
	fillQueue(t, b, q, ids)
	if n := leaseSettle(t, b, q, 5); n != 0 {
		t.Fatalf("%d tasks started after %d starts in the minute, under a Rate of %d per minute", n, starts, limit)
	}
	if _, r := slotTotals(t, b, q); r != int64(limit) {
		t.Fatalf("the nodes hold %d rate tokens, want %d", r, limit)
	}
}

// A Rate switched on just after a repartition ended counts the starts its
// new partitions made while it ran: 12 tasks start in the new span and one
// in the old without a rate, then a Rate of 9 per minute leaves no room.
func TestRateSwitchedOnAfterARepartitionCountsItsStarts(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-on-after-repart"
	repartitionHeld(t, b, q, 2, 3, func() {
		fillQueue(t, b, q, idsIn("a", 0, 1, 12))
		if n := leaseSettle(t, b, q, 2); n != 12 {
			t.Fatalf("leased %d tasks in the new span without limits, want 12", n)
		}
	})
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	wantRateFull(t, b, q, idsIn("b", 0, 1, 9), 13, 9)
}

// The same when a SetQueueLimits during the repartition switched the rate
// off: 13 per minute while 7 tasks start (one in the old span, 6 in the
// new), switched off while 6 more start in the new span, and switched on
// again after the end: the 13 starts fill the minute.
func TestRateSwitchedOffDuringARepartitionAndOnAfter(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-off-on-repart"
	rate := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 13, Per: time.Minute}}
	if err := b.SetQueueLimits(ctx, q, rate); err != nil {
		t.Fatal(err)
	}
	repartitionHeld(t, b, q, 2, 3, func() {
		fillQueue(t, b, q, idsIn("a", 0, 1, 6))
		if n := leaseSettle(t, b, q, 5); n != 6 {
			t.Fatalf("leased %d tasks in the new span under 13 per minute with 1 start, want 6", n)
		}
		if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{}); err != nil {
			t.Fatal(err)
		}
		fillQueue(t, b, q, idsIn("b", 0, 1, 6))
		if n := leaseSettle(t, b, q, 2); n != 6 {
			t.Fatalf("leased %d tasks in the new span without limits, want 6", n)
		}
	})
	if err := b.SetQueueLimits(ctx, q, rate); err != nil {
		t.Fatal(err)
	}
	wantRateFull(t, b, q, idsIn("c", 0, 1, 9), 13, 13)
}

// Starts that travel with their tokens keep counting when the rate is
// switched off and on again before the transfer is applied: partition 0
// gives its 7 tokens, every one used by a start, to partition 1, and the
// process dies before applying it (as a SIGKILL or a cut-off server leaves
// a rebalance; a repartition's old partition hands its tokens over the
// same way). The rate is switched off (no rebalance runs without limits,
// so the transfer stays outstanding) and on again: the rebalance that
// completes the transfer finds partition 1 in the new era, where the
// tokens do not count, but the starts must: 13 starts fill the minute's
// 13.
func TestRateOffAndOnKeepsStartsOfAnOutstandingTransfer(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-off-on-transfer"
	rate := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 13, Per: time.Minute}}
	if err := b.SetQueueLimits(ctx, q, rate); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 7), idsIn("b", 1, 2, 6)...))
	if n := leaseSettle(t, b, q, 5); n != 13 {
		t.Fatalf("leased %d tasks under 13 per minute, want 13", n)
	}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	ns := b.slotNodes(q, l)
	if err := b.readSlots(ctx, q, ns, rate); err != nil {
		t.Fatal(err)
	}
	if ns[1].r != 7 || ns[1].used != 7 {
		t.Fatalf("partition 0 holds %d tokens with %d starts, want 7 and 7", ns[1].r, ns[1].used)
	}
	give := b.slotCall(q, ns[1], "give", ns[1].id, ns[2].id, 0, 7, "")
	if err := b.runAll(ctx, "give", []*call{give}); err != nil {
		t.Fatal(err)
	}
	if v, err := give.cmd.Slice(); err != nil || v[0] != "ok" {
		t.Fatalf("give: %v %v", v, err)
	}
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetQueueLimits(ctx, q, rate); err != nil {
		t.Fatal(err)
	}
	wantRateFull(t, b, q, append(idsIn("c", 0, 2, 5), idsIn("d", 1, 2, 5)...), 13, 13)
}

// A Rate switched on just after a repartition ended, while another
// process, whose cached layout still has both spans, rebalances in
// between (after the rate is recorded, before the partitions have their
// settings) and again from what it read then: the 13 starts still fill the
// 9 tokens and nothing starts, in either process.
func TestRateSwitchedOnAfterARepartitionOverlappingRebalances(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	other := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-on-after-repart-overlap"
	repartitionHeld(t, b, q, 2, 3, func() {
		if l, err := other.layoutOf(ctx, q); err != nil || l.old == nil {
			t.Fatalf("the other process's layout %q (%v), want both spans", l.tag, err)
		}
		fillQueue(t, b, q, idsIn("a", 0, 1, 12))
		if n := leaseSettle(t, b, q, 2); n != 12 {
			t.Fatalf("leased %d tasks in the new span without limits, want 12", n)
		}
	})
	if l, err := other.layoutOf(ctx, q); err != nil || l.old == nil {
		t.Fatalf("the other process's layout %q (%v), want both spans still", l.tag, err)
	}
	on := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: time.Minute}}
	var stale []*slotNode
	SetLimitsRecorded(func(queue string) {
		if queue != q || stale != nil {
			return
		}
		l, err := other.layoutOf(ctx, q)
		if err != nil {
			t.Error(err)
			return
		}
		stale = other.slotNodes(q, l)
		if err := other.readSlots(ctx, q, stale, on); err != nil {
			t.Error(err)
		}
		if err := other.rebalance(ctx, q); err != nil {
			t.Error(err)
		}
	})
	err := b.SetQueueLimits(ctx, q, on)
	SetLimitsRecorded(nil)
	if err != nil {
		t.Fatal(err)
	}
	if stale == nil {
		t.Fatal("the slots were not read while the limits changed")
	}
	if _, err := other.dropUnbacked(ctx, q, stale, on); err != nil {
		t.Fatal(err)
	}
	fillQueue(t, b, q, idsIn("b", 0, 1, 9))
	for _, x := range []*Broker{other, b, other} {
		if n := leaseSettle(t, x, q, 3); n != 0 {
			t.Fatalf("%d tasks started after 13 starts in the minute, under a Rate of 9 per minute", n)
		}
	}
	if _, r := slotTotals(t, b, q); r != 9 {
		t.Fatalf("the nodes hold %d rate tokens, want 9", r)
	}
}

// A Rate switched on while the repartition ends: SetQueueLimits reads the
// layout with both spans and records the rate, and the repartition ends
// before the partitions get their settings (its own end gives them the
// recorded limits and rebalances). The 13 starts of the minute, 12 of them
// made by the new span, leave no room under 9 per minute.
func TestRateSwitchedOnAsARepartitionEnds(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	op := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "rate-on-as-repart-ends"
	on := tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 9, Per: time.Minute}}
	recorded := make(chan struct{})
	ended := make(chan struct{})
	limDone := make(chan error, 1)
	repartitionHeld(t, b, q, 2, 3, func() {
		fillQueue(t, b, q, idsIn("a", 0, 1, 12))
		if n := leaseSettle(t, b, q, 2); n != 12 {
			t.Fatalf("leased %d tasks in the new span without limits, want 12", n)
		}
		if l, err := op.freshLayout(ctx, q); err != nil || l.old == nil {
			t.Fatalf("the operator's layout %q (%v), want both spans", l.tag, err)
		}
		// The operator's SetQueueLimits records the rate, then waits
		// for the repartition's end before it gives the settings.
		SetLimitsRecorded(func(queue string) {
			if queue != q {
				return
			}
			select {
			case <-recorded:
				return
			default:
			}
			close(recorded)
			<-ended
		})
		go func() { limDone <- op.SetQueueLimits(ctx, q, on) }()
		<-recorded
	})
	close(ended)
	err := <-limDone
	SetLimitsRecorded(nil)
	if err != nil {
		t.Fatal(err)
	}
	wantRateFull(t, b, q, idsIn("b", 0, 1, 9), 13, 9)
}
