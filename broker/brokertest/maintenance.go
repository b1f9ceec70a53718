package brokertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

func testOwnership(t *testing.T, b broker.Broker) {
	req := func(owner string, ttl time.Duration) broker.MaintainResult {
		t.Helper()
		r, err := b.Maintain(t.Context(), broker.MaintainRequest{Queue: "own", Owner: owner, OwnerTTL: ttl})
		if err != nil {
			t.Fatalf("Maintain(%s): %v", owner, err)
		}
		return r
	}
	if r := req("A", time.Minute); !r.Owned {
		t.Fatalf("first claim by A: Owned = false")
	}
	if r := req("A", time.Minute); !r.Owned {
		t.Fatalf("renewal by A: Owned = false")
	}
	r := req("B", time.Minute)
	if r.Owned {
		t.Fatalf("B claimed a partition A holds")
	}
	if r.RetryIn <= 0 || r.RetryIn > time.Minute {
		t.Fatalf("B: RetryIn = %v, want in (0, 1m]", r.RetryIn)
	}
	// A renews with a short TTL and stops; B takes over once it lapses.
	const short = 200 * time.Millisecond
	start := time.Now()
	if r := req("A", short); !r.Owned {
		t.Fatalf("renewal by A: Owned = false")
	}
	eventually(t, waitLong, "B to take over after A's claim lapsed", func() bool {
		r := req("B", time.Minute)
		// In the claim's last millisecond RetryIn may round to 0.
		if !r.Owned && (r.RetryIn < 0 || r.RetryIn > short) {
			t.Fatalf("B refused with RetryIn = %v, want in [0, %v]", r.RetryIn, short)
		}
		return r.Owned
	})
	if time.Since(start) < short {
		t.Fatalf("B took over after %v, before A's claim of %v lapsed", time.Since(start), short)
	}
	if r := req("A", time.Minute); r.Owned || r.RetryIn <= 0 {
		t.Fatalf("A after B took over: Owned %v RetryIn %v, want false and positive", r.Owned, r.RetryIn)
	}
}

func testMaintainResult(t *testing.T, b broker.Broker) {
	r := maintain(t, b, "q")
	if r.Pending != 0 || !r.NextDue.IsZero() || r.NextLeaseIn != 0 || r.Forwarded != 0 || r.Recovered != 0 {
		t.Fatalf("Maintain of an empty queue: %+v, want zeros", r)
	}
	now := time.Now()
	s1, s2 := newMsg("q", "s1"), newMsg("q", "s2")
	s1.State, s1.NextProcessAt = tidetype.StateScheduled, now.Add(time.Hour)
	s2.State, s2.NextProcessAt = tidetype.StateScheduled, now.Add(2*time.Hour)
	enqueue(t, b, newMsg("q", "p1"), newMsg("q", "p2"), newMsg("q", "p3"), s2, s1)
	dequeueOne(t, b, "q", 30*time.Second)
	r = maintain(t, b, "q")
	switch {
	case r.Pending != 2:
		t.Fatalf("Pending = %d, want 2", r.Pending)
	case !sameTime(r.NextDue, s1.NextProcessAt):
		t.Fatalf("NextDue = %v, want %v", r.NextDue, s1.NextProcessAt)
	case r.NextLeaseIn <= 0 || r.NextLeaseIn > 30*time.Second:
		t.Fatalf("NextLeaseIn = %v, want in (0, 30s]", r.NextLeaseIn)
	case r.Forwarded != 0 || r.Recovered != 0:
		t.Fatalf("Forwarded %d Recovered %d, want 0 and 0", r.Forwarded, r.Recovered)
	}
}

func testSubscribePending(t *testing.T, b broker.Broker) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := b.Subscribe(ctx, []string{"a", "b"})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	// Events are hints and the subscription may still be settling, so the
	// suite tries several times, emptying the queue in between.
	deadline := time.Now().Add(waitLong)
	for i := 0; ; i++ {
		enqueue(t, b, newMsg("b", fmt.Sprint("p", i)))
		if awaitEvent(t, ch, waitEvent, func(e broker.Event) bool {
			return e.Kind == broker.EventPending && e.Queue == "b"
		}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no EventPending for queue b within %v", waitLong)
		}
		for _, d := range dequeue(t, b, []string{"b"}, 100, time.Minute) {
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
		}
	}
}

