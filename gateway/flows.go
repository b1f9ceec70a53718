package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

// Workflow is the JSON form of a workflow (or batch) that the gateway
// returns.
type Workflow struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`  // workflow or batch
	State string `json:"state"` // running, succeeded, failed or cancelled
	// Counts of steps (a batch's callback is not counted).
	Total      int        `json:"total"`
	Succeeded  int        `json:"succeeded"`
	Failed     int        `json:"failed"`
	Canceled   int        `json:"cancelled"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	FailedIDs  []string   `json:"failed_ids,omitempty"`
	Steps      []Step     `json:"steps,omitempty"`
}

// Step is the JSON form of one step of a workflow.
type Step struct {
	Name         string   `json:"name"`
	Queue        string   `json:"queue"`
	TaskID       string   `json:"task_id"`
	After        []string `json:"after,omitempty"`
	RunOnFailure bool     `json:"run_on_failure,omitempty"`
	// State is waiting, enqueued, succeeded, failed or cancelled;
	// TaskState, for an enqueued step, the state of its task.
	State     string `json:"state"`
	TaskState string `json:"task_state,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Batch is the JSON form of a batch.
type Batch struct {
	ID         string     `json:"id"`
	State      string     `json:"state"`
	Total      int        `json:"total"`
	Succeeded  int        `json:"succeeded"`
	Failed     int        `json:"failed"`
	FailedIDs  []string   `json:"failed_ids,omitempty"`
	CallbackID string     `json:"callback_id,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// WorkflowFromInfo returns the JSON form of w.
func WorkflowFromInfo(w *tide.WorkflowInfo) *Workflow {
	out := &Workflow{ID: w.ID, Kind: w.Kind.String(), State: w.State.String(), Total: w.Total, Succeeded: w.Succeeded,
		Failed: w.Failed, Canceled: w.Canceled, CreatedAt: w.CreatedAt.UTC(), FinishedAt: optTime(w.FinishedAt), FailedIDs: w.FailedIDs}
	for _, s := range w.Steps {
		st := Step{Name: s.Name, Queue: s.Queue, TaskID: s.TaskID, After: s.After, RunOnFailure: s.RunOnFailure, State: s.State.String(), Error: s.Err}
		if s.TaskState.Valid() {
			st.TaskState = s.TaskState.String()
		}
		out.Steps = append(out.Steps, st)
	}
	return out
}

// BatchFromInfo returns the JSON form of b.
func BatchFromInfo(b *tide.BatchInfo) *Batch {
	return &Batch{ID: b.ID, State: b.State.String(), Total: b.Total, Succeeded: b.Succeeded, Failed: b.Failed, FailedIDs: b.FailedIDs,
		CallbackID: b.CallbackID, CreatedAt: b.CreatedAt.UTC(), FinishedAt: optTime(b.FinishedAt)}
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// readJSONBody checks the content type and size and reads the body.
func (g *gateway) readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if aerr := checkJSONContentType(r); aerr != nil {
		return nil, aerr
	}
	if r.ContentLength > g.maxBody {
		return nil, g.tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, g.tooLarge()
		}
		return nil, badRequest("could not read the request body: %v", err)
	}
	return body, nil
}

// decodeStrict decodes one JSON object into v, refusing unknown fields and
// trailing data.
func decodeStrict(body []byte, v any) *apiError {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("the request body is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("the request body does not parse: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("the request body must hold one JSON object; found more data after it")
	}
	return nil
}

