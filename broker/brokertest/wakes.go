package brokertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// wakeTests run when the broker implements broker.Admin. They check that
// every change that lets a waiting task start tells idle servers
// (EventPending), so that no server waits for its periodic maintenance to
// find the task.
var wakeTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker, a broker.Admin)
}{
	{"WakeSlotFreedGrouped", testWakeSlotFreedGrouped},
	{"WakeSlotRecovered", testWakeSlotRecovered},
	{"WakeOrderedHolderRemoved", testWakeOrderedHolderRemoved},
	{"BlockedGroupsSkipped", testBlockedGroupsSkipped},
}

// groupPerPartition returns one group name per partition of queue, the
// group of partition p at index p.
func groupPerPartition(t *testing.T, b broker.Broker, queue, prefix string) []string {
	t.Helper()
	n := partitions(t, b, queue)
	gs := make([]string, n)
	for i, found := 0, 0; found < n; i++ {
		g := fmt.Sprintf("%s%d", prefix, i)
		if p := broker.Partition(g, n); gs[p] == "" {
			gs[p] = g
			found++
		}
	}
	return gs
}

// subscribed subscribes to queue; the subscription ends with the test.
func subscribed(t *testing.T, b broker.Broker, queue string) <-chan broker.Event {
	t.Helper()
	ch, err := b.Subscribe(t.Context(), []string{queue})
	if err != nil {
		t.Fatalf("Subscribe(%s): %v", queue, err)
	}
	return ch
}

// awaitPending fails the test unless an EventPending of queue (announcing
// work now, not at a later time) arrives on ch within waitLong.
func awaitPending(t *testing.T, ch <-chan broker.Event, queue, after string) {
	t.Helper()
	if !awaitEvent(t, ch, waitLong, func(e broker.Event) bool {
		return e.Kind == broker.EventPending && e.Queue == queue && !e.At.After(time.Now())
	}) {
		t.Fatalf("no pending event after %s: idle servers would wait for maintenance", after)
	}
}

// testWakeSlotFreedGrouped: at the queue's Concurrency, with only grouped
// tasks waiting, a settlement that frees a slot announces pending work, and
// the next Dequeue starts a waiting task.
func testWakeSlotFreedGrouped(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "wake-grouped"
	xs, ys := groupPerPartition(t, b, q, "x"), groupPerPartition(t, b, q, "y")
	n := len(xs)
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n})
	for _, g := range xs {
		enqueue(t, b, gmsg(q, "run", g))
	}
	running := drainAll(t, b, q, time.Minute)
	if len(running) != n {
		t.Fatalf("Dequeue under Concurrency %d started %d", n, len(running))
	}
	for _, g := range ys {
		enqueue(t, b, gmsgs(q, "wait", g, 2)...)
	}
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue at the limit started %v", idsOf(ds))
	}
	ch := subscribed(t, b, q)
	settleOK(t, b, outcomeOf(running[0], broker.SettleDone))
	awaitPending(t, ch, q, "a settlement freed a slot of a full queue with grouped tasks waiting")
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 1 || ds[0].Task.Group != ys[broker.Partition(running[0].Task.Group, n)] {
		t.Fatalf("after the slot was freed Dequeue started %v, want one task of the waiting group of its partition", idsOf(ds))
	}
}

// testWakeSlotRecovered: at the queue's Concurrency, the recovery of an
// expired lease frees a slot and announces pending work, for ungrouped and
// for grouped tasks waiting.
func testWakeSlotRecovered(t *testing.T, b broker.Broker, a broker.Admin) {
	for _, grouped := range []bool{false, true} {
		t.Run(map[bool]string{false: "Ungrouped", true: "Grouped"}[grouped], func(t *testing.T) {
			q := fmt.Sprintf("wake-recovered-%v", grouped)
			xs, ys := groupPerPartition(t, b, q, "x"), groupPerPartition(t, b, q, "y")
			n := len(xs)
			setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n})
			for _, g := range xs {
				m := gmsg(q, "run", g)
				m.MaxRetry = 0 // archived when its lease expires: only the freed slot can wake anyone
				if !grouped {
					m.Group = ""
				}
				enqueue(t, b, m)
			}
			if got := drainAll(t, b, q, 100*time.Millisecond); len(got) != n {
				t.Fatalf("Dequeue under Concurrency %d started %d", n, len(got))
			}
			for _, g := range ys {
				ms := gmsgs(q, "wait", g, 2)
				if !grouped {
					for _, m := range ms {
						m.Group = ""
					}
				}
				enqueue(t, b, ms...)
			}
			ch := subscribed(t, b, q)
			awaitRecovered(t, b, q, n)
			awaitPending(t, ch, q, "lease recovery freed the slots of a full queue with tasks waiting")
			if ds := drainAll(t, b, q, time.Minute); len(ds) != n {
				t.Fatalf("after the slots were recovered Dequeue started %v, want %d", idsOf(ds), n)
			}
		})
	}
}

