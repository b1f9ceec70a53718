package brokertest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// limitTests run when the broker implements broker.Admin.
var limitTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker, a broker.Admin)
}{
	{"LimitConcurrency", testLimitConcurrency},
	{"LimitLeaseExpiry", testLimitLeaseExpiry},
	{"LimitRuntimeChange", testLimitRuntimeChange},
	{"LimitWakes", testLimitWakes},
	{"LimitConcurrent", testLimitConcurrent},
	{"LimitInvalid", testLimitInvalid},
	{"LimitRate", testLimitRate},
	{"LimitRateWindow", testLimitRateWindow},
	{"LimitFollowsBacklog", testLimitFollowsBacklog},
	{"LimitBelowPartitions", testLimitBelowPartitions},
}

// fillOne enqueues count tasks into partition p of queue's n partitions.
func fillOne(t *testing.T, b broker.Broker, queue string, n, p, count int) {
	t.Helper()
	var msgs []*tidetype.TaskInfo
	for i := 0; len(msgs) < count; i++ {
		if id := fmt.Sprintf("%s-%d", queue, i); broker.Partition(id, n) == p {
			msgs = append(msgs, newMsg(queue, id))
		}
	}
	enqueue(t, b, msgs...)
}

// holdUntil dequeues from queue, holding every task, until want are held;
// more than most held at once fails the test.
func holdUntil(t *testing.T, b broker.Broker, queue string, want, most int) []*broker.Delivery {
	t.Helper()
	var held []*broker.Delivery
	eventually(t, waitLong, fmt.Sprintf("%d tasks of %s to run at once", want, queue), func() bool {
		held = append(held, dequeue(t, b, []string{queue}, 10, time.Minute)...)
		if len(held) > most {
			t.Fatalf("%d tasks of %s handed out at once, at most %d allowed", len(held), queue, most)
		}
		return len(held) >= want
	})
	return held
}

// testLimitFollowsBacklog: the limits are the queue's, not its partitions'
// shares: a backlog in one partition of several runs up to the whole
// Concurrency at once and starts up to the whole Rate, and no more.
func testLimitFollowsBacklog(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limfollow"
	n := partitions(t, b, q)
	limit := 2*n + 1
	fillOne(t, b, q, n, n-1, 3*limit)
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: limit})
	held := holdUntil(t, b, q, limit, limit)
	// Settled ones make room for as many again, still in that partition.
	for _, d := range held[:3] {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	holdUntil(t, b, q, 3, 3)
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue at the limit handed out %d more", len(ds))
	}

	const rq = "limfollowrate"
	fillOne(t, b, rq, n, 0, 3*limit)
	setLimits(t, a, rq, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: limit, Per: time.Hour}})
	started := holdUntil(t, b, rq, limit, limit)
	for _, d := range started {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	time.Sleep(50 * time.Millisecond)
	if ds := drainAll(t, b, rq, time.Minute); len(ds) != 0 {
		t.Fatalf("with the hour's %d starts used up Dequeue handed out %d more", limit, len(ds))
	}
}

// testLimitBelowPartitions: a Concurrency or Rate.Limit below the queue's
// partition count is accepted and holds, whichever partition the tasks are in.
func testLimitBelowPartitions(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limsmall"
	n := partitions(t, b, q)
	for p := range n {
		fillOne(t, b, q, n, p, 2)
	}
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: 1})
	held := holdUntil(t, b, q, 1, 1)
	time.Sleep(50 * time.Millisecond)
	if ds := drainAll(t, b, q, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue under Concurrency 1 with a task running handed out %d more", len(ds))
	}
	settleOK(t, b, outcomeOf(held[0], broker.SettleDone))
	holdUntil(t, b, q, 1, 1)

	const rq = "limsmallrate"
	fillOne(t, b, rq, n, n-1, 3)
	setLimits(t, a, rq, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 1, Per: time.Hour}})
	holdUntil(t, b, rq, 1, 1)
	time.Sleep(50 * time.Millisecond)
	if ds := drainAll(t, b, rq, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue under Rate 1/h after a start handed out %d more", len(ds))
	}
}

