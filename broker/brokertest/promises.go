package brokertest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// promiseTests run when the broker implements broker.Admin. They check
// promises of flow control that hold across changes: a replaced task's
// place, a rate's memory of earlier starts, limits across DeleteQueue, a
// throttle's end on the broker's clock.
var promiseTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker, a broker.Admin)
}{
	{"ReplaceFinishedTakesNewPlace", testReplaceFinishedTakesNewPlace},
	{"RateRemembersStarts", testRateRemembersStarts},
	{"DeleteQueueKeepsLimits", testDeleteQueueKeepsLimits},
	{"RetryInOnBrokerClock", testRetryInOnBrokerClock},
}

// testReplaceFinishedTakesNewPlace: a grouped task that replaces a
// finished one (completed, archived) is a new task: in its group it comes
// after the tasks enqueued before it, also in an ordered group.
func testReplaceFinishedTakesNewPlace(t *testing.T, b broker.Broker, a broker.Admin) {
	for _, st := range []tidetype.TaskState{tidetype.StateCompleted, tidetype.StateArchived} {
		for _, ordered := range []bool{false, true} {
			name := st.String()
			if ordered {
				name += "Ordered"
			}
			t.Run(name, func(t *testing.T) {
				q := "replace-finished-" + name
				setLimits(t, a, q, tidetype.QueueLimits{Ordered: ordered})
				x := gmsg(q, "x", "G")
				if st == tidetype.StateCompleted {
					x.Retention = time.Hour
				}
				enqueue(t, b, x)
				s := outcomeOf(dequeueOne(t, b, q, time.Minute), broker.SettleDone)
				if st == tidetype.StateArchived {
					s.Kind, s.Err = broker.SettleArchive, "bad"
				}
				settleOK(t, b, s)
				if got := get(t, b, q, x.ID).State; got != st {
					t.Fatalf("task x is %v, want %v", got, st)
				}
				later := gmsgs(q, "later", "G", 2)
				enqueue(t, b, later...)
				if err := enqueueReplace(t, b, replacement(x)); err != nil {
					t.Fatalf("Replace of a %v task: %v", st, err)
				}
				for _, want := range []string{later[0].ID, later[1].ID, x.ID} {
					d := dequeueOne(t, b, q, time.Minute)
					if d.Task.ID != want {
						t.Fatalf("dequeued %q, want %q: a task replacing a finished one comes after the tasks enqueued before it", d.Task.ID, want)
					}
					settleOK(t, b, outcomeOf(d, broker.SettleDone))
				}
			})
		}
	}
}

// testRateRemembersStarts: a Rate set or changed counts the starts made in
// its period before, also those made without a rate and those older than
// the period of the rate they were made under.
func testRateRemembersStarts(t *testing.T, b broker.Broker, a broker.Admin) {
	rate := func(limit int, per time.Duration) tidetype.QueueLimits {
		return tidetype.QueueLimits{Rate: tidetype.Rate{Limit: limit, Per: per}}
	}
	t.Run("FromNone", func(t *testing.T) {
		const q = "rate-from-none"
		n := fillPartitions(t, b, q, 2)
		got := drainAll(t, b, q, time.Minute)
		if len(got) != 2*n {
			t.Fatalf("Dequeue without limits started %d, want %d", len(got), 2*n)
		}
		for _, d := range got {
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
		}
		fillPartitions(t, b, q, 2) // the same IDs again
		setLimits(t, a, q, rate(2*n, time.Hour))
		if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
			t.Fatalf("Rate %d/h set after %d starts without a rate: Dequeue started %v", 2*n, 2*n, idsOf(ds))
		}
		setLimits(t, a, q, rate(3*n, time.Hour))
		if ds := drainAll(t, b, q, time.Minute); len(ds) != n {
			t.Fatalf("Rate raised to %d/h after %d starts: Dequeue started %d, want %d", 3*n, 2*n, len(ds), n)
		}
	})
	t.Run("LongerPeriod", func(t *testing.T) {
		const q = "rate-longer"
		const per = 200 * time.Millisecond
		n := fillPartitions(t, b, q, 4)
		setLimits(t, a, q, rate(n, per))
		if got := drainAll(t, b, q, time.Minute); len(got) != n {
			t.Fatalf("Dequeue under Rate %d/%v started %d", n, per, len(got))
		}
		total := 0
		eventually(t, waitLong, "a second round of starts under the short rate", func() bool {
			total += len(dequeue(t, b, []string{q}, 10, time.Minute))
			return total == n
		})
		// 2n starts within the last second or so, half of them older than
		// the short period: a rate of 3n an hour leaves room for n more.
		setLimits(t, a, q, rate(3*n, time.Hour))
		if ds := drainAll(t, b, q, time.Minute); len(ds) != n {
			t.Fatalf("Rate changed from %d/%v to %d/h after %d starts: Dequeue started %d, want %d", n, per, 3*n, 2*n, len(ds), n)
		}
	})
}