// testWakeOrderedHolderRemoved: deleting or cancelling the task that holds
// an ordered group's place while it waits in retry (one at a time, or in
// bulk with Admin.DeleteTasks) frees the place and announces pending work:
// the group's next task starts.
func testWakeOrderedHolderRemoved(t *testing.T, b broker.Broker, a broker.Admin) {
	for _, how := range []string{"Delete", "Cancel", "DeleteTasks"} {
		t.Run(how, func(t *testing.T) {
			q := "wake-holder-" + how
			setLimits(t, a, q, tidetype.QueueLimits{Ordered: true})
			ms := gmsgs(q, "a", "A", 2)
			enqueue(t, b, ms...)
			settleOK(t, b, retryOf(dequeueOne(t, b, q, time.Minute), time.Now().Add(time.Hour), "boom"))
			wantDrain(t, b, q, "with the holder of the group's place waiting in retry")
			ch := subscribed(t, b, q)
			var err error
			switch how {
			case "Delete":
				err = b.Delete(t.Context(), q, ms[0].ID)
			case "Cancel":
				err = b.Cancel(t.Context(), q, ms[0].ID)
			default:
				var n int
				if n, err = a.DeleteTasks(t.Context(), q, tidetype.StateRetry, 10); err == nil && n != 1 {
					t.Fatalf("DeleteTasks(retry) deleted %d tasks, want 1", n)
				}
			}
			if err != nil {
				t.Fatalf("%s of the holder: %v", how, err)
			}
			awaitPending(t, ch, q, how+" of the task holding an ordered group's place")
			wantDrain(t, b, q, "after the holder was removed", ms[1].ID)
		})
	}
}

// testBlockedGroupsSkipped: hundreds of groups that may not start a task
// (an ordered group whose earlier task runs, a group at GroupConcurrency),
// each with a task waiting, do not hide a group that may: one Dequeue of
// one task starts it. A blocked group that is let go (its running task
// ends) is announced and starts its next task.
func testBlockedGroupsSkipped(t *testing.T, b broker.Broker, a broker.Admin) {
	for _, lim := range []tidetype.QueueLimits{{Ordered: true}, {GroupConcurrency: 1}} {
		name := "Ordered"
		if !lim.Ordered {
			name = "GroupConcurrency"
		}
		t.Run(name, func(t *testing.T) {
			q := "blocked-" + name
			const blocked = 300
			gs := sameGroups(t, b, q, "g", blocked+1)
			setLimits(t, a, q, lim)
			var firsts, seconds []*tidetype.TaskInfo
			for _, g := range gs[:blocked] {
				firsts = append(firsts, gmsg(q, "a", g))
				seconds = append(seconds, gmsg(q, "b", g))
			}
			enqueue(t, b, firsts...)
			running := drainAll(t, b, q, time.Minute)
			if len(running) != blocked {
				t.Fatalf("Dequeue started %d of the %d groups' first tasks", len(running), blocked)
			}
			enqueue(t, b, seconds...)
			free := gmsg(q, "free", gs[blocked])
			enqueue(t, b, free)
			ds := dequeue(t, b, []string{q}, 1, time.Minute)
			if len(ds) != 1 || ds[0].Task.ID != free.ID {
				t.Fatalf("with %d blocked groups ahead of it, Dequeue(1) started %v, want %s", blocked, idsOf(ds), free.ID)
			}
			if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
				t.Fatalf("with every group blocked Dequeue started %v", idsOf(ds))
			}
			ch := subscribed(t, b, q)
			settleOK(t, b, outcomeOf(running[blocked/2], broker.SettleDone))
			awaitPending(t, ch, q, "a blocked group's running task ended")
			want := "b{" + running[blocked/2].Task.Group + "}"
			if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 1 || ds[0].Task.ID != want {
				t.Fatalf("after a blocked group's running task ended Dequeue started %v, want %s", idsOf(ds), want)
			}
		})
	}
}
