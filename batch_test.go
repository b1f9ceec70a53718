package tide_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// A 10,000-task batch processed by two servers: the callback runs exactly
// once, after every task ended, and sees the counts and the failed IDs.
func TestBatchCallbackRunsOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const n = 10_000
	var ended atomic.Int64
	var callbacks atomic.Int64
	var mu sync.Mutex
	var seen *tide.BatchInfo
	var endedAtCallback int64
	h := tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if task.Type() == "report" {
			callbacks.Add(1)
			b, ok := tide.GetBatch(ctx)
			mu.Lock()
			defer mu.Unlock()
			if !ok {
				return errors.New("GetBatch: not a callback")
			}
			seen, endedAtCallback = b, ended.Load()
			return nil
		}
		if _, ok := tide.GetBatch(ctx); ok {
			return errors.New("GetBatch answered for a member")
		}
		defer ended.Add(1)
		i, _ := strconv.Atoi(string(task.Payload()))
		if i%500 == 3 {
			return fmt.Errorf("row %d is bad: %w", i, tide.SkipRetry)
		}
		return nil
	})
	e.server(tide.Config{Concurrency: 16, Queues: map[string]int{"import": 1}}, h)
	e.server(tide.Config{Concurrency: 16, Queues: map[string]int{"import": 1}}, h)
	tasks := make([]*tide.Task, n)
	for i := range tasks {
		tasks[i] = tide.NewTask("row", []byte(strconv.Itoa(i)))
	}
	info, err := e.c.EnqueueBatch(ctx, tasks, tide.OnBatchDone(tide.NewTask("report", nil)), tide.Queue("import"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Total != n || info.CallbackID != info.ID+"/callback" || info.State != tide.FlowRunning {
		t.Fatalf("EnqueueBatch = %+v", info)
	}
	in := tide.NewInspector(e.b)
	var got *tide.BatchInfo
	testwait.For(t, 3*time.Minute, "the batch to end", func() bool {
		got, err = in.GetBatch(ctx, info.ID)
		return err == nil && !got.FinishedAt.IsZero()
	})
	// Every follow-up has run: nothing left in the queue.
	testwait.For(t, 30*time.Second, "the queue to drain", func() bool {
		qi, err := in.QueueInfo(ctx, "import")
		return err == nil && qi.Pending+qi.Active+qi.Retry == 0
	})
	if c := callbacks.Load(); c != 1 {
		t.Fatalf("callback ran %d times, want once", c)
	}
	mu.Lock()
	defer mu.Unlock()
	if endedAtCallback != n {
		t.Errorf("callback ran when %d of %d tasks had ended", endedAtCallback, n)
	}
	if seen.Total != n || seen.Succeeded != n-20 || seen.Failed != 20 || len(seen.FailedIDs) != 20 || seen.ID != info.ID {
		t.Errorf("the callback saw %+v", *seen)
	}
	if got.State != tide.FlowFailed || got.Succeeded != n-20 || got.Failed != 20 {
		t.Errorf("GetBatch = %+v", *got)
	}
	failed := e.info("import", got.FailedIDs[0])
	if failed.State != tide.StateArchived || failed.Queue != "import" {
		t.Errorf("failed member %s: %+v", got.FailedIDs[0], failed)
	}
	list, total, err := in.Batches(ctx, 0, 10)
	if err != nil || total != 1 || list[0].ID != info.ID || list[0].Total != n {
		t.Errorf("Batches = %v, %d, %v", list, total, err)
	}
}

// EnqueueBatch refuses what it cannot run and stores nothing for it; a
// member whose ID is taken counts as failed.
func TestEnqueueBatchInputs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"empty": func() error { _, err := e.c.EnqueueBatch(ctx, nil); return err },
		"nil task": func() error {
			_, err := e.c.EnqueueBatch(ctx, []*tide.Task{nil})
			return err
		},
		"two callbacks": func() error {
			_, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("t", nil)}, tide.OnBatchDone(tide.NewTask("cb", nil)), tide.OnBatchDone(tide.NewTask("cb", nil)))
			return err
		},
		"callback with an ID": func() error {
			_, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("t", nil)}, tide.OnBatchDone(tide.NewTask("cb", nil, tide.TaskID("x"))))
			return err
		},
		"OnBatchDone to Enqueue": func() error {
			_, err := e.c.Enqueue(ctx, tide.NewTask("t", nil), tide.OnBatchDone(tide.NewTask("cb", nil)))
			return err
		},
	} {
		if err := call(); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("%s: %v, want ErrInvalidTask", name, err)
		}
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("t", nil), tide.TaskID("taken")); err != nil {
		t.Fatal(err)
	}
	info, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("t", nil, tide.TaskID("taken")), tide.NewTask("t", nil)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tide.NewInspector(e.b).GetBatch(ctx, info.ID)
	if err != nil || b.Failed != 1 || b.FailedIDs[0] != "taken" || b.Total != 2 {
		t.Fatalf("GetBatch = %+v, %v", b, err)
	}
}
