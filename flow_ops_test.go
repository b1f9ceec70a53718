package tide_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// ranLog records which tasks' handlers started, by task ID.
type ranLog struct {
	mu  sync.Mutex
	ids map[string]int
}

func (r *ranLog) handler(block <-chan struct{}) tide.Handler {
	return tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		r.mu.Lock()
		if r.ids == nil {
			r.ids = map[string]int{}
		}
		r.ids[id]++
		r.mu.Unlock()
		if task.Type() == "block" && block != nil {
			select {
			case <-block:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
}

func (r *ranLog) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[id]
}

// Every way an operator ends a workflow step or batch task counts as its
// end: the workflow or batch finishes, and the steps after it are
// cancelled (or the callback runs).
func TestOperatorActionsEndFlows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	var ran ranLog
	e.server(tide.Config{Concurrency: 4, Queues: map[string]int{"default": 1, "import": 1}}, ran.handler(nil))

	later := func(name string) *tide.Task { return tide.NewTask(name, nil, tide.ProcessIn(time.Hour)) }
	t.Run("ArchiveWaitingStep", func(t *testing.T) {
		wf := tide.NewWorkflow("arch-1").Add("pay", later("pay")).Add("ship", tide.NewTask("ship", nil), tide.After("pay"))
		if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
			t.Fatal(err)
		}
		if err := in.ArchiveTask(ctx, "default", "arch-1/pay"); err != nil {
			t.Fatal(err)
		}
		got := waitFlow(t, in, "arch-1")
		if st := stepStates(got); got.State != tide.FlowFailed || st["pay"] != "failed" || st["ship"] != "cancelled" {
			t.Fatalf("workflow %s, steps %v; want failed, pay failed, ship cancelled", got.State, st)
		}
		if err := in.RunTask(ctx, "default", "arch-1/pay"); !errors.Is(err, broker.ErrFlowStep) {
			t.Fatalf("RunTask of the archived step: %v, want ErrFlowStep", err)
		}
	})
	t.Run("ArchiveAllSteps", func(t *testing.T) {
		wf := tide.NewWorkflow("arch-all").Add("a", later("a")).Add("b", later("b")).Add("c", tide.NewTask("c", nil), tide.After("a", "b"))
		if _, err := e.c.EnqueueWorkflow(ctx, wf, tide.Queue("archall")); err != nil {
			t.Fatal(err)
		}
		if n, err := in.ArchiveAllTasks(ctx, "archall", tide.StateScheduled); err != nil || n != 2 {
			t.Fatalf("ArchiveAllTasks: %d, %v", n, err)
		}
		srv := e.server(tide.Config{Queues: map[string]int{"archall": 1}}, ran.handler(nil))
		_ = srv
		if got := waitFlow(t, in, "arch-all"); got.State != tide.FlowFailed || got.Canceled != 1 || got.Failed != 2 {
			t.Fatalf("workflow %+v", got)
		}
	})
	for _, how := range []string{"archive", "bulk delete"} {
		t.Run("BatchMember "+how, func(t *testing.T) {
			tasks := []*tide.Task{later("row"), later("row"), tide.NewTask("row", nil)}
			q := "batch-" + strings.ReplaceAll(how, " ", "-")
			b, err := e.c.EnqueueBatch(ctx, tasks, tide.Queue(q), tide.OnBatchDone(tide.NewTask("report", nil, tide.Queue("import"))))
			if err != nil {
				t.Fatal(err)
			}
			if how == "archive" {
				for _, i := range []string{"0", "1"} {
					if err := in.ArchiveTask(ctx, q, b.ID+"/"+i); err != nil {
						t.Fatal(err)
					}
				}
			} else if n, err := in.DeleteAllTasks(ctx, q, tide.StateScheduled); err != nil || n != 2 {
				t.Fatalf("DeleteAllTasks: %d, %v", n, err)
			}
			e.server(tide.Config{Queues: map[string]int{q: 1}}, ran.handler(nil))
			var got *tide.BatchInfo
			testwait.For(t, 30*time.Second, "the batch to call back", func() bool {
				got, err = in.GetBatch(ctx, b.ID)
				return err == nil && got.State != tide.FlowRunning && ran.count(b.CallbackID) == 1
			})
			if got.Failed != 2 || got.Succeeded != 1 {
				t.Fatalf("batch %+v; want 2 failed, 1 succeeded", got)
			}
		})
	}
}

