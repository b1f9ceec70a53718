package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/internal/testwait"
)

// flowServer runs a server on queues until the test ends. Its handler acts
// by task type: "evil" fails with evilErr, "fail" with a plain error,
// "block" reports its task ID on the returned channel and runs until it is
// cancelled, "result" writes a result; the others succeed.
func flowServer(t *testing.T, e *env, queues ...string) <-chan string {
	t.Helper()
	started := make(chan string, 64)
	qs := map[string]int{}
	for _, q := range queues {
		qs[q] = 1
	}
	srv := tide.NewServer(e.b, tide.Config{Queues: qs, Concurrency: 4, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		switch task.Type() {
		case "evil":
			return errors.New(evilErr)
		case "fail":
			return errors.New("bad row")
		case "block":
			id, _ := tide.GetTaskID(ctx)
			started <- id
			<-ctx.Done()
			return context.Cause(ctx)
		case "result":
			return tide.WriteResult(ctx, []byte(`{"url":"https://img.example/42.png"}`))
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return started
}

// recv returns the next task ID a "block" handler reports.
func recv(t *testing.T, started <-chan string) string {
	t.Helper()
	select {
	case id := <-started:
		return id
	case <-time.After(15 * time.Second):
		t.Fatal("timed out waiting for a blocking task to start")
		return ""
	}
}

// flowEnded waits until the workflow or batch id has ended.
func flowEnded(t *testing.T, e *env, id string) {
	t.Helper()
	testwait.For(t, 15*time.Second, "workflow or batch "+id+" to end", func() bool {
		if b, err := e.in.GetBatch(context.Background(), id); err == nil {
			return b.State != tide.FlowRunning
		}
		w, err := e.in.GetWorkflow(context.Background(), id)
		return err == nil && w.State != tide.FlowRunning
	})
}

// row returns the fields of the first line of out that starts with the
// cell first.
func row(t *testing.T, out, first string) []string {
	t.Helper()
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == first {
			return f
		}
	}
	t.Fatalf("no row %q in:\n%s", first, out)
	return nil
}

// stepRow returns the line of step in 'workflows show' output.
func stepRow(t *testing.T, out, step string) string {
	t.Helper()
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, step+" ") {
			return line
		}
	}
	t.Fatalf("no step %q in:\n%s", step, out)
	return ""
}

