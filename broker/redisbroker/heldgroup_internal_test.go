package redisbroker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// groupsIn returns n group names whose tasks land in partition p of parts.
func groupsIn(prefix string, p, parts, n int) []string {
	var gs []string
	for i := 0; len(gs) < n; i++ {
		if g := fmt.Sprint(prefix, i); broker.Partition("x{"+g+"}", parts) == p {
			gs = append(gs, g)
		}
	}
	return gs
}

// enqueueOK enqueues ms, failing the test on any error.
func enqueueOK(t *testing.T, b *Broker, ms []*tidetype.TaskInfo) {
	t.Helper()
	errs, err := b.Enqueue(context.Background(), ms, broker.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("Enqueue %s: %v", ms[i].ID, e)
		}
	}
}

// dequeuePart runs a dequeue of up to n tasks of partition i of queue
// alone, as a server woken for that partition does: a reply that asks for
// a rebalance kicks one, as Dequeue does.
func dequeuePart(t *testing.T, b *Broker, queue string, i, n int) []*broker.Delivery {
	t.Helper()
	ctx := context.Background()
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	c := b.dequeueCall(b.partAt(queue, l, i), n, time.Minute)
	b.run(ctx, []*call{c})
	if c.err != nil {
		t.Fatal(c.err)
	}
	res, err := c.cmd.Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) == 1 {
		b.kick(queue)
	}
	var ds []*broker.Delivery
	for j := 0; j+2 < len(res); j += 3 {
		id, _ := res[j].(string)
		rec, _ := res[j+1].(string)
		task, tok, err := codec.Decode(queue, id, []byte(rec))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, &broker.Delivery{Task: task, Token: tok, LeaseFor: time.Minute, Internal: codec.Internal([]byte(rec))})
	}
	return ds
}

// A group whose throttle ends in a partition that holds its fair share of
// a contended Concurrency, every slot of it in use, asks for a rebalance:
// the other partition's slot may have become free meanwhile with nothing
// to run. Concurrency 2 over two partitions with tasks waiting in both
// leaves one slot in each, partition 0 held at its share (4 tasks wait
// there, 1 in partition 1). In partition 0 one group is throttled and a
// task of the other runs; partition 1's task ends, and its slot is free
// with nothing to run. When the throttle ends, the server woken for
// partition 0 finds no room: the group that came back is new demand, and
// the free slot must reach it without waiting for the periodic rebalance
// (Maintain's, every few seconds).
func TestHeldGroupBackAsksForASlot(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "held-group-back"
	gs := groupsIn("g", 0, 2, 2)
	now := time.Now()
	task := func(id, g string) *tidetype.TaskInfo {
		if g != "" {
			id += "{" + g + "}"
		}
		return &tidetype.TaskInfo{ID: id, Queue: q, Type: "t", State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now, Group: g}
	}
	var ms []*tidetype.TaskInfo
	for _, g := range gs {
		ms = append(ms, task("a", g), task("b", g))
	}
	ms = append(ms, task(idsIn("u", 1, 2, 1)[0], ""))
	enqueueOK(t, b, ms)
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	p0 := b.partAt(q, l, 0)
	if cs, _ := b.rdb.HGet(ctx, p0.k("lim"), "cs").Result(); cs != "1" {
		t.Fatalf("partition 0 is not held at its fair share (cs %q)", cs)
	}
	// Partition 0: a task of one group runs and throttles its group for a
	// minute; then a task of the other group runs on.
	ds := dequeuePart(t, b, q, 0, 1)
	if len(ds) != 1 {
		t.Fatalf("partition 0 started %d tasks on its one slot, want 1", len(ds))
	}
	throttled := ds[0].Task.Group
	if _, err := b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDefer, Task: ds[0].Task, RetryIn: time.Minute, Throttle: true}}); err != nil {
		t.Fatal(err)
	}
	ds = dequeuePart(t, b, q, 0, 1)
	if len(ds) != 1 || ds[0].Task.Group == throttled {
		t.Fatalf("partition 0 started %d tasks with group %s throttled, want one of the other group", len(ds), throttled)
	}
	running := ds[0]
	// Partition 1: its task runs and ends; its slot is free, nothing waits.
	ds = dequeuePart(t, b, q, 1, 1)
	if len(ds) != 1 {
		t.Fatalf("partition 1 started %d tasks, want 1", len(ds))
	}
	settleAll(t, b, ds)
	if cs, _ := b.rdb.HGet(ctx, p0.k("lim"), "cs").Result(); cs != "1" {
		t.Fatalf("partition 0 is no longer held at its fair share (cs %q): a rebalance ran", cs)
	}
	// The throttle ends (its time moved back).
	if err := b.rdb.ZAdd(ctx, p0.k("gw"), redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: throttled}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.HSet(ctx, p0.k("gs"), "t:"+throttled, time.Now().Add(-time.Second).UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	var started []*broker.Delivery
	testwait.For(t, 10*time.Second, "partition 0 to start a task on the slot partition 1 does not use", func() bool {
		started = append(started, dequeuePart(t, b, q, 0, 10)...)
		return len(started) > 0
	})
	if len(started) != 1 {
		t.Fatalf("partition 0 started %d tasks with one running under Concurrency 2, want 1", len(started))
	}
	settleAll(t, b, append(started, running))
}