// subTask parses one task object inside a workflow or batch request; its
// errors name the field by its path ("steps[2].task.delay").
func (g *gateway) subTask(raw json.RawMessage, path string, now time.Time) (*tide.Task, *apiError) {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, badField(path, "is required: a task object as POST /v1/tasks takes")
	}
	spec, aerr := parseEnqueue(raw, now)
	if aerr != nil {
		if aerr.field != "" {
			aerr.message = fmt.Sprintf("%q: %s", path+"."+aerr.field, strings.TrimPrefix(aerr.message, fmt.Sprintf("%q: ", aerr.field)))
			aerr.field = path + "." + aerr.field
		} else {
			aerr.field, aerr.message = path, fmt.Sprintf("%q: %s", path, aerr.message)
		}
		return nil, aerr
	}
	if aerr := g.allowQueue(spec.queue); aerr != nil {
		aerr.field = path + ".queue"
		return nil, aerr
	}
	return spec.task(), nil
}

// handleWorkflows serves POST /v1/workflows.
func (g *gateway) handleWorkflows(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		g.methodNotAllowed(w, r, "POST")
		return
	}
	body, aerr := g.readJSONBody(w, r)
	if aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	var req struct {
		ID    string `json:"id"`
		Steps []struct {
			Name      string          `json:"name"`
			Task      json.RawMessage `json:"task"`
			After     []string        `json:"after"`
			OnFailure string          `json:"on_dependency_failure"`
		} `json:"steps"`
	}
	if aerr := decodeStrict(body, &req); aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	if req.ID == "" {
		g.fail(w, r, badField("id", "is required: the workflow's ID, e.g. \"fulfil-order-42\""))
		return
	}
	wf := tide.NewWorkflow(req.ID)
	now := g.now()
	for i, s := range req.Steps {
		path := fmt.Sprintf("steps[%d]", i)
		t, aerr := g.subTask(s.Task, path+".task", now)
		if aerr != nil {
			g.fail(w, r, aerr)
			return
		}
		opts := []tide.StepOption{tide.After(s.After...)}
		switch s.OnFailure {
		case "", "cancel":
		case "run":
			opts = append(opts, tide.OnDependencyFailure(tide.RunDependents))
		default:
			g.fail(w, r, badField(path+".on_dependency_failure", "must be \"cancel\" (the default) or \"run\", got %q", clip(s.OnFailure, 32)))
			return
		}
		wf.Add(s.Name, t, opts...)
	}
	info, err := g.c.EnqueueWorkflow(r.Context(), wf)
	if err != nil {
		g.fail(w, r, g.flowError(err, req.ID))
		return
	}
	w.Header().Set("Location", "/v1/workflows/"+url.PathEscape(info.ID))
	writeJSON(w, http.StatusCreated, WorkflowFromInfo(info))
}

// handleWorkflow serves GET /v1/workflows/{id}.
func (g *gateway) handleWorkflow(w http.ResponseWriter, r *http.Request) {
	g.getFlow(w, r, func(ctx context.Context, id string) (any, error) {
		info, err := g.in.GetWorkflow(ctx, id)
		if err != nil {
			return nil, err
		}
		if !g.flowInScope(info) {
			return nil, errOutOfScope
		}
		return WorkflowFromInfo(info), nil
	})
}

// errOutOfScope stands for a workflow or batch that has a step (or a
// callback) in a queue outside Config.AllowedQueues: it is answered like an
// unknown ID.
var errOutOfScope = fmt.Errorf("%w: a step runs in a queue the gateway does not allow", tide.ErrWorkflowNotFound)

// flowInScope reports whether every step of f, a batch's callback
// included, runs in an allowed queue.
func (g *gateway) flowInScope(f *tide.WorkflowInfo) bool {
	if g.queues == nil {
		return true
	}
	for _, s := range f.Steps {
		if !g.queues[s.Queue] {
			return false
		}
	}
	return true
}

// checkFlowScope reads the workflow or batch id, when the gateway is
// limited to some queues, and returns errOutOfScope when one of its steps
// runs in another queue (or the read's error).
func (g *gateway) checkFlowScope(ctx context.Context, id string) error {
	if g.queues == nil {
		return nil
	}
	info, err := g.in.GetWorkflow(ctx, id)
	if err != nil {
		return err
	}
	if !g.flowInScope(info) {
		return errOutOfScope
	}
	return nil
}

