package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
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
		waitFor(t, "every task to be settled", func() bool {
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
		waitFor(t, "the workers to fill", func() bool { return running.Load() == 4 })
		close(release)
		waitFor(t, "every task to run", func() bool { return bd.state(t, "j") == 0 && bd.state(t, "a") == 0 })
		p.stop()
		if m := most.Load(); m != 4 {
			t.Fatalf("%d tasks ran at once with Concurrency 4", m)
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
		waitFor(t, "every task to be settled", func() bool {
			return bd.state(t, "a") == 0 && bd.state(t, "b") == 0 && bd.state(t, "c") == 0
		})
		p.stop()
		if n := flaky.failed.Load(); n != 2 {
			t.Fatalf("the flaky settlement failed %d times, want 2", n)
		}
	})
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
