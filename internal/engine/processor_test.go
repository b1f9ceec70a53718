package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

func TestProcessor(t *testing.T) {
	t.Parallel()

	t.Run("ProcessesAndSettles", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, nil)
		var ids []string
		for i := range 20 {
			ids = append(ids, fmt.Sprint("t", i))
		}
		bd.enqueue(t, 0, ids...)
		p := newProcessor(bd.cfg)
		p.start()
		p.wake()
		testwait.For(t, 10*time.Second, "every task to be settled", func() bool {
			for _, id := range ids {
				if bd.state(t, id) != 0 {
					return false
				}
			}
			return true
		})
		p.stop()
	})

	t.Run("ConcurrencyBound", func(t *testing.T) {
		t.Parallel()
		var running, most atomic.Int32
		release := make(chan struct{})
		bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
			n := running.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			<-release
			running.Add(-1)
			return broker.Settlement{Kind: broker.SettleDone}, true
		})
		bd.enqueue(t, 0, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
		p := newProcessor(bd.cfg)
		p.start()
		p.wake()
		testwait.For(t, 10*time.Second, "the workers to fill", func() bool { return running.Load() == 4 })
		close(release)
		testwait.For(t, 10*time.Second, "every task to run", func() bool { return bd.state(t, "j") == 0 && bd.state(t, "a") == 0 })
		p.stop()
		if m := most.Load(); m != 4 {
			t.Fatalf("%d tasks ran at once with Concurrency 4", m)
		}
	})

	// Workers are kept: with one slot, every task runs on the one worker
	// goroutine, not on a goroutine started for it.
	t.Run("ReusesWorkers", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		gs := map[string]bool{}
		bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
			buf := make([]byte, 64)
			g, _, _ := strings.Cut(string(buf[:runtime.Stack(buf, false)]), " [")
			mu.Lock()
			gs[g] = true
			mu.Unlock()
			return broker.Settlement{Kind: broker.SettleDone}, true
		})
		bd.cfg.Concurrency = 1
		ids := []string{"a", "b", "c", "d", "e"}
		bd.enqueue(t, 0, ids...)
		p := newProcessor(bd.cfg)
		p.start()
		p.wake()
		testwait.For(t, 10*time.Second, "every task to be settled", func() bool {
			for _, id := range ids {
				if bd.state(t, id) != 0 {
					return false
				}
			}
			return true
		})
		p.stop()
		if len(gs) != 1 {
			t.Fatalf("5 tasks with Concurrency 1 ran on %d goroutines (%v), want 1", len(gs), gs)
		}
	})

	// A cancellation reaches the handler as the cause of its context, from
	// the event and, when the event is missed, from the lease renewal.
	for _, via := range []string{"event", "renewal"} {
		t.Run("CancelVia"+via, func(t *testing.T) {
			t.Parallel()
			cause := make(chan error, 1)
			started := make(chan struct{})
			bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
				close(started)
				<-ctx.Done()
				cause <- context.Cause(ctx)
				return broker.Settlement{Kind: broker.SettleArchive, Err: "cancelled"}, true
			})
			bd.enqueue(t, 0, "job")
			p := newProcessor(bd.cfg)
			p.start()
			p.wake()
			<-started
			if via == "event" {
				p.cancelTask("q", "job")
			} else if err := bd.b.Cancel(context.Background(), "q", "job"); err != nil {
				t.Fatal(err) // recorded; the keeper's next Extend reports it
			}
			if c := <-cause; !errors.Is(c, broker.ErrTaskCanceled) {
				t.Fatalf("cause %v, want ErrTaskCanceled", c)
			}
			p.stop()
		})
	}

	// A handler whose lease was taken (it expired and another server
	// recovered the task) is stopped, and nothing is written for it.
	t.Run("LeaseLost", func(t *testing.T) {
		t.Parallel()
		cause := make(chan error, 1)
		started := make(chan struct{})
		var once sync.Once
		var wrote atomic.Bool
		bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
			// The recovered task is pending again and may be delivered
			// once more before the processor stops.
			once.Do(func() { close(started) })
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return broker.Settlement{}, false
		})
		bd.cfg.Broker = settleSpy{Broker: bd.b, wrote: &wrote}
		bd.enqueue(t, 0, "job")
		p := newProcessor(bd.cfg)
		p.start()
		p.wake()
		<-started
		bd.clock.Advance(time.Hour)
		if r, err := bd.b.Maintain(context.Background(), broker.MaintainRequest{Queue: "q", Owner: "other", OwnerTTL: time.Second}); err != nil || r.Recovered != 1 {
			t.Fatalf("recovery: %+v, %v", r, err)
		}
		if c := <-cause; !errors.Is(c, broker.ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", c)
		}
		p.stop()
		if wrote.Load() {
			t.Fatal("a settlement was written for a lost lease")
		}
	})

	// At shutdown, a handler still running after the grace period sees
	// ErrShutdown and its settlement is written before stop returns.
	t.Run("ShutdownCutsOffAndSettles", func(t *testing.T) {
		t.Parallel()
		started := make(chan struct{})
		cause := make(chan error, 1)
		bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return broker.Settlement{Kind: broker.SettleRequeue}, true
		})
		bd.cfg.ShutdownTimeout = 50 * time.Millisecond
		bd.enqueue(t, 0, "job")
		p := newProcessor(bd.cfg)
		p.start()
		p.wake()
		<-started
		p.stop()
		if c := <-cause; !errors.Is(c, ErrShutdown) {
			t.Fatalf("cause %v, want ErrShutdown", c)
		}
		if st := bd.state(t, "job"); st.String() != "pending" {
			t.Fatalf("after shutdown the task is %v, want pending", st)
		}
	})

	// A settlement the broker could not apply for want of a connection is
	// written again; the others of its batch are not held back.
	t.Run("SettleRetriesUnavailable", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, nil)
		flaky := &flakySettle{Broker: bd.b, failID: "b", failures: 2}
		bd.cfg.Broker = flaky
		bd.enqueue(t, 0, "a", "b", "c")
		p := newProcessor(bd.cfg)
		p.start()
		p.wake()
		testwait.For(t, 10*time.Second, "every task to be settled", func() bool {
			return bd.state(t, "a") == 0 && bd.state(t, "b") == 0 && bd.state(t, "c") == 0
		})
		p.stop()
		if n := flaky.failed.Load(); n != 2 {
			t.Fatalf("the flaky settlement failed %d times, want 2", n)
		}
	})
}

