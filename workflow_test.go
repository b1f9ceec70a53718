package tide_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// runLog records the starts and ends of steps in the order they happened.
type runLog struct {
	mu     sync.Mutex
	events []string
}

func (l *runLog) add(ev string) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
}

func (l *runLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// checkOrder fails unless every step in deps ("b": {"a"}) started only
// after each of its dependencies had ended once.
func checkOrder(t *testing.T, events []string, deps map[string][]string) {
	t.Helper()
	ended := map[string]bool{}
	for _, ev := range events {
		kind, step, _ := strings.Cut(ev, ":")
		switch kind {
		case "end":
			ended[step] = true
		case "start":
			for _, d := range deps[step] {
				if !ended[d] {
					t.Errorf("step %s started before its dependency %s ended: %v", step, d, events)
				}
			}
		}
	}
}

// waitFlow waits until the workflow has ended and returns it.
func waitFlow(t *testing.T, in *tide.Inspector, id string) *tide.WorkflowInfo {
	t.Helper()
	var wf *tide.WorkflowInfo
	testwait.For(t, 30*time.Second, "workflow "+id+" to end", func() bool {
		var err error
		wf, err = in.GetWorkflow(context.Background(), id)
		return err == nil && wf.State != tide.FlowRunning
	})
	return wf
}

func stepStates(wf *tide.WorkflowInfo) map[string]string {
	out := map[string]string{}
	for _, s := range wf.Steps {
		out[s.Name] = s.State.String()
	}
	return out
}

// A diamond: a, then b and c (in other queues), then d; each step reads
// its dependencies' results, and no step starts before its dependencies.
func TestWorkflowDiamond(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var log runLog
	e.server(tide.Config{Concurrency: 4, Queues: map[string]int{"default": 1, "left": 1, "right": 1}}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		step, _ := tide.GetStepName(ctx)
		log.add("start:" + step)
		defer log.add("end:" + step)
		out := step
		for _, dep := range strings.Split(string(task.Payload()), ",") {
			if dep == "" {
				continue
			}
			r, err := tide.StepResult(ctx, dep)
			if err != nil {
				return err
			}
			out += "(" + string(r) + ")"
		}
		return tide.WriteResult(ctx, []byte(out))
	}))
	wf := tide.NewWorkflow("diamond-1").
		Add("a", tide.NewTask("step", nil)).
		Add("b", tide.NewTask("step", []byte("a"), tide.Queue("left")), tide.After("a")).
		Add("c", tide.NewTask("step", []byte("a"), tide.Queue("right")), tide.After("a")).
		Add("d", tide.NewTask("step", []byte("b,c")), tide.After("b", "c"))
	info, err := e.c.EnqueueWorkflow(ctx, wf)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != "diamond-1" || info.Total != 4 || info.Steps[0].State != tide.StepEnqueued || info.Steps[3].State != tide.StepWaiting {
		t.Fatalf("EnqueueWorkflow: %+v", info)
	}
	in := tide.NewInspector(e.b)
	got := waitFlow(t, in, "diamond-1")
	if got.State != tide.FlowSucceeded || got.Succeeded != 4 || got.FinishedAt.IsZero() {
		t.Fatalf("workflow: %+v", got)
	}
	d := e.info("default", "diamond-1/d")
	if string(d.Result) != "d(b(a))(c(a))" {
		t.Errorf("d's result = %q, want d(b(a))(c(a))", d.Result)
	}
	if q := e.info("left", "diamond-1/b").Queue; q != "left" {
		t.Errorf("b ran in %q", q)
	}
	checkOrder(t, log.list(), map[string][]string{"b": {"a"}, "c": {"a"}, "d": {"b", "c"}})
	if n := len(log.list()); n != 8 {
		t.Errorf("%d starts and ends, want 8: %v", n, log.list())
	}
}

