package tide_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// gauge counts handlers running at once and remembers the most.
type gauge struct{ cur, peak atomic.Int64 }

func (g *gauge) enter() {
	n := g.cur.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (g *gauge) leave() { g.cur.Add(-1) }

// Three servers of concurrency 10 share a queue limited to 4: handlers
// running at once never exceed 4, on one partition and on four (shares of
// 1), and every task completes. Without the limit the servers run up to 30
// at once.
func TestQueueLimitsConcurrencyAcrossServers(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 4} {
		t.Run(fmt.Sprintf("%dpartitions", parts), func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(parts))
			ctx := context.Background()
			const q, limit, tasks = "lim", 4, 120
			var g gauge
			var done atomic.Int64
			h := tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
				g.enter()
				defer g.leave()
				time.Sleep(3 * time.Millisecond)
				done.Add(1)
				return nil
			})
			for range 3 {
				e.server(tide.Config{
					Concurrency: 10, Queues: map[string]int{q: 1},
					QueueLimits: map[string]tide.QueueLimits{q: {Concurrency: limit}},
				}, h)
			}
			for i := range tasks {
				if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.TaskID(fmt.Sprint("t", i))); err != nil {
					t.Fatal(err)
				}
			}
			testwait.For(t, 30*time.Second, "every task to complete", func() bool { return done.Load() == tasks })
			if p := g.peak.Load(); p > limit {
				t.Fatalf("%d handlers ran at once under Concurrency %d", p, limit)
			}
			got, err := tide.NewInspector(e.b).QueueLimits(ctx, q)
			if err != nil || got.Concurrency != limit {
				t.Fatalf("QueueLimits = %+v, %v", got, err)
			}
		})
	}
}

// A server whose handlers hang holds its slots while it lives; once it is
// gone (shut down hard, its handlers abandoned) its leases expire, lease
// recovery gives the slots back and another server runs the rest, the
// abandoned tasks too.
func TestQueueLimitsDeadServerGivesSlotsBack(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(2))
	ctx := context.Background()
	const q, limit = "limdead", 2
	cfg := tide.Config{
		Concurrency: 10, Queues: map[string]int{q: 1}, LeaseDuration: 500 * time.Millisecond,
		ShutdownTimeout: 10 * time.Millisecond,
		QueueLimits:     map[string]tide.QueueLimits{q: {Concurrency: limit}},
	}
	release := make(chan struct{})
	var hung atomic.Int64
	t.Cleanup(func() { close(release) })
	dead := e.server(cfg, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		hung.Add(1)
		<-release // ignores its context: a stuck worker
		return nil
	}))
	// Ten tasks in each partition (shares 1 and 1): the stuck server takes
	// one of each.
	for _, id := range idsPerPartition("d", 2, 10) {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "the stuck server to take every slot", func() bool { return hung.Load() == limit })
	var g gauge
	var done atomic.Int64
	e.server(cfg, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		g.enter()
		defer g.leave()
		done.Add(1)
		return nil
	}))
	time.Sleep(300 * time.Millisecond)
	if n := done.Load(); n != 0 {
		t.Fatalf("the live server ran %d tasks while the stuck one held every slot", n)
	}
	if h := hung.Load(); h != limit {
		t.Fatalf("the stuck server runs %d tasks, want %d", h, limit)
	}
	dead.Shutdown() // gives up after ShutdownTimeout and a second; leases stop being renewed
	in := tide.NewInspector(e.b)
	testwait.For(t, 30*time.Second, "every task to be done by the live server", func() bool {
		qi, err := in.QueueInfo(ctx, q)
		return err == nil && qi.Size == 0
	})
	if p := g.peak.Load(); p > limit {
		t.Fatalf("%d handlers ran at once under Concurrency %d", p, limit)
	}
	if done.Load() < 2 {
		t.Fatalf("the live server ran %d tasks", done.Load())
	}
}

