// Package brokertest is the behavioural conformance suite of broker.Broker.
//
// Every Broker implementation runs it from its tests:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, func(t *testing.T) broker.Broker {
//			b := mybroker.New(...)
//			t.Cleanup(func() { b.Close() })
//			return b
//		})
//	}
//
// The suite uses only the Broker interface and the real clock, with short
// durations (tens to hundreds of milliseconds) and generous polling timeouts,
// so it suits brokers backed by a server as well as in-process ones. It never
// asserts on speed. Subtests run in parallel, each on its own broker.
//
// Where the contract leaves a choice the suite accepts every reasonable one:
// a task recovered after its lease expired may wait in retry or be pending at
// once; Dequeue may forward due tasks itself; events may be repeated. Times
// are compared with millisecond tolerance. Brokers with several partitions per
// queue are maintained partition by partition, FIFO order is only checked
// when a queue has one partition, and unique tasks get IDs in their lock's
// partition (broker.Partition), as the tide client arranges. Grouped tasks
// get IDs tagged with their group ("id{group}"), so that a group's tasks
// share a partition (GroupFreeIDs checks that a queue of one partition
// takes untagged IDs too); round-robin among groups is checked only for groups
// (and ungrouped tasks) placed in one partition.
//
// Groups: ready tasks are served group by group, round-robin, the ungrouped
// tasks as one more group, a group's tasks in enqueue order; the queue's
// group limits (GroupConcurrency, GroupRate, Ordered), throttling
// settlements (Settlement.Throttle), EnqueueOptions.Replace and
// Admin.Groups are checked from their contract, not from one broker's
// choices: a task due in retry may be forwarded by Maintain or by Dequeue.
package brokertest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Timeouts of the polling helpers. They bound how long the suite waits for
// something that should happen within milliseconds; they are generous so that
// a loaded machine (the race detector, CI) does not make the suite flaky.
const (
	waitLong  = 10 * time.Second
	waitEvent = 500 * time.Millisecond
	pollEvery = 5 * time.Millisecond
)

// owner is the Maintain owner the suite uses except in the ownership test.
const owner = "brokertest"

// taskType is the type of every task the suite enqueues.
const taskType = "brokertest:task"

// Run runs the conformance suite. newBroker is called once per subtest and
// must return an isolated, empty broker (its own key prefix or instance);
// cleanup via t.Cleanup.
func Run(t *testing.T, newBroker func(t *testing.T) broker.Broker) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b broker.Broker)
	}{
		{"RoundTrip", testRoundTrip},
		{"FIFO", testFIFO},
		{"QueueOrder", testQueueOrder},
		{"DequeueLimit", testDequeueLimit},
		{"LargeBatch", testLargeBatch},
		{"IDConflict", testIDConflict},
		{"InvalidID", testInvalidID},
		{"MixedBatch", testMixedBatch},
		{"Unique", testUnique},
		{"UniqueExpires", testUniqueExpires},
		{"IdempotencyKey", testIdempotencyKey},
		{"Delayed", testDelayed},
		{"Retry", testRetry},
		{"Defer", testDefer},
		{"ActiveLease", testActiveLease},
		{"Archive", testArchive},
		{"Requeue", testRequeue},
		{"Retention", testRetention},
		{"SetResult", testSetResult},
		{"Extend", testExtend},
		{"LeaseExpiry", testLeaseExpiry},
		{"StaleToken", testStaleToken},
		{"RecoveryExhausted", testRecoveryExhausted},
		{"Delete", testDelete},
		{"Pause", testPause},
		{"Ownership", testOwnership},
		{"MaintainResult", testMaintainResult},
		{"SubscribePending", testSubscribePending},
		{"SubscribeScheduled", testSubscribeScheduled},
		{"SubscribeClosesOnCancel", testSubscribeCancel},
		{"ConcurrentDequeue", testConcurrentDequeue},
		{"Closed", testClosed},
		{"CloseEndsSubscriptions", testCloseEndsSubscriptions},
	}
	for _, tc := range slices.Concat(tests, groupBrokerTests, waitTests, eventTests, flowTests, followTests, durableTests) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newBroker(t))
		})
	}
	for _, tc := range slices.Concat(adminTests, limitTests, groupTests, wakeTests, promiseTests, durableAdminTests) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t)
			_, err := b.Queues(t.Context())
			needs(t, "Admin", err)
			tc.fn(t, b, b)
		})
	}
}