func TestWorkflowsAndBatches(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	flowServer(t, e, "flows")

	e.tide("workflows").want(t, exitOK, `No workflows under prefix "`+e.prefix+`". Workflows and batches are kept for 24h after they end.`)
	e.tide("batches", "ls").want(t, exitOK, "No batches under prefix")
	e.tide("workflows", "--json").want(t, exitOK, "[]")

	if _, err := e.c.EnqueueWorkflow(ctx, tide.NewWorkflow("wf-ok").
		Add("a", tide.NewTask("ok", nil)).
		Add("b", tide.NewTask("ok", nil), tide.After("a")), tide.Queue("flows")); err != nil {
		t.Fatal(err)
	}
	flowEnded(t, e, "wf-ok")
	// A step fails with a hostile error: the step after it is cancelled,
	// the clean-up step runs anyway.
	if _, err := e.c.EnqueueWorkflow(ctx, tide.NewWorkflow("wf-bad").
		Add("fetch", tide.NewTask("ok", nil)).
		Add("evil", tide.NewTask("evil", nil, tide.MaxRetry(0)), tide.After("fetch")).
		Add("report", tide.NewTask("ok", nil), tide.After("evil")).
		Add("cleanup", tide.NewTask("ok", nil), tide.After("evil"), tide.OnDependencyFailure(tide.RunDependents)),
		tide.Queue("flows")); err != nil {
		t.Fatal(err)
	}
	flowEnded(t, e, "wf-bad")

	// A batch with a callback, one of whose tasks fails and has an ID
	// with a right-to-left override and a C1 CSI.
	const evilID = "row-\u202eevil\u009b2J"
	b1, err := e.c.EnqueueBatch(ctx, []*tide.Task{
		tide.NewTask("ok", nil), tide.NewTask("ok", nil), tide.NewTask("ok", nil),
		tide.NewTask("fail", nil, tide.TaskID(evilID), tide.MaxRetry(0)),
	}, tide.Queue("flows"), tide.OnBatchDone(tide.NewTask("ok", nil)))
	if err != nil {
		t.Fatal(err)
	}
	flowEnded(t, e, b1.ID)
	// A batch of 25 failures, more than 'batches show' lists.
	var fails []*tide.Task
	for range 25 {
		fails = append(fails, tide.NewTask("fail", nil, tide.MaxRetry(0)))
	}
	b2, err := e.c.EnqueueBatch(ctx, fails, tide.Queue("flows"))
	if err != nil {
		t.Fatal(err)
	}
	flowEnded(t, e, b2.ID)

	// workflows ls: newest first, with the counts.
	r := e.tide("workflows")
	r.want(t, exitOK, "ID", "STATE", "STEPS DONE", "SUCCEEDED", "FAILED", "CANCELLED", "CREATED", "FINISHED")
	if f := row(t, r.stdout, "wf-bad"); strings.Join(f[1:6], " ") != "failed 4/4 2 1 1" || !strings.HasSuffix(f[len(f)-1], "ago") {
		t.Errorf("wf-bad row: %q", f)
	}
	if f := row(t, r.stdout, "wf-ok"); strings.Join(f[1:6], " ") != "succeeded 2/2 2 0 0" {
		t.Errorf("wf-ok row: %q", f)
	}
	if i, j := strings.Index(r.stdout, "wf-bad"), strings.Index(r.stdout, "wf-ok"); i > j {
		t.Errorf("not newest first:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, b1.ID) {
		t.Errorf("a batch listed as a workflow:\n%s", r.stdout)
	}
	r = e.tide("workflows", "ls", "--limit", "1")
	r.want(t, exitOK, "wf-bad", "Workflows 1 to 1 of 2. Next: tide workflows ls --offset 1 --limit 1")
	if strings.Contains(r.stdout, "wf-ok") {
		t.Errorf("--limit 1 lists two:\n%s", r.stdout)
	}
	r = e.tide("workflows", "list", "--offset", "1", "--limit", "1")
	r.want(t, exitOK, "wf-ok")
	if strings.Contains(r.stdout, "wf-bad") || strings.Contains(r.stdout, "Next:") {
		t.Errorf("--offset 1:\n%s", r.stdout)
	}
	e.tide("workflows", "--offset", "5").want(t, exitOK, "No workflows from offset 5: there are 2 workflows.")
	r = e.tide("workflows", "--json")
	var ws []workflowJSON
	if err := json.Unmarshal([]byte(r.stdout), &ws); err != nil || len(ws) != 2 {
		t.Fatalf("workflows --json: %v\n%s", err, r.stdout)
	}
	if w := ws[0]; w.ID != "wf-bad" || w.State != "failed" || w.Total != 4 || w.Done != 4 || w.Succeeded != 2 || w.Failed != 1 ||
		w.Cancelled != 1 || w.FinishedAt == nil || w.CreatedAt.IsZero() || w.Steps != nil {
		t.Errorf("workflows --json: %+v", w)
	}

	// workflows show: the header and the steps, the error escaped.
	r = e.tide("workflows", "show", "wf-bad")
	r.want(t, exitOK, "ID:", "wf-bad", "State:", "failed", "Steps:", "4 of 4 done: 2 succeeded, 1 failed, 1 cancelled",
		"Created:", "Finished:", "STEP", "STATE", "QUEUE", "TASK ID", "AFTER", "ERROR")
	if l := stepRow(t, r.stdout, "fetch"); !strings.Contains(l, "succeeded") || !strings.Contains(l, "wf-bad/fetch") || !strings.Contains(l, "flows") {
		t.Errorf("fetch: %q", l)
	}
	if l := stepRow(t, r.stdout, "evil"); !strings.Contains(l, "failed") || !strings.Contains(l, "wf-bad/evil") || !strings.Contains(l, " fetch ") ||
		!strings.HasSuffix(l, `boom\x1b[2J\x1b]0;pwned\x07 \u009b31m\u202egnp.exe …`) {
		t.Errorf("evil: %q", l)
	}
	if l := stepRow(t, r.stdout, "report"); !strings.Contains(l, "cancelled") {
		t.Errorf("report: %q", l)
	}
	if l := stepRow(t, r.stdout, "cleanup"); !strings.Contains(l, "succeeded") || !strings.Contains(l, "evil (even if they fail)") {
		t.Errorf("cleanup: %q", l)
	}
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("workflows show prints %s raw:\n%q", c, r.stdout)
	}
	r = e.tide("workflows", "get", "wf-bad", "--json")
	var w workflowJSON
	if err := json.Unmarshal([]byte(r.stdout), &w); err != nil || w.Steps == nil || len(*w.Steps) != 4 || w.FailedIDs == nil {
		t.Fatalf("workflows show --json: %v\n%s", err, r.stdout)
	}
	steps := *w.Steps
	if s := steps[1]; s.Name != "evil" || s.State != "failed" || s.TaskID != "wf-bad/evil" || s.Queue != "flows" ||
		len(s.After) != 1 || s.After[0] != "fetch" || !strings.Contains(s.Error, evilErr) {
		t.Errorf("evil step: %+v", s)
	}
	if s := steps[3]; s.Name != "cleanup" || !s.RunOnFailure || s.State != "succeeded" || s.Error != "" {
		t.Errorf("cleanup step: %+v", s)
	}
	if s := steps[0]; s.After == nil || len(s.After) != 0 {
		t.Errorf("fetch's after is not []: %+v", s)
	}
	if len(*w.FailedIDs) != 1 || (*w.FailedIDs)[0] != "wf-bad/evil" {
		t.Errorf("failed_ids: %q", *w.FailedIDs)
	}

	// batches ls and show.
	r = e.tide("batches")
	r.want(t, exitOK, "ID", "STATE", "TOTAL", "SUCCEEDED", "FAILED", "PENDING", "PROGRESS", "CALLBACK")
	if f := row(t, r.stdout, b1.ID); strings.Join(f[1:8], " ") != "failed 4 3 1 0 100% "+b1.CallbackID {
		t.Errorf("batch 1 row: %q", f)
	}
	if f := row(t, r.stdout, b2.ID); strings.Join(f[1:8], " ") != "failed 25 0 25 0 100% -" {
		t.Errorf("batch 2 row: %q", f)
	}
	r = e.tide("batches", "show", b1.ID)
	r.want(t, exitOK, "ID:", b1.ID, "Progress:    100% (4 of 4 tasks finished)", "Total:       4", "Succeeded:   3", "Failed:      1",
		"Pending:     0", "Callback:    "+b1.CallbackID, "Failed IDs:  "+`row-\u202eevil\u009b2J`)
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("batches show prints %s raw:\n%q", c, r.stdout)
	}
	r = e.tide("batches", "show", b2.ID)
	r.want(t, exitOK, "Callback:    -", "and 5 more (--json lists them all)")
	if n := strings.Count(r.stdout, b2.ID+"/"); n != 20 {
		t.Errorf("%d failed IDs shown, want 20:\n%s", n, r.stdout)
	}
	r = e.tide("batches", "show", b2.ID, "--json")
	var bj batchJSON
	if err := json.Unmarshal([]byte(r.stdout), &bj); err != nil || bj.FailedIDs == nil || len(*bj.FailedIDs) != 25 || bj.Total != 25 ||
		bj.Failed != 25 || bj.Pending != 0 || bj.ProgressPercent != 100 || bj.State != "failed" || bj.FinishedAt == nil {
		t.Errorf("batches show --json: %v\n%s", err, r.stdout)
	}
	r = e.tide("batches", "--json")
	var bs []batchJSON
	if err := json.Unmarshal([]byte(r.stdout), &bs); err != nil || len(bs) != 2 || bs[0].ID != b2.ID || bs[1].CallbackID != b1.CallbackID ||
		bs[1].Succeeded != 3 || bs[0].FailedIDs != nil {
		t.Errorf("batches --json: %v\n%s", err, r.stdout)
	}
	// --json is exact.
	r = e.tide("batches", "show", b1.ID, "--json")
	if err := json.Unmarshal([]byte(r.stdout), &bj); err != nil || bj.FailedIDs == nil || len(*bj.FailedIDs) != 1 || (*bj.FailedIDs)[0] != evilID {
		t.Errorf("batches show --json is not exact: %v\n%s", err, r.stdout)
	}

	// Unknown IDs, and IDs of the other kind: exit 3.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"workflows", "show", "nope"}, `tide: no workflow "nope" under prefix "` + e.prefix + `" (workflows are kept for 24h after they end; 'tide workflows' lists them)`},
		{[]string{"workflows", "cancel", "nope"}, `tide: no workflow "nope"`},
		{[]string{"batches", "show", "nope"}, `tide: no batch "nope" under prefix`},
		{[]string{"batches", "cancel", "nope"}, `tide: no batch "nope"`},
		{[]string{"workflows", "show", b1.ID}, `tide: no workflow "` + b1.ID + `": it is a batch (see 'tide batches show ` + b1.ID + `')`},
		{[]string{"batches", "show", "wf-ok"}, `tide: no batch "wf-ok": it is a workflow (see 'tide workflows show wf-ok')`},
	} {
		r := e.tide(c.args...)
		if r.code != exitNotFound || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("tide %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(c.args, " "), r.code, r.stdout, r.stderr)
		}
		r = e.tide(append(c.args, "--json")...)
		if msg, code := jsonError(t, r); code != exitNotFound || !strings.Contains("tide: "+msg, c.want) {
			t.Errorf("tide %s --json: %d %q", strings.Join(c.args, " "), code, msg)
		}
	}
	// Ended workflows are left as they are.
	r = e.tide("workflows", "cancel", "wf-ok")
	if r.code != exitError || !strings.Contains(r.stderr, `tide: workflow "wf-ok" had already ended (succeeded): nothing to cancel`) {
		t.Errorf("cancel of an ended workflow: exit %d\n%s", r.code, r.stderr)
	}
	if wf, err := e.in.GetWorkflow(ctx, "wf-ok"); err != nil || wf.State != tide.FlowSucceeded {
		t.Errorf("wf-ok after the refused cancel: %+v %v", wf, err)
	}
}