// TestProcessorWatchdog checks the lease watchdog on a fake local clock: a
// handler is stopped at the deadline counted from when its lease was asked
// for, while a renewal is still waiting for its answer, and a renewal
// moves the deadline from when it was sent, not from when its answer came.
func TestProcessorWatchdog(t *testing.T) {
	t.Parallel()
	// With a 600ms lease a worker counts on it for 540ms after sending the
	// request that granted or renewed it (see leaseBudget).
	const (
		lease  = 600 * time.Millisecond
		budget = 540 * time.Millisecond
	)

	// start runs a processor on a stallBroker and a fake local clock with
	// one task, "job", whose handler waits for its context to end and then
	// for finish to be called; it returns the handler's context.
	start := func(t *testing.T) (p *processor, sb *stallBroker, ft *fakeTimers, ctx context.Context, finish func()) {
		ctxs := make(chan context.Context, 1)
		release := make(chan struct{})
		var once sync.Once
		finish = func() { once.Do(func() { close(release) }) }
		bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
			ctxs <- ctx
			<-ctx.Done()
			<-release
			return broker.Settlement{}, false
		})
		bd.cfg.LeaseDuration = lease
		sb = &stallBroker{Broker: bd.b, clock: bd.clock, dequeued: make(chan time.Time, 1),
			extends: make(chan time.Time, 16), reply: make(chan struct{}), done: make(chan struct{})}
		bd.cfg.Broker = sb
		bd.enqueue(t, 0, "job")
		p = newProcessor(bd.cfg)
		ft = &fakeTimers{c: bd.clock}
		p.clock = ft
		p.start()
		t.Cleanup(func() {
			finish()
			close(sb.done)
			p.stop()
		})
		p.wake()
		return p, sb, ft, <-ctxs, finish
	}

	t.Run("StopsHandlerWhileRenewalBlocks", func(t *testing.T) {
		t.Parallel()
		p, sb, ft, ctx, finish := start(t)
		sent := <-sb.dequeued
		<-sb.extends // a renewal is on its way and gets no answer
		deadline := sent.Add(budget)
		ft.Advance(deadline.Sub(ft.Now()) - time.Millisecond)
		if ctx.Err() != nil {
			t.Fatalf("handler stopped (%v) 1ms before the deadline", context.Cause(ctx))
		}
		ft.Advance(time.Millisecond)
		if c := context.Cause(ctx); !errors.Is(c, broker.ErrLeaseLost) {
			t.Fatalf("at the lease deadline, with a renewal blocked, the handler's context cause is %v, want ErrLeaseLost", c)
		}
		if n := sb.blocked.Load(); n != 1 {
			t.Fatalf("%d renewals blocked, want the handler stopped while one is", n)
		}
		// The worker slot is free only when the handler has returned.
		if n := p.activeCount(); n != 1 {
			t.Fatalf("%d tasks active while the stopped handler still runs, want 1", n)
		}
		finish()
		testwait.For(t, 10*time.Second, "the stopped handler's slot to be free", func() bool { return p.activeCount() == 0 })
	})

	t.Run("RenewalCountsFromItsSendTime", func(t *testing.T) {
		t.Parallel()
		_, sb, ft, ctx, _ := start(t)
		s0 := <-sb.dequeued
		<-sb.extends // sent at s0
		ft.Advance(100 * time.Millisecond)
		sb.reply <- struct{}{}
		s1 := <-sb.extends
		if want := s0.Add(100 * time.Millisecond); !s1.Equal(want) {
			t.Fatalf("second renewal sent at %v, want %v", s1, want)
		}
		ft.Advance(300 * time.Millisecond) // its answer comes 300ms late
		sb.reply <- struct{}{}
		<-sb.extends // the next renewal: the answer above has been applied
		// The dequeue's deadline, s0+540ms, has passed; the renewal's is
		// s1+540ms, however late its answer came.
		ft.Advance(s1.Add(budget).Sub(ft.Now()) - time.Millisecond)
		if ctx.Err() != nil {
			t.Fatalf("handler stopped (%v) before the renewed deadline: the renewal did not move it", context.Cause(ctx))
		}
		ft.Advance(time.Millisecond)
		if c := context.Cause(ctx); !errors.Is(c, broker.ErrLeaseLost) {
			t.Fatalf("at the renewal's send time + %v the handler's context cause is %v, want ErrLeaseLost: a late answer moved the deadline", budget, c)
		}
	})
}