// ---- tests ----

func testRoundTrip(t *testing.T, b broker.Broker) {
	now := time.Now()
	full := newMsg("q", "full")
	full.ID = uniqueID(t, b, "q", "full", "round-trip-key")
	full.Type = "brokertest:full"
	full.Payload = []byte{0, 1, 2, 0xff, 0xfe, '\n', 0, 'x'}
	full.Headers = map[string]string{"traceparent": "00-abc-def-01", "empty": "", "ünï": "cödé"}
	full.State = tidetype.StateScheduled
	full.MaxRetry = 7
	full.Retried = 2
	full.LastErr = "previous failure"
	full.NextProcessAt = now.Add(time.Hour + 123456*time.Nanosecond)
	full.EnqueuedAt = now.Add(-time.Minute + 987654*time.Nanosecond)
	full.LastFailedAt = now.Add(-time.Second)
	full.CompletedAt = now.Add(-2 * time.Second)
	full.Timeout = 1500*time.Millisecond + 250*time.Microsecond
	full.Deadline = now.Add(48*time.Hour + 555*time.Microsecond)
	full.Retention = 36 * time.Hour
	full.UniqueKey = "round-trip-key"
	full.UniqueTTL = 2 * time.Hour

	empty := newMsg("q", "empty")
	empty.Payload = nil
	empty.Headers = nil
	emptySlice := newMsg("q", "empty-slice")
	emptySlice.Payload = []byte{}
	emptySlice.Headers = map[string]string{}

	want := map[string]*tidetype.TaskInfo{}
	for _, m := range []*tidetype.TaskInfo{full, empty, emptySlice} {
		want[m.ID] = cloneMsg(m)
	}
	enqueue(t, b, full, empty, emptySlice)

	// The broker keeps its own copies: mutating ours changes nothing.
	full.Payload[0] = 'X'
	full.Headers["traceparent"] = "changed"
	full.Type = "changed"

	for id, w := range want {
		got := get(t, b, "q", id)
		checkMessage(t, "GetTask("+id+")", got, w)
		if got.State != w.State {
			t.Errorf("GetTask(%s).State = %v, want %v", id, got.State, w.State)
		}
		if len(got.Result) != 0 {
			t.Errorf("GetTask(%s).Result = %q, want empty", id, got.Result)
		}
		// Mutating what GetTask returned changes nothing either.
		if len(got.Payload) > 0 {
			got.Payload[0] ^= 0xff
		}
		if got.Headers != nil {
			got.Headers["added"] = "x"
		}
		checkMessage(t, "GetTask("+id+") again", get(t, b, "q", id), w)
	}

	// A delivery carries the same fields, active.
	ds := dequeue(t, b, []string{"q"}, 10, time.Minute)
	if len(ds) != 2 {
		t.Fatalf("Dequeue returned %d deliveries, want the 2 pending ones", len(ds))
	}
	for _, d := range ds {
		w := want[d.Task.ID]
		if w == nil {
			t.Fatalf("Dequeue returned unexpected task %q", d.Task.ID)
		}
		checkMessage(t, "Delivery "+d.Task.ID, d.Task, w)
		if d.Task.State != tidetype.StateActive {
			t.Errorf("Delivery %s State = %v, want active", d.Task.ID, d.Task.State)
		}
		if d.Token == 0 {
			t.Errorf("Delivery %s has token 0", d.Task.ID)
		}
		if d.LeaseFor != time.Minute {
			t.Errorf("Delivery %s LeaseFor = %v, want 1m", d.Task.ID, d.LeaseFor)
		}
		if st := get(t, b, "q", d.Task.ID).State; st != tidetype.StateActive {
			t.Errorf("GetTask(%s).State after Dequeue = %v, want active", d.Task.ID, st)
		}
	}
}