// A step that fails for good cancels the steps that depend on it (and
// theirs), while a step that runs on failure runs and sees the failure
// through StepResult.
func TestWorkflowFailurePolicies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	var log runLog
	var cleanupSaw error
	e.server(tide.Config{Concurrency: 4}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		step, _ := tide.GetStepName(ctx)
		log.add("start:" + step)
		defer log.add("end:" + step)
		switch step {
		case "charge":
			return fmt.Errorf("card declined: %w", tide.SkipRetry)
		case "cleanup":
			_, cleanupSaw = tide.StepResult(ctx, "charge")
		}
		return nil
	}))
	wf := tide.NewWorkflow("fail-1").
		Add("charge", tide.NewTask("step", nil)).
		Add("reserve", tide.NewTask("step", nil)).
		Add("ship", tide.NewTask("step", nil), tide.After("charge", "reserve")).
		Add("notify", tide.NewTask("step", nil), tide.After("ship")).
		Add("cleanup", tide.NewTask("step", nil), tide.After("charge", "ship"), tide.OnDependencyFailure(tide.RunDependents))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	got := waitFlow(t, tide.NewInspector(e.b), "fail-1")
	want := map[string]string{"charge": "failed", "reserve": "succeeded", "ship": "cancelled", "notify": "cancelled", "cleanup": "succeeded"}
	if s := stepStates(got); fmt.Sprint(s) != fmt.Sprint(want) {
		t.Errorf("steps = %v, want %v", s, want)
	}
	if got.State != tide.FlowFailed || got.Failed != 1 || got.Canceled != 2 || got.Succeeded != 2 || !slices.Equal(got.FailedIDs, []string{"fail-1/charge"}) {
		t.Errorf("workflow: %+v", got)
	}
	if !errors.Is(cleanupSaw, tide.ErrStepFailed) || !strings.Contains(cleanupSaw.Error(), "card declined") {
		t.Errorf("cleanup's StepResult(charge) error = %v", cleanupSaw)
	}
	for _, ev := range log.list() {
		if strings.HasSuffix(ev, ":ship") || strings.HasSuffix(ev, ":notify") {
			t.Errorf("a cancelled step ran: %v", log.list())
		}
	}
	for _, s := range got.Steps {
		if s.Name == "ship" && !strings.Contains(s.Err, "charge") {
			t.Errorf("ship's reason = %q, want it to name charge", s.Err)
		}
	}
}

// CancelWorkflow cancels the running step's task and the waiting steps;
// the workflow ends cancelled.
func TestCancelWorkflow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	started := make(chan struct{}, 1)
	e.server(tide.Config{Concurrency: 2}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if task.Type() == "slow" {
			started <- struct{}{}
			<-ctx.Done()
			return context.Cause(ctx)
		}
		return nil
	}))
	wf := tide.NewWorkflow("cancel-1").
		Add("slow", tide.NewTask("slow", nil)).
		Add("next", tide.NewTask("step", nil), tide.After("slow"))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := e.c.CancelWorkflow(ctx, "cancel-1"); err != nil {
		t.Fatal(err)
	}
	got := waitFlow(t, tide.NewInspector(e.b), "cancel-1")
	if got.State != tide.FlowCanceled {
		t.Fatalf("state = %v", got.State)
	}
	testwait.For(t, 10*time.Second, "the slow step to end cancelled", func() bool {
		wf, err := tide.NewInspector(e.b).GetWorkflow(ctx, "cancel-1")
		return err == nil && !wf.FinishedAt.IsZero() && wf.Canceled == 2
	})
	if err := e.c.CancelWorkflow(ctx, "nope"); !errors.Is(err, tide.ErrWorkflowNotFound) {
		t.Errorf("CancelWorkflow(unknown) = %v", err)
	}
}

