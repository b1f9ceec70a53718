package brokertest

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// freeMsg returns a pending task of group g with the ID id as given, no
// group tag added.
func freeMsg(queue, id, g string) *tidetype.TaskInfo {
	m := newMsg(queue, id)
	m.Group = g
	return m
}

// groupBeside returns a group name in the same partition as group g on a
// queue of n partitions: "<base>", else "<base>-<k>" for the first k that
// fits.
func groupBeside(g, base string, n int) string {
	name := base
	for k := 1; broker.Partition(name, n) != broker.Partition(g, n); k++ {
		name = base + "-" + strconv.Itoa(k)
	}
	return name
}

// groupAway returns a group name in another partition than group g on a
// queue of n > 1 partitions.
func groupAway(g, base string, n int) string {
	name := base
	for k := 1; broker.Partition(name, n) == broker.Partition(g, n); k++ {
		name = base + "-" + strconv.Itoa(k)
	}
	return name
}

// testGroupFreeIDs: on a queue of any partition count a grouped task keeps
// the ID its caller chose, without the group's tag ("order-cancel:42" in
// group "shop-7"), and is found, deleted, cancelled, archived, run and
// replaced by it; the ID is the queue's, whatever the group: a task of
// another group or an ungrouped one with that ID is an ID conflict; Replace
// moves the task to another group, where it is a new task (after that
// group's others), and frees an ordered group's place it held, also into
// a group of another partition. A tagged ID works on any queue.
func testGroupFreeIDs(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := t.Context()
	t.Run("IDs", func(t *testing.T) {
		const q = "free"
		n := partitions(t, b, q)
		shop8 := groupBeside("shop-7", "shop-8", n)
		c42, c43, c44 := freeMsg(q, "order-cancel:42", "shop-7"), freeMsg(q, "order-cancel:43", "shop-7"), freeMsg(q, "order-cancel:44", shop8)
		legacy := freeMsg(q, "order-cancel:45{shop-7}", "shop-7")
		odd := freeMsg(q, "x{shop-9}", "shop-7") // another group's tag is just part of the ID
		plain := newMsg(q, "plain-1")
		enqueue(t, b, c44, c42, c43, legacy, odd, plain)
		for _, m := range []*tidetype.TaskInfo{c42, c43, c44, legacy, odd, plain} {
			if got := get(t, b, q, m.ID); got.Group != m.Group || got.State != tidetype.StatePending {
				t.Fatalf("GetTask(%s): group %q state %v, want %q pending", m.ID, got.Group, got.State, m.Group)
			}
		}
		// One ID, one task of the queue, whatever the group.
		for _, m := range []*tidetype.TaskInfo{freeMsg(q, c42.ID, shop8), freeMsg(q, c42.ID, "shop-9"), newMsg(q, c42.ID), freeMsg(q, plain.ID, "shop-7"), freeMsg(q, legacy.ID, shop8)} {
			if errs := enqueueErrs(t, b, m); !errors.Is(errs[0], broker.ErrTaskIDConflict) {
				t.Fatalf("Enqueue of %q in group %q over a task of group %q: %v, want ErrTaskIDConflict", m.ID, m.Group, get(t, b, q, m.ID).Group, errs[0])
			}
		}
		if got := get(t, b, q, c42.ID); got.Group != "shop-7" {
			t.Fatalf("refused enqueues changed %s's group to %q", c42.ID, got.Group)
		}
		// Deleted, then re-created in another group.
		if err := b.Delete(ctx, q, c43.ID); err != nil {
			t.Fatalf("Delete(%s): %v", c43.ID, err)
		}
		if _, err := b.GetTask(ctx, q, c43.ID); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("GetTask after Delete: %v, want ErrTaskNotFound", err)
		}
		c43 = freeMsg(q, c43.ID, shop8)
		enqueue(t, b, c43)
		if n > 1 {
			// Into a group of another partition, and on (below) into one
			// beside its first group's again.
			away := freeMsg(q, c42.ID, groupAway("shop-7", "shop-10", n))
			if err := enqueueReplace(t, b, away); err != nil {
				t.Fatalf("Replace of %s into group %q of another partition: %v", c42.ID, away.Group, err)
			}
			if got := get(t, b, q, c42.ID); got.Group != away.Group || got.State != tidetype.StatePending {
				t.Fatalf("GetTask(%s) after its Replace into %q: group %q state %v", c42.ID, away.Group, got.Group, got.State)
			}
		}
		// Replace moves a waiting task to another group, at its back.
		r := replacement(freeMsg(q, c42.ID, shop8))
		if err := enqueueReplace(t, b, r); err != nil {
			t.Fatalf("Replace of %s into another group: %v", c42.ID, err)
		}
		checkReplaced(t, b, r, tidetype.StatePending)
		if err := b.Cancel(ctx, q, odd.ID); err != nil {
			t.Fatalf("Cancel(%s): %v", odd.ID, err)
		}
		var started []string
		ds := map[string]*broker.Delivery{}
		for range 5 { // c44, c43, c42 of shop-8; legacy of shop-7; plain
			d := dequeueOne(t, b, q, time.Minute)
			ds[d.Task.ID] = d
			want := map[string]string{c42.ID: shop8, c43.ID: shop8, c44.ID: shop8, legacy.ID: "shop-7", plain.ID: ""}
			if g, ok := want[d.Task.ID]; !ok || g != d.Task.Group {
				t.Fatalf("delivery %q of group %q, want one of %v", d.Task.ID, d.Task.Group, want)
			}
			if d.Task.Group == shop8 {
				started = append(started, d.Task.ID)
			}
		}
		if want := []string{c44.ID, c43.ID, c42.ID}; len(started) != 3 || started[0] != want[0] || started[1] != want[1] || started[2] != want[2] {
			t.Fatalf("%s started %v, want %v (enqueue order; the task moved in last)", shop8, started, want)
		}
		// Cancel of a running task by its ID; then archive and run again.
		d := ds[c42.ID]
		if err := b.Cancel(ctx, q, c42.ID); err != nil {
			t.Fatalf("Cancel of running %s: %v", c42.ID, err)
		}
		settleOK(t, b, retryOf(d, time.Now(), "stopped"))
		if got := get(t, b, q, c42.ID); got.State != tidetype.StateArchived || got.Group != shop8 {
			t.Fatalf("cancelled %s is %v in %q, want archived in %s", c42.ID, got.State, got.Group, shop8)
		}
		if err := a.RunTask(ctx, q, c42.ID); err != nil {
			t.Fatalf("RunTask(%s): %v", c42.ID, err)
		}
		if d := dequeueOne(t, b, q, time.Minute); d.Task.ID != c42.ID || d.Task.Group != shop8 {
			t.Fatalf("after RunTask started %q of %q, want %s of %s", d.Task.ID, d.Task.Group, c42.ID, shop8)
		} else {
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
		}
		settleOK(t, b, retryOf(ds[c44.ID], time.Now().Add(time.Hour), "later"))
		if err := a.ArchiveTask(ctx, q, c44.ID); err != nil {
			t.Fatalf("ArchiveTask(%s): %v", c44.ID, err)
		}
		if got := get(t, b, q, c44.ID); got.State != tidetype.StateArchived || got.Group != shop8 {
			t.Fatalf("archived %s is %v in %q", c44.ID, got.State, got.Group)
		}
		// The ID is free again once the task is gone.
		if _, err := b.GetTask(ctx, q, c42.ID); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("GetTask of a done task: %v, want ErrTaskNotFound", err)
		}
		enqueue(t, b, freeMsg(q, c42.ID, "shop-9"))
		if got := get(t, b, q, c42.ID); got.Group != "shop-9" {
			t.Fatalf("re-created %s has group %q, want shop-9", c42.ID, got.Group)
		}
	})
	t.Run("MoveFreesOrderedPlace", func(t *testing.T) {
		const q = "free-ordered"
		acct2 := groupBeside("acct-1", "acct-2", partitions(t, b, q))
		setLimits(t, a, q, tidetype.QueueLimits{Ordered: true})
		first, second := freeMsg(q, "first", "acct-1"), freeMsg(q, "second", "acct-1")
		enqueue(t, b, first, second)
		d := dequeueOne(t, b, q, time.Minute)
		if d.Task.ID != first.ID {
			t.Fatalf("started %q, want %q", d.Task.ID, first.ID)
		}
		settleOK(t, b, retryOf(d, time.Now().Add(time.Hour), "later"))
		// first, waiting for its retry, holds acct-1's place.
		if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
			t.Fatalf("started %q while the group's first task waits for its retry", ds[0].Task.ID)
		}
		if err := enqueueReplace(t, b, freeMsg(q, first.ID, acct2)); err != nil {
			t.Fatalf("Replace into another group: %v", err)
		}
		wantDrain(t, b, q, "after the holder of acct-1 moved to acct-2", first.ID, second.ID)
	})
}
