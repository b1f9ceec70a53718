package tide_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// eventsOnly is a Redis broker whose servers do no maintenance: no
// maintainer's run finds pending work (noFallback) nor asks for the
// periodic rebalance of a limit's slots (the sweep). Only the broker's
// events, and the rebalances a dequeue asks for, move tasks: a test on it
// fails where a wake-up is missing, instead of passing seconds late.
type eventsOnly struct{ *redisbroker.Broker }

// Maintain claims nothing and does nothing.
func (eventsOnly) Maintain(context.Context, broker.MaintainRequest) (broker.MaintainResult, error) {
	return broker.MaintainResult{RetryIn: time.Hour}, nil
}

// limitWake is a server of queue q (and of a probe queue served after it)
// on eventsOnly whose handler runs "hold" tasks until release is closed,
// fails "fail" tasks, and counts the others.
type limitWake struct {
	e       *env
	q       string
	ran     atomic.Int64 // quick tasks run
	holding atomic.Int64 // hold tasks running
	probed  atomic.Int64
	release chan struct{}
	once    sync.Once
}

func newLimitWake(t *testing.T, parts int, q string, lim tide.QueueLimits) *limitWake {
	e := setup(t, redisbroker.WithPartitions(parts))
	w := &limitWake{e: e, q: q, release: make(chan struct{})}
	if err := tide.NewInspector(e.b).SetQueueLimits(context.Background(), q, lim); err != nil {
		t.Fatal(err)
	}
	e.serverOn(eventsOnly{e.broker()}, tide.Config{
		Concurrency: 10, Queues: map[string]int{q: 2, "probe": 1}, StrictPriority: true,
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return time.Hour },
	}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		switch string(task.Payload()) {
		case "hold":
			w.holding.Add(1)
			defer w.holding.Add(-1)
			select {
			case <-w.release:
			case <-ctx.Done():
			}
		case "fail":
			return errors.New("downstream down")
		case "probe":
			w.probed.Add(1)
		default:
			w.ran.Add(1)
		}
		return nil
	}))
	t.Cleanup(w.free) // before the server's Shutdown, which waits for the handlers
	return w
}

func (w *limitWake) free() { w.once.Do(func() { close(w.release) }) }

func (w *limitWake) enqueue(payload, group string) *tide.TaskInfo {
	w.e.t.Helper()
	opts := []tide.Option{tide.Queue(w.q)}
	if group != "" {
		opts = append(opts, tide.Group(group))
	}
	ti, err := w.e.c.Enqueue(context.Background(), tide.NewTask("w", []byte(payload)), opts...)
	if err != nil {
		w.e.t.Fatal(err)
	}
	return ti
}

// looked makes sure the server has looked at the queue since the tasks
// that wait were enqueued: a task of the probe queue, served after q, has
// run, and no quick task has.
func (w *limitWake) looked() {
	w.e.t.Helper()
	n := w.probed.Load()
	if _, err := w.e.c.Enqueue(context.Background(), tide.NewTask("w", []byte("probe")), tide.Queue("probe")); err != nil {
		w.e.t.Fatal(err)
	}
	testwait.For(w.e.t, wakeWait, "the probe task to run", func() bool { return w.probed.Load() > n })
	if r := w.ran.Load(); r != 0 {
		w.e.t.Fatalf("%d quick tasks ran before the limits changed", r)
	}
}

func (w *limitWake) set(lim tide.QueueLimits) {
	w.e.t.Helper()
	if err := tide.NewInspector(w.e.b).SetQueueLimits(context.Background(), w.q, lim); err != nil {
		w.e.t.Fatal(err)
	}
}

func (w *limitWake) waitRan(n int64, what string) {
	w.e.t.Helper()
	testwait.For(w.e.t, wakeWait, what, func() bool { return w.ran.Load() >= n })
}