// Limits changed through the Inspector take effect on running servers: a
// lower limit holds the queue at it, a higher one starts more at once.
func TestQueueLimitsRuntimeChange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "limlive"
	in := tide.NewInspector(e.b)
	if err := in.SetQueueLimits(ctx, q, tide.QueueLimits{Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var g gauge
	h := tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		g.enter()
		defer g.leave()
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return nil
	})
	for range 2 {
		e.server(tide.Config{Concurrency: 10, Queues: map[string]int{q: 1}}, h)
	}
	for range 20 {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "2 tasks to run", func() bool { return g.cur.Load() == 2 })
	time.Sleep(200 * time.Millisecond)
	if p := g.peak.Load(); p != 2 {
		t.Fatalf("%d tasks ran at once under Concurrency 2", p)
	}
	if err := in.SetQueueLimits(ctx, q, tide.QueueLimits{Concurrency: 7}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "7 tasks to run after raising the limit", func() bool { return g.cur.Load() == 7 })
	time.Sleep(200 * time.Millisecond)
	if p := g.peak.Load(); p != 7 {
		t.Fatalf("%d tasks ran at once under Concurrency 7", p)
	}
	if err := in.SetQueueLimits(ctx, q, tide.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "every task to run without a limit", func() bool { return g.cur.Load() == 20 })
	close(gate)
	testwait.For(t, 10*time.Second, "the queue to empty", func() bool {
		qi, err := in.QueueInfo(ctx, q)
		return err == nil && qi.Size == 0
	})
}

// A queue with a limit is repartitioned (1 -> 4 -> 6 -> 2, once to more
// partitions than the limit) while servers work through it: the limit holds
// over the old and the new partitions together, every task completes, and
// the limits are kept.
func TestQueueLimitsRepartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, limit, tasks = "limre", 4, 300
	var g, held gauge
	var done atomic.Int64
	var holding atomic.Bool
	hold := make(chan struct{})
	h := tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		if holding.Load() {
			held.enter()
			defer held.leave()
			select {
			case <-hold:
			case <-ctx.Done():
			}
			return nil
		}
		g.enter()
		defer g.leave()
		time.Sleep(2 * time.Millisecond)
		done.Add(1)
		return nil
	})
	cfg := tide.Config{
		Concurrency: 10, Queues: map[string]int{q: 1},
		QueueLimits: map[string]tide.QueueLimits{q: {Concurrency: limit}},
	}
	for range 2 {
		e.server(cfg, h)
	}
	for i := range tasks {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.TaskID(fmt.Sprint("r", i))); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, n := range []int{4, 6, 2} {
			if err := e.b.Repartition(ctx, q, n, nil); err != nil {
				t.Errorf("Repartition to %d: %v", n, err)
				return
			}
		}
	})
	testwait.For(t, 60*time.Second, "every task to complete", func() bool { return done.Load() == tasks })
	wg.Wait()
	if p := g.peak.Load(); p > limit {
		t.Fatalf("%d handlers ran at once under Concurrency %d", p, limit)
	}
	if got, err := tide.NewInspector(e.b).QueueLimits(ctx, q); err != nil || got.Concurrency != limit {
		t.Fatalf("QueueLimits after repartitioning = %+v, %v", got, err)
	}
	// The final layout's shares add up to the whole limit.
	holding.Store(true)
	for _, id := range idsPerPartition("h", 2, 6) {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "the limit to be reached on the new layout", func() bool { return held.cur.Load() == limit })
	time.Sleep(200 * time.Millisecond)
	if p := held.peak.Load(); p != limit {
		t.Fatalf("%d tasks held at once under Concurrency %d", p, limit)
	}
	close(hold)
}

// idsPerPartition returns per task IDs for each of n partitions.
func idsPerPartition(prefix string, n, per int) []string {
	count := make([]int, n)
	var ids []string
	for i := 0; len(ids) < n*per; i++ {
		id := fmt.Sprint(prefix, i)
		if p := broker.Partition(id, n); count[p] < per {
			count[p]++
			ids = append(ids, id)
		}
	}
	return ids
}

// starts records when handlers start (the tests count them; rates are
// checked on the broker's started events, see leaseStarts).
type starts struct {
	mu sync.Mutex
	at []time.Time
}

func (s *starts) add() {
	s.mu.Lock()
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
}

func (s *starts) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}

