package tide_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// A batch handler gets the tasks of its type in batches of at most
// BatchSize; the tasks it fails are retried on their own and the others
// complete, each with the result it wrote through its own context.
func TestHandleBatchPartialFailures(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const n, size = 120, 10
	var mu sync.Mutex
	sizes := []int{}
	runs := map[string]int{} // payload -> attempts
	mux := tide.NewServeMux()
	mux.HandleBatch("insert", tide.BatchHandlerFunc(func(ctx context.Context, ts []*tide.Task) []error {
		errs := make([]error, len(ts))
		mu.Lock()
		sizes = append(sizes, len(ts))
		mu.Unlock()
		for i, task := range ts {
			p := string(task.Payload())
			mu.Lock()
			runs[p]++
			first := runs[p] == 1
			mu.Unlock()
			k, _ := strconv.Atoi(p)
			if k%3 == 0 && first {
				errs[i] = errors.New("row rejected")
				continue
			}
			if err := tide.WriteResult(task.Context(), []byte("stored "+p)); err != nil {
				errs[i] = err
			}
		}
		return errs
	}), tide.BatchSize(size), tide.BatchWait(100*time.Millisecond))
	e.server(tide.Config{
		Concurrency:    30,
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 10 * time.Millisecond },
	}, mux)
	ids := make([]string, n)
	for i := range n {
		info, err := e.c.Enqueue(ctx, tide.NewTask("insert", []byte(strconv.Itoa(i))), tide.Retention(time.Hour), tide.MaxRetry(1))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = info.ID
	}
	for i, id := range ids {
		ti := e.waitState("default", id, tide.StateCompleted)
		if string(ti.Result) != fmt.Sprint("stored ", i) {
			t.Fatalf("task %d result %q", i, ti.Result)
		}
		if want := map[bool]int{true: 1, false: 0}[i%3 == 0]; ti.Retried != want {
			t.Fatalf("task %d retried %d times, want %d", i, ti.Retried, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	batched := 0
	for _, s := range sizes {
		if s > size {
			t.Fatalf("a batch of %d tasks under BatchSize %d", s, size)
		}
		if s > 1 {
			batched++
		}
	}
	if batched == 0 {
		t.Fatalf("no batch held more than one task: %v", sizes)
	}
	t.Logf("batch sizes: %v", sizes)
}

// A batch handler that returns the wrong number of errors, or panics, fails
// every task of the batch with an error that says so.
func TestHandleBatchMisbehaves(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	mux := tide.NewServeMux()
	mux.HandleBatch("short", tide.BatchHandlerFunc(func(context.Context, []*tide.Task) []error {
		return nil
	}), tide.BatchSize(5), tide.BatchWait(50*time.Millisecond))
	mux.HandleBatch("boom", tide.BatchHandlerFunc(func(context.Context, []*tide.Task) []error {
		panic("bulk insert exploded")
	}), tide.BatchSize(5), tide.BatchWait(50*time.Millisecond))
	e.server(tide.Config{Concurrency: 10}, mux)
	for _, tc := range []struct{ typ, want string }{
		{"short", "batch handler returned 0 errors for"},
		{"boom", "batch handler panic: bulk insert exploded"},
	} {
		var ids []string
		for range 3 {
			info, err := e.c.Enqueue(ctx, tide.NewTask(tc.typ, nil), tide.MaxRetry(0))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, info.ID)
		}
		for _, id := range ids {
			ti := e.waitState("default", id, tide.StateArchived)
			if !strings.Contains(ti.LastErr, tc.want) {
				t.Fatalf("%s: last error %q, want it to say %q", tc.typ, ti.LastErr, tc.want)
			}
		}
	}
}

// A server shutting down while a batch waits for more tasks runs the batch
// it has when the handlers' contexts end (after ShutdownTimeout) and
// settles its tasks; nothing is left running.
func TestHandleBatchShutdown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var ran atomic.Int64
	mux := tide.NewServeMux()
	mux.HandleBatch("slow", tide.BatchHandlerFunc(func(_ context.Context, ts []*tide.Task) []error {
		ran.Add(int64(len(ts)))
		return make([]error, len(ts))
	}), tide.BatchSize(100), tide.BatchWait(time.Hour))
	s := e.server(tide.Config{Concurrency: 4, ShutdownTimeout: 300 * time.Millisecond}, mux)
	info, err := e.c.Enqueue(ctx, tide.NewTask("slow", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the task to be active", func() bool { return e.info("default", info.ID).State == tide.StateActive })
	done := make(chan struct{})
	go func() { s.Shutdown(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown waited for a batch with an hour's BatchWait")
	}
	if ran.Load() != 1 {
		t.Fatalf("the batch handler ran %d tasks, want the 1 waiting", ran.Load())
	}
	if st := e.info("default", info.ID).State; st != tide.StateCompleted {
		t.Fatalf("task is %v after Shutdown, want completed", st)
	}
}