// A changed limit that lets waiting grouped tasks start wakes the servers:
// they start at once, with no maintenance to fall back on. An Ordered
// switched off while a group's holder waited to be retried left the group
// out of the rotation (its place forgotten, nothing to bring it back but
// the holder's retry, an hour later here); raised and removed limits, and
// a lowered Concurrency once the tasks over it end, are tested alongside.
func TestLimitChangeWakesGroups(t *testing.T) {
	t.Parallel()
	t.Run("GroupConcurrencyRaised", func(t *testing.T) {
		t.Parallel()
		w := newLimitWake(t, 1, "lw-gc", tide.QueueLimits{GroupConcurrency: 1})
		w.enqueue("hold", "g")
		testwait.For(t, wakeWait, "the hold task to start", func() bool { return w.holding.Load() == 1 })
		w.enqueue("quick", "g")
		w.enqueue("quick", "g")
		w.looked()
		w.set(tide.QueueLimits{GroupConcurrency: 3})
		w.waitRan(2, "the group's waiting tasks to start after GroupConcurrency was raised")
	})
	for _, parts := range []int{1, 2} {
		t.Run(fmt.Sprintf("ConcurrencyRaised%d", parts), func(t *testing.T) {
			t.Parallel()
			w := newLimitWake(t, parts, "lw-c", tide.QueueLimits{Concurrency: 1})
			w.enqueue("hold", "h")
			testwait.For(t, wakeWait, "the hold task to start", func() bool { return w.holding.Load() == 1 })
			for i := range 4 {
				w.enqueue("quick", fmt.Sprint("g", i))
			}
			w.looked()
			w.set(tide.QueueLimits{Concurrency: 3})
			w.waitRan(4, "the waiting grouped tasks to start after Concurrency was raised")
		})
		t.Run(fmt.Sprintf("ConcurrencyOff%d", parts), func(t *testing.T) {
			t.Parallel()
			w := newLimitWake(t, parts, "lw-c0", tide.QueueLimits{Concurrency: 1})
			w.enqueue("hold", "h")
			testwait.For(t, wakeWait, "the hold task to start", func() bool { return w.holding.Load() == 1 })
			for i := range 4 {
				w.enqueue("quick", fmt.Sprint("g", i))
			}
			w.looked()
			w.set(tide.QueueLimits{})
			w.waitRan(4, "the waiting grouped tasks to start after Concurrency was switched off")
		})
		t.Run(fmt.Sprintf("ConcurrencyLowered%d", parts), func(t *testing.T) {
			t.Parallel()
			w := newLimitWake(t, parts, "lw-cl", tide.QueueLimits{Concurrency: 3})
			for i := range 3 {
				w.enqueue("hold", fmt.Sprint("h", i))
			}
			testwait.For(t, wakeWait, "the hold tasks to start", func() bool { return w.holding.Load() == 3 })
			for i := range 4 {
				w.enqueue("quick", fmt.Sprint("g", i))
			}
			w.looked()
			w.set(tide.QueueLimits{Concurrency: 1})
			w.free()
			w.waitRan(4, "the waiting grouped tasks to start after the tasks over a lowered Concurrency ended")
		})
	}
	t.Run("GroupRateRaised", func(t *testing.T) {
		t.Parallel()
		w := newLimitWake(t, 1, "lw-gr", tide.QueueLimits{GroupRate: tide.Rate{Limit: 1, Per: time.Hour}})
		w.enqueue("quick", "g")
		w.waitRan(1, "the group's first task to run")
		w.ran.Store(0)
		w.enqueue("quick", "g")
		w.looked()
		w.set(tide.QueueLimits{GroupRate: tide.Rate{Limit: 5, Per: time.Hour}})
		w.waitRan(1, "the group's next task to start after its GroupRate was raised")
	})
	t.Run("OrderedOff", func(t *testing.T) {
		t.Parallel()
		w := newLimitWake(t, 1, "lw-o", tide.QueueLimits{Ordered: true})
		first := w.enqueue("fail", "g")
		w.e.waitState(w.q, first.ID, tide.StateRetry)
		w.enqueue("quick", "g")
		w.looked()
		w.set(tide.QueueLimits{})
		w.waitRan(1, "the group's waiting task to start once the queue is no longer ordered")
	})
}