// recordStarts turns on queue's task events (Inspector.SetQueueEvents) and
// follows them from then on; the function it returns waits until n
// started events were read (at most ten seconds) and returns when they
// were recorded, in time order. Each is recorded on the Redis clock in the
// script that leases the task, so a rate window checked on them
// (checkRate) is the broker's own, with no handler start-up delay in it.
// They are read as they come: a repartition drops the streams of the
// partitions it retires.
func recordStarts(t *testing.T, b broker.Broker, queue string) func(n int) []time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in := tide.NewInspector(b)
	if err := in.SetQueueEvents(ctx, queue, true); err != nil {
		t.Fatal(err)
	}
	evs, err := in.Events(ctx, tide.EventsFrom{Queues: []string{queue}, After: tide.EventsOldest})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var at []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range evs {
			if ev.Kind == tide.EventStarted {
				mu.Lock()
				at = append(at, ev.At)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return func(n int) []time.Time {
		t.Helper()
		var got []time.Time
		testwait.For(t, 10*time.Second, fmt.Sprintf("%d started events of queue %s", n, queue), func() bool {
			mu.Lock()
			defer mu.Unlock()
			got = slices.Clone(at)
			return len(got) >= n
		})
		slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
		return got
	}
}

// eventSlack is how much later than the lease it records an event's time
// may be: the script reads the clock again when it writes its events.
const eventSlack = 5 * time.Millisecond

// checkRate fails when limit+1 of the lease times at (in time order, from
// recordStarts) from index from on, with the limit before them, came
// within per (less eventSlack).
func checkRate(t *testing.T, at []time.Time, from, limit int, per time.Duration) {
	t.Helper()
	for j := max(from, limit); j < len(at); j++ {
		if i := j - limit; at[j].Sub(at[i]) < per-eventSlack {
			t.Fatalf("starts %d to %d (%d starts, %d of them before index %d) came within %v on the Redis clock, under Rate %d/%v",
				i, j, limit+1, max(0, from-i), from, at[j].Sub(at[i]), limit, per)
		}
	}
}

// Three servers of concurrency 10 share a queue limited to 20 starts a
// second, on one partition and on four: no window of a second (less the
// handlers' start-up jitter) holds more than 20 starts, and every task runs,
// woken by the announcements of when room opens.
func TestQueueLimitsRate(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 4} {
		t.Run(fmt.Sprintf("%dpartitions", parts), func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(parts))
			ctx := context.Background()
			const q, limit, per, tasks = "limrate", 20, time.Second, 70
			var st starts
			leaseStarts := recordStarts(t, e.b, q)
			h := tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
				st.add()
				return nil
			})
			for range 3 {
				e.server(tide.Config{
					Concurrency: 10, Queues: map[string]int{q: 1},
					QueueLimits: map[string]tide.QueueLimits{q: {Rate: tide.Rate{Limit: limit, Per: per}}},
				}, h)
			}
			for i := range tasks {
				if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.TaskID(fmt.Sprint("t", i))); err != nil {
					t.Fatal(err)
				}
			}
			testwait.For(t, 30*time.Second, "every task to run", func() bool { return st.len() == tasks })
			checkRate(t, leaseStarts(tasks), 0, limit, per)
		})
	}
}

// A queue under a rate limit is repartitioned (1 -> 4) while servers work
// through it: the starts made in the old partition count in the new ones,
// so no window holds more than the limit across the change.
func TestQueueLimitsRateRepartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, limit, per, tasks = "limraterep", 20, time.Second, 70
	var st starts
	leaseStarts := recordStarts(t, e.b, q)
	cfg := tide.Config{
		Concurrency: 10, Queues: map[string]int{q: 1},
		QueueLimits: map[string]tide.QueueLimits{q: {Concurrency: 8, Rate: tide.Rate{Limit: limit, Per: per}}},
	}
	for range 2 {
		e.server(cfg, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
			st.add()
			time.Sleep(5 * time.Millisecond)
			return nil
		}))
	}
	for i := range tasks {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.TaskID(fmt.Sprint("t", i))); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "the first second's starts", func() bool { return st.len() >= limit })
	if err := e.b.Repartition(ctx, q, 4, nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "every task to run", func() bool { return st.len() == tasks })
	checkRate(t, leaseStarts(tasks), 0, limit, per)
	if got, err := tide.NewInspector(e.b).QueueLimits(ctx, q); err != nil || got != cfg.QueueLimits[q] {
		t.Fatalf("QueueLimits after repartitioning = %+v, %v; want %+v", got, err, cfg.QueueLimits[q])
	}
}