func TestFlowsCancel(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	started := flowServer(t, e, "flows")

	if _, err := e.c.EnqueueWorkflow(ctx, tide.NewWorkflow("wf-block").
		Add("slow", tide.NewTask("block", nil, tide.MaxRetry(0))).
		Add("next", tide.NewTask("ok", nil), tide.After("slow")), tide.Queue("flows")); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, started); id != "wf-block/slow" {
		t.Fatalf("started %q", id)
	}
	r := e.tide("workflows", "show", "wf-block")
	r.want(t, exitOK, "running", "0 of 2 done")
	if l := stepRow(t, r.stdout, "slow"); !strings.Contains(l, "enqueued (active)") {
		t.Errorf("slow: %q", l)
	}
	if l := stepRow(t, r.stdout, "next"); !strings.Contains(l, "waiting") || !strings.Contains(l, " slow ") {
		t.Errorf("next: %q", l)
	}
	r = e.tide("workflows", "show", "wf-block", "--json")
	var w workflowJSON
	if err := json.Unmarshal([]byte(r.stdout), &w); err != nil || w.Steps == nil || (*w.Steps)[0].TaskState != "active" ||
		(*w.Steps)[1].TaskState != "" || w.FinishedAt != nil {
		t.Fatalf("show --json: %v\n%s", err, r.stdout)
	}
	e.tide("workflows").want(t, exitOK, "wf-block", "running", "0/2")

	// A batch is not cancelled by 'workflows cancel', nor a workflow by
	// 'batches cancel'.
	b, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("ok", nil), tide.NewTask("ok", nil), tide.NewTask("block", nil, tide.MaxRetry(0))},
		tide.Queue("flows"), tide.OnBatchDone(tide.NewTask("ok", nil)))
	if err != nil {
		t.Fatal(err)
	}
	recv(t, started)
	testwait.For(t, 15*time.Second, "the batch's other tasks to succeed", func() bool {
		bi, err := e.in.GetBatch(ctx, b.ID)
		return err == nil && bi.Succeeded == 2
	})
	r = e.tide("batches", "show", b.ID)
	r.want(t, exitOK, "State:       running", "Progress:    66% (2 of 3 tasks finished)", "Pending:     1", "Finished:    -")
	if f := row(t, e.tide("batches").stdout, b.ID); strings.Join(f[1:7], " ") != "running 3 2 0 1 66%" {
		t.Errorf("running batch row: %q", f)
	}
	if r := e.tide("workflows", "cancel", b.ID); r.code != exitNotFound || !strings.Contains(r.stderr, "it is a batch (see 'tide batches cancel") {
		t.Errorf("workflows cancel of a batch: exit %d %s", r.code, r.stderr)
	}
	if r := e.tide("batches", "cancel", "wf-block"); r.code != exitNotFound || !strings.Contains(r.stderr, "it is a workflow (see 'tide workflows cancel") {
		t.Errorf("batches cancel of a workflow: exit %d %s", r.code, r.stderr)
	}
	if bi, err := e.in.GetBatch(ctx, b.ID); err != nil || bi.State != tide.FlowRunning {
		t.Fatalf("batch after the refusal: %+v %v", bi, err)
	}

	e.tide("workflows", "cancel", "wf-block").want(t, exitOK, "Workflow wf-block cancelled")
	wf, err := e.in.GetWorkflow(ctx, "wf-block")
	if err != nil || wf.State != tide.FlowCanceled {
		t.Fatalf("after cancel: %+v %v", wf, err)
	}
	// The running step's handler is cancelled: its task is archived.
	testwait.For(t, 15*time.Second, "the running step to stop", func() bool {
		ti, err := e.in.GetTaskInfo(ctx, "flows", "wf-block/slow")
		return err != nil || ti.State == tide.StateArchived
	})
	r = e.tide("workflows", "show", "wf-block")
	r.want(t, exitOK, "State:      cancelled")
	if l := stepRow(t, r.stdout, "next"); !strings.Contains(l, "cancelled") {
		t.Errorf("next after cancel: %q", l)
	}
	// Again: it stays cancelled.
	e.tide("workflows", "cancel", "wf-block", "--json").want(t, exitOK, `"state": "cancelled"`, `"kind": "workflow"`)

	r = e.tide("batches", "cancel", b.ID, "--json")
	r.want(t, exitOK)
	var res map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res["id"] != b.ID || res["state"] != "cancelled" || res["kind"] != "batch" {
		t.Errorf("batches cancel --json: %v %s", err, r.stdout)
	}
	if bi, err := e.in.GetBatch(ctx, b.ID); err != nil || bi.State != tide.FlowCanceled {
		t.Fatalf("batch after cancel: %+v %v", bi, err)
	}
	e.tide("batches", "show", b.ID).want(t, exitOK, "State:       cancelled")
}

