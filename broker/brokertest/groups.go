package brokertest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// groupBrokerTests need only the Broker interface.
var groupBrokerTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker)
}{
	{"GroupIDs", testGroupIDs},
	{"GroupRoundRobin", testGroupRoundRobin},
	{"Replace", testReplace},
}

// groupTests run when the broker implements broker.Admin (they set limits
// or list groups).
var groupTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker, a broker.Admin)
}{
	{"GroupConcurrency", testGroupConcurrency},
	{"GroupRate", testGroupRate},
	{"GroupOrdered", testGroupOrdered},
	{"ThrottleGroup", testThrottleGroup},
	{"GroupsAdmin", testGroupsAdmin},
	{"GroupedTaskOps", testGroupedTaskOps},
	{"GroupSlotOnLeaseExpiry", testGroupSlotOnLeaseExpiry},
	{"GroupLimitsChange", testGroupLimitsChange},
	{"GroupFreeIDs", testGroupFreeIDs},
}

// gmsg returns a pending task of group g whose ID is "<base>{<g>}", the
// form the tide client gives a grouped task with an ID.
func gmsg(queue, base, g string) *tidetype.TaskInfo {
	m := newMsg(queue, base+"{"+g+"}")
	m.Group = g
	return m
}

// gmsgs returns n pending tasks of group g: base-0{g}, base-1{g}, ...
func gmsgs(queue, base, g string, n int) []*tidetype.TaskInfo {
	ms := make([]*tidetype.TaskInfo, n)
	for i := range ms {
		ms[i] = gmsg(queue, fmt.Sprintf("%s-%03d", base, i), g)
	}
	return ms
}

// idsOf returns the task IDs of ds in order.
func idsOf(ds []*broker.Delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.Task.ID
	}
	return ids
}

// byGroup counts ds by group ("" for ungrouped tasks).
func byGroup(ds []*broker.Delivery) map[string]int {
	c := map[string]int{}
	for _, d := range ds {
		c[d.Task.Group]++
	}
	return c
}

// sameGroups returns k group names starting with prefix whose tasks share a
// partition of queue, so that one partition's rotation serves them all
// (every name works on a queue of one partition).
func sameGroups(t *testing.T, b broker.Broker, queue, prefix string, k int) []string {
	t.Helper()
	n := partitions(t, b, queue)
	var gs []string
	for i := 0; len(gs) < k; i++ {
		g := fmt.Sprintf("%s%d", prefix, i)
		if len(gs) == 0 || broker.Partition(g, n) == broker.Partition(gs[0], n) {
			gs = append(gs, g)
		}
	}
	return gs
}

// drainIDs dequeues everything queue hands out now and returns the IDs,
// sorted, with the deliveries by ID.
func drainIDs(t *testing.T, b broker.Broker, queue string) ([]string, map[string]*broker.Delivery) {
	t.Helper()
	ds := drainAll(t, b, queue, time.Minute)
	m := make(map[string]*broker.Delivery, len(ds))
	for _, d := range ds {
		m[d.Task.ID] = d
	}
	return slices.Sorted(slices.Values(idsOf(ds))), m
}

// wantDrain drains queue and fails unless exactly the tasks ids start; it
// returns their deliveries by ID.
func wantDrain(t *testing.T, b broker.Broker, queue, why string, ids ...string) map[string]*broker.Delivery {
	t.Helper()
	got, m := drainIDs(t, b, queue)
	if want := slices.Sorted(slices.Values(ids)); !slices.Equal(got, want) {
		t.Fatalf("%s: Dequeue started %v, want %v", why, got, want)
	}
	return m
}

// isInvalid reports whether an Enqueue of one task was refused with
// ErrInvalidTask, for the call or for the task.
func isInvalid(t *testing.T, b broker.Broker, m *tidetype.TaskInfo) bool {
	t.Helper()
	errs, err := b.Enqueue(t.Context(), []*tidetype.TaskInfo{m}, broker.EnqueueOptions{})
	if err != nil {
		return errors.Is(err, broker.ErrInvalidTask)
	}
	return len(errs) == 1 && errors.Is(errs[0], broker.ErrInvalidTask)
}