// EnqueueWorkflow is idempotent by ID: the same steps again store nothing
// more; other steps under the ID are refused; invalid workflows store
// nothing and say why.
func TestEnqueueWorkflowIdempotentAndValidated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	build := func(payload string) *tide.Workflow {
		return tide.NewWorkflow("idem-1").
			Add("a", tide.NewTask("step", []byte(payload))).
			Add("b", tide.NewTask("step", nil), tide.After("a"))
	}
	if _, err := e.c.EnqueueWorkflow(ctx, build("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.EnqueueWorkflow(ctx, build("x")); err != nil {
		t.Fatalf("same workflow again: %v", err)
	}
	if _, err := e.c.EnqueueWorkflow(ctx, build("y")); !errors.Is(err, tide.ErrWorkflowExists) {
		t.Fatalf("other steps under the same ID: %v", err)
	}
	qi, err := tide.NewInspector(e.b).QueueInfo(ctx, "default")
	if err != nil || qi.Pending != 1 {
		t.Fatalf("pending = %d (%v), want the one root step", qi.Pending, err)
	}
	for name, wf := range map[string]*tide.Workflow{
		"no steps":      tide.NewWorkflow("bad-1"),
		"unknown after": tide.NewWorkflow("bad-2").Add("a", tide.NewTask("t", nil), tide.After("zz")),
		"cycle": tide.NewWorkflow("bad-3").Add("a", tide.NewTask("t", nil), tide.After("b")).
			Add("b", tide.NewTask("t", nil), tide.After("a")).Add("c", tide.NewTask("t", nil)),
		"self":         tide.NewWorkflow("bad-4").Add("a", tide.NewTask("t", nil), tide.After("a")),
		"twice":        tide.NewWorkflow("bad-5").Add("a", tide.NewTask("t", nil)).Add("a", tide.NewTask("t", nil)),
		"bad name":     tide.NewWorkflow("bad-6").Add("a b", tide.NewTask("t", nil)),
		"bad id":       tide.NewWorkflow("bad{7}").Add("a", tide.NewTask("t", nil)),
		"task id":      tide.NewWorkflow("bad-8").Add("a", tide.NewTask("t", nil, tide.TaskID("x"))),
		"delayed dep":  tide.NewWorkflow("bad-9").Add("a", tide.NewTask("t", nil)).Add("b", tide.NewTask("t", nil, tide.ProcessIn(time.Hour)), tide.After("a")),
		"nil task":     tide.NewWorkflow("bad-10").Add("a", nil),
		"empty type":   tide.NewWorkflow("bad-11").Add("a", tide.NewTask("", nil)),
		"nil option":   tide.NewWorkflow("bad-12").Add("a", tide.NewTask("t", nil), nil),
		"own header":   tide.NewWorkflow("bad-13").Add("a", headerTask("tide-flow", "w:x")),
		"replace step": tide.NewWorkflow("bad-14").Add("a", tide.NewTask("t", nil, tide.Replace())),
	} {
		if _, err := e.c.EnqueueWorkflow(ctx, wf); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("%s: err = %v, want ErrInvalidTask", name, err)
		}
	}
	if _, err := tide.NewInspector(e.b).GetWorkflow(ctx, "bad-3"); !errors.Is(err, tide.ErrWorkflowNotFound) {
		t.Errorf("an invalid workflow was stored: %v", err)
	}
	if _, err := tide.StepResult(ctx, "a"); !errors.Is(err, tide.ErrNotInWorkflow) {
		t.Errorf("StepResult outside a handler = %v", err)
	}
}

func headerTask(k, v string) *tide.Task {
	t := tide.NewTask("t", nil)
	t.Headers()[k] = v
	return t
}

// Deleting a waiting step fails it instead: its workflow learns, cancels
// the steps after it and ends. CancelWorkflow ends a workflow whose
// running step's task is gone.
func TestDeleteWorkflowStep(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error { return nil }))
	wf := tide.NewWorkflow("del-1").
		Add("later", tide.NewTask("step", nil, tide.ProcessIn(time.Hour))).
		Add("after", tide.NewTask("step", nil), tide.After("later"))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(ctx, "default", "del-1/later"); err != nil {
		t.Fatal(err)
	}
	got := waitFlow(t, tide.NewInspector(e.b), "del-1")
	if s := stepStates(got); got.State != tide.FlowFailed || s["later"] != "failed" || s["after"] != "cancelled" {
		t.Fatalf("workflow after deleting a step: %v %v", got.State, s)
	}
	if ti := e.info("default", "del-1/later"); ti.State != tide.StateArchived || !strings.Contains(ti.LastErr, "deleted by an operator") {
		t.Fatalf("deleted step's task: %v %q", ti.State, ti.LastErr)
	}

	// A step whose task vanished (removed behind tide's back) is ended by
	// CancelWorkflow.
	wf = tide.NewWorkflow("gone-1").Add("a", tide.NewTask("step", nil, tide.ProcessIn(time.Hour)))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	keys, err := e.rdb.Keys(ctx, e.prefix+":{default:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		e.rdb.HDel(ctx, k, "gone-1/a")
		e.rdb.ZRem(ctx, k, "gone-1/a")
	}
	if err := e.c.CancelWorkflow(ctx, "gone-1"); err != nil {
		t.Fatal(err)
	}
	g, err := tide.NewInspector(e.b).GetWorkflow(ctx, "gone-1")
	if err != nil || g.State != tide.FlowCanceled || g.FinishedAt.IsZero() {
		t.Fatalf("after CancelWorkflow: %+v, %v", g, err)
	}
}