func TestTasksWait(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	flowServer(t, e, "jobs")

	// Completed, with its result kept.
	e.enqueue("result", "{}", tide.Queue("jobs"), tide.TaskID("r1"), tide.Retention(time.Hour))
	r := e.tide("tasks", "wait", "jobs", "r1")
	r.want(t, exitOK, "ID:", "r1", "Queue:", "jobs", "State:         completed", "Completed at:", "Result:        36 bytes")
	if r.stderr != "" {
		t.Errorf("stderr: %s", r.stderr)
	}
	r = e.tide("tasks", "wait", "jobs", "r1", "--json")
	r.want(t, exitOK)
	var task gateway.Task
	var result bytes.Buffer
	if err := json.Unmarshal([]byte(r.stdout), &task); err == nil {
		_ = json.Compact(&result, task.Result)
	}
	if task.ID != "r1" || task.State != "completed" || task.CompletedAt == nil || result.String() != `{"url":"https://img.example/42.png"}` {
		t.Errorf("wait --json:\n%s", r.stdout)
	}
	// The same JSON as 'tasks show --json'.
	if show := e.tide("tasks", "show", "jobs", "r1", "--json"); show.stdout != r.stdout {
		t.Errorf("wait --json differs from show --json:\n%s\n%s", r.stdout, show.stdout)
	}

	// Archived: exit 4, the last error escaped.
	e.enqueue("evil", "{}", tide.Queue("jobs"), tide.TaskID("e1"), tide.MaxRetry(0))
	r = e.tide("tasks", "wait", "jobs", "e1")
	r.want(t, exitArchived, "State:         archived", "Failed at:", "Retried:       0 of 0",
		"Last error:\n  boom\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\u009b31m\\u202egnp.exe\n  second line\tindented\n")
	if !strings.Contains(r.stderr, `tide: task "e1" in queue "jobs" failed: it was archived`) {
		t.Errorf("stderr: %s", r.stderr)
	}
	if c := rawControls(r.stdout + r.stderr); c != "" {
		t.Errorf("tasks wait prints %s raw:\n%q", c, r.stdout)
	}
	r = e.tide("tasks", "wait", "jobs", "e1", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &task); err != nil || task.State != "archived" || task.LastError != evilErr {
		t.Errorf("wait --json of an archived task is not exact: %v\n%s", err, r.stdout)
	}
	if msg, code := jsonError(t, r); code != exitArchived || !strings.Contains(msg, "it was archived") {
		t.Errorf("archived --json: %d %q", code, msg)
	}

	// Timeout: exit 5, with the task's state.
	e.enqueue("ok", "{}", tide.Queue("jobs"), tide.TaskID("later"), tide.ProcessIn(time.Hour))
	r = e.tide("tasks", "wait", "jobs", "later", "--timeout", "20ms")
	if r.code != exitTimeout || r.stdout != "" || !strings.Contains(r.stderr, `tide: task "later" in queue "jobs" did not finish within 20ms (it is scheduled)`) {
		t.Errorf("timeout: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	r = e.tide("tasks", "wait", "jobs", "later", "--timeout=20ms", "--json")
	if msg, code := jsonError(t, r); code != exitTimeout || !strings.Contains(msg, "did not finish within 20ms") || r.stdout != "" {
		t.Errorf("timeout --json: %d %q %s", code, msg, r.stdout)
	}
	// Interrupted (Ctrl-C): exit 1. The context ends during the wait or,
	// on a slow machine, before it: either way the command fails.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, cancel)
	r = e.tideCtx(cctx, "tasks", "wait", "jobs", "later", "--timeout", "1h")
	cancel()
	if r.code != exitError || !strings.Contains(r.stderr, `tide: interrupted while waiting for task "later" in queue "jobs"`) &&
		!strings.Contains(r.stderr, "cannot reach Redis") {
		t.Errorf("interrupted: exit %d\n%s", r.code, r.stderr)
	}
	if ti, err := e.in.GetTaskInfo(ctx, "jobs", "later"); err != nil || ti.State != tide.StateScheduled {
		t.Errorf("the task waited for changed: %+v %v", ti, err)
	}

	// No such task: exit 3.
	r = e.tide("tasks", "wait", "jobs", "nope")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `tide: no task "nope" in queue "jobs" to wait for`) {
		t.Errorf("wait for a missing task: exit %d %s", r.code, r.stderr)
	}
}

// A task deleted when it succeeded is reported by Wait with its ID, queue,
// state and time only.
func TestPrintWaitedWithoutRecord(t *testing.T) {
	var out bytes.Buffer
	a := &app{stdout: &out}
	now := time.Now()
	printWaited(a, &tide.TaskInfo{ID: "x\u202e", Queue: "q", State: tide.StateCompleted, CompletedAt: now.Add(-time.Second)}, now)
	for _, want := range []string{`ID:            x\u202e`, "State:         completed", "Completed at: ", "1s ago", "Result:        - (the task was not kept once it succeeded"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "Type:") {
		t.Errorf("an empty type is shown:\n%s", out.String())
	}
}

func TestFlowsUsageErrors(t *testing.T) {
	dead := closedPort(t)
	singleDash := singleDashFlag()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"workflows", "ls", "--limit", "0"}, "--limit 0: must be between 1 and 1000"},
		{[]string{"workflows", "--limit", "1001"}, "--limit 1001: must be between 1 and 1000"},
		{[]string{"batches", "--offset", "-1"}, "--offset -1: must be 0 or more"},
		{[]string{"workflows", "ls", "--limit", "many"}, `--limit "many": parse error`},
		{[]string{"workflows", "ls", "--bogus"}, "unknown flag --bogus"},
		{[]string{"workflows", "ls", "extra"}, "usage: tide workflows ls [--offset N] [--limit N]"},
		{[]string{"workflows", "show"}, "usage: tide workflows show <id>"},
		{[]string{"workflows", "show", "a", "b"}, "usage: tide workflows show <id>"},
		{[]string{"workflows", "show", "bad id"}, `workflow ID "bad id" has invalid character ' ' at byte 3 (allowed: letters, digits, . _ - :)`},
		{[]string{"workflows", "cancel", strings.Repeat("x", 129)}, "want 1 to 128 bytes"},
		{[]string{"batches", "show", "b/1"}, `batch ID "b/1" has invalid character '/'`},
		{[]string{"batches", "cancel"}, "usage: tide batches cancel <id>"},
		{[]string{"workflows", "frob", "x"}, "usage: tide workflows ls"},
		{[]string{"tasks", "wait", "q"}, "usage: tide tasks wait <queue> <id> [--timeout 30s]"},
		{[]string{"tasks", "wait", "bad queue", "x"}, `queue name "bad queue" has invalid character`},
		{[]string{"tasks", "wait", "q", "x", "--timeout", "0s"}, `--timeout "0s": duration "0s" must be positive`},
		{[]string{"tasks", "wait", "q", "x", "--timeout", "soon"}, `--timeout "soon": invalid duration "soon"`},
		{[]string{"tasks", "wait", "q", "x", "--timeout"}, "--timeout needs a value"},
	} {
		r := noEnv(append([]string{"--redis", dead}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "--help' for usage") {
			t.Errorf("tide %s: exit %d, want 2 and %q:\n%s", strings.Join(c.args, " "), r.code, c.want, r.stderr)
		}
		if m := singleDash.FindString(r.stderr); m != "" {
			t.Errorf("tide %s: stderr names a flag with one dash (%q):\n%s", strings.Join(c.args, " "), m, r.stderr)
		}
		r = noEnv(append([]string{"--redis", dead, "--json"}, c.args...)...)
		if _, code := jsonError(t, r); code != exitUsage {
			t.Errorf("tide --json %s: code %d", strings.Join(c.args, " "), code)
		}
	}
	// An invalid task ID is found by the library, after connecting.
	e := setup(t)
	if r := e.tide("tasks", "wait", "q", "a\x01b"); r.code != exitUsage || !strings.Contains(r.stderr, `has a control character`) {
		t.Errorf("wait with a control character in the ID: exit %d %s", r.code, r.stderr)
	}
}

