package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/internal/testwait"
)

// serve runs a tide server on the env's broker that succeeds every task
// but those of type "fail".
func (e *env) serve() {
	e.t.Helper()
	s := tide.NewServer(e.b, tide.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := s.Start(tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		if t.Type() == "fail" {
			return fmt.Errorf("no: %w", tide.SkipRetry)
		}
		return nil
	})); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(s.Shutdown)
}

// A workflow enqueued over HTTP runs, and GET shows its steps; the same
// request again is accepted, other steps under the ID are a conflict.
func TestWorkflowEndpoints(t *testing.T) {
	t.Parallel()
	e := setup(t, gateway.Config{})
	e.serve()
	body := `{"id": "order-42", "steps": [
		{"name": "charge", "task": {"type": "pay", "payload": {"order": 42}}},
		{"name": "reserve", "task": {"type": "fail"}},
		{"name": "ship", "task": {"type": "ship"}, "after": ["charge", "reserve"]},
		{"name": "report", "task": {"type": "report"}, "after": ["ship"], "on_dependency_failure": "run"}]}`
	r := e.do("POST", "/v1/workflows", body)
	if r.status != 201 || r.header.Get("Location") != "/v1/workflows/order-42" {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	var wf gateway.Workflow
	if err := json.Unmarshal(r.body, &wf); err != nil || wf.ID != "order-42" || len(wf.Steps) != 4 || wf.Steps[2].State != "waiting" {
		t.Fatalf("POST answer: %s (%v)", r.body, err)
	}
	testwait.For(e.t, 20*time.Second, "the workflow to end", func() bool {
		r = e.do("GET", "/v1/workflows/order-42", "")
		wf = gateway.Workflow{}
		return r.status == 200 && json.Unmarshal(r.body, &wf) == nil && wf.State != "running"
	})
	states := map[string]string{}
	for _, s := range wf.Steps {
		states[s.Name] = s.State
	}
	if wf.State != "failed" || states["charge"] != "succeeded" || states["reserve"] != "failed" || states["ship"] != "cancelled" || states["report"] != "succeeded" {
		t.Fatalf("workflow: %s", r.body)
	}
	if r := e.do("POST", "/v1/workflows", body); r.status != 201 {
		t.Errorf("the same workflow again: %d %s", r.status, r.body)
	}
	other := `{"id": "order-42", "steps": [{"name": "x", "task": {"type": "t"}}]}`
	if r := e.do("POST", "/v1/workflows", other); r.status != 409 {
		t.Errorf("other steps under the ID: %d %s", r.status, r.body)
	} else if code, _, _ := r.errorBody(t); code != "workflow_exists" {
		t.Errorf("code %q", code)
	}
	if r := e.do("GET", "/v1/workflows/nope", ""); r.status != 404 {
		t.Errorf("unknown workflow: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/v1/workflows/order-42", ""); r.status != 405 {
		t.Errorf("DELETE: %d", r.status)
	}
}

// Bad workflow and batch requests are refused with the field at fault, and
// store nothing.
func TestFlowRequestErrors(t *testing.T) {
	t.Parallel()
	e := setup(t, gateway.Config{AllowedQueues: []string{"default"}})
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/workflows", `{"steps": [{"name": "a", "task": {"type": "t"}}]}`, "id"},
		{"/v1/workflows", `{"id": "w", "steps": [{"name": "a", "task": {"type": "t", "delay": "soon"}}]}`, "steps[0].task.delay"},
		{"/v1/workflows", `{"id": "w", "steps": [{"name": "a"}]}`, "steps[0].task"},
		{"/v1/workflows", `{"id": "w", "steps": [{"name": "a", "task": {"type": "t", "queue": "secret"}}]}`, "steps[0].task.queue"},
		{"/v1/workflows", `{"id": "w", "steps": [{"name": "a", "task": {"type": "t"}, "on_dependency_failure": "maybe"}]}`, "steps[0].on_dependency_failure"},
		{"/v1/workflows", `{"id": "w", "steps": [{"name": "a", "task": {"type": "t"}, "after": ["b"]}]}`, ""},
		{"/v1/workflows", `{"id": "w", "stepz": []}`, ""},
		{"/v1/batches", `{"tasks": []}`, "tasks"},
		{"/v1/batches", `{"tasks": [{"type": "t"}, {"typo": "t"}]}`, "tasks[1].typo"},
		{"/v1/batches", `{"tasks": [{"type": "t"}], "on_done": {"type": "t", "task_id": "x"}}`, ""},
	} {
		r := e.do("POST", tc.path, tc.body)
		if r.status != 400 && r.status != 403 {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, r.status, r.body)
			continue
		}
		if _, field, _ := r.errorBody(t); field != tc.field {
			t.Errorf("%s %s: field %q, want %q (%s)", tc.path, tc.body, field, tc.field, r.body)
		}
	}
	if _, err := e.in.GetWorkflow(context.Background(), "w"); err == nil {
		t.Error("a refused workflow was stored")
	}
}