func testFIFO(t *testing.T, b broker.Broker) {
	var ids []string
	var batch []*tidetype.TaskInfo
	for i := range 10 {
		m := newMsg("q", fmt.Sprintf("batch-%02d", i))
		batch = append(batch, m)
		ids = append(ids, m.ID)
	}
	enqueue(t, b, batch...)
	for i := range 10 {
		m := newMsg("q", fmt.Sprintf("single-%02d", i))
		enqueue(t, b, m)
		ids = append(ids, m.ID)
	}
	var got []string
	for range ids {
		ds := dequeue(t, b, []string{"q"}, 1, time.Minute)
		if len(ds) != 1 {
			t.Fatalf("Dequeue(n=1) returned %d deliveries after %d of %d tasks", len(ds), len(got), len(ids))
		}
		got = append(got, ds[0].Task.ID)
	}
	if ds := dequeue(t, b, []string{"q"}, 1, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue returned %q after all tasks were taken", ds[0].Task.ID)
	}
	if partitions(t, b, "q") > 1 {
		slices.Sort(got)
		want := slices.Sorted(slices.Values(ids))
		if !slices.Equal(got, want) {
			t.Fatalf("dequeued %v, want %v in any order (queue has several partitions)", got, want)
		}
		return
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("dequeue order\n got %v\nwant %v", got, ids)
	}
}

func testQueueOrder(t *testing.T, b broker.Broker) {
	enqueue(t, b, newMsg("low", "l1"), newMsg("low", "l2"), newMsg("high", "h1"), newMsg("high", "h2"))

	ds := dequeue(t, b, []string{"high", "low"}, 3, time.Minute)
	if got, want := queuesOf(ds), []string{"high", "high", "low"}; !slices.Equal(got, want) {
		t.Fatalf("Dequeue([high low], 3) queues = %v, want %v", got, want)
	}
	enqueue(t, b, newMsg("high", "h3"))
	ds = dequeue(t, b, []string{"missing", "high", "low"}, 3, time.Minute)
	if got, want := queuesOf(ds), []string{"high", "low"}; !slices.Equal(got, want) {
		t.Fatalf("Dequeue([missing high low], 3) queues = %v, want %v", got, want)
	}
	if ds := dequeue(t, b, []string{"high", "low"}, 3, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue on empty queues returned %d deliveries", len(ds))
	}
}

func testDequeueLimit(t *testing.T, b broker.Broker) {
	if ds := dequeue(t, b, []string{"q"}, 5, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue on an empty broker returned %d deliveries", len(ds))
	}
	for i := range 5 {
		enqueue(t, b, newMsg("q", fmt.Sprint("t", i)))
	}
	for _, c := range []struct{ n, want int }{{2, 2}, {10, 3}, {10, 0}} {
		if ds := dequeue(t, b, []string{"q"}, c.n, time.Minute); len(ds) != c.want {
			t.Fatalf("Dequeue(n=%d) returned %d deliveries, want %d", c.n, len(ds), c.want)
		}
	}
}

