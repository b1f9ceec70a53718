package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// markSwept makes b's Maintain take its periodic rebalance of queue (the
// sweep) as just done, so that only what a call finds asks for one.
func markSwept(b *Broker, queue string) {
	r := &b.reb
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.queues == nil {
		r.queues = map[string]*rebalancing{}
	}
	q := r.queues[queue]
	if q == nil {
		q = &rebalancing{}
		r.queues[queue] = q
	}
	q.swept = time.Now()
}

// leasePart runs a dequeue of partition i of queue alone (a server woken
// for that partition) and returns the tasks it leased. A reply asking for
// a rebalance asks nobody.
func leasePart(t *testing.T, b *Broker, queue string, i int) []string {
	t.Helper()
	ctx := context.Background()
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	c := b.dequeueCall(b.partAt(queue, l, i), 10, time.Minute)
	b.run(ctx, []*call{c})
	if c.err != nil {
		t.Fatal(c.err)
	}
	res, err := c.cmd.Slice()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for j := 0; j+2 < len(res); j += 3 {
		id, _ := res[j].(string)
		ids = append(ids, id)
	}
	return ids
}

// A recovered lease of a limited queue asks for a rebalance, so that the
// slot it frees is used where tasks wait. Concurrency 2 runs two tasks in
// partition 0, then is lowered to 1: every partition is held until the
// running tasks are within the new limit, and the tasks waiting in
// partition 1 cannot start. The two leases run out and Maintain recovers
// them (their tasks wait an hour to be retried, so nothing waits in
// partition 0 that would make a dequeue there ask): the slots they free
// pay the limit's debt and one goes to partition 1, whose tasks start
// without anything else rebalancing (a dequeue of a held partition does
// not ask, and Maintain's periodic rebalance is taken as done).
func TestRecoveredLeaseAsksForARebalance(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "recovered-kick"
	fillQueue(t, b, q, idsIn("run", 0, 2, 2))
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	// A worker of its own, closed before the limit changes, so that no
	// rebalance it asked for runs afterwards.
	w := New(redistest.Client(t, addr), WithPrefix(prefix), WithPartitions(2))
	var running []*broker.Delivery
	testwait.For(t, 10*time.Second, "partition 0's two tasks to start", func() bool {
		ds, err := w.Dequeue(ctx, []string{q}, 10, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		running = append(running, ds...)
		return len(running) >= 2
	})
	_ = w.Close()
	fillQueue(t, b, q, idsIn("wait", 1, 2, 3))
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 1}); err != nil {
		t.Fatal(err)
	}
	if ids := leasePart(t, b, q, 1); len(ids) > 0 {
		t.Fatalf("%s started in partition 1 with 2 tasks running under Concurrency 1", ids[0])
	}
	recovered := 0
	testwait.For(t, 10*time.Second, "Maintain to recover partition 0's two leases", func() bool {
		markSwept(b, q)
		res, err := b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: 0, Owner: "m", OwnerTTL: time.Minute, RecoverBackoff: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		recovered += res.Recovered
		return recovered >= 2
	})
	var started []string
	testwait.For(t, 10*time.Second, "a task of partition 1 to start on a slot the recovered leases freed", func() bool {
		started = append(started, leasePart(t, b, q, 1)...)
		return len(started) > 0
	})
	if ids := leasePart(t, b, q, 1); len(started)+len(ids) != 1 {
		t.Fatalf("%d tasks started in partition 1 under Concurrency 1 with none running, want 1", len(started)+len(ids))
	}
}