// TestProcessorWatchdogSharesOneTimer checks the watchdog with tasks leased
// at different times: each handler is stopped at its own deadline, no
// earlier and no later, and one timer serves them all.
func TestProcessorWatchdogSharesOneTimer(t *testing.T) {
	t.Parallel()
	const budget = 540 * time.Millisecond // of a 600ms lease
	ctxs := make(chan context.Context, 3)
	release := make(chan struct{})
	bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
		ctxs <- ctx
		<-ctx.Done()
		<-release
		return broker.Settlement{}, false
	})
	bd.cfg.LeaseDuration = 600 * time.Millisecond
	sb := &stallBroker{Broker: bd.b, clock: bd.clock, dequeued: make(chan time.Time, 1),
		extends: make(chan time.Time, 16), reply: make(chan struct{}), done: make(chan struct{})}
	bd.cfg.Broker = sb
	p := newProcessor(bd.cfg)
	ft := &fakeTimers{c: bd.clock}
	p.clock = ft
	p.start()
	t.Cleanup(func() {
		close(release)
		close(sb.done)
		p.stop()
	})
	var sent []time.Time
	var hctx []context.Context
	for _, id := range []string{"a", "b", "c"} {
		bd.enqueue(t, 0, id)
		p.wake()
		sent = append(sent, <-sb.dequeued)
		hctx = append(hctx, <-ctxs)
		ft.Advance(100 * time.Millisecond)
	}
	for i := range hctx {
		ft.Advance(sent[i].Add(budget).Sub(ft.Now()) - time.Millisecond)
		for j, ctx := range hctx {
			if stopped := ctx.Err() != nil; stopped != (j < i) {
				t.Fatalf("1ms before task %d's deadline, task %d stopped = %v (%v)", i, j, stopped, context.Cause(ctx))
			}
		}
		ft.Advance(time.Millisecond)
		if c := context.Cause(hctx[i]); !errors.Is(c, broker.ErrLeaseLost) {
			t.Fatalf("at task %d's deadline its context's cause is %v, want ErrLeaseLost", i, c)
		}
	}
	ft.mu.Lock()
	n := len(ft.ts)
	ft.mu.Unlock()
	if n != 1 {
		t.Fatalf("the watchdog of 3 tasks used %d timers, want 1", n)
	}
}

