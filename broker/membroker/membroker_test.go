package membroker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/brokertest"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/tidetype"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		b := membroker.New()
		t.Cleanup(func() { _ = b.Close() })
		return b
	})
}

// fakeClock is a Clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is a broker on a fake clock with helpers that fail the test on error.
type env struct {
	t   *testing.T
	clk *fakeClock
	b   *membroker.Broker
}

func newEnv(t *testing.T, opts ...membroker.Option) *env {
	t.Helper()
	clk := newFakeClock()
	b := membroker.New(append([]membroker.Option{membroker.WithClock(clk)}, opts...)...)
	t.Cleanup(func() { _ = b.Close() })
	return &env{t: t, clk: clk, b: b}
}

func (e *env) msg(id string) *tidetype.TaskInfo {
	now := e.clk.Now()
	return &tidetype.TaskInfo{
		ID: id, Queue: "q", Type: "t", Payload: []byte(id),
		State: tidetype.StatePending, MaxRetry: 3, NextProcessAt: now, EnqueuedAt: now,
	}
}

func (e *env) scheduled(id string, in time.Duration) *tidetype.TaskInfo {
	m := e.msg(id)
	m.State, m.NextProcessAt = tidetype.StateScheduled, e.clk.Now().Add(in)
	return m
}

func (e *env) enqueue(msgs ...*tidetype.TaskInfo) []error {
	e.t.Helper()
	errs, err := e.b.Enqueue(e.t.Context(), msgs, broker.EnqueueOptions{})
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return errs
}

func (e *env) mustEnqueue(msgs ...*tidetype.TaskInfo) {
	e.t.Helper()
	for i, err := range e.enqueue(msgs...) {
		if err != nil {
			e.t.Fatalf("Enqueue %s: %v", msgs[i].ID, err)
		}
	}
}

func (e *env) dequeue(n int, lease time.Duration) []*broker.Delivery {
	e.t.Helper()
	ds, err := e.b.Dequeue(e.t.Context(), []string{"q"}, n, lease)
	if err != nil {
		e.t.Fatalf("Dequeue: %v", err)
	}
	return ds
}

func (e *env) one(lease time.Duration) *broker.Delivery {
	e.t.Helper()
	ds := e.dequeue(1, lease)
	if len(ds) != 1 {
		e.t.Fatalf("Dequeue returned %d deliveries, want 1", len(ds))
	}
	return ds[0]
}

func (e *env) settle(d *broker.Delivery, o broker.SettleKind, mod func(*broker.Settlement)) error {
	e.t.Helper()
	s := broker.Settlement{
		Lease: broker.LeaseRef{Queue: d.Task.Queue, ID: d.Task.ID, Token: d.Token},
		Kind:  o, Task: d.Task, At: e.clk.Now(),
	}
	if mod != nil {
		mod(&s)
	}
	errs, err := e.b.Settle(e.t.Context(), []broker.Settlement{s})
	if err != nil {
		e.t.Fatalf("Settle: %v", err)
	}
	return errs[0]
}

func (e *env) maintain() broker.MaintainResult {
	e.t.Helper()
	r, err := e.b.Maintain(e.t.Context(), broker.MaintainRequest{
		Queue: "q", Owner: "me", OwnerTTL: time.Minute,
	})
	if err != nil {
		e.t.Fatalf("Maintain: %v", err)
	}
	return r
}

func (e *env) get(id string) (*tidetype.TaskInfo, error) {
	return e.b.GetTask(e.t.Context(), "q", id)
}

func (e *env) mustGet(id string) *tidetype.TaskInfo {
	e.t.Helper()
	m, err := e.get(id)
	if err != nil {
		e.t.Fatalf("GetTask(%s): %v", id, err)
	}
	return m
}

func TestDelayedWithFakeClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustEnqueue(e.scheduled("later", time.Hour), e.scheduled("sooner", time.Minute))
	due := e.clk.Now().Add(time.Minute)

	r := e.maintain()
	if r.Forwarded != 0 || !r.NextDue.Equal(due) || r.Pending != 0 {
		t.Fatalf("Maintain before due: %+v", r)
	}
	e.clk.Add(time.Minute - time.Millisecond)
	if r := e.maintain(); r.Forwarded != 0 {
		t.Fatalf("forwarded 1ms early: %+v", r)
	}
	e.clk.Add(time.Millisecond)
	r = e.maintain()
	if r.Forwarded != 1 || r.Pending != 1 || !r.NextDue.Equal(due.Add(59*time.Minute)) {
		t.Fatalf("Maintain at due: %+v", r)
	}
	d := e.one(time.Minute)
	if d.Task.ID != "sooner" || !d.Task.NextProcessAt.Equal(due) {
		t.Fatalf("dequeued %s due %v, want sooner due %v", d.Task.ID, d.Task.NextProcessAt, due)
	}
}

func TestNowUsesClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.clk.Add(time.Hour)
	if got, want := e.b.Now(), e.clk.Now(); !got.Equal(want) {
		t.Fatalf("Now() = %v, want the fake clock's %v", got, want)
	}
}

func TestDueScheduledIsStoredPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	past := e.scheduled("past", -time.Second)
	now := e.scheduled("now", 0)
	e.mustEnqueue(past, now)
	for _, id := range []string{"past", "now"} {
		if m := e.mustGet(id); m.State != tidetype.StatePending {
			t.Fatalf("%s: State %v, want pending", id, m.State)
		}
	}
	if m := e.mustGet("past"); !m.NextProcessAt.Equal(past.NextProcessAt) {
		t.Fatalf("ProcessAt = %v, want the due time %v", m.NextProcessAt, past.NextProcessAt)
	}
}

// leaseExpiredErr is the LastErr of a task recovered after its lease expired.
const leaseExpiredErr = "tide: lease expired: the worker died, stalled or lost the broker while processing the task"

func TestLeaseExpiryWithFakeClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustEnqueue(e.msg("a"))
	d := e.one(10 * time.Second)

	e.clk.Add(9 * time.Second)
	if r := e.maintain(); r.Recovered != 0 || r.NextLeaseIn != time.Second {
		t.Fatalf("Maintain before expiry: %+v", r)
	}
	errs, err := e.b.Extend(t.Context(), []broker.LeaseRef{{Queue: "q", ID: "a", Token: d.Token}}, 5*time.Second)
	if err != nil || errs[0] != nil {
		t.Fatalf("Extend: %v %v", errs, err)
	}
	e.clk.Add(4 * time.Second)
	if r := e.maintain(); r.Recovered != 0 || r.NextLeaseIn != time.Second {
		t.Fatalf("Maintain within the extended lease: %+v", r)
	}
	e.clk.Add(time.Second)
	r := e.maintain()
	if r.Recovered != 1 || r.Pending != 1 || r.NextLeaseIn != 0 || r.Forwarded != 0 {
		t.Fatalf("Maintain at expiry: %+v", r)
	}
	m := e.mustGet("a")
	now := e.clk.Now()
	if m.State != tidetype.StatePending || m.Retried != 1 || m.LastErr != leaseExpiredErr ||
		!m.LastFailedAt.Equal(now) || !m.NextProcessAt.Equal(now) {
		t.Fatalf("recovered task: %+v", m)
	}
	if err := e.settle(d, broker.SettleDone, nil); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("Settle with the expired lease: %v, want ErrLeaseLost", err)
	}
	if d2 := e.one(time.Minute); d2.Token <= d.Token {
		t.Fatalf("redelivery token %d, want one above %d", d2.Token, d.Token)
	}
}