func TestFlowsHelp(t *testing.T) {
	// The codes the help documents.
	if exitArchived != 4 || exitTimeout != 5 {
		t.Errorf("exit codes %d and %d, documented as 4 and 5", exitArchived, exitTimeout)
	}
	r := noEnv("--help")
	r.want(t, exitOK, "  workflows  inspect and cancel workflows, DAGs of tasks (ls, show, cancel)",
		"  batches    inspect and cancel batches of tasks (ls, show, cancel)", "cancel, wait)",
		"3  the task, queue, workflow or batch was not found", "4  tasks wait: the task failed (it was archived)",
		"5  tasks wait: --timeout passed before the task finished", "tide workflows show fulfil-order-42")
	noEnv("workflows", "--help").want(t, exitOK, "Subcommands:", "ls ", "show ", "cancel ")
	noEnv("help", "batches").want(t, exitOK, "Subcommands:", "ls ", "show ", "cancel ")
	noEnv("workflows", "ls", "--help").want(t, exitOK, "--offset N", "--limit N", "(default 20)", "kept for 24h")
	noEnv("tasks", "wait", "-h").want(t, exitOK, "--timeout 2m", "(default 30s)", "4  the task failed", "5  --timeout passed first")
	noEnv("help", "batches", "show").want(t, exitOK, "the\nfirst 20; --json has them all")
	noEnv("help", "workflows", "get").want(t, exitOK, "Usage: tide workflows show <id>")
	// Help lines stay within 80 columns.
	for _, c := range commands {
		r := noEnv(append(strings.Fields(c.name), "--help")...)
		for line := range strings.SplitSeq(r.stdout, "\n") {
			if strings.HasPrefix(line, "  --") || strings.HasPrefix(line, "Global flags") || strings.HasPrefix(line, "Usage:") ||
				strings.HasPrefix(line, "  tide ") || strings.HasPrefix(line, "  TIDE_") {
				continue
			}
			if n := len([]rune(line)); n > 80 && (strings.HasPrefix(c.name, "workflows") || strings.HasPrefix(c.name, "batches") || c.name == "tasks wait") {
				t.Errorf("tide %s --help: line of %d characters: %q", c.name, n, line)
			}
		}
	}
}