// testGroupIDs: a grouped task enqueued without an ID gets one that carries
// its group as hash tag; a grouped task with an ID keeps it; a delivery and
// GetTask show the group; a group key the broker cannot keep is refused
// (IDs without the group's tag: testGroupFreeIDs).
func testGroupIDs(t *testing.T, b broker.Broker) {
	const q = "gids"
	var ms []*tidetype.TaskInfo
	for _, g := range []string{"tenant-a", "tenant-a", "tenant-a", "tenant b/ü"} {
		m := newMsg(q, "")
		m.Group = g
		ms = append(ms, m)
	}
	mine := gmsg(q, "mine", "tenant-a")
	plain := newMsg(q, "")
	enqueue(t, b, append(ms, mine, plain)...)
	seen := map[string]bool{}
	for _, m := range ms {
		if m.ID == "" || seen[m.ID] {
			t.Fatalf("grouped task got ID %q (empty or repeated)", m.ID)
		}
		seen[m.ID] = true
		if tag := broker.HashTag(m.ID); tag != m.Group {
			t.Fatalf("drawn ID %q of group %q has hash tag %q, want the group", m.ID, m.Group, tag)
		}
		if got := get(t, b, q, m.ID); got.Group != m.Group {
			t.Fatalf("GetTask(%s).Group = %q, want %q", m.ID, got.Group, m.Group)
		}
	}
	if mine.ID != "mine{tenant-a}" {
		t.Fatalf("grouped task with ID mine{tenant-a} stored as %q", mine.ID)
	}
	if plain.ID == "" || get(t, b, q, plain.ID).Group != "" {
		t.Fatalf("ungrouped task %q: empty ID or a group", plain.ID)
	}
	want := map[string]string{mine.ID: "tenant-a", plain.ID: ""}
	for _, m := range ms {
		want[m.ID] = m.Group
	}
	ds := drainAll(t, b, q, time.Minute)
	if len(ds) != len(want) {
		t.Fatalf("Dequeue started %d tasks, want %d", len(ds), len(want))
	}
	for _, d := range ds {
		if g, ok := want[d.Task.ID]; !ok || d.Task.Group != g {
			t.Fatalf("delivery %q has group %q, want %q (known %v)", d.Task.ID, d.Task.Group, g, ok)
		}
	}
	bad := []*tidetype.TaskInfo{gmsg(q, "x", "a{b"), gmsg(q, "y", "tab\t"), gmsg(q, "z", string(make([]byte, broker.MaxGroupLen+1)))}
	for _, m := range bad {
		if !isInvalid(t, b, m) {
			t.Errorf("Enqueue of ID %q with group %q: want ErrInvalidTask", m.ID, m.Group)
		}
	}
}

