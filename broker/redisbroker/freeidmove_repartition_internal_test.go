package redisbroker

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
)

// While a repartition runs, Replace moves a waiting grouped task with a
// free ID into a group of another partition of the new span, as it does
// any other time: whether the task still waits in the old span (it moves
// ahead first) or has moved already; into a group of the ID's own
// partition too (no pointer then). The task is found by its ID in its new
// group, stored once, with one pointer naming that group, during and after
// the repartition, and runs once.
func TestFreeIDReplaceAcrossPartitionsDuringARepartition(t *testing.T) {
	t.Parallel()
	const id = "order-cancel:42"
	from, away, home := repartitionGroups(id)
	in3 := broker.Partition(id, 3)
	for _, c := range []struct {
		name  string
		into  string
		ahead bool // the repartition moved the task before the Replace
		put   bool // a drain step wrote the task's new pointer, then stopped (the take found the task gone or active)
	}{
		{"WaitingInTheOldSpan", away, false, false},
		{"MovedAlready", away, true, false},
		{"IntoTheIDsPartition", home, false, false},
		{"PointerPutAhead", away, false, true},
		{"PointerPutAheadIntoTheIDsPartition", home, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const q = "moverep"
			ctx := context.Background()
			b, l, enqueue := repartitionStarted(t, q, id, from)
			if c.put {
				if r, err := b.idsText(ctx, b.partOf(q, l, id), "put", id, newNonce(), from); err != nil || r != "1" {
					t.Fatalf("put: %q, %v", r, err)
				}
			}
			if c.ahead {
				o, _ := b.oldPartOf(q, l, from)
				if err := b.moveAhead(ctx, l, o, []string{id}); err != nil {
					t.Fatal(err)
				}
			}
			if err := enqueue(c.into, "moved", true); err != nil {
				t.Fatalf("Replace into %s during the repartition: %v", c.into, err)
			}
			check := func(when string) {
				t.Helper()
				recs, ptrs := newSpanIndex(t, b, l, q, id)
				gp := broker.Partition(c.into, 3)
				if len(recs) != 1 || recs[0] != gp {
					t.Fatalf("%s: records in %v, want one in %d", when, recs, gp)
				}
				if gp == in3 && len(ptrs) != 0 || gp != in3 && (len(ptrs) != 1 || ptrs[0].p != in3 || ptrs[0].state != 'k' || ptrs[0].group != c.into) {
					t.Fatalf("%s: pointers %+v, want one naming %s", when, ptrs, c.into)
				}
				if got, err := b.GetTask(ctx, q, id); err != nil || got.Group != c.into || string(got.Payload) != "moved" {
					t.Fatalf("%s: GetTask: %+v, %v", when, got, err)
				}
			}
			check("during the repartition")
			if err := b.Repartition(ctx, q, 3, nil); err != nil {
				t.Fatal(err)
			}
			check("after the repartition")
			var ran []string
			for {
				ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if len(ds) == 0 {
					break
				}
				for _, d := range ds {
					ran = append(ran, d.Task.ID+"/"+d.Task.Group)
					if _, err := b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if len(ran) != 1 || ran[0] != id+"/"+c.into {
				t.Fatalf("ran %v, want %s once in %s", ran, id, c.into)
			}
			if _, err := b.GetTask(ctx, q, id); !errors.Is(err, broker.ErrTaskNotFound) {
				t.Fatalf("GetTask after it ran: %v", err)
			}
		})
	}
}

// A drain step that wrote a task's pointer in the new span and stopped
// there (its take found the task gone or running) leaves that pointer; a
// Delete of the task, still waiting in the old span, and an Enqueue of the
// ID into a group of another partition then leave one task, which the
// repartition does not meet twice.
func TestFreeIDDeleteAndEnqueueAfterAPutDuringARepartition(t *testing.T) {
	t.Parallel()
	const id = "order-cancel:42"
	from, away, _ := repartitionGroups(id)
	for _, replace := range []bool{false, true} {
		t.Run("Replace="+strconv.FormatBool(replace), func(t *testing.T) {
			t.Parallel()
			const q = "putdel"
			ctx := context.Background()
			b, l, enqueue := repartitionStarted(t, q, id, from)
			if r, err := b.idsText(ctx, b.partOf(q, l, id), "put", id, newNonce(), from); err != nil || r != "1" {
				t.Fatalf("put: %q, %v", r, err)
			}
			if err := b.Delete(ctx, q, id); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if err := enqueue(away, "again", replace); err != nil {
				t.Fatalf("Enqueue into %s: %v", away, err)
			}
			if err := b.Repartition(ctx, q, 3, nil); err != nil {
				t.Fatal(err)
			}
			recs, ptrs := newSpanIndex(t, b, l, q, id)
			if gp := broker.Partition(away, 3); len(recs) != 1 || recs[0] != gp {
				t.Fatalf("records in %v, want one in %d (pointers %+v)", recs, gp, ptrs)
			}
			if got, err := b.GetTask(ctx, q, id); err != nil || got.Group != away || string(got.Payload) != "again" {
				t.Fatalf("GetTask: %+v, %v", got, err)
			}
		})
	}
}

// repartitionGroups picks groups for a task with the free ID id in a queue
// repartitioned from 6 partitions to 3: from is in neither of the ID's
// partitions; away, in the new span, is in neither the ID's partition nor
// from's; home is in the ID's partition of the new span.
func repartitionGroups(id string) (from, away, home string) {
	group := func(ok func(p6, p3 int) bool) string {
		for i := 0; ; i++ {
			if g := "shop-" + strconv.Itoa(i); ok(broker.Partition(g, 6), broker.Partition(g, 3)) {
				return g
			}
		}
	}
	in6, in3 := broker.Partition(id, 6), broker.Partition(id, 3)
	from = group(func(p6, p3 int) bool { return p6 != in6 && p3 != in3 })
	fp := broker.Partition(from, 3)
	away = group(func(_, p3 int) bool { return p3 != fp && p3 != in3 })
	home = group(func(_, p3 int) bool { return p3 == in3 })
	return from, away, home
}

// A Delete looks the task up before a drain step writes its pointer and
// placeholder in the new span, and reaches the old partition after the
// step took the task there (flagged as moving). The step places its copy
// of the task later: the Delete must not delete the old record and release
// the old pointer before the placeholder is gone, or the task lives on in
// the new span, the old span shows nothing, and an enqueue of the ID into
// another group meanwhile releases the step's new pointer (a placeholder
// is no task) and stores a second record. (Not parallel: the hook is
// global.)
func TestFreeIDDeleteWhileADrainStepMovesTheTask(t *testing.T) {
	const id = "order-cancel:42"
	from, away, _ := repartitionGroups(id)
	b := New(redistest.Client(t, redistest.Addr(t)), WithPrefix(redistest.Prefix(t)), WithPartitions(6))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q = "deltake"
	enqueue := func(g, payload string) error { return enqueueOne(ctx, b, q, id, g, payload, false) }
	if err := enqueue(from, "first"); err != nil {
		t.Fatal(err)
	}
	l, err := b.startRepartition(ctx, q, 3)
	if err != nil || l.old == nil {
		t.Fatalf("startRepartition: %+v, %v", l, err)
	}
	o, _ := b.oldPartOf(q, l, from)
	var ms []moved
	var stepErr error
	stepped := false
	f := func(queue, rid string, p part) {
		if queue != q || rid != id || !p.old || stepped {
			return
		}
		// The drain step: pointer and placeholder in the new span, take.
		stepped = true
		peek, err := b.moveCall(ctx, o, "peekids", id).Slice()
		if err == nil {
			ms, err = b.reserveAndTake(ctx, l, o, peek)
		}
		stepErr = err
	}
	beforeRemove.Store(&f)
	t.Cleanup(func() { beforeRemove.Store(nil) })
	derr := b.Delete(ctx, q, id)
	beforeRemove.Store(nil)
	if stepErr != nil || !stepped || len(ms) != 1 {
		t.Fatalf("drain step: took %d, %v (ran: %v)", len(ms), stepErr, stepped)
	}
	if derr != nil {
		t.Fatalf("Delete: %v", derr)
	}
	// An enqueue of the ID before the step places what it took.
	if err := enqueue(away, "again"); err != nil {
		t.Fatalf("Enqueue into %s: %v", away, err)
	}
	if err := b.place(ctx, l, o, ms); err != nil {
		t.Fatal(err)
	}
	if err := b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	recs, ptrs := newSpanIndex(t, b, l, q, id)
	if gp := broker.Partition(away, 3); len(recs) != 1 || recs[0] != gp || len(ptrs) != 1 || ptrs[0].group != away {
		t.Fatalf("records in %v, pointers %+v; want one record in %d and one pointer naming %s", recs, ptrs, gp, away)
	}
	if got, err := b.GetTask(ctx, q, id); err != nil || got.Group != away || string(got.Payload) != "again" {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}
}

// A Replace's move ahead peeks the task in the old span, and the
// repartition moves the task, retires the old partition and finishes (its
// last step drops every placeholder) before the move reserves the task's
// ID in the new span; meanwhile the task ran and is gone. The late move
// must leave no placeholder behind: one left there holds the ID for good
// (an enqueue of the ID into that group is refused, and a lookup by ID
// meets a task that is not there).
func TestFreeIDMoveAheadAfterTheRepartitionFinished(t *testing.T) {
	t.Parallel()
	const id = "order-cancel:42"
	from, _, _ := repartitionGroups(id)
	const q = "latemove"
	ctx := context.Background()
	b, l, enqueue := repartitionStarted(t, q, id, from)
	o, _ := b.oldPartOf(q, l, from)
	peek, err := b.moveCall(ctx, o, "peekids", id).Slice()
	if err != nil || len(peek) != 3 {
		t.Fatalf("peekids: %v, %v", peek, err)
	}
	if err := b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %d tasks, %v", len(ds), err)
	}
	if _, err := b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil {
		t.Fatal(err)
	}
	// The rest of the move ahead: the old partition is retired now.
	if ms, err := b.reserveAndTake(ctx, l, o, peek); err == nil && len(ms) > 0 {
		t.Fatalf("the late move took %d tasks from a retired partition", len(ms))
	}
	recs, ptrs := newSpanIndex(t, b, l, q, id)
	fp := b.partOf(q, l, from)
	left, err := b.rdb.HGet(ctx, fp.k("t"), id).Result()
	if err == nil || len(recs) > 0 {
		t.Fatalf("after the late move: %q in %s's partition; records in %v, pointers %+v", left, from, recs, ptrs)
	}
	if in, _ := b.rdb.SIsMember(ctx, fp.k("reserved"), id).Result(); in {
		t.Fatalf("%s left reserved in %s's partition", id, from)
	}
	if _, err := b.GetTask(ctx, q, id); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("GetTask: %v", err)
	}
	if err := enqueue(from, "again", false); err != nil {
		t.Fatalf("Enqueue into %s after the late move: %v", from, err)
	}
	if got, err := b.GetTask(ctx, q, id); err != nil || string(got.Payload) != "again" {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}
}

