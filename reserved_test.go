package tide_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
)

// Every public entry point refuses what tide keeps for itself: its own task
// types, the headers of workflow steps, the NotifyURL header set by hand
// and task IDs with the reserved prefix.
func TestReservedRefusedAtEveryEntryPoint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	forged := []struct {
		name string
		task func() *tide.Task
		opts []tide.Option
	}{
		{"flow type", func() *tide.Task { return tide.NewTask(tide.FlowType, []byte(`{"flow":"w:order-42","step":"charge"}`)) }, nil},
		{"notify type", func() *tide.Task { return tide.NewTask(tide.NotifyType, []byte(`{"url":"http://127.0.0.1/"}`)) }, nil},
		{"flow header", func() *tide.Task {
			t := tide.NewTask("ok", nil)
			t.Headers()["tide-flow"] = "w:order-42"
			return t
		}, nil},
		{"step header, other case", func() *tide.Task {
			t := tide.NewTask("ok", nil)
			t.Headers()["Tide-Step"] = "charge"
			return t
		}, nil},
		{"notify header", func() *tide.Task {
			t := tide.NewTask("tide:webhook", nil)
			t.Headers()["tide-notify-url"] = "http://127.0.0.1:1/"
			return t
		}, nil},
		{"reserved ID", func() *tide.Task { return tide.NewTask("ok", nil) }, []tide.Option{tide.TaskID("tide:n7{order-42/charge}")}},
	}
	for _, f := range forged {
		t.Run(f.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, tide.ErrInvalidTask) {
					t.Errorf("%s: %v, want ErrInvalidTask", what, err)
				}
			}
			_, err := e.c.Enqueue(ctx, f.task(), f.opts...)
			check("Enqueue", err)
			_, err = e.c.EnqueueMany(ctx, []*tide.Task{tide.NewTask("fine", nil), f.task()}, f.opts...)
			check("EnqueueMany", err)
			_, err = tide.Prepare(f.task(), f.opts...)
			check("Prepare", err)
			_, err = e.c.EnqueueWorkflow(ctx, tide.NewWorkflow("wf-"+strings.ReplaceAll(f.name, " ", "-")).Add("s", f.task()), f.opts...)
			check("EnqueueWorkflow", err)
			_, err = e.c.EnqueueBatch(ctx, []*tide.Task{f.task()}, f.opts...)
			check("EnqueueBatch", err)
			_, err = e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("fine", nil)}, tide.OnBatchDone(f.task()))
			if len(f.opts) == 0 { // TaskID is refused on a callback anyway
				check("OnBatchDone", err)
			}
			sch := tide.NewScheduler(e.b, nil)
			_, err = sch.Register("@every 1m", f.task(), f.opts...)
			check("Scheduler.Register", err)
		})
	}
	// EnqueuePrepared checks what it is given as untrusted input (an
	// outbox row, another process).
	good, err := tide.Prepare(tide.NewTask("ok", nil), tide.NotifyURL("https://hooks.example.com/done"))
	if err != nil {
		t.Fatal(err)
	}
	prepared := []struct {
		name   string
		change func(*tide.TaskInfo)
	}{
		{"flow type", func(i *tide.TaskInfo) { i.Type = tide.FlowType }},
		{"notify type", func(i *tide.TaskInfo) { i.Type = tide.NotifyType }},
		{"flow header", func(i *tide.TaskInfo) { i.Headers["tide-flow"] = "w:order-42" }},
		{"step header", func(i *tide.TaskInfo) { i.Headers["tide-step"] = "charge" }},
		{"notify header, other case", func(i *tide.TaskInfo) { i.Headers["Tide-Notify-Url"] = "https://hooks.example.com/x" }},
		{"notify header, not a URL", func(i *tide.TaskInfo) { i.Headers["tide-notify-url"] = "gopher://x" }},
		{"reserved ID", func(i *tide.TaskInfo) { i.ID = "tide:n1{x}" }},
	}
	for _, p := range prepared {
		info := *good
		info.Headers = map[string]string{"tide-notify-url": good.Headers["tide-notify-url"]}
		p.change(&info)
		if _, err := e.c.EnqueuePrepared(ctx, &info); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("EnqueuePrepared with %s: %v, want ErrInvalidTask", p.name, err)
		}
	}
	// What Prepare made with NotifyURL goes through.
	if _, err := e.c.EnqueuePrepared(ctx, good); err != nil {
		t.Fatalf("EnqueuePrepared of a task prepared with NotifyURL: %v", err)
	}
}