// testGroupRoundRobin: ready tasks are served by group round-robin, the
// ungrouped ones as one more group; within a group in enqueue order, also
// for a task that became due after later ones were ready.
func testGroupRoundRobin(t *testing.T, b broker.Broker) {
	t.Run("Groups", func(t *testing.T) {
		const q = "rr"
		gs := sameGroups(t, b, q, "g", 2)
		big, small := gmsgs(q, "big", gs[0], 500), gmsgs(q, "small", gs[1], 5)
		for i := 0; i < len(big); i += 100 {
			enqueue(t, b, big[i:i+100]...)
		}
		enqueue(t, b, small...)
		var order []string
		for range 10 { // two lanes: each small task within two dequeues
			order = append(order, dequeueOne(t, b, q, time.Minute).Task.ID)
		}
		var gotSmall, gotBig []string
		for _, id := range order {
			if broker.HashTag(id) == gs[1] {
				gotSmall = append(gotSmall, id)
			} else {
				gotBig = append(gotBig, id)
			}
		}
		if want := idsOfMsgs(small); !slices.Equal(gotSmall, want) {
			t.Fatalf("the first 10 dequeues (behind 500 tasks of another group) started %v of the small group, want all of %v in order; order %v", gotSmall, want, order)
		}
		if want := idsOfMsgs(big[:len(gotBig)]); !slices.Equal(gotBig, want) {
			t.Fatalf("the big group's tasks started as %v, want enqueue order %v", gotBig, want)
		}
	})
	t.Run("Ungrouped", func(t *testing.T) {
		const q = "rr-plain"
		g := sameGroups(t, b, q, "g", 1)[0]
		enqueue(t, b, gmsgs(q, "big", g, 100)...)
		var plain []string
		for i := range 3 {
			m := newMsg(q, uniqueID(t, b, q, fmt.Sprint("plain", i), g))
			enqueue(t, b, m)
			plain = append(plain, m.ID)
		}
		var order, gotPlain []string
		for range 6 {
			id := dequeueOne(t, b, q, time.Minute).Task.ID
			order = append(order, id)
			if slices.Contains(plain, id) {
				gotPlain = append(gotPlain, id)
			}
		}
		if !slices.Equal(gotPlain, plain) {
			t.Fatalf("the first 6 dequeues (behind 100 grouped tasks) started %v of the ungrouped tasks, want all of %v in order; order %v", gotPlain, plain, order)
		}
	})
	t.Run("DueLater", func(t *testing.T) {
		const q = "rr-due"
		late := gmsg(q, "a-late", "g")
		late.State, late.NextProcessAt = tidetype.StateScheduled, time.Now().Add(200*time.Millisecond)
		enqueue(t, b, late)
		rest := gmsgs(q, "b-ready", "g", 2)
		enqueue(t, b, rest...)
		awaitState(t, b, q, late.ID, tidetype.StatePending)
		for _, want := range append([]string{late.ID}, idsOfMsgs(rest)...) {
			if got := dequeueOne(t, b, q, time.Minute).Task.ID; got != want {
				t.Fatalf("dequeued %q, want %q: a group's ready tasks start in enqueue order", got, want)
			}
		}
	})
}

func idsOfMsgs(ms []*tidetype.TaskInfo) []string {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

// testGroupConcurrency: no more than GroupConcurrency tasks of a group are
// active; other groups and ungrouped tasks keep running; a task leaving
// active (done, retry, requeue) gives its group a slot back.
func testGroupConcurrency(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "gconc"
	setLimits(t, a, q, tidetype.QueueLimits{GroupConcurrency: 2})
	enqueue(t, b, gmsgs(q, "a", "A", 5)...)
	enqueue(t, b, gmsgs(q, "b", "B", 5)...)
	for i := range 4 {
		enqueue(t, b, newMsg(q, fmt.Sprint("plain-", i)))
	}
	got := drainAll(t, b, q, time.Minute)
	if c := byGroup(got); len(got) != 8 || c["A"] != 2 || c["B"] != 2 || c[""] != 4 {
		t.Fatalf("Dequeue under GroupConcurrency 2 started %v by group, want A:2 B:2 and the 4 ungrouped", c)
	}
	var held []*broker.Delivery
	for _, d := range got {
		if d.Task.Group == "A" {
			held = append(held, d)
		}
	}
	for _, kind := range []broker.SettleKind{broker.SettleDone, broker.SettleRetry, broker.SettleRequeue, broker.SettleArchive} {
		s := outcomeOf(held[0], kind)
		s.RetryAt, s.Err = time.Now().Add(time.Hour), "x"
		settleOK(t, b, s)
		ds := drainAll(t, b, q, time.Minute)
		if len(ds) != 1 || ds[0].Task.Group != "A" {
			t.Fatalf("after a %v settlement of a task of A at its limit, Dequeue started %v, want one task of A", kind, idsOf(ds))
		}
		held = append(held[1:], ds[0])
	}
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("with both groups at their limit Dequeue started %v", idsOf(ds))
	}
}

