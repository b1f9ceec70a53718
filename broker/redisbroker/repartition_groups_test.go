package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/tidetype"
)

// groupMsg returns a pending task of queue q with ID id, in group g unless g
// is empty (the ID then carries the group as its tag).
func groupMsg(q, id, g string) *tidetype.TaskInfo {
	now := time.Now()
	if g != "" {
		id += "{" + g + "}"
	}
	return &tidetype.TaskInfo{ID: id, Queue: q, Type: "t", Payload: []byte("payload of " + id), State: tidetype.StatePending,
		MaxRetry: 3, NextProcessAt: now, EnqueuedAt: now, Group: g}
}

func mustEnqueue(t *testing.T, b broker.Broker, opts broker.EnqueueOptions, ms ...*tidetype.TaskInfo) {
	t.Helper()
	errs, err := b.Enqueue(context.Background(), ms, opts)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("Enqueue %s: %v", ms[i].ID, e)
		}
	}
}

// maintainAll maintains every partition of q once.
func maintainAll(t *testing.T, b broker.Broker, q string) {
	t.Helper()
	ctx := context.Background()
	n, err := b.Partitions(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	for p := range n {
		if _, err := b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: p, Owner: "test", OwnerTTL: time.Second}); err != nil {
			t.Fatalf("Maintain %s/%d: %v", q, p, err)
		}
	}
}

// runOneByOne dequeues q's tasks one at a time, settling each done at once,
// until a Dequeue hands out nothing, and returns their IDs in start order.
func runOneByOne(t *testing.T, b broker.Broker, q string) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for {
		ds, err := b.Dequeue(ctx, []string{q}, 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			return ids
		}
		d := ds[0]
		ids = append(ids, d.Task.ID)
		errs, err := b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task}})
		if err != nil || errs[0] != nil {
			t.Fatalf("Settle %s: %v %v", d.Task.ID, err, errs)
		}
	}
}

// orderDiff describes where got, a run order, leaves want.
func orderDiff(got, want []string) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("%s at position %d where %s was due (%d tasks, want %d)", got[i], i, want[i], len(got), len(want))
		}
	}
	return fmt.Sprintf("%d tasks, want %d", len(got), len(want))
}

// An ordered group keeps its enqueue order across a repartition: tasks are
// not renumbered in the order they are moved, so a task enqueued while the
// move runs starts after every task enqueued before it, and a scheduled task
// that was moved first does not overtake pending tasks enqueued before it.
func TestRepartitionKeepsOrderedSequence(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, n = "ordmove", 250 // more than one step of the move
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range n {
		m := groupMsg(q, fmt.Sprintf("p%03d", i), "g")
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, m)
		want = append(want, m.ID)
	}
	s := groupMsg(q, "sched", "g")
	s.State, s.NextProcessAt = tidetype.StateScheduled, time.Now().Add(200*time.Millisecond)
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, s)
	late := groupMsg(q, "late", "g")
	want = append(want, s.ID, late.ID)
	steps := 0
	err := e.b.Repartition(ctx, q, 3, func(moved, left int) {
		if steps++; steps == 1 {
			if left == 0 {
				t.Errorf("the move took one step: nothing left to overtake")
			}
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, late)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(s.NextProcessAt) + 10*time.Millisecond)
	maintainAll(t, e.b, q)
	if got := runOneByOne(t, e.b, q); !slices.Equal(got, want) {
		t.Fatalf("after the repartition the ordered group ran %s", orderDiff(got, want))
	}
}

// A group's rate window holds across a repartition: the starts made in the
// old partition still count in the new one.
func TestRepartitionKeepsGroupRateWindow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "ratemove"
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{GroupRate: tidetype.Rate{Limit: 3, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, fmt.Sprint("r", i), "g"))
	}
	started := 0
	for range 10 {
		ds, err := e.b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			started++
			if _, err := e.b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if started != 3 {
		t.Fatalf("%d tasks started under GroupRate 3/min", started)
	}
	if err := e.b.Repartition(ctx, q, 2, nil); err != nil {
		t.Fatal(err)
	}
	maintainAll(t, e.b, q)
	if got := runOneByOne(t, e.b, q); len(got) != 0 {
		t.Fatalf("after the repartition %d more tasks started within the minute of GroupRate 3/min: %v", len(got), got)
	}
}

// A group's throttle holds across a repartition: the one set before it, and
// the one a task still running in the old partition sets while the group's
// waiting tasks have moved on (no group limits: the throttle is the only
// promise, and it must hold too).
func TestRepartitionKeepsThrottle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	throttle := func(t *testing.T, b broker.Broker, d *broker.Delivery) {
		t.Helper()
		errs, err := b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDefer, Throttle: true, Task: d.Task,
			RetryAt: time.Now().Add(time.Hour), Err: "slow down"}})
		if err != nil || errs[0] != nil {
			t.Fatalf("throttling settlement: %v %v", err, errs)
		}
	}
	t.Run("before", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		const q = "throttlebefore"
		for i := range 3 {
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, fmt.Sprint("t", i), "g"))
		}
		ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Dequeue: %d, %v", len(ds), err)
		}
		throttle(t, e.b, ds[0])
		if err := e.b.Repartition(ctx, q, 2, nil); err != nil {
			t.Fatal(err)
		}
		maintainAll(t, e.b, q)
		if got := runOneByOne(t, e.b, q); len(got) != 0 {
			t.Fatalf("a throttled group started %v after the repartition", got)
		}
	})
	t.Run("during", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		const q = "throttleduring"
		for i := range 3 {
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, fmt.Sprint("t", i), "g"))
		}
		ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Dequeue: %d, %v", len(ds), err)
		}
		waiting := make(chan struct{})
		var once sync.Once
		done := make(chan error, 1)
		go func() {
			done <- e.b.Repartition(ctx, q, 2, func(moved, left int) {
				if moved >= 2 && left == 1 { // only the running task is left behind
					once.Do(func() { close(waiting) })
				}
			})
		}()
		select {
		case <-waiting:
		case err := <-done:
			t.Fatalf("Repartition returned %v with a task running", err)
		}
		if got, err := e.b.Dequeue(ctx, []string{q}, 10, time.Minute); err != nil || len(got) != 0 {
			t.Fatalf("while the group runs a task in the old partition, Dequeue started %d of its tasks in the new one (%v)", len(got), err)
		}
		throttle(t, e.b, ds[0])
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		maintainAll(t, e.b, q)
		if got := runOneByOne(t, e.b, q); len(got) != 0 {
			t.Fatalf("the group throttled by its task in the old partition started %v after the repartition", got)
		}
	})
}