// TestProcessorWakeAnsweredByNextCall checks that a wake that came before
// a Dequeue call (here while the call before it was on its way) is taken
// when the call is made, not left to end the wait after it in an empty
// call.
func TestProcessorWakeAnsweredByNextCall(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	wb := &wakeBroker{Broker: bd.b}
	bd.cfg.Broker = wb
	bd.enqueue(t, 0, "a")
	p := newProcessor(bd.cfg)
	wb.p = p
	p.start()
	t.Cleanup(p.stop)
	p.wake()
	testwait.For(t, 10*time.Second, "the task to be settled and the fetcher to look again", func() bool {
		return bd.state(t, "a") == 0 && wb.calls.Load() >= 2
	})
	if n := wb.pending.Load(); n != 0 {
		t.Fatalf("%d Dequeue calls were made with a wake pending: the call answers it, and the wake left pending ends the next wait in an empty call", n)
	}
}

// wakeBroker wakes its processor during the first Dequeue call, as a
// notification of a task that call takes would, and counts the calls made
// with a wake pending.
type wakeBroker struct {
	broker.Broker
	p              *processor
	calls, pending atomic.Int32
}

func (w *wakeBroker) Dequeue(ctx context.Context, qs []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	if len(w.p.wakeC) > 0 {
		w.pending.Add(1)
	}
	if w.calls.Add(1) == 1 {
		w.p.wake()
	}
	return w.Broker.Dequeue(ctx, qs, n, lease)
}

// TestProcessorLateDequeue checks that a delivery whose Dequeue answered
// only after the lease could have ended is not run: its task may already be
// someone else's. The task stays leased until lease recovery takes it back.
func TestProcessorLateDequeue(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	bd := setup(t, func(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
		runs.Add(1)
		return broker.Settlement{Kind: broker.SettleDone}, true
	})
	sb := &stallBroker{Broker: bd.b, clock: bd.clock, dequeued: make(chan time.Time, 1),
		extends: make(chan time.Time, 16), reply: make(chan struct{}), done: make(chan struct{}),
		lateBy: bd.cfg.LeaseDuration - bd.cfg.LeaseDuration/10}
	close(sb.done)
	bd.cfg.Broker = sb
	bd.enqueue(t, 0, "job")
	p := newProcessor(bd.cfg)
	p.clock = &fakeTimers{c: bd.clock}
	p.start()
	t.Cleanup(p.stop)
	p.wake()
	testwait.For(t, 10*time.Second, "the late delivery to be refused or run", func() bool {
		return runs.Load() > 0 || strings.Contains(bd.logs.String(), "dequeue answered too late")
	})
	testwait.For(t, 10*time.Second, "every worker slot to be free", func() bool { return len(p.slots) == cap(p.slots) })
	if n := runs.Load(); n != 0 {
		t.Fatalf("a delivery answered after its lease could have ended was run %d times", n)
	}
	if st := bd.state(t, "job"); st != tidetype.StateActive {
		t.Fatalf("the late delivery's task is %v, want still active (until lease recovery)", st)
	}
}