// fillPartitions enqueues per tasks into every partition of queue and
// returns the number of partitions.
func fillPartitions(t *testing.T, b broker.Broker, queue string, per int) int {
	t.Helper()
	n := partitions(t, b, queue)
	count := make([]int, n)
	var msgs []*tidetype.TaskInfo
	for i := 0; len(msgs) < n*per; i++ {
		id := fmt.Sprintf("%s-%d", queue, i)
		if p := broker.Partition(id, n); count[p] < per {
			count[p]++
			msgs = append(msgs, newMsg(queue, id))
		}
	}
	enqueue(t, b, msgs...)
	return n
}

func setLimits(t *testing.T, a broker.Admin, queue string, l tidetype.QueueLimits) {
	t.Helper()
	if err := a.SetQueueLimits(t.Context(), queue, l); err != nil {
		t.Fatalf("SetQueueLimits(%s, %+v): %v", queue, l, err)
	}
	got, err := a.QueueLimits(t.Context(), queue)
	if err != nil || got != l {
		t.Fatalf("QueueLimits(%s) after setting %+v = %+v, %v", queue, l, got, err)
	}
}

// drainAll dequeues from queue until a call returns nothing and returns all
// it got.
func drainAll(t *testing.T, b broker.Broker, queue string, lease time.Duration) []*broker.Delivery {
	t.Helper()
	var all []*broker.Delivery
	for {
		ds := dequeue(t, b, []string{queue}, 10, lease)
		if len(ds) == 0 {
			return all
		}
		all = append(all, ds...)
	}
}

// startN dequeues from queue until n tasks started, failing the test when
// more start or n do not within 10 s, then checks that no more start. A
// broker that splits a queue's limits among partitions moves slots and
// rate tokens to where tasks wait in a rebalance that a refused Dequeue
// asks for, so the n may take several calls.
func startN(t *testing.T, b broker.Broker, queue string, n int, what string) []*broker.Delivery {
	t.Helper()
	var started []*broker.Delivery
	eventually(t, 10*time.Second, what, func() bool {
		started = append(started, dequeue(t, b, []string{queue}, 10, time.Minute)...)
		if len(started) > n {
			t.Fatalf("%s: Dequeue started %d, want %d", what, len(started), n)
		}
		return len(started) == n
	})
	if ds := dequeue(t, b, []string{queue}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("%s: Dequeue started %d more than %d", what, len(ds), n)
	}
	return started
}

// testLimitConcurrency: Dequeue hands out no more than the limit, asked for
// more; a settlement gives one slot back; zero means no limit.
func testLimitConcurrency(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "lim"
	const per = 8
	n := fillPartitions(t, b, q, per)
	limit := max(2*n, 4)
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: limit})
	got := drainAll(t, b, q, time.Minute)
	if len(got) != limit {
		t.Fatalf("Dequeue under Concurrency %d handed out %d tasks", limit, len(got))
	}
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue at the limit handed out %d more", len(ds))
	}
	// Done, retry and archive each give their slot back: one more each.
	for i, kind := range []broker.SettleKind{broker.SettleDone, broker.SettleRetry, broker.SettleArchive, broker.SettleRequeue} {
		s := outcomeOf(got[i], kind)
		s.RetryAt, s.Err = time.Now().Add(time.Hour), "x"
		settleOK(t, b, s)
		ds := dequeue(t, b, []string{q}, 10, time.Minute)
		if len(ds) != 1 {
			t.Fatalf("after a %v settlement at the limit, Dequeue handed out %d tasks, want 1", kind, len(ds))
		}
		got[i] = ds[0]
	}
	// Zero removes the limit: the rest comes out.
	setLimits(t, a, q, tidetype.QueueLimits{})
	rest := drainAll(t, b, q, time.Minute)
	if want := n*per - limit - 3; len(rest) != want { // 3 tasks went to retry or archive
		t.Fatalf("without a limit Dequeue handed out %d tasks, want %d", len(rest), want)
	}
}

