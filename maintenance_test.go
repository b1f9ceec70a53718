package tide_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// Completed tasks are trimmed as fast as they complete: 20,000 tasks kept
// for 1ms each, processed at full speed, leave (almost) nothing behind a few
// seconds later.
func TestRetentionTrimmingKeepsPace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const n = 20000
	ts := make([]*tide.Task, n)
	for i := range ts {
		ts[i] = tide.NewTask("kept", []byte("x"))
	}
	for off := 0; off < n; off += 5000 {
		if _, err := e.c.EnqueueMany(ctx, ts[off:off+5000], tide.Retention(time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	e.server(tide.Config{Concurrency: 50}, tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
	in := tide.NewInspector(e.b)
	var qi *tide.QueueInfo
	testwait.For(t, 60*time.Second, "every task to be processed", func() bool {
		var err error
		qi, err = in.QueueInfo(ctx, "default")
		return err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0
	})
	testwait.For(t, 5*time.Second, "the completed tasks to be trimmed", func() bool {
		var err error
		qi, err = in.QueueInfo(ctx, "default")
		return err == nil && qi.Completed <= 100
	})
	if keys := e.rdb.HLen(ctx, e.prefix+":{default:0}:t").Val(); keys > 100 {
		t.Fatalf("%d task records left behind", keys)
	}
}

// A queue's partition count is recorded in Redis: a process configured with
// another one fails at Start, naming both counts, instead of running tasks
// it could never settle; a process that does not say adopts the recorded
// count and runs them.
func TestServerStartRefusesAnotherPartitionCount(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(4))
	ctx := context.Background()
	for i := range 8 {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("orders"), tide.TaskID(fmt.Sprint("o", i))); err != nil {
			t.Fatal(err)
		}
	}
	wrong := redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix), redisbroker.WithQueuePartitions("orders", 3))
	s := tide.NewServer(wrong, tide.Config{Queues: map[string]int{"orders": 1}, Logger: testLogger(t)})
	err := s.Start(tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
	if !errors.Is(err, tide.ErrLayout) || !strings.Contains(err.Error(), "4") || !strings.Contains(err.Error(), "3") {
		t.Fatalf("Start with 3 partitions on a queue recorded with 4: %v", err)
	}
	if _, err := tide.NewClient(wrong).Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("orders")); !errors.Is(err, tide.ErrLayout) {
		t.Fatalf("Enqueue with 3 partitions: %v", err)
	}

	adopter := redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix))
	var mu sync.Mutex
	ran := map[string]bool{}
	s2 := tide.NewServer(adopter, tide.Config{Queues: map[string]int{"orders": 1}, Logger: testLogger(t)})
	if err := s2.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		mu.Lock()
		ran[id] = true
		mu.Unlock()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s2.Shutdown)
	testwait.For(t, 10*time.Second, "every task to run on the adopting server", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == 8
	})
}

// Due times are decided on one clock, Redis's: a server whose own clock runs
// five seconds fast does not start a task before it is due, and a client
// whose clock is off still schedules "in 2s" two seconds from now.
func TestFastClockNeverStartsTasksEarly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	fast := func() time.Time { return time.Now().Add(5 * time.Second) }
	skewed := func() *redisbroker.Broker {
		return redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix), redisbroker.WithLocalClock(fast))
	}
	started := make(chan time.Time, 1)
	s := tide.NewServer(skewed(), tide.Config{Logger: testLogger(t)})
	if err := s.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		now, err := e.rdb.Time(ctx).Result()
		if err != nil {
			return err
		}
		started <- now
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)

	before, err := e.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	info, err := tide.NewClient(skewed()).Enqueue(ctx, tide.NewTask("later", nil), tide.ProcessIn(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if lead := info.NextProcessAt.Sub(before); lead < 2*time.Second || lead > 3*time.Second {
		t.Fatalf("a client with a fast clock scheduled ProcessIn(2s) %v after Redis's now", lead)
	}
	select {
	case at := <-started:
		if at.Before(info.NextProcessAt) {
			t.Fatalf("task started at %v by Redis's clock, %v before it was due", at, info.NextProcessAt.Sub(at))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the task never started")
	}
}