// A queue of one partition takes grouped tasks whose IDs do not carry their
// group; a repartition does not move them, so it is refused while the
// queue holds one, and goes ahead once they are gone; the queue of four
// partitions then takes such IDs too.
func TestRepartitionRefusesFreeGroupIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "freemove"
	free := func(id string) *tidetype.TaskInfo {
		m := groupMsg(q, id, "")
		m.Group = "shop-7"
		return m
	}
	tagged := groupMsg(q, "tagged", "shop-7")
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, free("order-cancel:42"), tagged, groupMsg(q, "plain", ""))
	err := e.b.Repartition(ctx, q, 4, nil)
	if !errors.Is(err, broker.ErrLayout) || !strings.Contains(err.Error(), `"order-cancel:42"`) {
		t.Fatalf("Repartition to 4 of a queue holding a grouped task with a free ID: %v, want ErrLayout naming it", err)
	}
	if n, err := e.b.Partitions(ctx, q); err != nil || n != 1 {
		t.Fatalf("Partitions after the refused repartition = %d, %v; want 1", n, err)
	}
	// The refused repartition lets free IDs in again.
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, free("order-cancel:43"))
	for _, id := range []string{"order-cancel:42", "order-cancel:43"} {
		if err := e.b.Delete(ctx, q, id); err != nil {
			t.Fatalf("Delete(%s): %v", id, err)
		}
	}
	if err := e.b.Repartition(ctx, q, 4, nil); err != nil {
		t.Fatalf("Repartition to 4 once the free IDs are gone: %v", err)
	}
	if got, err := e.b.GetTask(ctx, q, tagged.ID); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask(%s) after the repartition: %+v, %v", tagged.ID, got, err)
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, free("order-cancel:44"))
	if got, err := e.b.GetTask(ctx, q, "order-cancel:44"); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask of a free grouped ID on 4 partitions: %+v, %v", got, err)
	}
}

// A repartition that stopped after it held free grouped IDs back (its mark
// is set, the layout not yet changed) keeps refusing them, and a
// repartition to one partition lifts the hold.
func TestRepartitionHoldOfFreeGroupIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "freehold"
	m := groupMsg(q, "order-cancel:42", "")
	m.Group = "shop-7"
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, "first", "shop-7")) // the queue exists
	if err := e.rdb.HSet(ctx, e.prefix+":{"+q+":0}:gs", "xf", "1").Err(); err != nil {
		t.Fatal(err)
	}
	errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{})
	if err != nil || !errors.Is(errs[0], broker.ErrInvalidTask) {
		t.Fatalf("a free grouped ID while a repartition holds them: %v, %v; want ErrInvalidTask", errs, err)
	}
	if err := e.b.Repartition(ctx, q, 1, nil); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, m)
}

// Should a grouped task with a free ID get into the partition after the
// repartition looked (its hold lifted meanwhile, as a concurrent
// repartition to one partition does), the move stops at it with an error
// that names it and leaves it where it is found by its ID; once it is
// deleted, running the repartition again finishes it. Not parallel: it
// sets a package-wide hook.
func TestRepartitionStopsAtALateFreeGroupID(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const q = "freelate"
	tagged := groupMsg(q, "tagged", "shop-7")
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, tagged)
	late := groupMsg(q, "order-cancel:42", "")
	late.Group = "shop-7"
	redisbroker.SetAfterHold(func(queue string) {
		if queue != q {
			return
		}
		if err := e.rdb.HDel(ctx, e.prefix+":{"+q+":0}:gs", "xf").Err(); err != nil {
			t.Error(err)
		}
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, late)
	})
	t.Cleanup(func() { redisbroker.SetAfterHold(nil) })
	err := e.b.Repartition(ctx, q, 4, nil)
	if !errors.Is(err, broker.ErrLayout) || !strings.Contains(err.Error(), `"order-cancel:42"`) {
		t.Fatalf("Repartition meeting a late free grouped ID: %v, want ErrLayout naming it", err)
	}
	redisbroker.SetAfterHold(nil)
	if got, err := e.b.GetTask(ctx, q, late.ID); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask(%s) while the repartition stopped: %+v, %v", late.ID, got, err)
	}
	if err := e.b.Delete(ctx, q, late.ID); err != nil {
		t.Fatalf("Delete(%s): %v", late.ID, err)
	}
	if err := e.b.Repartition(ctx, q, 4, nil); err != nil {
		t.Fatalf("Repartition run again: %v", err)
	}
	if got, err := e.b.GetTask(ctx, q, tagged.ID); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask(%s) after the repartition: %+v, %v", tagged.ID, got, err)
	}
}
