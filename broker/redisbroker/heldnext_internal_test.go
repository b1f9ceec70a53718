package redisbroker

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// The end of a group's GroupRate hold is announced even when the call
// woken by the end of an earlier hold finds no room. Concurrency 1 and
// GroupRate 1 per minute on one partition: a task of group A starts and
// ends (A held, its end announced), a task of group B starts and runs on
// (B held until later; not announced, as A's comes first). When A's hold
// ends, the call woken for it finds the slot in use: it puts A back, and
// must announce B's end, which no call would announce otherwise: B's next
// task waited, with the slot free, for a settle or the maintainer to bring
// a call (the limit model's idle slots).
func TestHeldGroupNextHoldAnnounced(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 1)
	ctx := context.Background()
	const q = "held-next"
	now := time.Now()
	var ms []*tidetype.TaskInfo
	for _, g := range []string{"ga", "gb"} {
		for _, id := range []string{"1", "2"} {
			ms = append(ms, &tidetype.TaskInfo{ID: id + "{" + g + "}", Queue: q, Type: "t", State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now, Group: g})
		}
	}
	enqueueOK(t, b, ms)
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: 1, GroupRate: tidetype.Rate{Limit: 1, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	first := dequeuePart(t, b, q, 0, 1)
	if len(first) != 1 {
		t.Fatalf("started %d tasks, want 1", len(first))
	}
	settleAll(t, b, first)
	second := dequeuePart(t, b, q, 0, 1)
	if len(second) != 1 || second[0].Task.Group == first[0].Task.Group {
		t.Fatalf("started %d tasks after group %s's, want one of the other group", len(second), first[0].Task.Group)
	}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	p := b.partAt(q, l, 0)
	holds, err := b.rdb.ZRangeWithScores(ctx, p.k("gw"), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(holds) != 2 {
		t.Fatalf("%d groups held for their GroupRate, want 2: %v", len(holds), holds)
	}
	later := int64(holds[1].Score)
	if holds[1].Member != second[0].Task.Group {
		t.Fatalf("the later hold is group %v's, want %s's", holds[1].Member, second[0].Task.Group)
	}
	sub := b.rdb.Subscribe(ctx, b.channel(q))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	// The first group's hold ends (its time moved back); the call woken
	// for it finds the one slot in use.
	if err := b.rdb.ZAdd(ctx, p.k("gw"), redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: first[0].Task.Group}).Err(); err != nil {
		t.Fatal(err)
	}
	if more := dequeuePart(t, b, q, 0, 1); len(more) != 0 {
		t.Fatalf("started %d tasks with the one slot in use", len(more))
	}
	want := "p" + strconv.Itoa(p.idx) + ":" + strconv.FormatInt(later, 10)
	for {
		msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
		if err != nil {
			t.Fatalf("the end of group %s's hold (%s) was not announced: %v", second[0].Task.Group, want, err)
		}
		if m, ok := msg.(*redis.Message); ok && m.Payload == want {
			break
		}
	}
	settleAll(t, b, second)
}

// A throttle's end is announced by the settle that throttles the group:
// servers look again then. Before, only a later lease call of the
// partition announced it, and with none coming (nothing else to run
// there) the group waited for the maintainer that makes the deferred task
// ready, which wakes its own server only (busy, maybe).
func TestThrottleEndAnnounced(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 1)
	ctx := context.Background()
	const q = "throttle-end"
	now := time.Now()
	var ms []*tidetype.TaskInfo
	for _, id := range []string{"1", "2"} {
		ms = append(ms, &tidetype.TaskInfo{ID: id + "{g}", Queue: q, Type: "t", State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now, Group: "g"})
	}
	if _, err := b.Enqueue(ctx, ms, broker.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	ds := dequeuePart(t, b, q, 0, 1)
	if len(ds) != 1 {
		t.Fatalf("started %d tasks, want 1", len(ds))
	}
	l, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	p := b.partAt(q, l, 0)
	sub := b.rdb.Subscribe(ctx, b.channel(q))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	if _, err := b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDefer, Task: ds[0].Task, RetryIn: time.Minute, Throttle: true}}); err != nil {
		t.Fatal(err)
	}
	until, err := b.rdb.ZScore(ctx, p.k("gw"), "g").Result()
	if err != nil {
		t.Fatalf("group g is not held: %v", err)
	}
	want := "p" + strconv.Itoa(p.idx) + ":" + strconv.FormatInt(int64(until), 10)
	for {
		msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
		if err != nil {
			t.Fatalf("the end of group g's throttle (%s) was not announced: %v", want, err)
		}
		if m, ok := msg.(*redis.Message); ok && m.Payload == want {
			break
		}
	}
}
