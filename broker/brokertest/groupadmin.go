package brokertest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// groups calls Admin.Groups and fails the test on error.
func groups(t *testing.T, a broker.Admin, queue string, n int) []tidetype.GroupInfo {
	t.Helper()
	gs, err := a.Groups(t.Context(), queue, n)
	if err != nil {
		t.Fatalf("Groups(%s, %d): %v", queue, n, err)
	}
	return gs
}

// testGroupsAdmin: Groups lists the groups with tasks waiting, running or
// throttled, the largest backlogs first (ties by name), at most n of them;
// n out of 1..MaxGroupsListed is refused.
func testGroupsAdmin(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "gadmin"
	d1 := gmsg(q, "d1", "D")
	enqueue(t, b, d1)
	dd := dequeueOne(t, b, q, time.Minute)
	enqueue(t, b, gmsg(q, "e1", "E"))
	s := outcomeOf(dequeueOne(t, b, q, time.Minute), broker.SettleDefer)
	until := msTrunc(time.Now().Add(time.Hour))
	s.RetryAt, s.Throttle = until, true
	settleOK(t, b, s)
	enqueue(t, b, gmsgs(q, "a", "A", 2)...)
	enqueue(t, b, gmsgs(q, "b", "B", 4)...)
	enqueue(t, b, gmsgs(q, "c", "C", 2)...)
	later := gmsg(q, "b-later", "B")
	later.State, later.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
	enqueue(t, b, later, newMsg(q, "u1"), newMsg(q, "u2"))

	want := []tidetype.GroupInfo{
		{Queue: q, Group: "B", Waiting: 4}, {Queue: q, Group: "A", Waiting: 2}, {Queue: q, Group: "C", Waiting: 2},
		{Queue: q, Group: "D", Running: 1}, {Queue: q, Group: "E", ThrottledUntil: until},
	}
	check := func(got, want []tidetype.GroupInfo) {
		t.Helper()
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			g, w := got[i], want[i]
			ok = g.Queue == w.Queue && g.Group == w.Group && g.Waiting == w.Waiting && g.Running == w.Running && sameTime(g.ThrottledUntil, w.ThrottledUntil)
		}
		if !ok {
			t.Fatalf("Groups = %+v\nwant %+v", got, want)
		}
	}
	check(groups(t, a, q, broker.MaxGroupsListed), want)
	check(groups(t, a, q, 2), want[:2])
	for _, n := range []int{0, -1, broker.MaxGroupsListed + 1} {
		if _, err := a.Groups(t.Context(), q, n); !errors.Is(err, broker.ErrInvalidTask) {
			t.Errorf("Groups(n=%d) = %v, want ErrInvalidTask", n, err)
		}
	}
	if gs, err := a.Groups(t.Context(), "never-used", 10); err != nil || len(gs) != 0 {
		t.Fatalf("Groups of an unused queue = %+v, %v; want none", gs, err)
	}
	settleOK(t, b, outcomeOf(dd, broker.SettleDone))
	check(groups(t, a, q, 10), append(want[:3:3], want[4]))
}