// A bulk delete of a queue's pending tasks leaves a step's follow-up alone:
// the step succeeded, so the next one runs. A workflow follow-up cannot be
// deleted, cancelled or archived one by one either.
func TestBulkDeleteKeepsFollowups(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	var ran ranLog
	wf := tide.NewWorkflow("keep-1").Add("a", tide.NewTask("a", nil, tide.Queue("keep"))).Add("b", tide.NewTask("b", nil, tide.Queue("keep")), tide.After("a"))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	// Run a, then stop: its follow-up waits in the queue.
	d, err := e.b.Dequeue(ctx, []string{"keep"}, 1, time.Minute)
	if err != nil || len(d) != 1 {
		t.Fatalf("Dequeue: %v %v", d, err)
	}
	if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: d[0].Lease(), Kind: broker.SettleDone, Task: d[0].Task, At: time.Now()}}); err != nil || errs[0] != nil {
		t.Fatalf("Settle: %v %v", err, errs)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("other", nil), tide.Queue("keep")); err != nil {
		t.Fatal(err)
	}
	n, err := in.DeleteAllTasks(ctx, "keep", tide.StatePending)
	if err != nil || n != 1 {
		t.Fatalf("DeleteAllTasks(pending): %d, %v; want 1 (the other task)", n, err)
	}
	tasks, err := in.ListTasks(ctx, "keep", tide.StatePending, 1, 10)
	if err != nil || len(tasks) != 1 || tasks[0].Type != tide.FlowType {
		t.Fatalf("pending after the bulk delete: %+v, %v; want the follow-up", tasks, err)
	}
	fu := tasks[0].ID
	for name, err := range map[string]error{
		"Delete":  e.c.Delete(ctx, "keep", fu),
		"Cancel":  e.c.Cancel(ctx, "keep", fu),
		"Archive": in.ArchiveTask(ctx, "keep", fu),
	} {
		if !errors.Is(err, broker.ErrInternalTask) {
			t.Errorf("%s of the follow-up: %v, want ErrInternalTask", name, err)
		}
	}
	e.server(tide.Config{Queues: map[string]int{"keep": 1}}, ran.handler(nil))
	if got := waitFlow(t, in, "keep-1"); got.State != tide.FlowSucceeded || ran.count("keep-1/b") != 1 {
		t.Fatalf("workflow %+v, b ran %d times", got, ran.count("keep-1/b"))
	}
}

// A rolling deploy: a batch member interrupted by Shutdown goes back to its
// queue and runs again; the batch ends succeeded (the requeue is not an
// end, whatever order its tasks run in).
func TestBatchSurvivesShutdownRequeue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	var ran ranLog
	block := make(chan struct{})
	first := tide.NewServer(e.broker(), tide.Config{Concurrency: 2, ShutdownTimeout: 50 * time.Millisecond, Logger: testLogger(t), Queues: map[string]int{"deploy": 1}})
	if err := first.Start(ran.handler(block)); err != nil {
		t.Fatal(err)
	}
	b, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("block", nil), tide.NewTask("quick", nil)}, tide.Queue("deploy"),
		tide.OnBatchDone(tide.NewTask("report", nil, tide.Queue("deploy"))))
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the member to start", func() bool { return ran.count(b.ID+"/0") == 1 })
	first.Shutdown() // interrupts the blocked member: requeued
	close(block)
	e.server(tide.Config{Concurrency: 2, Queues: map[string]int{"deploy": 1}}, ran.handler(nil))
	var got *tide.BatchInfo
	testwait.For(t, 30*time.Second, "the batch to end", func() bool {
		got, err = in.GetBatch(ctx, b.ID)
		return err == nil && got.State != tide.FlowRunning && ran.count(b.CallbackID) == 1
	})
	if got.State != tide.FlowSucceeded || got.Succeeded != 2 || got.Failed != 0 {
		t.Fatalf("batch %+v; want every member succeeded", got)
	}
}