// A tide:flow task that names a workflow step as done, written to the store
// without going through any entry point (the way a task enqueued before the
// refusal, or by a process with raw store access, would be there), is never
// run: the step it names keeps waiting for its own task, and the steps
// after it are not released.
func TestForgedInternalTasksAreNotRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan string, 10)
	e.server(tide.Config{Concurrency: 4, Queues: map[string]int{"public": 1, "payments": 1}}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		step, _ := tide.GetStepName(ctx)
		started <- step
		if step == "charge" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
	wf := tide.NewWorkflow("order-42").
		Add("charge", tide.NewTask("pay", nil, tide.Queue("payments"))).
		Add("ship", tide.NewTask("ship", nil, tide.Queue("payments")), tide.After("charge"))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if s := <-started; s != "charge" {
		t.Fatalf("started %q first, want charge", s)
	}
	now := time.Now()
	flowForged := &tide.TaskInfo{ID: "forged-flow", Queue: "public", Type: tide.FlowType, State: tide.StatePending, NextProcessAt: now, EnqueuedAt: now,
		Payload: []byte(`{"flow":"w:order-42","step":"charge","queue":"payments","task_id":"order-42/charge","outcome":"completed"}`)}
	notifyForged := &tide.TaskInfo{ID: "forged-notify", Queue: "public", Type: tide.NotifyType, State: tide.StatePending, NextProcessAt: now, EnqueuedAt: now,
		Payload: []byte(`{"url":"https://hooks.example.com/","body":{"task_id":"x","state":"completed"}}`)}
	errs, err := e.b.Enqueue(ctx, []*tide.TaskInfo{flowForged, notifyForged}, broker.EnqueueOptions{})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("writing the forged tasks: %v %v", err, errs)
	}
	for _, id := range []string{"forged-flow", "forged-notify"} {
		ti := e.waitState("public", id, tide.StateArchived)
		if !strings.Contains(ti.LastErr, "that tide did not store itself is never run") {
			t.Errorf("%s archived with %q", id, ti.LastErr)
		}
	}
	in := tide.NewInspector(e.b)
	wi, err := in.GetWorkflow(ctx, "order-42")
	if err != nil {
		t.Fatal(err)
	}
	if st := stepStates(wi); st["charge"] != "enqueued" || st["ship"] != "waiting" {
		t.Fatalf("after the forged follow-up: %v, want charge enqueued and ship waiting", st)
	}
	close(release)
	if got := waitFlow(t, in, "order-42"); got.State != tide.FlowSucceeded {
		t.Fatalf("workflow %+v", got)
	}
	if s := <-started; s != "ship" {
		t.Fatalf("then started %q, want ship", s)
	}
}

// A task that holds a step's ID before the step is released is not taken
// for the step: the step fails with a reason that says so (the workflow
// ends instead of waiting for a task that never reports), Replace cannot
// take a waiting step's place, and the IDs of two workflows never meet.
func TestStepIDsCannotBeSquatted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.server(tide.Config{Concurrency: 4}, tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
	// The squatter's task waits far in the future, holding the ID.
	if _, err := e.c.Enqueue(ctx, tide.NewTask("mine", []byte("not the step's")), tide.TaskID("order-43/ship"), tide.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	wf := tide.NewWorkflow("order-43").
		Add("charge", tide.NewTask("pay", nil)).
		Add("ship", tide.NewTask("ship", nil), tide.After("charge"))
	if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	in := tide.NewInspector(e.b)
	got := waitFlow(t, in, "order-43")
	var ship tide.StepInfo
	for _, s := range got.Steps {
		if s.Name == "ship" {
			ship = s
		}
	}
	if got.State != tide.FlowFailed || ship.State != tide.StepFailed || !strings.Contains(ship.Err, "held by a task that is not this step's") {
		t.Fatalf("workflow %s, ship %+v; want failed, ship failed because its ID is held", got.State, ship)
	}
	if ti := e.info("default", "order-43/ship"); string(ti.Payload) != "not the step's" || ti.State != tide.StateScheduled {
		t.Fatalf("the squatter's task changed: %+v", ti)
	}

	// Replace does not take a waiting step's place.
	block := tide.NewWorkflow("order-44").
		Add("a", tide.NewTask("a", nil, tide.ProcessIn(time.Hour)))
	if _, err := e.c.EnqueueWorkflow(ctx, block); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("mine", nil), tide.TaskID("order-44/a"), tide.Replace()); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("Replace over a waiting step: %v, want ErrTaskIDConflict", err)
	}

	// "shop" with step "order.ship" and "shop.order" with step "ship".
	one := tide.NewWorkflow("shop").Add("order.ship", tide.NewTask("s", nil))
	two := tide.NewWorkflow("shop.order").Add("first", tide.NewTask("s", nil)).Add("ship", tide.NewTask("s", nil), tide.After("first"))
	for _, w := range []*tide.Workflow{one, two} {
		if _, err := e.c.EnqueueWorkflow(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"shop", "shop.order"} {
		if got := waitFlow(t, in, id); got.State != tide.FlowSucceeded {
			t.Fatalf("workflow %s: %+v", id, got)
		}
	}
}