// testLargeBatch leases 9,000 tasks in one Dequeue and settles them in one
// Settle (past the thousand members a Redis script writes with one command,
// and past the 8,000 values Lua unpacks at once): a tenth pending, the rest
// scheduled and already due. Every task is leased once with its own token,
// and after the settlement none is left, active or anywhere.
func testLargeBatch(t *testing.T, b broker.Broker) {
	const n = 9000
	msgs := make([]*tidetype.TaskInfo, n)
	due := time.Now().Add(-time.Second)
	for i := range msgs {
		msgs[i] = newMsg("big", fmt.Sprintf("t%04d", i))
		if i%10 != 0 {
			msgs[i].State, msgs[i].NextProcessAt = tidetype.StateScheduled, due
		}
	}
	enqueue(t, b, msgs...)
	var ds []*broker.Delivery
	for len(ds) < n {
		got := dequeue(t, b, []string{"big"}, n-len(ds), time.Minute)
		if len(got) == 0 {
			t.Fatalf("Dequeue returned nothing after %d of %d tasks", len(ds), n)
		}
		ds = append(ds, got...)
	}
	seen := map[string]bool{}
	tokens := map[uint64]bool{}
	for _, d := range ds {
		if seen[d.Task.ID] {
			t.Fatalf("task %s leased twice", d.Task.ID)
		}
		seen[d.Task.ID] = true
		if tokens[d.Token] {
			t.Fatalf("token %d handed out twice", d.Token)
		}
		tokens[d.Token] = true
		if d.Task.State != tidetype.StateActive {
			t.Fatalf("leased task %s is %v", d.Task.ID, d.Task.State)
		}
	}
	if got := get(t, b, "big", ds[n-1].Task.ID); got.State != tidetype.StateActive {
		t.Fatalf("a leased task reads back as %v", got.State)
	}
	ss := make([]broker.Settlement, n)
	for i, d := range ds {
		ss[i] = outcomeOf(d, broker.SettleDone)
	}
	errs, err := b.Settle(t.Context(), ss)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("settlement %d: %v", i, e)
		}
	}
	if ds := dequeue(t, b, []string{"big"}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("%d tasks leased again after all were settled", len(ds))
	}
	for _, d := range []*broker.Delivery{ds[0], ds[n/2], ds[n-1]} {
		if _, err := b.GetTask(t.Context(), "big", d.Task.ID); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("task %s after it was settled done: %v", d.Task.ID, err)
		}
	}
	if st, err := b.QueueInfo(t.Context(), "big"); !errors.Is(err, broker.ErrNotSupported) {
		if err != nil {
			t.Fatal(err)
		}
		if st.Active != 0 || st.Pending != 0 {
			t.Fatalf("after settling every task: %d active, %d pending", st.Active, st.Pending)
		}
	}
}

func testIDConflict(t *testing.T, b broker.Broker) {
	for _, st := range allStates() {
		t.Run(st.String(), func(t *testing.T) {
			q := "conflict-" + st.String()
			putInState(t, b, q, "dup", st)
			errs := enqueueErrs(t, b, newMsg(q, "dup"))
			if !errors.Is(errs[0], broker.ErrTaskIDConflict) {
				t.Fatalf("Enqueue of an ID that is %v: error %v, want ErrTaskIDConflict", st, errs[0])
			}
			if got := get(t, b, q, "dup"); got.State != st {
				t.Fatalf("after refused Enqueue the task is %v, want %v", got.State, st)
			}
			// IDs are per queue: the same ID elsewhere is fine.
			enqueue(t, b, newMsg(q+"-other", "dup"))
		})
	}
}

// testInvalidID: an ID with a control character or over MaxIDLen bytes is
// refused with ErrInvalidTask, whatever its group, and nothing of it is
// stored (brokers name an ID's own records with control characters, so
// such an ID could name another task's); the longest ID is kept.
func testInvalidID(t *testing.T, b broker.Broker) {
	const q = "badids"
	long := strings.Repeat("i", broker.MaxIDLen)
	for _, id := range []string{"\x00over", "a\x00b", "tab\tid", "del\x7f", "nl\n", long + "i"} {
		for _, g := range []string{"", "tenant-a"} {
			m := newMsg(q, id)
			m.Group = g
			if !isInvalid(t, b, m) {
				t.Errorf("Enqueue of ID %q (group %q): want ErrInvalidTask", id, g)
			}
		}
	}
	enqueue(t, b, newMsg(q, "ok"), newMsg(q, long))
	got, _ := drainIDs(t, b, q)
	if want := []string{long, "ok"}; !slices.Equal(got, want) {
		t.Fatalf("Dequeue started %q, want only the valid IDs %q", got, want)
	}
}