// Invalid limits are refused: by Start for Config.QueueLimits (wrapping
// ErrInvalidConfig and ErrInvalidTask) and by SetQueueLimits.
func TestQueueLimitsInvalid(t *testing.T) {
	t.Parallel()
	h := tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil })
	for _, c := range []struct {
		l     tide.QueueLimits
		field string
	}{
		{tide.QueueLimits{Concurrency: -1}, "Concurrency"},
		{tide.QueueLimits{Concurrency: 1 << 30}, "Concurrency"},
		{tide.QueueLimits{Rate: tide.Rate{Limit: -5, Per: time.Second}}, "Rate.Limit"},
		{tide.QueueLimits{Rate: tide.Rate{Limit: 5}}, "Rate.Per"},
		{tide.QueueLimits{Rate: tide.Rate{Limit: 5, Per: time.Microsecond}}, "Rate.Per"},
		{tide.QueueLimits{Rate: tide.Rate{Per: time.Second}}, "Rate.Per"},
		{tide.QueueLimits{Rate: tide.Rate{Limit: 1 << 30, Per: time.Second}}, "Rate.Limit"},
	} {
		l := c.l
		s := tide.NewServer(membroker.New(), tide.Config{QueueLimits: map[string]tide.QueueLimits{"q": l}})
		err := s.Start(h)
		if !errors.Is(err, tide.ErrInvalidConfig) || !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Start with QueueLimits %+v = %v; want ErrInvalidConfig and ErrInvalidTask naming %s", l, err, c.field)
		}
		if err := tide.NewInspector(membroker.New()).SetQueueLimits(context.Background(), "q", l); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("SetQueueLimits(%+v) = %v, want ErrInvalidTask", l, err)
		}
	}
	s := tide.NewServer(membroker.New(), tide.Config{QueueLimits: map[string]tide.QueueLimits{"bad name": {Concurrency: 1}}})
	if err := s.Start(h); !errors.Is(err, tide.ErrInvalidConfig) {
		t.Errorf("Start with a bad queue name in QueueLimits = %v", err)
	}
}

// The queue's Concurrency is the queue's, not fixed shares of its
// partitions: on six partitions a limit of 3 is accepted, and a backlog in
// one partition runs up to the whole limit at once (10 over six partitions:
// not the 2 of an even share), never more, while three servers work.
func TestQueueLimitsFollowBacklog(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{3, 10} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(6))
			ctx := context.Background()
			const q = "follow"
			var g gauge
			var done atomic.Int64
			release := make(chan struct{})
			h := tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
				g.enter()
				defer g.leave()
				select {
				case <-release:
				case <-ctx.Done():
				}
				done.Add(1)
				return nil
			})
			for range 3 {
				e.server(tide.Config{
					Concurrency: 10, Queues: map[string]int{q: 1},
					QueueLimits: map[string]tide.QueueLimits{q: {Concurrency: limit}},
				}, h)
			}
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free) // before the servers shut down
			var ids []string
			for i := 0; len(ids) < 3*limit; i++ {
				if id := fmt.Sprint("f", i); broker.Partition(id, 6) == 5 {
					ids = append(ids, id)
				}
			}
			for _, id := range ids {
				if _, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Queue(q), tide.TaskID(id)); err != nil {
					t.Fatal(err)
				}
			}
			testwait.For(t, 10*time.Second, fmt.Sprintf("%d handlers to run at once", limit), func() bool { return g.cur.Load() == int64(limit) })
			free()
			testwait.For(t, 10*time.Second, "every task to run", func() bool { return done.Load() == int64(len(ids)) })
			if p := g.peak.Load(); p > int64(limit) {
				t.Fatalf("%d handlers ran at once under Concurrency %d", p, limit)
			}
		})
	}
}
