package tide_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

// costEnqueuerEnv makes the test binary act as the enqueuing client of
// BenchmarkServerCost/life: a process of its own, so that its CPU is not
// counted with the server's.
const costEnqueuerEnv = "TIDE_TEST_COST_ENQUEUER"

func init() {
	if os.Getenv(costEnqueuerEnv) == "" {
		return
	}
	n, _ := strconv.Atoi(os.Getenv(costEnqueuerEnv))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("TIDE_TEST_REDIS")})
	c := tide.NewClient(redisbroker.New(rdb, redisbroker.WithPrefix(os.Getenv("TIDE_TEST_PREFIX"))))
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Bool
	p := make([]byte, 64)
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := c.Enqueue(context.Background(), tide.NewTask("bench", p)); err != nil {
					fmt.Fprintln(os.Stderr, "enqueue:", err)
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	_ = rdb.Close()
	if failed.Load() {
		os.Exit(1)
	}
	os.Exit(0)
}

// countingBroker counts a server's lease and settle calls.
type countingBroker struct {
	*redisbroker.Broker
	dequeues, empty, leased, settles atomic.Int64
}

func (c *countingBroker) Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	ds, err := c.Broker.Dequeue(ctx, queues, n, lease)
	c.dequeues.Add(1)
	if len(ds) == 0 {
		c.empty.Add(1)
	}
	c.leased.Add(int64(len(ds)))
	return ds, err
}

func (c *countingBroker) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	c.settles.Add(1)
	return c.Broker.Settle(ctx, ss)
}

// cpuTime is the CPU (user + system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkServerCost measures what a server process spends on a task's
// lease, dispatch to a no-op handler and settlement, with the defaults the
// cost bench's life row uses (concurrency 50, a discarding logger, every
// other option the default): b.N tasks a run, reported as CPU µs per task
// (this process's user + system time, from before Start until the last
// handler call and Shutdown) and allocations per task.
//
//   - drain: the tasks are enqueued with EnqueueMany before the server
//     starts, so every lease call finds a full batch.
//   - life: a process of its own enqueues them with single Enqueue calls
//     from 8 goroutines while the server runs, as in the bench's life row,
//     so the server also waits for and is woken by new work.
//
// Run it with a fixed count, e.g.
//
//	go test -run '^$' -bench ServerCost -benchtime 20000x -count 5 .
func BenchmarkServerCost(b *testing.B) {
	b.Run("drain", func(b *testing.B) { benchServerCost(b, false) })
	b.Run("life", func(b *testing.B) { benchServerCost(b, true) })
}

func benchServerCost(b *testing.B, life bool) {
	addr := redistest.Addr(b)
	prefix := redistest.Prefix(b)
	rdb := redistest.Client(b, addr)
	ctx := context.Background()
	var enq *exec.Cmd
	if life {
		enq = exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
		enq.Env = append(os.Environ(), costEnqueuerEnv+"="+strconv.Itoa(b.N), "TIDE_TEST_REDIS="+addr, "TIDE_TEST_PREFIX="+prefix)
		enq.Stderr = os.Stderr
	} else {
		c := tide.NewClient(redisbroker.New(rdb, redisbroker.WithPrefix(prefix)))
		p := make([]byte, 64)
		const chunk = 1000
		for i := 0; i < b.N; i += chunk {
			ts := make([]*tide.Task, min(chunk, b.N-i))
			for j := range ts {
				ts[j] = tide.NewTask("bench", p)
			}
			if _, err := c.EnqueueMany(ctx, ts); err != nil {
				b.Fatal(err)
			}
		}
	}
	srdb := redis.NewClient(&redis.Options{Addr: addr})
	defer srdb.Close()
	var got atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	cb := &countingBroker{Broker: redisbroker.New(srdb, redisbroker.WithPrefix(prefix))}
	srv := tide.NewServer(cb, tide.Config{
		Concurrency: 50,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	if err := srv.Start(tide.HandlerFunc(func(context.Context, *tide.Task) error {
		if got.Add(1) == n {
			close(done)
		}
		return nil
	})); err != nil {
		b.Fatal(err)
	}
	if enq != nil {
		if err := enq.Start(); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d tasks run", got.Load(), n)
	}
	srv.Shutdown()
	cpu := cpuTime(b) - cpu0
	b.StopTimer()
	if enq != nil {
		if err := enq.Wait(); err != nil {
			b.Fatalf("enqueuer: %v", err)
		}
	}
	qi, err := tide.NewInspector(redisbroker.New(rdb, redisbroker.WithPrefix(prefix))).QueueInfo(ctx, tide.DefaultQueue)
	if err != nil {
		b.Fatal(err)
	}
	if qi.Size != 0 {
		b.Fatalf("after the run the queue holds %d tasks (%d pending, %d active), want none", qi.Size, qi.Pending, qi.Active)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/task")
	b.ReportMetric(float64(cb.leased.Load())/float64(cb.dequeues.Load()), "tasks/lease-call")
	b.ReportMetric(float64(b.N)/float64(cb.settles.Load()), "tasks/settle-call")
	b.ReportMetric(float64(cb.empty.Load())/float64(cb.dequeues.Load()), "empty-lease-calls/lease-call")
}