// A task recovered after its lease expired waits RecoverBackoff, doubled per
// retry it has used, before it runs again: a task that kills its worker must
// not hit the fleet again at once.
func TestRecoveryBacksOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustEnqueue(e.msg("a"))
	maintain := func() broker.MaintainResult {
		r, err := e.b.Maintain(t.Context(), broker.MaintainRequest{Queue: "q", Owner: "me", OwnerTTL: time.Minute, RecoverBackoff: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i, wait := range []time.Duration{10 * time.Second, 20 * time.Second} {
		e.one(time.Second)
		e.clk.Add(time.Second)
		if r := maintain(); r.Recovered != 1 || r.Pending != 0 {
			t.Fatalf("recovery %d: %+v", i, r)
		}
		m := e.mustGet("a")
		if m.State != tidetype.StateRetry || m.LastErr != leaseExpiredErr || !m.NextProcessAt.Equal(e.clk.Now().Add(wait)) {
			t.Fatalf("recovery %d: %+v, want retry due in %v", i, m, wait)
		}
		e.clk.Add(wait - time.Millisecond)
		if r := maintain(); r.Forwarded != 0 {
			t.Fatalf("recovery %d: forwarded before its back-off ended", i)
		}
		e.clk.Add(time.Millisecond)
		if r := maintain(); r.Forwarded != 1 {
			t.Fatalf("recovery %d: not forwarded when its back-off ended: %+v", i, r)
		}
	}
}

func TestLateSettleBeforeRecoverySucceeds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustEnqueue(e.msg("a"))
	d := e.one(time.Second)
	e.clk.Add(time.Hour) // expired, but nobody recovered it yet
	if err := e.settle(d, broker.SettleDone, nil); err != nil {
		t.Fatalf("Settle of an expired but unrecovered lease: %v", err)
	}
}

func TestRecoveryArchivesWhenExhausted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.msg("a")
	m.MaxRetry = 0
	m.UniqueKey, m.UniqueTTL = "k", time.Hour
	e.mustEnqueue(m)
	e.one(time.Second)
	e.clk.Add(time.Second)
	if r := e.maintain(); r.Recovered != 1 || r.Pending != 0 {
		t.Fatalf("Maintain: %+v", r)
	}
	got := e.mustGet("a")
	if got.State != tidetype.StateArchived || got.Retried != 0 || got.LastErr == "" || !got.LastFailedAt.Equal(e.clk.Now()) {
		t.Fatalf("exhausted task: %+v", got)
	}
	m2 := e.msg("b")
	m2.UniqueKey, m2.UniqueTTL = "k", time.Hour
	e.mustEnqueue(m2)
}

func TestRetentionWithFakeClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.msg("a")
	m.Retention = time.Hour
	e.mustEnqueue(m)
	d := e.one(time.Minute)
	d.Task.Retention = 0 // the stored message's retention counts, not the settlement's
	if err := e.settle(d, broker.SettleDone, nil); err != nil {
		t.Fatal(err)
	}
	if got := e.mustGet("a"); got.State != tidetype.StateCompleted || !got.CompletedAt.Equal(e.clk.Now()) {
		t.Fatalf("completed task: %+v", got)
	}
	e.clk.Add(time.Hour - time.Millisecond)
	e.maintain()
	e.mustGet("a")
	e.clk.Add(time.Millisecond)
	e.maintain()
	if _, err := e.get("a"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("GetTask after retention: %v, want ErrTaskNotFound", err)
	}
}

func TestArchiveTrim(t *testing.T) {
	t.Parallel()
	archive := func(e *env, n int) {
		t.Helper()
		for i := range n {
			e.mustEnqueue(e.msg(fmt.Sprint("a", i)))
			if err := e.settle(e.one(time.Minute), broker.SettleArchive, func(s *broker.Settlement) { s.Err = "x" }); err != nil {
				t.Fatal(err)
			}
			e.clk.Add(time.Second)
		}
	}
	exists := func(e *env, id string) bool {
		_, err := e.get(id)
		return err == nil
	}
	t.Run("ByCount", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, membroker.WithMaxArchived(3))
		archive(e, 5)
		e.maintain()
		for i, want := range []bool{false, false, true, true, true} {
			if got := exists(e, fmt.Sprint("a", i)); got != want {
				t.Errorf("a%d exists = %v, want %v", i, got, want)
			}
		}
	})
	t.Run("ByAge", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, membroker.WithArchiveTTL(time.Hour))
		archive(e, 3)                        // archived at T, T+1s, T+2s; now T+3s
		e.clk.Add(time.Hour - 3*time.Second) // a0 is exactly an hour old
		e.maintain()
		for i, want := range []bool{false, true, true} {
			if got := exists(e, fmt.Sprint("a", i)); got != want {
				t.Errorf("a%d exists = %v, want %v", i, got, want)
			}
		}
	})
	t.Run("Unbounded", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, membroker.WithMaxArchived(0), membroker.WithArchiveTTL(0))
		archive(e, 3)
		e.clk.Add(1000 * 24 * time.Hour)
		e.maintain()
		for i := range 3 {
			if !exists(e, fmt.Sprint("a", i)) {
				t.Errorf("a%d was trimmed", i)
			}
		}
	})
}

func TestUniqueTTLWithFakeClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	u := func(id string) *tidetype.TaskInfo {
		m := e.msg(id)
		m.UniqueKey, m.UniqueTTL = "k", time.Minute
		return m
	}
	e.mustEnqueue(u("a"))
	e.clk.Add(time.Minute - time.Millisecond)
	if errs := e.enqueue(u("b")); !errors.Is(errs[0], broker.ErrDuplicateTask) {
		t.Fatalf("before the TTL: %v, want ErrDuplicateTask", errs[0])
	}
	e.clk.Add(time.Millisecond)
	e.mustEnqueue(u("b"))
	// a finishing must not release b's lock.
	if err := e.b.Delete(t.Context(), "q", "a"); err != nil {
		t.Fatal(err)
	}
	if errs := e.enqueue(u("c")); !errors.Is(errs[0], broker.ErrDuplicateTask) {
		t.Fatalf("after the expired holder finished: %v, want ErrDuplicateTask (b holds the lock)", errs[0])
	}
}

func TestOwnershipWithFakeClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	claim := func(owner string) broker.MaintainResult {
		r, err := e.b.Maintain(t.Context(), broker.MaintainRequest{Queue: "q", Owner: owner, OwnerTTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if !claim("A").Owned {
		t.Fatal("A not owner")
	}
	e.clk.Add(4 * time.Second)
	if r := claim("B"); r.Owned || r.RetryIn != 6*time.Second {
		t.Fatalf("B: %+v, want not owned, RetryIn 6s", r)
	}
	e.clk.Add(6 * time.Second)
	if !claim("B").Owned {
		t.Fatal("B did not take over")
	}
	if r := claim("A"); r.Owned || r.RetryIn != 10*time.Second {
		t.Fatalf("A: %+v, want not owned, RetryIn 10s", r)
	}
}

func TestRequeueGoesToFront(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustEnqueue(e.msg("a"), e.msg("b"))
	if err := e.settle(e.one(time.Minute), broker.SettleRequeue, nil); err != nil {
		t.Fatal(err)
	}
	if d := e.one(time.Minute); d.Task.ID != "a" {
		t.Fatalf("after requeue dequeued %s, want a", d.Task.ID)
	}
}

func TestRetryStaysUntilForwarded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustEnqueue(e.msg("a"))
	if err := e.settle(e.one(time.Minute), broker.SettleRetry, func(s *broker.Settlement) {
		s.RetryAt, s.Err = e.clk.Now().Add(-time.Second), "boom"
	}); err != nil {
		t.Fatal(err)
	}
	if len(e.dequeue(1, time.Minute)) != 0 {
		t.Fatal("retry task dequeued before Maintain forwarded it")
	}
	if r := e.maintain(); r.Forwarded != 1 {
		t.Fatalf("Maintain: %+v", r)
	}
	e.one(time.Minute)
}

func TestEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := e.b.Subscribe(ctx, []string{"q"})
	if err != nil {
		t.Fatal(err)
	}
	next := func(want broker.EventKind, at time.Time) {
		t.Helper()
		select {
		case ev := <-ch:
			if ev.Kind != want || ev.Queue != "q" || ev.Partition != 0 || !ev.At.Equal(at) {
				t.Fatalf("event %+v, want kind %d at %v", ev, want, at)
			}
		default:
			t.Fatalf("no event, want kind %d", want)
		}
	}
	none := func() {
		t.Helper()
		select {
		case ev := <-ch:
			t.Fatalf("unexpected event %+v", ev)
		default:
		}
	}
	now := e.clk.Now()

	e.mustEnqueue(e.msg("p1"))
	next(broker.EventPending, time.Time{})
	e.mustEnqueue(e.msg("p2")) // queue not empty
	none()

	e.mustEnqueue(e.scheduled("s1", time.Hour))
	next(broker.EventScheduled, now.Add(time.Hour))
	e.mustEnqueue(e.scheduled("s2", 2*time.Hour)) // not the earliest
	none()
	e.mustEnqueue(e.scheduled("s3", time.Minute))
	next(broker.EventScheduled, now.Add(time.Minute))

	// A retry earlier than everything else.
	d := e.one(time.Minute)
	if err := e.settle(d, broker.SettleRetry, func(s *broker.Settlement) { s.RetryAt = now.Add(time.Second) }); err != nil {
		t.Fatal(err)
	}
	next(broker.EventScheduled, now.Add(time.Second))

	// Empty the queue, then forwarding makes it pending again.
	e.one(time.Minute)
	none()
	e.clk.Add(time.Second)
	if r := e.maintain(); r.Forwarded != 1 {
		t.Fatalf("Maintain: %+v", r)
	}
	next(broker.EventPending, time.Time{})

	// Recovery of an expired lease into an empty queue.
	e.dequeue(10, time.Second)
	none()
	e.clk.Add(time.Second)
	if r := e.maintain(); r.Recovered == 0 {
		t.Fatalf("Maintain: %+v", r)
	}
	next(broker.EventPending, time.Time{})
	none()
}