func testDelayed(t *testing.T, b broker.Broker) {
	due := msTrunc(time.Now().Add(time.Second))
	m := newMsg("q", "delayed")
	m.State, m.NextProcessAt = tidetype.StateScheduled, due
	enqueue(t, b, m)
	if st := get(t, b, "q", "delayed").State; st != tidetype.StateScheduled && time.Now().Before(due) {
		t.Fatalf("task due in the future is %v, want scheduled", st)
	}
	dequeueNoneBefore(t, b, "q", due)
	if r := maintain(t, b, "q"); time.Now().Before(due) {
		if r.Forwarded != 0 {
			t.Fatalf("Maintain before the due time forwarded %d tasks", r.Forwarded)
		}
		if !sameTime(r.NextDue, due) {
			t.Fatalf("Maintain NextDue = %v, want %v", r.NextDue, due)
		}
	}
	awaitState(t, b, "q", "delayed", tidetype.StatePending)
	if time.Now().Before(due) {
		t.Fatalf("task became pending before it was due")
	}
	d := dequeueOne(t, b, "q", time.Minute)
	if d.Task.ID != "delayed" {
		t.Fatalf("dequeued %q, want delayed", d.Task.ID)
	}
	if !sameTime(d.Task.NextProcessAt, due) {
		t.Fatalf("forwarded task ProcessAt = %v, want the due time %v", d.Task.NextProcessAt, due)
	}
	settleOK(t, b, outcomeOf(d, broker.SettleDone))
}

func testRetry(t *testing.T, b broker.Broker) {
	enqueue(t, b, newMsg("q", "r"))
	d := dequeueOne(t, b, "q", time.Minute)
	at := time.Now()
	retryAt := msTrunc(at.Add(time.Second))
	s := retryOf(d, retryAt, "boom")
	s.At = at
	settleOK(t, b, s)

	got := get(t, b, "q", "r")
	switch {
	case got.State != tidetype.StateRetry:
		t.Fatalf("State = %v, want retry", got.State)
	case got.Retried != 1:
		t.Fatalf("Retried = %d, want 1", got.Retried)
	case got.LastErr != "boom":
		t.Fatalf("LastErr = %q, want boom", got.LastErr)
	case !sameTime(got.LastFailedAt, at):
		t.Fatalf("LastFailedAt = %v, want %v", got.LastFailedAt, at)
	case !sameTime(got.NextProcessAt, retryAt):
		t.Fatalf("ProcessAt = %v, want RetryAt %v", got.NextProcessAt, retryAt)
	}
	dequeueNoneBefore(t, b, "q", retryAt)
	awaitState(t, b, "q", "r", tidetype.StatePending)
	if time.Now().Before(retryAt) {
		t.Fatalf("retry task became pending before RetryAt")
	}
	d2 := dequeueOne(t, b, "q", time.Minute)
	if d2.Task.Retried != 1 || d2.Task.LastErr != "boom" {
		t.Fatalf("redelivered Retried=%d LastErr=%q, want 1 and boom", d2.Task.Retried, d2.Task.LastErr)
	}
	if d2.Token <= d.Token {
		t.Fatalf("redelivery token %d not above first token %d", d2.Token, d.Token)
	}
	settleOK(t, b, outcomeOf(d2, broker.SettleDone))
	if _, err := b.GetTask(t.Context(), "q", "r"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("GetTask after done: %v, want ErrTaskNotFound", err)
	}
}

func testArchive(t *testing.T, b broker.Broker) {
	m := newMsg("q", "a")
	m.Retried = 1
	enqueue(t, b, m)
	d := dequeueOne(t, b, "q", time.Minute)
	s := outcomeOf(d, broker.SettleArchive)
	s.Err = "bad payload"
	s.At = time.Now()
	settleOK(t, b, s)
	got := get(t, b, "q", "a")
	switch {
	case got.State != tidetype.StateArchived:
		t.Fatalf("State = %v, want archived", got.State)
	case got.Retried != 1:
		t.Fatalf("Retried = %d, want it unchanged at 1", got.Retried)
	case got.LastErr != "bad payload":
		t.Fatalf("LastErr = %q, want %q", got.LastErr, "bad payload")
	case !sameTime(got.LastFailedAt, s.At):
		t.Fatalf("LastFailedAt = %v, want %v", got.LastFailedAt, s.At)
	}
	maintain(t, b, "q")
	if ds := dequeue(t, b, []string{"q"}, 1, time.Minute); len(ds) != 0 {
		t.Fatalf("archived task was dequeued")
	}
	if st := get(t, b, "q", "a").State; st != tidetype.StateArchived {
		t.Fatalf("after Maintain the task is %v, want archived", st)
	}
}

