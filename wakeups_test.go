package tide_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// noFallback is a Redis broker whose maintenance never reports pending
// work. A server's maintainer wakes the server's workers when its periodic
// run finds tasks pending, a fallback for lost events; on this broker only
// the broker's events wake them, so a test on it fails where an event is
// missing instead of passing seconds late on the fallback.
type noFallback struct{ *redisbroker.Broker }

// Maintain maintains the partition as the broker does and hides its
// pending count.
func (b noFallback) Maintain(ctx context.Context, req broker.MaintainRequest) (broker.MaintainResult, error) {
	r, err := b.Broker.Maintain(ctx, req)
	r.Pending = 0
	return r, err
}

// wakeWait bounds how long a test on noFallback waits for tasks that an
// event should let start within milliseconds. It is generous, and below
// the 30 s at which every server looks at its queues again anyway (its
// layout check), so that a missing event fails the test.
const wakeWait = 10 * time.Second

// serverOn starts a server on b with cfg and h; it is shut down when the
// test ends.
func (e *env) serverOn(b broker.Broker, cfg tide.Config, h tide.Handler) *tide.Server {
	e.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(e.t)
	}
	s := tide.NewServer(b, cfg)
	if err := s.Start(h); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	e.t.Cleanup(s.Shutdown)
	return s
}

// Grouped tasks under a queue Concurrency keep moving: each task that ends
// in a full partition wakes a server for the next one, as for ungrouped
// tasks, so twenty short tasks do not wait for maintenance between them.
func TestConcurrencyLimitGroupedKeepsMoving(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 2} {
		t.Run(fmt.Sprintf("%dpartitions", parts), func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(parts))
			ctx := context.Background()
			const q, limit, tasks = "conc-grouped", 2, 20
			var g gauge
			var done atomic.Int64
			e.serverOn(noFallback{e.broker()}, tide.Config{
				Concurrency: 10, Queues: map[string]int{q: 1},
				QueueLimits: map[string]tide.QueueLimits{q: {Concurrency: limit}},
			}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
				g.enter()
				defer g.leave()
				done.Add(1)
				return nil
			}))
			for i := range tasks {
				if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.Group(fmt.Sprint("tenant-", i%5))); err != nil {
					t.Fatal(err)
				}
			}
			testwait.For(t, wakeWait, "every grouped task to run with only events waking the server", func() bool { return done.Load() == tasks })
			if p := g.peak.Load(); p > limit {
				t.Fatalf("%d handlers ran at once under Concurrency %d", p, limit)
			}
		})
	}
}

// Cancelling or deleting the task that holds an ordered group's place while
// it waits to be retried lets the group's next task start at once: the
// removal wakes the servers. (A task of a second queue, served after the
// first, runs before the removal: the server has looked at the blocked
// group by then, so only a wake-up makes it look again.)
func TestOrderedHolderRemovedWakes(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Cancel", "Delete"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			const q, probe = "ord-holder", "probe"
			var ran, probed atomic.Int64
			e.serverOn(noFallback{e.broker()}, tide.Config{
				Queues: map[string]int{q: 2, probe: 1}, StrictPriority: true,
				QueueLimits:    map[string]tide.QueueLimits{q: {Ordered: true}},
				RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return time.Hour },
			}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
				switch string(task.Payload()) {
				case "first":
					return fmt.Errorf("downstream down")
				case "probe":
					probed.Add(1)
				default:
					ran.Add(1)
				}
				return nil
			}))
			first, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("first")), tide.Queue(q), tide.Group("acct"))
			if err != nil {
				t.Fatal(err)
			}
			e.waitState(q, first.ID, tide.StateRetry)
			if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("second")), tide.Queue(q), tide.Group("acct")); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("probe")), tide.Queue(probe)); err != nil {
				t.Fatal(err)
			}
			testwait.For(t, wakeWait, "the probe task to run", func() bool { return probed.Load() == 1 })
			if n := ran.Load(); n != 0 {
				t.Fatalf("%d tasks of the group ran while its holder waited in retry", n)
			}
			if how == "Cancel" {
				err = e.c.Cancel(ctx, q, first.ID)
			} else {
				err = e.c.Delete(ctx, q, first.ID)
			}
			if err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			testwait.For(t, wakeWait, "the group's next task to run after its holder was removed", func() bool { return ran.Load() == 1 })
		})
	}
}

// A task of a group that may run starts at once behind hundreds of ordered
// groups that may not (each one's first task waits to be retried, its
// second waits behind it), all made ready in one call before it: the
// servers never have to walk past the blocked groups to find it.
func TestRunnableGroupBehindBlockedGroups(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, blocked = "behind-blocked", 300
	var ran atomic.Int64
	e.serverOn(noFallback{e.broker()}, tide.Config{
		Queues:         map[string]int{q: 1},
		QueueLimits:    map[string]tide.QueueLimits{q: {Ordered: true}},
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return time.Hour },
	}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if string(task.Payload()) == "first" {
			return fmt.Errorf("downstream down")
		}
		ran.Add(1)
		return nil
	}))
	task := func(payload string, g int) *tide.Task {
		return tide.NewTask("step", []byte(payload), tide.Group(fmt.Sprint("acct-", g)))
	}
	var firsts, seconds []*tide.Task
	for g := range blocked {
		firsts = append(firsts, task("first", g))
		seconds = append(seconds, task("second", g))
	}
	if _, err := e.c.EnqueueMany(ctx, firsts, tide.Queue(q)); err != nil {
		t.Fatal(err)
	}
	in := tide.NewInspector(e.b)
	testwait.For(t, 30*time.Second, "every group's first task to wait in retry", func() bool {
		qi, err := in.QueueInfo(ctx, q)
		return err == nil && qi.Retry == blocked
	})
	if _, err := e.c.EnqueueMany(ctx, seconds, tide.Queue(q)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, task("free", blocked), tide.Queue(q)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wakeWait, "the one task that may run to run", func() bool { return ran.Load() == 1 })
	if n := ran.Load(); n != 1 {
		t.Fatalf("%d tasks ran, want only the free group's", n)
	}
}
