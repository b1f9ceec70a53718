package tide_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// EnqueueAndWait from many goroutines at once: each caller gets its own
// task back, completed, with its result when the task has a Retention and
// with its completion time when it has none.
func TestEnqueueAndWaitUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.server(tide.Config{Concurrency: 8}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		return tide.WriteResult(ctx, append([]byte("done:"), task.Payload()...))
	}))
	const n = 60
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []tide.Option{}
			if i%2 == 0 {
				opts = append(opts, tide.Retention(time.Minute))
			}
			payload := fmt.Sprint(i)
			info, err := e.c.EnqueueAndWait(ctx, tide.NewTask("echo", []byte(payload)), opts...)
			switch {
			case err != nil:
				errs <- err
			case info.State != tide.StateCompleted || info.CompletedAt.IsZero():
				errs <- fmt.Errorf("task %d: state %v, completed at %v", i, info.State, info.CompletedAt)
			case i%2 == 0 && string(info.Result) != "done:"+payload:
				errs <- fmt.Errorf("task %d: result %q", i, info.Result)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Wait reports an archived task with its error, refuses an unknown ID,
// returns ErrTaskNotFound for a task deleted while waited for, and gives
// up with the context.
func TestWaitOutcomes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		return errors.New("boom")
	}))
	t.Run("archived", func(t *testing.T) {
		info, err := e.c.EnqueueAndWait(ctx, tide.NewTask("fail", nil), tide.MaxRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		if info.State != tide.StateArchived || info.LastErr != "boom" {
			t.Fatalf("state %v, last error %q", info.State, info.LastErr)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		if _, err := e.c.Wait(ctx, "default", "no-such-task"); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("Wait: %v, want ErrTaskNotFound", err)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		info, err := e.c.Enqueue(ctx, tide.NewTask("later", nil), tide.ProcessIn(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			_, err := e.c.Wait(ctx, info.Queue, info.ID)
			got <- err
		}()
		time.Sleep(50 * time.Millisecond) // let the waiter register (either order must work)
		if err := e.c.Delete(ctx, info.Queue, info.ID); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if !errors.Is(err, tide.ErrTaskNotFound) {
				t.Fatalf("Wait: %v, want ErrTaskNotFound", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Wait did not return when the task was deleted")
		}
	})
	t.Run("context", func(t *testing.T) {
		info, err := e.c.Enqueue(ctx, tide.NewTask("later", nil), tide.ProcessIn(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := e.c.Wait(wctx, info.Queue, info.ID); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait: %v, want the context's error", err)
		}
	})
}

// A waiter whose subscription is cut while the task ends still learns of
// the end: the broken subscription makes it look again.
func TestWaitSurvivesABrokenSubscription(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		<-release
		return nil
	}))
	info, err := e.c.Enqueue(ctx, tide.NewTask("slow", nil))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := e.c.Wait(ctx, info.Queue, info.ID)
		got <- err
	}()
	testwait.For(t, 10*time.Second, "the task to start", func() bool { return e.info(info.Queue, info.ID).State == tide.StateActive })
	time.Sleep(50 * time.Millisecond)
	// Cut every pub/sub connection (the servers' too), then end the task
	// before the waiter could have subscribed again.
	if err := e.rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	close(release)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait missed the end of the task while its subscription was cut")
	}
}

// ReportProgress is kept with the running task and shown by GetTaskInfo;
// bad input and calls outside a handler are refused.
func TestReportProgress(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	reported := make(chan error, 1)
	release := make(chan struct{})
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		if err := tide.ReportProgress(ctx, 101, ""); !errors.Is(err, tide.ErrInvalidTask) {
			reported <- fmt.Errorf("ReportProgress(101): %v, want ErrInvalidTask", err)
			return nil
		}
		reported <- tide.ReportProgress(ctx, 40, "resized 4 of 10")
		<-release
		return tide.ReportProgress(ctx, 100, "done")
	}))
	info, err := e.c.Enqueue(ctx, tide.NewTask("resize", nil), tide.Retention(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-reported; err != nil {
		t.Fatal(err)
	}
	p := e.info(info.Queue, info.ID).Progress
	if p.Percent != 40 || p.Note != "resized 4 of 10" || p.At.IsZero() {
		t.Fatalf("progress while running = %+v", p)
	}
	close(release)
	done := e.waitState(info.Queue, info.ID, tide.StateCompleted)
	if done.Progress.Percent != 100 || done.Progress.Note != "done" {
		t.Fatalf("progress when completed = %+v", done.Progress)
	}
	if err := tide.ReportProgress(ctx, 10, ""); err == nil {
		t.Fatal("ReportProgress outside a handler succeeded")
	}
}