// testLimitLeaseExpiry: a worker that dies holding slots gives them back
// when its leases expire and are recovered.
func testLimitLeaseExpiry(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limexp"
	n := fillPartitions(t, b, q, 3)
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n})
	if got := drainAll(t, b, q, 100*time.Millisecond); len(got) != n {
		t.Fatalf("Dequeue under Concurrency %d handed out %d tasks", n, len(got))
	}
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue at the limit handed out %d more", len(ds))
	}
	awaitRecovered(t, b, q, n)
	if got := drainAll(t, b, q, time.Minute); len(got) != n {
		t.Fatalf("after the leases were recovered Dequeue handed out %d tasks, want %d", len(got), n)
	}
}

// testLimitRuntimeChange: the next Dequeue after SetQueueLimits obeys the
// new limit, raised or lowered; under a lowered limit the waiting tasks
// start once the running ones are below it (on a broker that splits the
// limit among partitions, after the rebalance the Dequeue asks for).
func testLimitRuntimeChange(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limchange"
	n := fillPartitions(t, b, q, 6)
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n})
	got := drainAll(t, b, q, time.Minute)
	if len(got) != n {
		t.Fatalf("Dequeue under Concurrency %d handed out %d tasks", n, len(got))
	}
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: 3 * n})
	more := drainAll(t, b, q, time.Minute)
	if len(more) != 2*n {
		t.Fatalf("after raising the limit to %d Dequeue handed out %d more, want %d", 3*n, len(more), 2*n)
	}
	got = append(got, more...)
	// Lowered under what runs: nothing starts until the running tasks are
	// below the new limit in every partition.
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n})
	for _, d := range got[:n] {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("after lowering the limit to %d with %d running, Dequeue handed out %d", n, 2*n, len(ds))
	}
	for _, d := range got[n:] {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	startN(t, b, q, n, fmt.Sprintf("with nothing running, the waiting tasks under the lowered limit %d", n))
}

// testLimitWakes: a settlement that gives room back to a full queue with
// tasks waiting announces pending work.
func testLimitWakes(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limwake"
	n := fillPartitions(t, b, q, 2)
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n})
	got := drainAll(t, b, q, time.Minute)
	if len(got) != n {
		t.Fatalf("Dequeue under Concurrency %d handed out %d tasks", n, len(got))
	}
	ch, err := b.Subscribe(t.Context(), []string{q})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the subscription settle in
	settleOK(t, b, outcomeOf(got[0], broker.SettleDone))
	if !awaitEvent(t, ch, waitLong, func(e broker.Event) bool { return e.Kind == broker.EventPending && e.Queue == q }) {
		t.Fatal("no pending event after a settlement gave room back to a full queue")
	}
}