// A Delete looks the task up through the claim of a Replace into another
// group of the task's partition (the claim took the pointer's place) and
// deletes the task before the Replace stores its own; the Replace then
// stores and confirms its claim, and only then does the Delete release
// the pointer it came through. The claim's nonce is the new task's
// pointer's by then: released, it would leave the new task with no
// pointer (GetTask, Delete and Replace would not find it). (Not parallel:
// the hooks are global.)
func TestFreeIDDeleteThroughAClaimKeepsTheNewTasksPointer(t *testing.T) {
	const id = "order-cancel:42" // in partition 2; shop-7 and shop-9 in 3
	b := New(redistest.Client(t, redistest.Addr(t)), WithPrefix(redistest.Prefix(t)), WithPartitions(6))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q = "delclaim"
	if err := enqueueOne(ctx, b, q, id, "shop-7", "first", false); err != nil {
		t.Fatal(err)
	}
	claimed, resume := make(chan struct{}), make(chan struct{})
	hold := func(string) error {
		close(claimed)
		<-resume
		return nil
	}
	afterClaim.Store(&hold)
	t.Cleanup(func() { afterClaim.Store(nil); afterRemove.Store(nil) })
	replaced := make(chan error, 1)
	go func() { replaced <- enqueueOne(ctx, b, q, id, "shop-9", "second", true) }()
	<-claimed
	afterClaim.Store(nil)
	var rerr error
	stored := func(string) {
		close(resume)
		rerr = <-replaced
	}
	afterRemove.Store(&stored)
	derr := b.Delete(ctx, q, id)
	afterRemove.Store(nil)
	if derr != nil || rerr != nil {
		t.Fatalf("Delete: %v; Replace: %v", derr, rerr)
	}
	recs, ptrs := newSpanIndex(t, b, layout{cur: span{n: 6}}, q, id)
	if len(recs) != 1 || recs[0] != 3 || len(ptrs) != 1 || ptrs[0].p != 2 || ptrs[0].state != 'k' || ptrs[0].group != "shop-9" {
		t.Fatalf("records in %v, pointers %+v; want the Replace's task in 3 and its pointer in 2", recs, ptrs)
	}
	if got, err := b.GetTask(ctx, q, id); err != nil || got.Group != "shop-9" || string(got.Payload) != "second" {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}
}
