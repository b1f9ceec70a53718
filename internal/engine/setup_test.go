package engine

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/tidetype"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// bundle is what a service's test needs besides the service: the broker
// (a membroker on a fake clock), the clock and the captured log.
type bundle struct {
	b     *membroker.Broker
	clock *fakeClock
	logs  *testlog.Buffer
	cfg   Config
}

// setup returns a bundle whose Config serves queue "q" on a membroker with a
// fake clock. run is the RunFunc of the processor; nil settles every task as
// done.
func setup(t *testing.T, run RunFunc) *bundle {
	t.Helper()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := membroker.New(membroker.WithClock(clock))
	t.Cleanup(func() { _ = b.Close() })
	logs := &testlog.Buffer{}
	var w io.Writer = logs
	if testing.Verbose() {
		w = io.MultiWriter(logs, os.Stderr)
	}
	if run == nil {
		run = func(context.Context, *broker.Delivery) (broker.Settlement, bool) {
			return broker.Settlement{Kind: broker.SettleDone}, true
		}
	}
	cfg := Config{
		Broker:          b,
		Queues:          map[string]int{"q": 1},
		Concurrency:     4,
		LeaseDuration:   time.Second,
		ShutdownTimeout: time.Second,
		ServerID:        "test-server",
		Logger:          slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Run:             run,
		Now:             clock.Now,
	}
	cfg.health = newHealth(cfg.Logger)
	return &bundle{b: b, clock: clock, logs: logs, cfg: cfg}
}

// enqueue stores tasks of type "t" in queue q, due at the fake clock's now
// plus in.
func (bd *bundle) enqueue(t *testing.T, in time.Duration, ids ...string) {
	t.Helper()
	now := bd.clock.Now()
	var ts []*tidetype.TaskInfo
	for _, id := range ids {
		ti := &tidetype.TaskInfo{ID: id, Queue: "q", Type: "t", State: tidetype.StatePending, MaxRetry: 3, NextProcessAt: now.Add(in), EnqueuedAt: now}
		if in > 0 {
			ti.State = tidetype.StateScheduled
		}
		ts = append(ts, ti)
	}
	errs, err := bd.b.Enqueue(context.Background(), ts, broker.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		if e != nil {
			t.Fatal(e)
		}
	}
}

// state returns the state of task id, or 0 when it is gone.
func (bd *bundle) state(t *testing.T, id string) tidetype.TaskState {
	t.Helper()
	ti, err := bd.b.GetTask(context.Background(), "q", id)
	if err != nil {
		return 0
	}
	return ti.State
}