func TestEventsWhilePaused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch, err := e.b.Subscribe(t.Context(), []string{"q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.Pause(t.Context(), "q"); err != nil {
		t.Fatal(err)
	}
	e.mustEnqueue(e.msg("a"))
	select {
	case ev := <-ch:
		t.Fatalf("event %+v for a paused queue", ev)
	default:
	}
	if err := e.b.Unpause(t.Context(), "q"); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		if ev.Kind != broker.EventPending {
			t.Fatalf("event %+v, want pending", ev)
		}
	default:
		t.Fatal("no event on Unpause with a task waiting")
	}
}

func TestSubscribeDropsWhenFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := e.b.Subscribe(ctx, []string{"q"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 { // never read: must not block
		e.mustEnqueue(e.msg(fmt.Sprint(i)))
		if err := e.settle(e.one(time.Minute), broker.SettleDone, nil); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	n := 0
	for range ch {
		n++
	}
	if n == 0 || n > 1000 {
		t.Fatalf("received %d buffered events", n)
	}
}

func TestCloseClosesSubscriptions(t *testing.T) {
	t.Parallel()
	b := membroker.New()
	ch1, err := b.Subscribe(t.Context(), []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	ch2, err := b.Subscribe(t.Context(), []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan broker.Event{ch1, ch2} {
		if _, ok := <-ch; ok {
			t.Fatal("channel open after Close")
		}
	}
	if err := b.Close(); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}
	if _, err := b.Partitions(context.Background(), "a"); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Partitions after Close: %v, want ErrClosed", err)
	}
}

func TestCanceledContext(t *testing.T) {
	t.Parallel()
	b := membroker.New()
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := b.Enqueue(ctx, nil, broker.EnqueueOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Enqueue: %v", err)
	}
	if _, err := b.Subscribe(ctx, []string{"q"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := b.Pause(ctx, "q"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Pause: %v", err)
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	bad := func(mod func(m *tidetype.TaskInfo)) *tidetype.TaskInfo {
		m := e.msg("x")
		mod(m)
		return m
	}
	msgs := []*tidetype.TaskInfo{
		nil,
		bad(func(m *tidetype.TaskInfo) { m.Retried = -1 }), // an empty ID is valid: the broker chooses one
		bad(func(m *tidetype.TaskInfo) { m.Queue = "" }),
		bad(func(m *tidetype.TaskInfo) { m.Type = "" }),
		bad(func(m *tidetype.TaskInfo) { m.State = tidetype.StateActive }),
		bad(func(m *tidetype.TaskInfo) { m.State = 0 }),
		bad(func(m *tidetype.TaskInfo) { m.State, m.NextProcessAt = tidetype.StateScheduled, time.Time{} }),
		bad(func(m *tidetype.TaskInfo) { m.MaxRetry = -1 }),
		bad(func(m *tidetype.TaskInfo) { m.Timeout = -time.Second }),
		bad(func(m *tidetype.TaskInfo) { m.UniqueKey = "k" }),
		e.msg("good"),
	}
	errs := e.enqueue(msgs...)
	for i, err := range errs[:len(errs)-1] {
		if err == nil || errors.Is(err, broker.ErrTaskIDConflict) || errors.Is(err, broker.ErrDuplicateTask) {
			t.Errorf("message %d: error %v, want a validation error", i, err)
		}
	}
	if errs[len(errs)-1] != nil {
		t.Errorf("valid message: %v", errs[len(errs)-1])
	}
	if _, err := e.b.GetTask(ctx, "q", "x"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Errorf("an invalid message was stored: %v", err)
	}

	if _, err := e.b.Dequeue(ctx, []string{"q"}, 1, 0); err == nil {
		t.Error("Dequeue with a zero lease succeeded")
	}
	if _, err := e.b.Dequeue(ctx, []string{""}, 1, time.Second); err == nil {
		t.Error("Dequeue of an empty queue name succeeded")
	}
	if ds, err := e.b.Dequeue(ctx, []string{"q"}, 0, time.Second); err != nil || len(ds) != 0 {
		t.Errorf("Dequeue(n=0): %v %v, want nothing", ds, err)
	}
	if _, err := e.b.Extend(ctx, nil, 0); err == nil {
		t.Error("Extend by zero succeeded")
	}
	d := e.one(time.Minute)
	if err := e.settle(d, 0, nil); err == nil || errors.Is(err, broker.ErrLeaseLost) {
		t.Errorf("Settle with outcome 0: %v, want a validation error", err)
	}
	if err := e.settle(d, broker.SettleDone, nil); err != nil {
		t.Errorf("Settle after an invalid one: %v", err)
	}
	for _, req := range []broker.MaintainRequest{
		{Owner: "o", OwnerTTL: time.Second},
		{Queue: "q", Partition: 1, Owner: "o", OwnerTTL: time.Second},
		{Queue: "q", OwnerTTL: time.Second},
		{Queue: "q", Owner: "o"},
	} {
		if _, err := e.b.Maintain(ctx, req); err == nil {
			t.Errorf("Maintain(%+v) succeeded", req)
		}
	}
	if _, err := e.b.Subscribe(ctx, nil); err == nil {
		t.Error("Subscribe to no queues succeeded")
	}
	if err := e.b.Pause(ctx, ""); err == nil {
		t.Error("Pause of an empty queue name succeeded")
	}
}

func TestMillisecondPrecision(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.msg("a")
	m.NextProcessAt = m.NextProcessAt.Add(1500 * time.Microsecond)
	m.Timeout = 2*time.Second + 999*time.Microsecond
	e.mustEnqueue(m)
	got := e.mustGet("a")
	if !got.NextProcessAt.Equal(e.clk.Now().Add(time.Millisecond)) || got.Timeout != 2*time.Second {
		t.Fatalf("ProcessAt %v Timeout %v, want truncated to ms", got.NextProcessAt, got.Timeout)
	}
}

// TestManyTasks pushes a demo-sized load through the heaps and the FIFO and
// checks that due tasks come out in due-time order.
func TestManyTasks(t *testing.T) {
	t.Parallel()
	const n = 100_000
	e := newEnv(t)
	rng := rand.New(rand.NewPCG(1, 2))
	batch := make([]*tidetype.TaskInfo, 0, 1000)
	for i := range n {
		batch = append(batch, e.scheduled(fmt.Sprint(i), time.Duration(1+rng.IntN(3600_000))*time.Millisecond))
		if len(batch) == cap(batch) {
			e.mustEnqueue(batch...)
			batch = batch[:0]
		}
	}
	e.clk.Add(2 * time.Hour)
	if r := e.maintain(); r.Forwarded != n || r.Pending != n {
		t.Fatalf("Maintain: %+v", r)
	}
	var last time.Time
	total := 0
	for {
		ds := e.dequeue(100, time.Minute)
		if len(ds) == 0 {
			break
		}
		for _, d := range ds {
			if d.Task.NextProcessAt.Before(last) {
				t.Fatalf("task due %v handed out after one due %v", d.Task.NextProcessAt, last)
			}
			last = d.Task.NextProcessAt
		}
		total += len(ds)
	}
	if total != n {
		t.Fatalf("dequeued %d tasks, want %d", total, n)
	}
}

func BenchmarkEnqueueDequeueSettle(b *testing.B) {
	br := membroker.New()
	defer br.Close()
	ctx := context.Background()
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m := &tidetype.TaskInfo{ID: fmt.Sprint(i), Queue: "q", Type: "t", State: tidetype.StatePending, NextProcessAt: now}
		if _, err := br.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{}); err != nil {
			b.Fatal(err)
		}
		ds, err := br.Dequeue(ctx, []string{"q"}, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			b.Fatal(err)
		}
		ref := broker.LeaseRef{Queue: "q", ID: m.ID, Token: ds[0].Token}
		if _, err := br.Settle(ctx, []broker.Settlement{{Lease: ref, Kind: broker.SettleDone}}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestIdempotencyWindow(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	b := membroker.New(membroker.WithClock(clk), membroker.WithIdempotencyWindow(time.Hour))
	enq := func() string {
		t.Helper()
		m := &tidetype.TaskInfo{Queue: "q", Type: "t", State: tidetype.StatePending, IdempotencyKey: "k"}
		errs, err := b.Enqueue(t.Context(), []*tidetype.TaskInfo{m}, broker.EnqueueOptions{})
		if err != nil || errs[0] != nil {
			t.Fatalf("Enqueue: %v %v", err, errs)
		}
		return m.ID
	}
	first := enq()
	clk.Add(59 * time.Minute)
	if id := enq(); id != first {
		t.Fatalf("within the window: ID %q, want %q", id, first)
	}
	clk.Add(2 * time.Minute)
	if id := enq(); id == first {
		t.Fatal("after the window the key still answered with the first task")
	}
}
