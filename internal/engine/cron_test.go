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
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// everyMinute ticks on every whole minute.
type everyMinute struct{}

func (everyMinute) Next(t time.Time) time.Time { return t.Truncate(time.Minute).Add(time.Minute) }
func (everyMinute) Prev(now time.Time, lookback time.Duration) (time.Time, bool) {
	p := now.Truncate(time.Minute)
	return p, now.Sub(p) <= lookback
}

func cronSetup(t *testing.T, b broker.Broker, bd *bundle, failed func(*CronEntry, time.Time, error)) (*Cron, *CronEntry) {
	t.Helper()
	c := NewCron(CronConfig{Broker: b, SchedulerID: "s1", Grace: time.Minute, Logger: bd.cfg.Logger, Now: bd.clock.Now, Failed: failed})
	e := &CronEntry{ID: "e1", Spec: "@every 1m", Type: "t", Queue: "q", Schedule: everyMinute{},
		Build: func(id string, tick time.Time, retention time.Duration) (*tidetype.TaskInfo, broker.EnqueueOptions, error) {
			return &tidetype.TaskInfo{ID: id, Queue: "q", Type: "t", State: tidetype.StatePending, NextProcessAt: tick, EnqueuedAt: tick, Retention: retention}, broker.EnqueueOptions{}, nil
		}}
	c.Add(e)
	return c, e
}

// Each tick is enqueued once, with the tick's ID and a retention of at least
// two intervals, and two services on one broker (two replicas) agree.
func TestCronEnqueuesEachTickOnce(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	bd.clock.Advance(30 * time.Second) // between ticks
	a, _ := cronSetup(t, bd.b, bd, nil)
	b, _ := cronSetup(t, bd.b, bd, nil)
	a.Start()
	b.Start()
	defer a.Stop()
	defer b.Stop()
	tick := bd.clock.Now().Truncate(time.Minute)
	id := CronTaskID("e1", tick)
	testwait.For(t, 10*time.Second, "the tick of Start to be enqueued", func() bool { return bd.state(t, id) != 0 })
	ti, _ := bd.b.GetTask(context.Background(), "q", id)
	if ti.Retention != 2*time.Minute {
		t.Fatalf("tick task retention %v, want 2m", ti.Retention)
	}
	qi, _ := bd.b.QueueInfo(context.Background(), "q")
	if qi.Size != 1 {
		t.Fatalf("%d tasks after one tick from two replicas, want 1", qi.Size)
	}
}

// flakyEnqueue fails the first n enqueues with ErrUnavailable.
type flakyEnqueue struct {
	broker.Broker
	n atomic.Int32
}

func (f *flakyEnqueue) Enqueue(ctx context.Context, ts []*tidetype.TaskInfo, o broker.EnqueueOptions) ([]error, error) {
	if f.n.Add(-1) >= 0 {
		return nil, fmt.Errorf("%w: connection refused", broker.ErrUnavailable)
	}
	return f.Broker.Enqueue(ctx, ts, o)
}

// A tick whose enqueue fails is retried with back-off and every failure is
// reported; it is enqueued once the broker answers.
func TestCronRetriesAFailedTick(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	fb := &flakyEnqueue{Broker: bd.b}
	fb.n.Store(2)
	var mu sync.Mutex
	var reports []error
	c, _ := cronSetup(t, fb, bd, func(_ *CronEntry, _ time.Time, err error) {
		mu.Lock()
		reports = append(reports, err)
		mu.Unlock()
	})
	c.Start()
	defer c.Stop()
	id := CronTaskID("e1", bd.clock.Now().Truncate(time.Minute))
	testwait.For(t, 10*time.Second, "the tick to be enqueued after the failures", func() bool {
		// Retries wait on the fake clock: move it along within the grace.
		bd.clock.Advance(100 * time.Millisecond)
		nudge(c.wake)
		return bd.state(t, id) != 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 2 || !errors.Is(reports[0], broker.ErrUnavailable) {
		t.Fatalf("failures reported: %v", reports)
	}
}