// testGroupedTaskOps: GetTask, Delete, Cancel, QueueInfo and ListTasks
// handle grouped tasks like the others.
func testGroupedTaskOps(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "gops"
	ms := gmsgs(q, "g", "G", 3)
	u := newMsg(q, "u1")
	enqueue(t, b, append(ms, u)...)
	pending := func(want int) {
		t.Helper()
		qi, err := a.QueueInfo(t.Context(), q)
		if err != nil || qi.Pending != want {
			t.Fatalf("QueueInfo = %+v, %v; want %d pending", qi, err, want)
		}
		ts, err := a.ListTasks(t.Context(), q, tidetype.StatePending, 0, 100)
		if err != nil || len(ts) != want {
			t.Fatalf("ListTasks(pending) listed %d tasks, %v; want %d", len(ts), err, want)
		}
	}
	pending(4)
	if got := get(t, b, q, ms[0].ID); got.Group != "G" || got.State != tidetype.StatePending {
		t.Fatalf("GetTask of a grouped task: Group %q State %v", got.Group, got.State)
	}
	if err := b.Delete(t.Context(), q, ms[1].ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := b.GetTask(t.Context(), q, ms[1].ID); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("GetTask after Delete: %v, want ErrTaskNotFound", err)
	}
	pending(3)
	if err := b.Cancel(t.Context(), q, ms[2].ID); err != nil {
		t.Fatalf("Cancel of a pending task: %v", err)
	}
	pending(2)
	ds := wantDrain(t, b, q, "after a Delete and a Cancel", ms[0].ID, u.ID)
	d := ds[ms[0].ID]
	if d.Task.Group != "G" {
		t.Fatalf("delivery Group = %q, want G", d.Task.Group)
	}
	pending(0)
	if err := b.Cancel(t.Context(), q, ms[0].ID); err != nil {
		t.Fatalf("Cancel of an active task: %v", err)
	}
	errs, err := b.Extend(t.Context(), []broker.LeaseRef{leaseOf(d)}, time.Minute)
	if err != nil || !errors.Is(errs[0], broker.ErrTaskCanceled) {
		t.Fatalf("Extend of a cancelled task: %v, %v; want ErrTaskCanceled", errs, err)
	}
	settleOK(t, b, retryOf(d, time.Now(), "stopped"))
	if got := get(t, b, q, ms[0].ID); got.State != tidetype.StateArchived {
		t.Fatalf("cancelled task settled for retry is %v, want archived", got.State)
	}
	if gs := groups(t, a, q, 10); len(gs) != 0 {
		t.Fatalf("Groups with no grouped task left waiting or running = %+v", gs)
	}
}

// testGroupSlotOnLeaseExpiry: a grouped task whose lease expires gives its
// group's slot back once recovered; in an ordered group it keeps the place
// while it waits to be retried and frees it when archived.
func testGroupSlotOnLeaseExpiry(t *testing.T, b broker.Broker, a broker.Admin) {
	const lease = 100 * time.Millisecond
	t.Run("Concurrency", func(t *testing.T) {
		const q = "gexp"
		setLimits(t, a, q, tidetype.QueueLimits{GroupConcurrency: 1})
		enqueue(t, b, gmsgs(q, "a", "A", 2)...)
		if ds := drainAll(t, b, q, lease); len(ds) != 1 {
			t.Fatalf("Dequeue under GroupConcurrency 1 started %v", idsOf(ds))
		}
		if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
			t.Fatalf("Dequeue with the group's slot taken started %v", idsOf(ds))
		}
		awaitRecovered(t, b, q, 1)
		if d := redeliver(t, b, q, time.Minute); d.Task.Group != "A" {
			t.Fatalf("redelivered %q of group %q", d.Task.ID, d.Task.Group)
		}
	})
	t.Run("OrderedRetry", func(t *testing.T) {
		const q = "gexp-retry"
		setLimits(t, a, q, tidetype.QueueLimits{Ordered: true})
		ms := gmsgs(q, "a", "A", 2)
		enqueue(t, b, ms...)
		wantDrainLease(t, b, q, lease, ms[0].ID)
		awaitRecovered(t, b, q, 1)
		if d := redeliver(t, b, q, time.Minute); d.Task.ID != ms[0].ID {
			t.Fatalf("after the recovery of %s, which holds its ordered group's place, %s started", ms[0].ID, d.Task.ID)
		}
	})
	t.Run("OrderedArchive", func(t *testing.T) {
		const q = "gexp-archive"
		setLimits(t, a, q, tidetype.QueueLimits{Ordered: true})
		ms := gmsgs(q, "a", "A", 2)
		ms[0].MaxRetry = 0
		enqueue(t, b, ms...)
		wantDrainLease(t, b, q, lease, ms[0].ID)
		awaitRecovered(t, b, q, 1)
		if st := get(t, b, q, ms[0].ID).State; st != tidetype.StateArchived {
			t.Fatalf("recovered task without retries left is %v, want archived", st)
		}
		if d := redeliver(t, b, q, time.Minute); d.Task.ID != ms[1].ID {
			t.Fatalf("after the archive of %s, %s started; want %s", ms[0].ID, d.Task.ID, ms[1].ID)
		}
	})
}