// getFlow serves a GET of one workflow or batch, read by get.
func (g *gateway) getFlow(w http.ResponseWriter, r *http.Request, get func(ctx context.Context, id string) (any, error)) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		g.methodNotAllowed(w, r, "GET, HEAD")
		return
	}
	id := r.PathValue("id")
	out, err := get(r.Context(), id)
	if err != nil {
		g.fail(w, r, g.flowError(err, id))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// handleWorkflowCancel serves POST /v1/workflows/{id}/cancel.
func (g *gateway) handleWorkflowCancel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		g.methodNotAllowed(w, r, "POST")
		return
	}
	id := r.PathValue("id")
	if err := g.checkFlowScope(r.Context(), id); err != nil {
		g.fail(w, r, g.flowError(err, id))
		return
	}
	if err := g.c.CancelWorkflow(r.Context(), id); err != nil {
		g.fail(w, r, g.flowError(err, id))
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "cancelled"})
}

// handleBatches serves POST /v1/batches.
func (g *gateway) handleBatches(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		g.methodNotAllowed(w, r, "POST")
		return
	}
	body, aerr := g.readJSONBody(w, r)
	if aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	var req struct {
		Tasks  []json.RawMessage `json:"tasks"`
		OnDone json.RawMessage   `json:"on_done"`
	}
	if aerr := decodeStrict(body, &req); aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	if len(req.Tasks) == 0 {
		g.fail(w, r, badField("tasks", "is required: at least one task object as POST /v1/tasks takes"))
		return
	}
	now := g.now()
	tasks := make([]*tide.Task, len(req.Tasks))
	for i, raw := range req.Tasks {
		t, aerr := g.subTask(raw, fmt.Sprintf("tasks[%d]", i), now)
		if aerr != nil {
			g.fail(w, r, aerr)
			return
		}
		tasks[i] = t
	}
	var opts []tide.Option
	if len(bytes.TrimSpace(req.OnDone)) > 0 && !bytes.Equal(bytes.TrimSpace(req.OnDone), []byte("null")) {
		cb, aerr := g.subTask(req.OnDone, "on_done", now)
		if aerr != nil {
			g.fail(w, r, aerr)
			return
		}
		opts = append(opts, tide.OnBatchDone(cb))
	}
	info, err := g.c.EnqueueBatch(r.Context(), tasks, opts...)
	if err != nil {
		g.fail(w, r, g.flowError(err, ""))
		return
	}
	w.Header().Set("Location", "/v1/batches/"+url.PathEscape(info.ID))
	writeJSON(w, http.StatusCreated, BatchFromInfo(info))
}

// handleBatch serves GET /v1/batches/{id}.
func (g *gateway) handleBatch(w http.ResponseWriter, r *http.Request) {
	g.getFlow(w, r, func(ctx context.Context, id string) (any, error) {
		if err := g.checkFlowScope(ctx, id); err != nil {
			return nil, err
		}
		info, err := g.in.GetBatch(ctx, id)
		if err != nil {
			return nil, err
		}
		return BatchFromInfo(info), nil
	})
}

// flowError maps an error of a workflow or batch call to a response.
func (g *gateway) flowError(err error, id string) *apiError {
	switch {
	case errors.Is(err, tide.ErrWorkflowExists):
		return &apiError{status: http.StatusConflict, code: "workflow_exists", field: "id",
			message: fmt.Sprintf("workflow %q exists with other steps (the same steps again would have been accepted)", clip(id, 64))}
	case errors.Is(err, tide.ErrWorkflowNotFound):
		return &apiError{status: http.StatusNotFound, code: "workflow_not_found",
			message: fmt.Sprintf("no workflow or batch %q (it may have ended more than %v ago)", clip(id, 64), tide.WorkflowRetention)}
	}
	return g.taskError(err, "", "")
}