// A batch enqueued over HTTP runs its callback once; GET shows the counts.
func TestBatchEndpoints(t *testing.T) {
	t.Parallel()
	e := setup(t, gateway.Config{})
	e.serve()
	r := e.do("POST", "/v1/batches", `{"tasks": [{"type": "a"}, {"type": "fail"}, {"type": "b", "task_id": "mine"}], "on_done": {"type": "done"}}`)
	if r.status != 201 {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	var b gateway.Batch
	if err := json.Unmarshal(r.body, &b); err != nil || b.Total != 3 || b.CallbackID != b.ID+"/callback" {
		t.Fatalf("POST answer: %s", r.body)
	}
	testwait.For(e.t, 20*time.Second, "the batch to end", func() bool {
		r = e.do("GET", "/v1/batches/"+b.ID, "")
		b = gateway.Batch{}
		return r.status == 200 && json.Unmarshal(r.body, &b) == nil && b.FinishedAt != nil
	})
	if b.Succeeded != 2 || b.Failed != 1 || len(b.FailedIDs) != 1 || b.State != "failed" {
		t.Fatalf("batch: %s", r.body)
	}
	if r := e.do("POST", "/v1/workflows/"+b.ID+"/cancel", ""); r.status != 202 {
		t.Errorf("cancelling an ended batch: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/v1/workflows/nope/cancel", ""); r.status != 404 {
		t.Errorf("cancelling an unknown workflow: %d %s", r.status, r.body)
	}
}

// A gateway limited to some queues treats a workflow or batch with a step
// (or a batch callback) in another queue as unknown: GET and cancel answer
// 404 workflow_not_found, exactly as for an ID that names nothing, and the
// flow is left running. Creating one is refused with 403 like a task in
// such a queue, and there is no listing to leak through.
func TestFlowQueueScope(t *testing.T) {
	t.Parallel()
	e := setup(t, gateway.Config{AllowedQueues: []string{"public"}})
	ctx := context.Background()
	task := func(typ, queue string) *tide.Task { return tide.NewTask(typ, nil, tide.Queue(queue)) }
	// No server runs: every flow stays running.
	if _, err := e.c.EnqueueWorkflow(ctx, tide.NewWorkflow("mixed").
		Add("notify", task("notify", "public")).
		Add("pay", task("pay", "payroll"), tide.After("notify"))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.EnqueueWorkflow(ctx, tide.NewWorkflow("open").Add("a", task("a", "public"))); err != nil {
		t.Fatal(err)
	}
	secretCB, err := e.c.EnqueueBatch(ctx, []*tide.Task{task("a", "public")}, tide.OnBatchDone(task("done", "payroll")))
	if err != nil {
		t.Fatal(err)
	}
	secretMember, err := e.c.EnqueueBatch(ctx, []*tide.Task{task("a", "public"), task("b", "payroll")})
	if err != nil {
		t.Fatal(err)
	}
	open, err := e.c.EnqueueBatch(ctx, []*tide.Task{task("a", "public")}, tide.OnBatchDone(task("done", "public")))
	if err != nil {
		t.Fatal(err)
	}

	// An unknown ID's answer is what an out-of-scope flow must look like.
	unknown := e.do("GET", "/v1/workflows/nope", "")
	_, _, unknownMsg := unknown.errorBody(t)
	hidden := func(method, path, id string) {
		t.Helper()
		r := e.do(method, path, "")
		if r.status != http.StatusNotFound {
			t.Errorf("%s %s: %d %s, want 404", method, path, r.status, r.body)
			return
		}
		code, field, msg := r.errorBody(t)
		if want := strings.ReplaceAll(unknownMsg, `"nope"`, fmt.Sprintf("%q", id)); code != "workflow_not_found" || field != "" || msg != want {
			t.Errorf("%s %s: %s, want the answer to an unknown ID (%q)", method, path, r.body, want)
		}
	}
	hidden("GET", "/v1/workflows/mixed", "mixed")
	hidden("POST", "/v1/workflows/mixed/cancel", "mixed")
	for _, id := range []string{secretCB.ID, secretMember.ID} {
		hidden("GET", "/v1/batches/"+id, id)
		hidden("GET", "/v1/workflows/"+id, id)
		hidden("POST", "/v1/workflows/"+id+"/cancel", id)
	}
	for _, id := range []string{"mixed", secretCB.ID, secretMember.ID} {
		if w, err := e.in.GetWorkflow(ctx, id); err != nil || w.State != tide.FlowRunning {
			t.Errorf("%s after a refused cancel: %+v %v, want it running", id, w, err)
		}
	}

	// Flows wholly in allowed queues are served.
	if r := e.do("GET", "/v1/workflows/open", ""); r.status != http.StatusOK {
		t.Errorf("GET of an allowed workflow: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/v1/batches/"+open.ID, ""); r.status != http.StatusOK {
		t.Errorf("GET of an allowed batch: %d %s", r.status, r.body)
	}
	for _, id := range []string{"open", open.ID} {
		if r := e.do("POST", "/v1/workflows/"+id+"/cancel", ""); r.status != http.StatusAccepted {
			t.Errorf("cancel of allowed %s: %d %s", id, r.status, r.body)
		}
	}

	// Creation: every step's queue and the callback's must be allowed.
	for _, c := range []struct{ path, body, field string }{
		{"/v1/workflows", `{"id": "new-wf", "steps": [{"name": "a", "task": {"type": "t", "queue": "public"}},
			{"name": "b", "task": {"type": "t", "queue": "payroll"}, "after": ["a"]}]}`, "steps[1].task.queue"},
		{"/v1/workflows", `{"id": "new-wf", "steps": [{"name": "a", "task": {"type": "t"}}]}`, "steps[0].task.queue"}, // "default"
		{"/v1/batches", `{"tasks": [{"type": "t", "queue": "public"}, {"type": "t", "queue": "payroll"}]}`, "tasks[1].queue"},
		{"/v1/batches", `{"tasks": [{"type": "t", "queue": "public"}], "on_done": {"type": "t", "queue": "payroll"}}`, "on_done.queue"},
	} {
		r := e.do("POST", c.path, c.body)
		if r.status != http.StatusForbidden {
			t.Errorf("POST %s %s: %d %s, want 403", c.path, c.body, r.status, r.body)
			continue
		}
		if code, field, _ := r.errorBody(t); code != "queue_not_allowed" || field != c.field {
			t.Errorf("POST %s: code %q field %q, want queue_not_allowed %q", c.path, code, field, c.field)
		}
	}
	if _, err := e.in.GetWorkflow(ctx, "new-wf"); err == nil {
		t.Error("a refused workflow was stored")
	}
	if _, n, err := e.in.Batches(ctx, 0, 10); err != nil || n != 3 {
		t.Errorf("batches: %d %v, want the 3 made here (a refused one was stored?)", n, err)
	}
	// There are no list endpoints that could show other queues' flows.
	for _, path := range []string{"/v1/workflows", "/v1/batches"} {
		if r := e.do("GET", path, ""); r.status != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: %d %s, want 405 (no listing)", path, r.status, r.body)
		}
	}
}