func testRequeue(t *testing.T, b broker.Broker) {
	enqueue(t, b, newMsg("q", "rq"))
	d := dequeueOne(t, b, "q", time.Minute)
	settleOK(t, b, retryOf(d, time.Now(), "first failure"))
	awaitState(t, b, "q", "rq", tidetype.StatePending)
	d2 := dequeueOne(t, b, "q", time.Minute)
	settleOK(t, b, outcomeOf(d2, broker.SettleRequeue))
	got := get(t, b, "q", "rq")
	if got.State != tidetype.StatePending || got.Retried != 1 {
		t.Fatalf("after requeue State=%v Retried=%d, want pending and 1", got.State, got.Retried)
	}
	d3 := dequeueOne(t, b, "q", time.Minute)
	if d3.Task.Retried != 1 {
		t.Fatalf("requeued delivery Retried = %d, want 1", d3.Task.Retried)
	}
	if d3.Token <= d2.Token {
		t.Fatalf("token after requeue %d not above %d", d3.Token, d2.Token)
	}
	settleOK(t, b, outcomeOf(d3, broker.SettleDone))
}

func testRetention(t *testing.T, b broker.Broker) {
	const retention = time.Second
	m := newMsg("q", "kept")
	m.Retention = retention
	enqueue(t, b, m)
	d := dequeueOne(t, b, "q", time.Minute)
	if err := b.SetResult(t.Context(), leaseOf(d), []byte("the result")); err != nil {
		t.Fatalf("SetResult: %v", err)
	}
	s := outcomeOf(d, broker.SettleDone)
	s.At = time.Now()
	settleOK(t, b, s)
	got := get(t, b, "q", "kept")
	switch {
	case got.State != tidetype.StateCompleted:
		t.Fatalf("State = %v, want completed", got.State)
	case !sameTime(got.CompletedAt, s.At):
		t.Fatalf("CompletedAt = %v, want %v", got.CompletedAt, s.At)
	case string(got.Result) != "the result":
		t.Fatalf("Result = %q, want %q", got.Result, "the result")
	}
	if ds := dequeue(t, b, []string{"q"}, 1, time.Minute); len(ds) != 0 {
		t.Fatalf("completed task was dequeued")
	}
	eventually(t, waitLong, "the completed task to be trimmed", func() bool {
		maintain(t, b, "q")
		_, err := b.GetTask(t.Context(), "q", "kept")
		if err != nil && !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("GetTask: %v", err)
		}
		return err != nil
	})
	if since := time.Since(msTrunc(s.At)); since < retention {
		t.Fatalf("completed task trimmed after %v, before its retention %v", since, retention)
	}
	enqueue(t, b, newMsg("q", "kept")) // the ID is free again
}

func testSetResult(t *testing.T, b broker.Broker) {
	m := newMsg("q", "res")
	m.Retention = time.Hour
	enqueue(t, b, m)
	d := dequeueOne(t, b, "q", time.Minute)
	for _, data := range [][]byte{[]byte("first"), {0, 1, 2, 0xff}} {
		if err := b.SetResult(t.Context(), leaseOf(d), data); err != nil {
			t.Fatalf("SetResult: %v", err)
		}
		if got := get(t, b, "q", "res"); !bytes.Equal(got.Result, data) || got.State != tidetype.StateActive {
			t.Fatalf("after SetResult(%q): Result %q State %v, want the data and active", data, got.Result, got.State)
		}
	}
	settleOK(t, b, outcomeOf(d, broker.SettleDone))
	if got := get(t, b, "q", "res"); !bytes.Equal(got.Result, []byte{0, 1, 2, 0xff}) {
		t.Fatalf("completed task Result = %q", got.Result)
	}
	if err := b.SetResult(t.Context(), leaseOf(d), []byte("late")); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("SetResult after settle: %v, want ErrLeaseLost", err)
	}
	if err := b.SetResult(t.Context(), broker.LeaseRef{Queue: "q", ID: "nope", Token: 1}, nil); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("SetResult for a missing task: %v, want ErrLeaseLost", err)
	}
}

