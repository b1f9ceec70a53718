package tide_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
)

// deaf is a broker whose subscriptions never deliver cancellations, as when a
// server's subscription is reconnecting at the moment an operator cancels.
type deaf struct{ broker.Broker }

func (d deaf) Subscribe(ctx context.Context, queues []string) (<-chan broker.Event, error) {
	in, err := d.Broker.Subscribe(ctx, queues)
	if err != nil {
		return nil, err
	}
	out := make(chan broker.Event, 64)
	go func() {
		defer close(out)
		for ev := range in {
			if ev.Kind != broker.EventCancel {
				out <- ev
			}
		}
	}()
	return out, nil
}

// A cancellation is recorded with the task: a server that never hears the
// notice still stops the handler at its next lease renewal, and the task is
// archived as cancelled instead of being retried.
func TestCancelReachesAServerThatMissedTheNotice(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	running := make(chan struct{})
	cause := make(chan error, 1)
	s := tide.NewServer(deaf{e.broker()}, tide.Config{LeaseDuration: 900 * time.Millisecond, Logger: testLogger(t)})
	if err := s.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		close(running)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	info, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.MaxRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	<-running
	if err := e.c.Cancel(ctx, "default", info.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-cause:
		if !errors.Is(c, tide.ErrTaskCanceled) {
			t.Fatalf("handler's context ended with %v, want ErrTaskCanceled", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancellation never reached the handler")
	}
	ti := e.waitState("default", info.ID, tide.StateArchived)
	if ti.Retried != 0 || !strings.HasPrefix(ti.LastErr, tide.ErrTaskCanceled.Error()) {
		t.Fatalf("cancelled task: retried %d, LastErr %q", ti.Retried, ti.LastErr)
	}
}

// Client.Cancel stops a task whatever its state: a waiting one is deleted, an
// unknown one is reported.
func TestCancelWaitingTask(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	if _, err := e.c.Enqueue(ctx, tide.NewTask("cancel", nil), tide.TaskID("order-cancel:7"), tide.ProcessIn(15*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Cancel(ctx, "default", "order-cancel:7"); err != nil {
		t.Fatal(err)
	}
	if _, err := tide.NewInspector(e.b).GetTaskInfo(ctx, "default", "order-cancel:7"); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Fatalf("after Cancel: %v, want ErrTaskNotFound", err)
	}
	if err := e.c.Cancel(ctx, "default", "order-cancel:7"); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Fatalf("second Cancel: %v, want ErrTaskNotFound", err)
	}
}

// A task cancelled while its worker is gone is archived when its lease is
// recovered, never retried.
func TestCancelledTaskOfADeadWorkerIsArchived(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	info, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.MaxRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := e.b.Dequeue(ctx, []string{"default"}, 1, 200*time.Millisecond) // a worker that then dies
	if err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	if err := e.c.Cancel(ctx, "default", info.ID); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the lease to be recovered", func() bool {
		r, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: "default", Owner: "m", OwnerTTL: time.Second, RecoverBackoff: time.Millisecond})
		return err == nil && r.Recovered == 1
	})
	if ti := e.info("default", info.ID); ti.State != tide.StateArchived || !strings.Contains(ti.LastErr, "cancelled") {
		t.Fatalf("cancelled task of a dead worker: %+v", ti)
	}
}

// One function decides how an attempt ends: a task cancelled by an operator
// whose handler then fails is archived, and the server neither asks
// RetryDelayFunc for a retry that will not happen nor logs one.
func TestCancelledFailureIsDecidedOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var delays, handled atomic.Int32
	var logs testlog.Buffer
	running := make(chan struct{})
	e.server(tide.Config{
		Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { delays.Add(1); return time.Second },
		ErrorHandler:   func(context.Context, *tide.Task, error) { handled.Add(1) },
	}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		close(running)
		<-ctx.Done()
		return errors.New("charge interrupted")
	}))
	info, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.MaxRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	<-running
	if err := tide.NewInspector(e.b).CancelProcessing(ctx, "default", info.ID); err != nil {
		t.Fatal(err)
	}
	ti := e.waitState("default", info.ID, tide.StateArchived)
	if !strings.Contains(ti.LastErr, "charge interrupted") || !strings.HasPrefix(ti.LastErr, tide.ErrTaskCanceled.Error()) {
		t.Fatalf("LastErr = %q", ti.LastErr)
	}
	if n := delays.Load(); n != 0 {
		t.Fatalf("RetryDelayFunc called %d times for a task that was archived", n)
	}
	if n := handled.Load(); n != 1 {
		t.Fatalf("ErrorHandler called %d times, want 1", n)
	}
	if out := logs.String(); strings.Contains(out, "will retry") || !strings.Contains(out, "archived (cancelled)") {
		t.Fatalf("log contradicts the outcome:\n%s", out)
	}
}