// testGroupRate: a group starts at most GroupRate.Limit tasks in any window
// of GroupRate.Per; another group runs meanwhile; all start in the end.
func testGroupRate(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "grate"
	const limit, per = 2, 300 * time.Millisecond
	setLimits(t, a, q, tidetype.QueueLimits{GroupRate: tidetype.Rate{Limit: limit, Per: per}})
	enqueue(t, b, gmsgs(q, "a", "A", 6)...)
	type start struct{ begin, end time.Time }
	var starts []start
	take := func(ds []*broker.Delivery, begin time.Time) {
		end := time.Now()
		for _, d := range ds {
			if d.Task.Group == "A" {
				starts = append(starts, start{begin, end})
			}
		}
	}
	begin := time.Now()
	first := drainAll(t, b, q, time.Minute)
	take(first, begin)
	if len(first) < limit || len(first) > limit && time.Since(begin) < per {
		t.Fatalf("Dequeue under GroupRate %d/%v started %d tasks of the group", limit, per, len(first))
	}
	enqueue(t, b, gmsgs(q, "b", "B", 2)...)
	begin2 := time.Now()
	ds := drainAll(t, b, q, time.Minute)
	take(ds, begin2)
	if byGroup(ds)["B"] != 2 {
		t.Fatalf("with group A over its rate Dequeue started %v, want both tasks of B", idsOf(ds))
	}
	eventually(t, waitLong, "all tasks of the rate-limited group to start", func() bool {
		begin := time.Now()
		take(dequeue(t, b, []string{q}, 10, time.Minute), begin)
		return len(starts) == 6
	})
	for k := limit; k < len(starts); k++ {
		// The broker started task k at most at its call's end and task
		// k-limit at least at its call's begin.
		if d := starts[k].end.Sub(starts[k-limit].begin); d < per-time.Millisecond {
			t.Fatalf("start %d came within %v of start %d, under GroupRate %d/%v", k, d, k-limit, limit, per)
		}
	}
}

// testGroupOrdered: with Ordered, a group's tasks start one at a time in
// enqueue order, the next only when the previous finished; a task waiting
// in retry or deferred keeps its group's place; a requeued one starts
// again first; a deleted one frees the place.
func testGroupOrdered(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "gord"
	setLimits(t, a, q, tidetype.QueueLimits{Ordered: true})
	as := idsOfMsgs(gmsgs(q, "a", "A", 5))
	bs := idsOfMsgs(gmsgs(q, "b", "B", 2))
	enqueue(t, b, gmsgs(q, "a", "A", 5)...)
	enqueue(t, b, gmsgs(q, "b", "B", 2)...)
	ds := wantDrain(t, b, q, "ordered groups", as[0], bs[0])
	settleOK(t, b, outcomeOf(ds[bs[0]], broker.SettleDone))
	settleOK(t, b, outcomeOf(wantDrain(t, b, q, "after B's first finished", bs[1])[bs[1]], broker.SettleDone))

	// A retry holds the place until the task ran again and finished.
	settleOK(t, b, retryOf(ds[as[0]], time.Now().Add(time.Hour), "boom"))
	wantDrain(t, b, q, "with A's first task waiting in retry")
	run := func(id string) *broker.Delivery {
		t.Helper()
		if err := a.RunTask(t.Context(), q, id); err != nil {
			t.Fatalf("RunTask(%s): %v", id, err)
		}
		return wantDrain(t, b, q, "after RunTask of the task holding the place", id)[id]
	}
	settleOK(t, b, outcomeOf(run(as[0]), broker.SettleDone))
	// An archive finishes the task: the next starts.
	s := outcomeOf(wantDrain(t, b, q, "after A's first finished", as[1])[as[1]], broker.SettleArchive)
	s.Err = "bad"
	settleOK(t, b, s)
	// A deferral holds the place; a requeue starts the task again first.
	d := wantDrain(t, b, q, "after A's second was archived", as[2])[as[2]]
	s = outcomeOf(d, broker.SettleDefer)
	s.RetryAt, s.Err = time.Now().Add(time.Hour), "later"
	settleOK(t, b, s)
	wantDrain(t, b, q, "with A's third task deferred")
	settleOK(t, b, outcomeOf(run(as[2]), broker.SettleRequeue))
	d = wantDrain(t, b, q, "after A's third was requeued", as[2])[as[2]]
	settleOK(t, b, outcomeOf(d, broker.SettleDone))
	// Deleting the task that holds the place frees it.
	settleOK(t, b, retryOf(wantDrain(t, b, q, "after A's third finished", as[3])[as[3]], time.Now().Add(time.Hour), "boom"))
	wantDrain(t, b, q, "with A's fourth task waiting in retry")
	if err := b.Delete(t.Context(), q, as[3]); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	settleOK(t, b, outcomeOf(wantDrain(t, b, q, "after A's fourth was deleted", as[4])[as[4]], broker.SettleDone))
	wantDrain(t, b, q, "with every task finished")
}