// testDeleteQueueKeepsLimits: the limits of a queue outlive DeleteQueue,
// with what they count (the rate's recent starts), so that servers that
// set them keep their promise when the queue comes back; the queue leaves
// Queues all the same. Limits removed before the deletion are gone.
func testDeleteQueueKeepsLimits(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "delete-limits"
	n := partitions(t, b, q)
	lim := tidetype.QueueLimits{Concurrency: n, Rate: tidetype.Rate{Limit: 2 * n, Per: time.Hour}}
	setLimits(t, a, q, lim)
	fillPartitions(t, b, q, 2)
	for round := range 2 {
		ds := startN(t, b, q, n, fmt.Sprintf("round %d under Concurrency %d and Rate %d/h", round, n, 2*n))
		for _, d := range ds {
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
		}
	}
	if err := a.DeleteQueue(t.Context(), q); err != nil {
		t.Fatalf("DeleteQueue of the empty queue: %v", err)
	}
	if qs, err := a.Queues(t.Context()); err != nil || slices.Contains(qs, q) {
		t.Fatalf("Queues after DeleteQueue = %v, %v", qs, err)
	}
	if got, err := a.QueueLimits(t.Context(), q); err != nil || got != lim {
		t.Fatalf("QueueLimits after DeleteQueue = %+v, %v; want %+v", got, err, lim)
	}
	fillPartitions(t, b, q, 2)
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("the queue came back with its Rate %d/h used up before DeleteQueue: Dequeue started %v", 2*n, idsOf(ds))
	}
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n})
	for _, d := range startN(t, b, q, n, fmt.Sprintf("under Concurrency %d after DeleteQueue", n)) {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	// Removed first, the limits go with the queue.
	setLimits(t, a, q, tidetype.QueueLimits{})
	for _, d := range drainAll(t, b, q, time.Minute) {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	if err := a.DeleteQueue(t.Context(), q); err != nil {
		t.Fatalf("DeleteQueue of the empty queue without limits: %v", err)
	}
	if got, err := a.QueueLimits(t.Context(), q); err != nil || got != (tidetype.QueueLimits{}) {
		t.Fatalf("QueueLimits after removing them and DeleteQueue = %+v, %v; want none", got, err)
	}
	fillPartitions(t, b, q, 2)
	if ds := drainAll(t, b, q, time.Minute); len(ds) != 2*n {
		t.Fatalf("without limits Dequeue started %d, want %d", len(ds), 2*n)
	}
}

// testRetryInOnBrokerClock: a settlement's RetryIn counts from when the
// broker applies it, on the broker's clock, whatever RetryAt says (here a
// time already past, as a server whose clock runs 20 s behind would send):
// a throttle holds the group, and a retried or deferred task waits, for
// RetryIn.
func testRetryInOnBrokerClock(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "retry-in"
	const in = time.Hour
	behind := time.Now().Add(-20 * time.Second)
	ms := gmsgs(q, "a", "A", 2)
	plain := newMsg(q, "plain")
	enqueue(t, b, ms[0], plain)
	ds := wantDrain(t, b, q, "the first tasks", ms[0].ID, plain.ID)
	before := time.Now()
	s := outcomeOf(ds[ms[0].ID], broker.SettleDefer)
	s.RetryAt, s.RetryIn, s.Throttle, s.Err = behind, in, true, "slow down"
	settleOK(t, b, s)
	r := retryOf(ds[plain.ID], behind, "boom")
	r.RetryIn = in
	settleOK(t, b, r)
	after := time.Now()
	within := func(what string, got time.Time) {
		t.Helper()
		if got.Before(msTrunc(before.Add(in))) || got.After(after.Add(in)) {
			t.Fatalf("%s = %v, want %v from the settlement (between %v and %v)", what, got, in, before.Add(in), after.Add(in))
		}
	}
	for _, id := range []string{ms[0].ID, plain.ID} {
		got := get(t, b, q, id)
		if got.State != tidetype.StateRetry {
			t.Fatalf("task %s is %v after its settlement, want retry", id, got.State)
		}
		within("ProcessAt of "+id, got.NextProcessAt)
	}
	enqueue(t, b, ms[1])
	wantDrain(t, b, q, "with group A throttled for an hour")
	gs := groups(t, a, q, 10)
	if len(gs) != 1 || gs[0].Group != "A" {
		t.Fatalf("Groups = %+v, want group A", gs)
	}
	within("ThrottledUntil of group A", gs[0].ThrottledUntil)
}