// A partition whose last task ends with nothing left to run gives its free
// slot away when another partition holds its fair share of a contended
// Concurrency: the settle wakes servers for it, whose dequeue finds the
// free slot under its cap and asks for a rebalance. Concurrency 2 over two
// partitions, 3 tasks waiting in partition 0 and 1 in partition 1: one slot
// each, partition 0 held at its share (it does not ask for more). When
// partition 1's task ends, partition 0 gets its slot and starts a second
// task, without waiting for the periodic rebalance.
func TestDrySlotGoesToAPartitionAtItsShare(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "dry-slot"
	fillQueue(t, b, q, append(idsIn("a", 0, 2, 3), idsIn("b", 1, 2, 1)...))
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if cs, _ := b.rdb.HGet(ctx, b.partAt(q, l, 0).k("lim"), "cs").Result(); cs != "1" {
		t.Fatalf("partition 0 is not held at its fair share (cs %q)", cs)
	}
	running := dequeuePart(t, b, q, 0, 10)
	if len(running) != 1 {
		t.Fatalf("partition 0 started %d tasks on its one slot, want 1", len(running))
	}
	ds := dequeuePart(t, b, q, 1, 10)
	if len(ds) != 1 {
		t.Fatalf("partition 1 started %d tasks, want 1", len(ds))
	}
	if more := dequeuePart(t, b, q, 0, 10); len(more) != 0 {
		t.Fatalf("partition 0 started %d more tasks with both slots in use", len(more))
	}
	sub := b.rdb.Subscribe(ctx, b.channel(q))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	settleAll(t, b, ds)
	// The servers woken for partition 1 dequeue it.
	woken := false
	for !woken {
		msg, err := sub.ReceiveTimeout(ctx, 10*time.Second)
		if err != nil {
			t.Fatalf("no server woken for partition 1 when its last task ended with its slot free: %v", err)
		}
		if m, ok := msg.(*redis.Message); ok && m.Payload == "p1" {
			woken = true
		}
	}
	if more := dequeuePart(t, b, q, 1, 10); len(more) != 0 {
		t.Fatalf("partition 1 started %d tasks with none left", len(more))
	}
	var started []*broker.Delivery
	testwait.For(t, 10*time.Second, "partition 0 to start a task on partition 1's free slot", func() bool {
		started = append(started, dequeuePart(t, b, q, 0, 10)...)
		return len(started) > 0
	})
	if len(started) != 1 {
		t.Fatalf("partition 0 started %d tasks with one running under Concurrency 2, want 1", len(started))
	}
	settleAll(t, b, append(started, running...))
}

// The ready tasks of groups that may not start one now (over their group
// rate, throttled) are no demand for slots: a rebalance gives the slots of
// a partition that holds only such tasks to a partition whose tasks can
// start. (Counted as demand, they kept a slot idle in their partition
// while tasks waited in the other for it, until one of the other's own
// tasks ended: the flow-control model found a group's tasks waiting 2 s
// with a slot of the queue free, seed 7.) Concurrency 2 over two
// partitions: partition 0 holds one group under a GroupRate of 1 a minute,
// partition 1 three groups of one task each.
func TestHeldGroupsTasksAreNoDemandForSlots(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "held-no-demand"
	held := groupsIn("h", 0, 2, 1)[0]
	others := groupsIn("o", 1, 2, 3)
	now := time.Now()
	task := func(id, g string) *tidetype.TaskInfo {
		return &tidetype.TaskInfo{ID: id + "{" + g + "}", Queue: q, Type: "t", State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now, Group: g}
	}
	ms := []*tidetype.TaskInfo{task("a", held), task("b", held), task("c", held)}
	for _, g := range others {
		ms = append(ms, task("x", g))
	}
	enqueueOK(t, b, ms)
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 2, GroupRate: tidetype.Rate{Limit: 1, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	// Partition 0's group starts its one task a minute, which ends: its
	// other two tasks wait for the minute to pass.
	ds := dequeuePart(t, b, q, 0, 10)
	if len(ds) != 1 || ds[0].Task.Group != held {
		t.Fatalf("partition 0 started %d tasks, want 1 of group %s", len(ds), held)
	}
	settleAll(t, b, ds)
	if more := dequeuePart(t, b, q, 0, 10); len(more) != 0 {
		t.Fatalf("partition 0 started %d more tasks of a group over its rate", len(more))
	}
	// Partition 1 starts one task and keeps it running (a rebalance that
	// the calls above asked for may have given it both slots already).
	running := dequeuePart(t, b, q, 1, 1)
	if len(running) != 1 {
		t.Fatalf("partition 1 started %d tasks, want 1", len(running))
	}
	// A rebalance (as Maintain's periodic one) gives partition 0's idle
	// slot to partition 1, where two tasks can start.
	var started []*broker.Delivery
	testwait.For(t, 5*time.Second, "partition 1 to start a second task on partition 0's idle slot", func() bool {
		if err := b.rebalance(ctx, q); err != nil {
			t.Fatal(err)
		}
		started = append(started, dequeuePart(t, b, q, 1, 10)...)
		return len(started) > 0
	})
	if len(started) != 1 {
		t.Fatalf("partition 1 started %d more tasks with one running under Concurrency 2, want 1", len(started))
	}
	settleAll(t, b, append(started, running...))
}
