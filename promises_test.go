package tide_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// A task that replaces a finished task of an ordered group (Replace with
// the finished task's ID) is a new task: it runs after the tasks enqueued
// before it, never ahead of them.
func TestReplaceFinishedRunsInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "replace-order"
	var mu sync.Mutex
	var order []string
	started := make(chan string, 10)
	release := make(chan struct{})
	e.server(tide.Config{
		Queues:      map[string]int{q: 1},
		QueueLimits: map[string]tide.QueueLimits{q: {Ordered: true}},
	}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		p := string(task.Payload())
		mu.Lock()
		order = append(order, p)
		mu.Unlock()
		started <- p
		if p == "a" {
			<-release
		}
		return nil
	}))
	opts := []tide.Option{tide.Queue(q), tide.Group("acct")}
	x := append([]tide.Option{tide.TaskID("x{acct}"), tide.Retention(time.Hour)}, opts...)
	if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("x")), x...); err != nil {
		t.Fatal(err)
	}
	e.waitState(q, "x{acct}", tide.StateCompleted)
	for _, p := range []string{"a", "b"} {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte(p)), opts...); err != nil {
			t.Fatal(err)
		}
	}
	for p := range started {
		if p == "a" {
			break
		}
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("x again")), append(x, tide.Replace())...); err != nil {
		t.Fatalf("Replace of the completed task: %v", err)
	}
	close(release)
	testwait.For(t, 10*time.Second, "every task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"x", "a", "b", "x again"}; !slices.Equal(order, want) {
		t.Fatalf("the group ran %q, want %q: the replacement of a finished task is enqueued after b", order, want)
	}
}

// A Rate set or changed on running servers counts the starts made before
// the change within its period: those made without a rate, and those made
// under a rate with a shorter period. No window of the new period holds
// more starts than its limit.
func TestRateCountsStartsBeforeChange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		before tide.Rate // zero: none
		first  int       // tasks run before the change
		after  tide.Rate
	}{
		{"FromNone", tide.Rate{}, 15, tide.Rate{Limit: 10, Per: 2 * time.Second}},
		{"LongerPeriod", tide.Rate{Limit: 4, Per: 300 * time.Millisecond}, 8, tide.Rate{Limit: 10, Per: 3 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			const q = "rate-change"
			in := tide.NewInspector(e.b)
			if err := in.SetQueueLimits(ctx, q, tide.QueueLimits{Rate: tc.before}); err != nil {
				t.Fatal(err)
			}
			var st starts
			leaseStarts := recordStarts(t, e.b, q)
			e.server(tide.Config{Concurrency: 20, Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
				st.add()
				return nil
			}))
			enqueue := func(n int) {
				t.Helper()
				for range n {
					if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q)); err != nil {
						t.Fatal(err)
					}
				}
			}
			enqueue(tc.first)
			testwait.For(t, 10*time.Second, "the tasks before the change to run", func() bool { return st.len() == tc.first })
			if err := in.SetQueueLimits(ctx, q, tide.QueueLimits{Rate: tc.after}); err != nil {
				t.Fatal(err)
			}
			enqueue(10)
			testwait.For(t, 30*time.Second, "every task to run", func() bool { return st.len() == tc.first+10 })
			// The starts before the change obey their own limit only;
			// every window that ends at a later start holds at most the
			// new limit (on the Redis clock, see checkRate).
			checkRate(t, leaseStarts(tc.first+10), tc.first, tc.after.Limit, tc.after.Per)
		})
	}
}

// Servers started with Config.QueueLimits keep their limit on a queue that
// an operator deleted while it was empty: when tasks come again, no more
// than the limit run at once.
func TestDeleteQueueKeepsServersLimits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, limit = "delete-limited", 2
	var g gauge
	var done atomic.Int64
	e.server(tide.Config{
		Concurrency: 10, Queues: map[string]int{q: 1},
		QueueLimits: map[string]tide.QueueLimits{q: {Concurrency: limit}},
	}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		g.enter()
		defer g.leave()
		time.Sleep(20 * time.Millisecond) // long enough for the others to start if they may
		done.Add(1)
		return nil
	}))
	enqueue := func(n int) {
		t.Helper()
		for range n {
			if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q)); err != nil {
				t.Fatal(err)
			}
		}
	}
	enqueue(1)
	testwait.For(t, 10*time.Second, "the first task to run", func() bool { return done.Load() == 1 })
	in := tide.NewInspector(e.b)
	testwait.For(t, 10*time.Second, "the queue to be deleted once empty", func() bool { return in.DeleteQueue(ctx, q) == nil })
	if got, err := in.QueueLimits(ctx, q); err != nil || got.Concurrency != limit {
		t.Fatalf("QueueLimits after DeleteQueue = %+v, %v; want Concurrency %d", got, err, limit)
	}
	enqueue(12)
	testwait.For(t, 30*time.Second, "every task to run", func() bool { return done.Load() == 13 })
	if p := g.peak.Load(); p > limit {
		t.Fatalf("%d handlers ran at once on the queue that came back, under Concurrency %d", p, limit)
	}
}

// A server whose clock was stepped back 20 s (it re-measures its offset to
// Redis only every 30 s) throttles a group with ThrottleGroup: the group is
// held for the whole throttle on every server, counted on Redis's clock.
func TestThrottleGroupOnRedisClock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, hold = "throttle-clock", 2 * time.Second
	var stepped atomic.Bool
	skewed := redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix), redisbroker.WithLocalClock(func() time.Time {
		if stepped.Load() {
			return time.Now().Add(-20 * time.Second)
		}
		return time.Now()
	}))
	skewed.Now() // measures the offset while the clock is right
	stepped.Store(true)
	var mu sync.Mutex
	var throttledAt, secondAt time.Time
	var once atomic.Bool
	e.serverOn(skewed, tide.Config{Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if string(task.Payload()) == "first" && once.CompareAndSwap(false, true) {
			mu.Lock()
			throttledAt = time.Now()
			mu.Unlock()
			return fmt.Errorf("downstream says slow down: %w", tide.ThrottleGroup(hold))
		}
		return nil
	}))
	first, err := e.c.Enqueue(ctx, tide.NewTask("call", []byte("first")), tide.Queue(q), tide.Group("tenant"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitState(q, first.ID, tide.StateRetry)
	// Another server, whose clock is right, serves the queue too.
	e.server(tide.Config{Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if string(task.Payload()) == "second" {
			mu.Lock()
			secondAt = time.Now()
			mu.Unlock()
		}
		return nil
	}))
	if _, err := e.c.Enqueue(ctx, tide.NewTask("call", []byte("second")), tide.Queue(q), tide.Group("tenant")); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "the group's second task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !secondAt.IsZero()
	})
	mu.Lock()
	defer mu.Unlock()
	if d := secondAt.Sub(throttledAt); d < hold-50*time.Millisecond {
		t.Fatalf("a task of the group started %v after ThrottleGroup(%v) on a server whose clock was 20 s behind", d, hold)
	}
}