// wantDrainLease is wantDrain with a lease of d.
func wantDrainLease(t *testing.T, b broker.Broker, queue string, d time.Duration, ids ...string) {
	t.Helper()
	got := slices.Sorted(slices.Values(idsOf(drainAll(t, b, queue, d))))
	if want := slices.Sorted(slices.Values(ids)); !slices.Equal(got, want) {
		t.Fatalf("Dequeue started %v, want %v", got, want)
	}
}

// testGroupLimitsChange: the group limits round-trip, nonsensical ones are
// refused, and a change applies from the next Dequeue on.
func testGroupLimitsChange(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "gchange"
	setLimits(t, a, q, tidetype.QueueLimits{GroupConcurrency: 3, GroupRate: tidetype.Rate{Limit: 5, Per: 2 * time.Second}, Ordered: true})
	grate := func(limit int, per time.Duration) tidetype.QueueLimits {
		return tidetype.QueueLimits{GroupRate: tidetype.Rate{Limit: limit, Per: per}}
	}
	for _, l := range []tidetype.QueueLimits{
		{GroupConcurrency: -1}, {GroupConcurrency: broker.MaxQueueConcurrency + 1},
		grate(-1, time.Second), grate(broker.MaxGroupRate+1, time.Second), grate(1, 0), grate(0, time.Second),
		grate(1, 1500*time.Microsecond), grate(1, broker.MaxRatePer+time.Millisecond),
	} {
		if err := a.SetQueueLimits(t.Context(), q, l); !errors.Is(err, broker.ErrInvalidTask) {
			t.Errorf("SetQueueLimits(%+v) = %v, want ErrInvalidTask", l, err)
		}
	}
	setLimits(t, a, q, tidetype.QueueLimits{GroupConcurrency: 1})
	enqueue(t, b, gmsgs(q, "a", "A", 6)...)
	count := func(why string, want int) []*broker.Delivery {
		t.Helper()
		ds := drainAll(t, b, q, time.Minute)
		if len(ds) != want {
			t.Fatalf("%s: Dequeue started %v, want %d", why, idsOf(ds), want)
		}
		return ds
	}
	running := count("GroupConcurrency 1", 1)
	setLimits(t, a, q, tidetype.QueueLimits{GroupConcurrency: 3})
	running = append(running, count("raised to 3", 2)...)
	setLimits(t, a, q, tidetype.QueueLimits{GroupConcurrency: 1})
	for _, d := range running[:2] {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
		count("lowered to 1 with tasks still running", 0)
	}
	settleOK(t, b, outcomeOf(running[2], broker.SettleDone))
	last := count("lowered to 1 with none running", 1)[0]
	settleOK(t, b, outcomeOf(last, broker.SettleDone))
	setLimits(t, a, q, tidetype.QueueLimits{Ordered: true})
	first := count("ordered", 1)[0]
	setLimits(t, a, q, tidetype.QueueLimits{})
	count("without limits", 1)
	settleOK(t, b, outcomeOf(first, broker.SettleDone))
	// A queue no longer ordered runs the tasks of a group whose place a
	// task waiting to be retried held.
	enqueue(t, b, gmsgs(q, "c", "C", 2)...)
	setLimits(t, a, q, tidetype.QueueLimits{Ordered: true})
	settleOK(t, b, retryOf(count("C ordered", 1)[0], time.Now().Add(time.Hour), "boom"))
	count("C ordered, its first task waiting in retry", 0)
	setLimits(t, a, q, tidetype.QueueLimits{})
	settleOK(t, b, outcomeOf(count("C no longer ordered, its first task waiting in retry", 1)[0], broker.SettleDone))

	// A group rate counts the starts made before it changed.
	enqueue(t, b, gmsgs(q, "b", "B", 4)...)
	setLimits(t, a, q, grate(1, time.Hour))
	count("GroupRate 1/h", 1)
	setLimits(t, a, q, grate(3, time.Hour))
	count("GroupRate raised to 3/h", 2)
	setLimits(t, a, q, tidetype.QueueLimits{})
	count("without limits", 1)
}