// testThrottleGroup: a deferral with Throttle puts the task in retry and
// holds its whole group back until RetryAt, which Groups reports; other
// groups and ungrouped tasks run; an ungrouped task's Throttle is ignored.
func testThrottleGroup(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "gthrottle"
	a1 := gmsg(q, "a1", "A")
	enqueue(t, b, a1)
	d := dequeueOne(t, b, q, time.Minute)
	until := msTrunc(time.Now().Add(time.Hour))
	s := outcomeOf(d, broker.SettleDefer)
	s.RetryAt, s.Err, s.Throttle = until, "slow down", true
	settleOK(t, b, s)
	if got := get(t, b, q, a1.ID); got.State != tidetype.StateRetry || got.Retried != 0 || !sameTime(got.NextProcessAt, until) {
		t.Fatalf("throttled task: State %v Retried %d ProcessAt %v; want retry, 0, %v", got.State, got.Retried, got.NextProcessAt, until)
	}
	rest := gmsgs(q, "a", "A", 2)
	b1, u1 := gmsg(q, "b1", "B"), newMsg(q, "u1")
	enqueue(t, b, append(rest, b1, u1)...)
	wantDrain(t, b, q, "with group A throttled", b1.ID, u1.ID)
	gs, err := a.Groups(t.Context(), q, 10)
	if err != nil {
		t.Fatalf("Groups: %v", err)
	}
	i := slices.IndexFunc(gs, func(g tidetype.GroupInfo) bool { return g.Group == "A" })
	if i < 0 || gs[i].Waiting != 2 || gs[i].Running != 0 || !sameTime(gs[i].ThrottledUntil, until) {
		t.Fatalf("Groups = %+v, want A with 2 waiting, none running, throttled until %v", gs, until)
	}

	t.Run("Ends", func(t *testing.T) {
		const q = "gthrottle-ends"
		c1 := gmsg(q, "c1", "C")
		enqueue(t, b, c1)
		d := dequeueOne(t, b, q, time.Minute)
		due := msTrunc(time.Now().Add(300 * time.Millisecond))
		s := outcomeOf(d, broker.SettleDefer)
		s.RetryAt, s.Throttle = due, true
		settleOK(t, b, s)
		enqueue(t, b, gmsg(q, "c2", "C"))
		eventually(t, waitLong, "the throttled group to start again", func() bool {
			maintain(t, b, q)
			ds := dequeue(t, b, []string{q}, 1, time.Minute)
			if len(ds) > 0 && time.Now().Before(due) {
				t.Fatalf("task %q of a group throttled until %v started before", ds[0].Task.ID, due)
			}
			return len(ds) > 0
		})
	})
	t.Run("Ungrouped", func(t *testing.T) {
		const q = "gthrottle-plain"
		enqueue(t, b, newMsg(q, "p1"))
		s := outcomeOf(dequeueOne(t, b, q, time.Minute), broker.SettleDefer)
		s.RetryAt, s.Throttle = time.Now().Add(time.Hour), true
		settleOK(t, b, s)
		enqueue(t, b, newMsg(q, "p2"))
		wantDrain(t, b, q, "after an ungrouped task deferred with Throttle", "p2")
	})
}