// testLimitConcurrent: many workers dequeue and settle at once; the tasks
// they hold never exceed the limit. A worker counts a task from its delivery
// until just before it settles it, so its count is never above the broker's.
func testLimitConcurrent(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limrace"
	n := fillPartitions(t, b, q, 25)
	limit := n + 1 // unequal shares when n > 1
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: limit})
	var running, done atomic.Int64
	total := int64(n * 25)
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			deadline := time.Now().Add(waitLong)
			for done.Load() < total && time.Now().Before(deadline) {
				ds, err := b.Dequeue(t.Context(), []string{q}, 3, time.Minute)
				if err != nil {
					errc <- err
					return
				}
				for range ds {
					if r := running.Add(1); r > int64(limit) {
						errc <- fmt.Errorf("%d tasks held at once under Concurrency %d", r, limit)
						return
					}
				}
				if len(ds) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				time.Sleep(time.Millisecond)
				for _, d := range ds {
					running.Add(-1)
					errs, err := b.Settle(t.Context(), []broker.Settlement{outcomeOf(d, broker.SettleDone)})
					if err == nil && errs[0] != nil {
						err = errs[0]
					}
					if err != nil {
						errc <- err
						return
					}
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if done.Load() != total {
		t.Fatalf("%d of %d tasks done", done.Load(), total)
	}
}

// testLimitInvalid: nonsensical limits are refused with ErrInvalidTask and
// change nothing.
func testLimitInvalid(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limbad"
	n := partitions(t, b, q)
	setLimits(t, a, q, tidetype.QueueLimits{Concurrency: n + 1})
	rate := func(limit int, per time.Duration) tidetype.QueueLimits {
		return tidetype.QueueLimits{Rate: tidetype.Rate{Limit: limit, Per: per}}
	}
	bad := []tidetype.QueueLimits{
		{Concurrency: -1}, {Concurrency: broker.MaxQueueConcurrency + 1},
		rate(-1, time.Second), rate(broker.MaxQueueRate+1, time.Second), rate(10, 0), rate(10, -time.Second),
		rate(10, time.Microsecond), rate(10, 1500*time.Microsecond), rate(10, broker.MaxRatePer+time.Millisecond),
		rate(0, time.Second),
	}
	for _, l := range bad {
		if err := a.SetQueueLimits(t.Context(), q, l); !errors.Is(err, broker.ErrInvalidTask) {
			t.Errorf("SetQueueLimits(%+v) = %v, want ErrInvalidTask", l, err)
		}
	}
	if got, err := a.QueueLimits(t.Context(), q); err != nil || got.Concurrency != n+1 {
		t.Fatalf("after refused changes QueueLimits = %+v, %v; want Concurrency %d", got, err, n+1)
	}
	if got, err := a.QueueLimits(t.Context(), "never-limited"); err != nil || got != (tidetype.QueueLimits{}) {
		t.Fatalf("QueueLimits of a queue without limits = %+v, %v", got, err)
	}
}

// testLimitRate: a rate limit hands out no more than Rate.Limit starts per
// Rate.Per, whatever finishes meanwhile; a refused Dequeue with tasks
// waiting announces when room opens; a waiting task uses no retry.
func testLimitRate(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limrate"
	n := fillPartitions(t, b, q, 4)
	limit := 2 * n
	setLimits(t, a, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: limit, Per: time.Hour}})
	ch, err := b.Subscribe(t.Context(), []string{q})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the subscription settle in
	got := drainAll(t, b, q, time.Minute)
	if len(got) != limit {
		t.Fatalf("Dequeue under Rate %d/h handed out %d tasks", limit, len(got))
	}
	for _, d := range got {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue with the hour's starts used up handed out %d (settling must not give starts back)", len(ds))
	}
	if !awaitEvent(t, ch, waitLong, func(e broker.Event) bool {
		return e.Kind == broker.EventPending && e.Queue == q && e.At.After(time.Now().Add(50*time.Minute))
	}) {
		t.Fatal("a Dequeue refused by the rate limit announced no pending event with the time room opens")
	}
	// Tasks held back are pending, their retries untouched.
	in, err := a.ListTasks(t.Context(), q, tidetype.StatePending, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 4*n-limit {
		t.Fatalf("%d tasks pending, want %d", len(in), 4*n-limit)
	}
	for _, ti := range in {
		if ti.Retried != 0 {
			t.Fatalf("task %s waiting for the rate limit has Retried %d", ti.ID, ti.Retried)
		}
	}
	// Removing the limit lets the rest start.
	setLimits(t, a, q, tidetype.QueueLimits{})
	if rest := drainAll(t, b, q, time.Minute); len(rest) != 4*n-limit {
		t.Fatalf("without a limit Dequeue handed out %d tasks, want %d", len(rest), 4*n-limit)
	}
}

// testLimitRateWindow: with Rate n per 300ms (a start per partition), the
// second round of starts comes no sooner than 300ms after the Dequeue call
// that made the first, and all tasks start in the end.
func testLimitRateWindow(t *testing.T, b broker.Broker, a broker.Admin) {
	const q = "limwindow"
	const per = 300 * time.Millisecond
	n := fillPartitions(t, b, q, 3)
	setLimits(t, a, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: n, Per: per}})
	began := time.Now()
	first := drainAll(t, b, q, time.Minute)
	if len(first) != n {
		t.Fatalf("Dequeue under Rate %d/%v handed out %d tasks", n, per, len(first))
	}
	total := len(first)
	for total < 3*n {
		if time.Since(began) > waitLong {
			t.Fatalf("only %d of %d tasks started after %v", total, 3*n, waitLong)
		}
		ds := dequeue(t, b, []string{q}, 10, time.Minute)
		if len(ds) > 0 && total < 2*n {
			if since := time.Since(began); since < per-time.Millisecond {
				t.Fatalf("a second round of starts came %v after the first round's Dequeue began, under Rate %d/%v", since, n, per)
			}
		}
		total += len(ds)
		time.Sleep(pollEvery)
	}
}