// CancelWorkflow answers a second call like the first: a caller whose
// first call's reply was lost (the flow is cancelled in the store) calls
// again and the enqueued steps are still stopped. A step released just
// before the cancel by a release that never confirmed (the releaser died)
// never runs either.
func TestCancelWorkflowTwice(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	fl := e.b
	wf := tide.NewWorkflow("cx-1").
		Add("a", tide.NewTask("a", nil, tide.ProcessIn(time.Hour))).
		Add("pre", tide.NewTask("pre", nil)).
		Add("b", tide.NewTask("b", nil), tide.After("pre"))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	// pre ends and b is made ready; a releaser stores b's task and dies
	// before confirming the release.
	ds, err := e.b.Dequeue(ctx, []string{"default"}, 1, time.Minute)
	if err != nil || len(ds) != 1 || ds[0].Task.ID != "cx-1/pre" {
		t.Fatalf("Dequeue: %v %v", ds, err)
	}
	ready, err := fl.EndStep(ctx, "cx-1", "pre", "cx-1/pre", true, "")
	if err != nil || len(ready) != 1 || ready[0].Name != "b" {
		t.Fatalf("EndStep: %v, %v", ready, err)
	}
	bt := ready[0].Task
	bt.State, bt.NextProcessAt, bt.EnqueuedAt = tide.StatePending, time.Now(), time.Now()
	if errs, err := e.b.Enqueue(ctx, []*tide.TaskInfo{bt}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatalf("storing b's task: %v %v", err, errs)
	}
	// The first cancel runs in the store; its reply is lost.
	if _, err := fl.CancelFlow(ctx, "cx-1"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.CancelWorkflow(ctx, "cx-1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"cx-1/a", "cx-1/b"} {
		if ti, err := in.GetTaskInfo(ctx, "default", id); err != nil || ti.State != tide.StateArchived || !strings.Contains(ti.LastErr, "cancelled") {
			t.Fatalf("%s after the second CancelWorkflow: %+v, %v; want archived as cancelled", id, ti, err)
		}
	}
	var ran ranLog
	e.server(tide.Config{}, ran.handler(nil))
	if got := waitFlow(t, in, "cx-1"); got.State != tide.FlowCanceled {
		t.Fatalf("workflow %+v", got)
	}
	if n := ran.count("cx-1/a") + ran.count("cx-1/b"); n != 0 {
		t.Fatalf("cancelled steps ran %d times", n)
	}
}

// A step whose task no canceller reached (stored after CancelWorkflow
// looked) does not run: the server checks its workflow first.
func TestStepOfCancelledWorkflowDoesNotRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	wf := tide.NewWorkflow("late-1").Add("pre", tide.NewTask("pre", nil)).Add("b", tide.NewTask("b", nil), tide.After("pre"))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	ds, err := e.b.Dequeue(ctx, []string{"default"}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %v %v", ds, err)
	}
	ready, err := e.b.EndStep(ctx, "late-1", "pre", "late-1/pre", true, "")
	if err != nil || len(ready) != 1 {
		t.Fatalf("EndStep: %v, %v", ready, err)
	}
	if err := e.c.CancelWorkflow(ctx, "late-1"); err != nil {
		t.Fatal(err)
	}
	// Now the release lands, after the cancel looked for b's task.
	bt := ready[0].Task
	bt.State, bt.NextProcessAt, bt.EnqueuedAt = tide.StatePending, time.Now(), time.Now()
	if errs, err := e.b.Enqueue(ctx, []*tide.TaskInfo{bt}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatalf("storing b's task: %v %v", err, errs)
	}
	var ran atomic.Int64
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		if t.Type() == "b" {
			ran.Add(1)
		}
		return nil
	}))
	ti := e.waitState("default", "late-1/b", tide.StateArchived)
	if !strings.Contains(ti.LastErr, "workflow was cancelled") || ran.Load() != 0 {
		t.Fatalf("b: %+v, ran %d; want archived unrun", ti, ran.Load())
	}
	if got := waitFlow(t, in, "late-1"); got.State != tide.FlowCanceled {
		t.Fatalf("workflow %+v", got)
	}
}

// failingEnqueue is a broker whose Enqueue fails while fail is set: the
// store going away (or the process dying) right after a workflow's or
// batch's bookkeeping was written.
type failingEnqueue struct {
	*redisbroker.Broker
	fail atomic.Bool
}

func (f *failingEnqueue) Enqueue(ctx context.Context, ts []*tide.TaskInfo, o broker.EnqueueOptions) ([]error, error) {
	if f.fail.Load() {
		return nil, broker.ErrUnavailable
	}
	return f.Broker.Enqueue(ctx, ts, o)
}