func testSubscribeScheduled(t *testing.T, b broker.Broker) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := b.Subscribe(ctx, []string{"a", "b"})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	base := time.Now().Add(time.Hour)
	var sent []time.Time
	deadline := time.Now().Add(waitLong)
	for i := 0; ; i++ {
		m := newMsg("a", fmt.Sprint("s", i))
		m.State, m.NextProcessAt = tidetype.StateScheduled, base.Add(-time.Duration(i)*time.Minute)
		sent = append(sent, m.NextProcessAt)
		enqueue(t, b, m)
		if awaitEvent(t, ch, waitEvent, func(e broker.Event) bool {
			return e.Kind == broker.EventScheduled && e.Queue == "a" &&
				slices.ContainsFunc(sent, func(at time.Time) bool { return sameTime(at, e.At) })
		}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no EventScheduled for queue a within %v", waitLong)
		}
	}
}

func testSubscribeCancel(t *testing.T, b broker.Broker) {
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := b.Subscribe(ctx, []string{"q"})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	enqueue(t, b, newMsg("q", "x"))
	cancel()
	awaitClosed(t, ch)
}

func testConcurrentDequeue(t *testing.T, b broker.Broker) {
	const tasks, workers = 2000, 8
	for i := 0; i < tasks; i += 100 {
		var batch []*tidetype.TaskInfo
		for j := i; j < i+100; j++ {
			batch = append(batch, newMsg("q", fmt.Sprint("c", j)))
		}
		enqueue(t, b, batch...)
	}
	got := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				ds, err := b.Dequeue(t.Context(), []string{"q"}, 1+w%5, time.Minute)
				if err != nil {
					t.Errorf("Dequeue: %v", err)
					return
				}
				if len(ds) == 0 {
					return
				}
				ss := make([]broker.Settlement, len(ds))
				for i, d := range ds {
					got[w] = append(got[w], d.Task.ID)
					ss[i] = outcomeOf(d, broker.SettleDone)
				}
				errs, err := b.Settle(t.Context(), ss)
				if err != nil {
					t.Errorf("Settle: %v", err)
					return
				}
				for i, e := range errs {
					if e != nil {
						t.Errorf("Settle %s: %v", ss[i].Lease.ID, e)
					}
				}
			}
		})
	}
	wg.Wait()
	seen := make(map[string]bool, tasks)
	for _, ids := range got {
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("task %s handed out twice", id)
			}
			seen[id] = true
		}
	}
	if len(seen) != tasks {
		t.Fatalf("%d distinct tasks handed out, want %d", len(seen), tasks)
	}
}

func testClosed(t *testing.T, b broker.Broker) {
	ctx := t.Context()
	enqueue(t, b, newMsg("q", "x"))
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ref := broker.LeaseRef{Queue: "q", ID: "x", Token: 1}
	calls := map[string]func() error{
		"Enqueue": func() error {
			_, err := b.Enqueue(ctx, []*tidetype.TaskInfo{newMsg("q", "y")}, broker.EnqueueOptions{})
			return err
		},
		"Dequeue": func() error { _, err := b.Dequeue(ctx, []string{"q"}, 1, time.Minute); return err },
		"Extend":  func() error { _, err := b.Extend(ctx, []broker.LeaseRef{ref}, time.Minute); return err },
		"Settle": func() error {
			_, err := b.Settle(ctx, []broker.Settlement{{Lease: ref, Kind: broker.SettleDone, At: time.Now()}})
			return err
		},
		"SetResult": func() error { return b.SetResult(ctx, ref, nil) },
		"Maintain": func() error {
			_, err := b.Maintain(ctx, broker.MaintainRequest{Queue: "q", Owner: owner, OwnerTTL: time.Minute})
			return err
		},
		"Subscribe": func() error { _, err := b.Subscribe(ctx, []string{"q"}); return err },
		"GetTask":   func() error { _, err := b.GetTask(ctx, "q", "x"); return err },
		"Delete":    func() error { return b.Delete(ctx, "q", "x") },
		"Pause":     func() error { return b.Pause(ctx, "q") },
		"Unpause":   func() error { return b.Unpause(ctx, "q") },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, broker.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

// testCloseEndsSubscriptions checks that Close, which releases the broker's
// resources, also ends its subscriptions: their channels close although
// their contexts are still live.
func testCloseEndsSubscriptions(t *testing.T, b broker.Broker) {
	ch1, err := b.Subscribe(t.Context(), []string{"q"})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	ch2, err := b.Subscribe(t.Context(), []string{"q", "r"})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	awaitClosed(t, ch1)
	awaitClosed(t, ch2)
}

// ---- helpers ----