// stallBroker records the local (fake) time of each Dequeue that hands out
// tasks and of each Extend call, and holds every Extend call until the test
// sends on reply (or closes done), ignoring the call's context as a Redis
// client without context timeouts does. A Dequeue that hands out tasks
// answers lateBy late.
type stallBroker struct {
	broker.Broker
	clock    *fakeClock
	lateBy   time.Duration
	dequeued chan time.Time
	extends  chan time.Time
	reply    chan struct{}
	done     chan struct{}
	blocked  atomic.Int32
}

func (s *stallBroker) Dequeue(ctx context.Context, qs []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	at := s.clock.Now()
	ds, err := s.Broker.Dequeue(ctx, qs, n, lease)
	if len(ds) > 0 {
		s.clock.Advance(s.lateBy)
		select {
		case s.dequeued <- at:
		default:
		}
	}
	return ds, err
}

func (s *stallBroker) Extend(_ context.Context, leases []broker.LeaseRef, d time.Duration) ([]error, error) {
	s.blocked.Add(1)
	defer s.blocked.Add(-1)
	select {
	case s.extends <- s.clock.Now():
	case <-s.done:
	}
	select {
	case <-s.reply:
	case <-s.done:
	}
	return s.Broker.Extend(context.Background(), leases, d)
}

// fakeTimers is a leaseClock on a fakeClock: a timer's function runs in the
// goroutine that moves the clock past it with Advance (or resets it to a
// time already past).
type fakeTimers struct {
	c  *fakeClock
	mu sync.Mutex
	ts []*fakeTimer
}

type fakeTimer struct {
	ft    *fakeTimers
	at    time.Time
	f     func()
	armed bool
}

func (ft *fakeTimers) Now() time.Time { return ft.c.Now() }

func (ft *fakeTimers) AfterFunc(d time.Duration, f func()) leaseTimer {
	t := &fakeTimer{ft: ft, f: f}
	t.Reset(d)
	ft.mu.Lock()
	ft.ts = append(ft.ts, t)
	ft.mu.Unlock()
	return t
}

// Advance moves the clock by d and runs the functions of the timers due.
func (ft *fakeTimers) Advance(d time.Duration) {
	ft.c.Advance(d)
	now := ft.c.Now()
	var due []func()
	ft.mu.Lock()
	for _, t := range ft.ts {
		if t.armed && !t.at.After(now) {
			t.armed = false
			due = append(due, t.f)
		}
	}
	ft.mu.Unlock()
	for _, f := range due {
		f()
	}
}

func (t *fakeTimer) Stop() bool {
	t.ft.mu.Lock()
	defer t.ft.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.ft.mu.Lock()
	was := t.armed
	if d <= 0 {
		t.armed = false
		t.ft.mu.Unlock()
		t.f()
		return was
	}
	t.armed, t.at = true, t.ft.c.Now().Add(d)
	t.ft.mu.Unlock()
	return was
}

// settleSpy records whether Settle was called.
type settleSpy struct {
	broker.Broker
	wrote *atomic.Bool
}

func (s settleSpy) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	s.wrote.Store(true)
	return s.Broker.Settle(ctx, ss)
}

// flakySettle fails the settlement of one task with ErrUnavailable a number
// of times.
type flakySettle struct {
	broker.Broker
	failID   string
	failures int32
	failed   atomic.Int32
	mu       sync.Mutex
}

func (f *flakySettle) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	errs := make([]error, len(ss))
	var pass []broker.Settlement
	var at []int
	f.mu.Lock()
	for i, s := range ss {
		if s.Lease.ID == f.failID && f.failed.Load() < f.failures {
			f.failed.Add(1)
			errs[i] = fmt.Errorf("%w: connection refused", broker.ErrUnavailable)
			continue
		}
		pass, at = append(pass, s), append(at, i)
	}
	f.mu.Unlock()
	if len(pass) > 0 {
		got, err := f.Broker.Settle(ctx, pass)
		if err != nil {
			return nil, err
		}
		for j, i := range at {
			errs[i] = got[j]
		}
	}
	return errs, nil
}
