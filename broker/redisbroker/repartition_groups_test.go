package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// Grouped tasks whose IDs do not carry their group move with their groups:
// a repartition from one partition to six, then to three, keeps each
// findable, cancellable and deletable by its ID, its ordered group's order
// (one at a time, in enqueue order) and the ID unique in the queue.
func TestRepartitionMovesFreeGroupIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const q = "freemove"
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	groups := map[string]string{}
	for i := range 30 {
		g := []string{"shop-7", "shop-8", "shop-9"}[i%3]
		id := fmt.Sprintf("order-cancel:%d", 40+i)
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, id, g))
		want[g] = append(want[g], id)
		groups[id] = g
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, "tagged", "shop-7"), groupMsg(q, "plain", ""))
	want["shop-7"] = append(want["shop-7"], "tagged{shop-7}")
	groups["tagged{shop-7}"] = "shop-7"
	check := func(n int) {
		t.Helper()
		for id, g := range groups {
			if got, err := e.b.GetTask(ctx, q, id); err != nil || got.Group != g {
				t.Fatalf("GetTask(%s) on %d partitions: %+v, %v; want group %s", id, n, got, err, g)
			}
			errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{freeMsg(q, id, "shop-10")}, broker.EnqueueOptions{})
			if err != nil || !errors.Is(errs[0], broker.ErrTaskIDConflict) {
				t.Fatalf("Enqueue of %s in another group on %d partitions: %v, %v; want ErrTaskIDConflict", id, n, errs, err)
			}
		}
	}
	for _, n := range []int{6, 3} {
		if err := e.b.Repartition(ctx, q, n, nil); err != nil {
			t.Fatalf("Repartition to %d: %v", n, err)
		}
		check(n)
	}
	// Cancel and Delete by ID on three partitions.
	for i, id := range []string{"order-cancel:69", "order-cancel:68", "order-cancel:67"} {
		remove := e.b.Cancel
		if i == 2 {
			remove = e.b.Delete
		}
		if err := remove(ctx, q, id); err != nil {
			t.Fatalf("Cancel/Delete(%s): %v", id, err)
		}
		g := groups[id]
		want[g] = slices.DeleteFunc(want[g], func(s string) bool { return s == id })
		if _, err := e.b.GetTask(ctx, q, id); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("GetTask(%s) after Cancel/Delete: %v", id, err)
		}
	}
	// Ordered: one task of a group at a time, in enqueue order.
	ran := map[string][]string{}
	for {
		ds, err := e.b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break
		}
		seen := map[string]bool{}
		for _, d := range ds {
			if g := d.Task.Group; g != "" {
				if seen[g] {
					t.Fatalf("two tasks of ordered group %s started at once", g)
				}
				seen[g] = true
				ran[g] = append(ran[g], d.Task.ID)
			}
		}
		for _, d := range ds {
			if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task}}); err != nil || errs[0] != nil {
				t.Fatalf("Settle %s: %v %v", d.Task.ID, err, errs)
			}
		}
	}
	for g, w := range want {
		if !slices.Equal(ran[g], w) {
			t.Fatalf("group %s ran %s", g, orderDiff(ran[g], w))
		}
	}
}

// A repartition that stopped after it held free grouped IDs back (its mark
// is set, the layout not yet changed) keeps refusing them (an enqueue waits
// for the new layout a while first), and a repartition to one partition
// lifts the hold. Not parallel: it sets how long that wait is.
func TestRepartitionHoldOfFreeGroupIDs(t *testing.T) {
	defer redisbroker.SetHoldWait(redisbroker.SetHoldWait(100 * time.Millisecond))
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
// repartition held them (its hold lifted meanwhile, as a concurrent
// repartition to one partition does), it moves with the others and is
// found by its ID. Not parallel: it sets a package-wide hook.
func TestRepartitionMovesALateFreeGroupID(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const q = "freelate"
	tagged := groupMsg(q, "tagged", "shop-7")
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, tagged)
	late := freeMsg(q, "order-cancel:42", "shop-7")
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
	if err := e.b.Repartition(ctx, q, 4, nil); err != nil {
		t.Fatalf("Repartition meeting a late free grouped ID: %v", err)
	}
	redisbroker.SetAfterHold(nil)
	for _, id := range []string{late.ID, tagged.ID} {
		if got, err := e.b.GetTask(ctx, q, id); err != nil || got.Group != "shop-7" {
			t.Fatalf("GetTask(%s) after the repartition: %+v, %v", id, got, err)
		}
	}
}