// A batch or workflow whose enqueue stopped right after its bookkeeping was
// written (nothing of its tasks stored) is finished by a server's repair:
// the batch's tasks run and its callback runs once; the workflow runs.
func TestFlowCreationStoppedHalfway(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	tide.SetFlowRepairForTest(50*time.Millisecond, 20*time.Millisecond)
	t.Cleanup(func() { tide.SetFlowRepairForTest(30*time.Second, 0) })
	fb := &failingEnqueue{Broker: e.broker()}
	fb.fail.Store(true)
	c := tide.NewClient(fb)
	b, err := c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("row", nil), tide.NewTask("row", nil)},
		tide.OnBatchDone(tide.NewTask("report", nil)))
	if !errors.Is(err, broker.ErrUnavailable) || b == nil {
		t.Fatalf("EnqueueBatch with the store gone: %+v, %v; want the batch and ErrUnavailable", b, err)
	}
	if _, err := c.EnqueueWorkflow(ctx, tide.NewWorkflow("half-1").Add("a", tide.NewTask("a", nil)).Add("b", tide.NewTask("b", nil), tide.After("a"))); !errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("EnqueueWorkflow with the store gone: %v", err)
	}
	var ran ranLog
	e.server(tide.Config{}, ran.handler(nil))
	var got *tide.BatchInfo
	testwait.For(t, 30*time.Second, "the batch to be repaired and end", func() bool {
		got, err = in.GetBatch(ctx, b.ID)
		return err == nil && got.State != tide.FlowRunning && ran.count(b.CallbackID) == 1
	})
	if got.State != tide.FlowSucceeded || got.Succeeded != 2 {
		t.Fatalf("batch %+v", got)
	}
	if wf := waitFlow(t, in, "half-1"); wf.State != tide.FlowSucceeded || ran.count("half-1/b") != 1 {
		t.Fatalf("workflow %+v", wf)
	}
}

// waitEnded waits until the flow has ended: not running, and its last step
// finished (FinishedAt; a cancelled flow ends when its enqueued steps do).
func waitEnded(t *testing.T, in *tide.Inspector, id string) *tide.WorkflowInfo {
	t.Helper()
	var wf *tide.WorkflowInfo
	testwait.For(t, 30*time.Second, "workflow "+id+" to end", func() bool {
		var err error
		wf, err = in.GetWorkflow(context.Background(), id)
		return err == nil && wf.State != tide.FlowRunning && !wf.FinishedAt.IsZero()
	})
	return wf
}

// settleNext runs the next task of queue by hand, successfully, with no
// server: its end is stored (its follow-up waits in the queue) but its
// workflow has not recorded it yet.
func (e *env) settleNext(queue, want string) {
	e.t.Helper()
	ctx := context.Background()
	d, err := e.b.Dequeue(ctx, []string{queue}, 1, time.Minute)
	if err != nil || len(d) != 1 || d[0].Task.ID != want {
		e.t.Fatalf("Dequeue: %v %v; want %s", d, err, want)
	}
	if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: d[0].Lease(), Kind: broker.SettleDone, Task: d[0].Task, At: time.Now()}}); err != nil || errs[0] != nil {
		e.t.Fatalf("Settle: %v %v", err, errs)
	}
}

// A step that succeeded before CancelWorkflow, whose end its workflow has
// not recorded yet (the follow-up still waits in its queue), is a step
// already finished: it keeps its outcome and its task (kept for
// WorkflowRetention), also when CancelWorkflow runs twice (a caller whose
// reply was lost).
func TestCancelWorkflowKeepsFinishedStep(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	wf := tide.NewWorkflow("fin-1").Add("a", tide.NewTask("a", nil)).Add("later", tide.NewTask("later", nil, tide.ProcessIn(time.Hour)))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	e.settleNext("default", "fin-1/a")
	for range 2 {
		if err := e.c.CancelWorkflow(ctx, "fin-1"); err != nil {
			t.Fatal(err)
		}
	}
	if ti, err := in.GetTaskInfo(ctx, "default", "fin-1/a"); err != nil || ti.State != tide.StateCompleted {
		t.Errorf("a's task after CancelWorkflow: %+v, %v; want it kept, completed", ti, err)
	}
	var ran ranLog
	e.server(tide.Config{}, ran.handler(nil))
	got := waitEnded(t, in, "fin-1")
	if st := stepStates(got); got.State != tide.FlowCanceled || st["a"] != "succeeded" || st["later"] != "cancelled" {
		t.Fatalf("workflow %s, steps %v; want cancelled, a succeeded (it did), later cancelled", got.State, st)
	}
}

// A batch task without Retention is deleted when it succeeds; its end
// still reaches the batch after a CancelWorkflow that found the task gone:
// it counts as succeeded.
func TestCancelBatchKeepsFinishedMember(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	b, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("now", nil), tide.NewTask("later", nil, tide.ProcessIn(time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	e.settleNext("default", b.ID+"/0")
	if err := e.c.CancelWorkflow(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	var ran ranLog
	e.server(tide.Config{}, ran.handler(nil))
	waitEnded(t, in, b.ID)
	got, err := in.GetBatch(ctx, b.ID)
	if err != nil || got.State != tide.FlowCanceled || got.Succeeded != 1 || got.Failed != 1 {
		t.Fatalf("batch %+v, %v; want cancelled with 1 succeeded (task 0 did) and 1 failed", got, err)
	}
}