func testDelete(t *testing.T, b broker.Broker) {
	for _, st := range allStates() {
		t.Run(st.String(), func(t *testing.T) {
			q := "delete-" + st.String()
			putInState(t, b, q, "victim", st)
			err := b.Delete(t.Context(), q, "victim")
			if st == tidetype.StateActive {
				if !errors.Is(err, broker.ErrTaskActive) {
					t.Fatalf("Delete of an active task: %v, want ErrTaskActive", err)
				}
				if got := get(t, b, q, "victim"); got.State != tidetype.StateActive {
					t.Fatalf("after refused Delete the task is %v, want active", got.State)
				}
				return
			}
			if err != nil {
				t.Fatalf("Delete of a %v task: %v", st, err)
			}
			if _, err := b.GetTask(t.Context(), q, "victim"); !errors.Is(err, broker.ErrTaskNotFound) {
				t.Fatalf("GetTask after Delete: %v, want ErrTaskNotFound", err)
			}
			if err := b.Delete(t.Context(), q, "victim"); !errors.Is(err, broker.ErrTaskNotFound) {
				t.Fatalf("second Delete: %v, want ErrTaskNotFound", err)
			}
			maintain(t, b, q)
			if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
				t.Fatalf("deleted task was dequeued")
			}
			enqueue(t, b, newMsg(q, "victim")) // the ID is free again
		})
	}
	t.Run("DueRetry", func(t *testing.T) {
		enqueue(t, b, newMsg("delete-due", "d"))
		d := dequeueOne(t, b, "delete-due", time.Minute)
		settleOK(t, b, retryOf(d, time.Now(), "boom"))
		if err := b.Delete(t.Context(), "delete-due", "d"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if r := maintain(t, b, "delete-due"); r.Forwarded != 0 || r.Pending != 0 {
			t.Fatalf("Maintain after Delete forwarded %d, pending %d; want 0 and 0", r.Forwarded, r.Pending)
		}
		if ds := dequeue(t, b, []string{"delete-due"}, 1, time.Minute); len(ds) != 0 {
			t.Fatalf("deleted task was dequeued")
		}
	})
	t.Run("Missing", func(t *testing.T) {
		for _, ref := range [][2]string{{"never-used", "x"}, {"delete-pending", "never-enqueued"}} {
			if err := b.Delete(t.Context(), ref[0], ref[1]); !errors.Is(err, broker.ErrTaskNotFound) {
				t.Fatalf("Delete(%s, %s): %v, want ErrTaskNotFound", ref[0], ref[1], err)
			}
			if _, err := b.GetTask(t.Context(), ref[0], ref[1]); !errors.Is(err, broker.ErrTaskNotFound) {
				t.Fatalf("GetTask(%s, %s): %v, want ErrTaskNotFound", ref[0], ref[1], err)
			}
		}
	})
}

func testPause(t *testing.T, b broker.Broker) {
	ctx := t.Context()
	for range 2 { // idempotent
		if err := b.Pause(ctx, "p"); err != nil {
			t.Fatalf("Pause: %v", err)
		}
	}
	enqueue(t, b, newMsg("p", "p1"), newMsg("o", "o1"))
	ds := dequeue(t, b, []string{"p", "o"}, 10, time.Minute)
	if got := queuesOf(ds); !slices.Equal(got, []string{"o"}) {
		t.Fatalf("Dequeue with p paused took from %v, want [o]", got)
	}
	maintain(t, b, "p")
	if ds := dequeue(t, b, []string{"p"}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue of a paused queue returned %d deliveries", len(ds))
	}
	for range 2 {
		if err := b.Unpause(ctx, "p"); err != nil {
			t.Fatalf("Unpause: %v", err)
		}
	}
	if err := b.Unpause(ctx, "never-paused"); err != nil {
		t.Fatalf("Unpause of a queue that was not paused: %v", err)
	}
	d := dequeueOne(t, b, "p", time.Minute)
	if d.Task.ID != "p1" {
		t.Fatalf("after Unpause dequeued %q, want p1", d.Task.ID)
	}
}
