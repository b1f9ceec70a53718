package tide

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// FlowType is the type of the tasks that carry a workflow step's or batch
// member's end to its workflow: the broker stores one in the same atomic
// step as the step's end, however it ends (a settlement, lease recovery, an
// operator's archive or delete), in the step's queue; it records the end
// and enqueues the steps it makes ready. Servers run them themselves,
// whatever their handler; they are retried FlowMaxRetry times with back-off
// while the store cannot be reached. No enqueue accepts the type.
const FlowType = broker.FlowType

// FlowMaxRetry is how often a FlowType task that could not reach the store
// is retried.
const FlowMaxRetry = broker.FlowMaxRetry

// Headers that make a task a step: the flow ("w:<id>" or "b:<id>") and the
// step's name. Enqueue refuses them from users.
const (
	flowHeader = broker.FlowHeader
	stepHeader = broker.StepHeader
)

// flowRef splits a flow header into its kind and ID.
func flowRef(h string) (tidetype.FlowKind, string, bool) {
	switch {
	case strings.HasPrefix(h, "w:") && len(h) > 2:
		return tidetype.KindWorkflow, h[2:], true
	case strings.HasPrefix(h, "b:") && len(h) > 2:
		return tidetype.KindBatch, h[2:], true
	}
	return 0, "", false
}

// stepTask builds the task of a step: t with the flow's default options
// under its own, the step's ID (idBase.name, with the group's tag) unless
// allowID lets t's TaskID stand, and the flow's headers.
func stepTask(t *Task, defaults []Option, now time.Time, idBase, name, header string, dependent, allowID bool) (*TaskInfo, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: nil task", ErrInvalidTask)
	}
	merged := &Task{typ: t.typ, payload: t.payload, headers: t.headers, opts: append(append([]Option(nil), defaults...), t.opts...)}
	info, eo, err := prepare(merged, nil, now)
	if err != nil {
		return nil, err
	}
	switch {
	case eo.Replace:
		return nil, fmt.Errorf("%w: Replace does not apply to a workflow step or batch task", ErrInvalidTask)
	case eo.WaitReplicas > 0:
		return nil, fmt.Errorf("%w: WaitForReplicas does not apply to a workflow step or batch task", ErrInvalidTask)
	case info.ID != "" && !allowID:
		return nil, fmt.Errorf("%w: TaskID does not apply to a workflow step: its ID is %s.%s", ErrInvalidTask, idBase, name)
	case dependent && info.State == StateScheduled:
		return nil, fmt.Errorf("%w: ProcessIn/ProcessAt do not apply to a step with dependencies: it starts when they succeed", ErrInvalidTask)
	}
	if info.ID == "" {
		// "/" is in no workflow ID or step name: two steps never share an ID.
		info.ID = idBase + "/" + name
		if info.Group != "" {
			info.ID += "{" + info.Group + "}"
		}
		if err := validateName("task ID", info.ID); err != nil {
			return nil, err
		}
	}
	info.Headers = maps.Clone(info.Headers)
	if info.Headers == nil {
		info.Headers = map[string]string{}
	}
	info.Headers[flowHeader] = header
	info.Headers[stepHeader] = name
	return info, nil
}

// digest identifies a flow's steps: what they run and how they depend on
// each other, not when they were built.
func digest(f *broker.Flow) string {
	type step struct {
		Name, ID, Queue, Type, Group, Unique string
		After                                []string
		RunOnFailure                         bool
		Payload                              []byte
		Headers                              map[string]string
		MaxRetry                             int
		Timeout, Retention, UniqueTTL        time.Duration
		Deadline                             time.Time
	}
	steps := make([]step, len(f.Steps))
	for i, s := range f.Steps {
		t := s.Task
		steps[i] = step{s.Name, t.ID, t.Queue, t.Type, t.Group, t.UniqueKey, s.After, s.RunOnFailure, t.Payload, t.Headers, t.MaxRetry, t.Timeout, t.Retention, t.UniqueTTL, t.Deadline}
	}
	b, _ := json.Marshal(struct {
		Kind     tidetype.FlowKind
		Callback string
		Steps    []step
	}{f.Kind, f.Callback, steps})
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:18])
}

// releaseReady enqueues the tasks of ready steps and confirms them
// (broker.Flows protocol). A step whose task ID is taken by the step's own
// task (it carries this flow's and step's headers, which no caller can
// set) is already released: its task stays kept (WorkflowRetention). A
// step whose task cannot be stored (uniqueness lock held, ID held by
// another task) fails, which may release or cancel others in turn. Steps
// cancelled meanwhile have their tasks cancelled.
func releaseReady(ctx context.Context, b broker.Broker, fl broker.Flows, flow string, ready []broker.ReadyStep, now time.Time) error {
	now = now.Truncate(time.Millisecond)
	for len(ready) > 0 {
		chunk := ready[:min(len(ready), 1000)]
		ready = ready[len(chunk):]
		tasks := make([]*TaskInfo, 0, len(chunk))
		names := make([]string, 0, len(chunk))
		for _, r := range chunk {
			t := r.Task
			if t == nil {
				return fmt.Errorf("tide: workflow %s: step %s is ready but its task is not stored", flow, r.Name)
			}
			// A step without dependencies may be due later (ProcessIn);
			// any other starts now.
			if t.NextProcessAt.After(now) {
				t.State = StateScheduled
			} else {
				t.State, t.EnqueuedAt, t.NextProcessAt = StatePending, now, now
			}
			tasks = append(tasks, t)
			names = append(names, r.Name)
		}
		errs, err := b.Enqueue(ctx, tasks, broker.EnqueueOptions{})
		if err != nil {
			return err
		}
		released := names[:0:0]
		for i, e := range errs {
			if errors.Is(e, ErrTaskIDConflict) {
				e = ownStep(ctx, b, tasks[i])
			}
			switch {
			case e == nil, errors.Is(e, ErrNotReplicated):
				released = append(released, names[i])
			case errors.Is(e, ErrTaskIDConflict), errors.Is(e, ErrDuplicateTask):
				why := "tide: step not enqueued: " + e.Error()
				if errors.Is(e, ErrTaskIDConflict) {
					why = fmt.Sprintf("tide: step not enqueued: its task ID %s is held by a task that is not this step's", tasks[i].ID)
				}
				more, err := fl.EndStep(ctx, flow, names[i], tasks[i].ID, false, why)
				if err != nil {
					return err
				}
				ready = append(ready, more...)
			default:
				return fmt.Errorf("step %s: %w", names[i], e)
			}
		}
		hook("enqueued", strings.Join(released, ","))
		canceled, err := fl.ReleaseSteps(ctx, flow, released)
		if err != nil {
			return err
		}
		byName := make(map[string]*TaskInfo, len(tasks))
		for i, n := range names {
			byName[n] = tasks[i]
		}
		for _, n := range canceled {
			if t := byName[n]; t != nil {
				if err := b.Cancel(ctx, t.Queue, t.ID); err != nil && !errors.Is(err, ErrTaskNotFound) {
					return err
				}
			}
		}
	}
	return nil
}

// ownStep tells, for a step whose task ID an enqueue found taken, whether
// the task holding it is the step's own, stored by an earlier run of the
// release (nil): it carries the same flow and step headers, which no caller
// can set (and Replace leaves a step's task alone). It returns
// ErrTaskIDConflict when another task holds the ID. A task gone a moment
// after the enqueue met it was not the step's (a step's own task does not
// vanish: deleting one archives it, and it is kept WorkflowRetention), so
// the step's task is enqueued again.
func ownStep(ctx context.Context, b broker.Broker, t *TaskInfo) error {
	for range 3 {
		cur, err := b.GetTask(ctx, t.Queue, t.ID)
		switch {
		case err == nil:
			if cur.Headers[flowHeader] == t.Headers[flowHeader] && cur.Headers[stepHeader] == t.Headers[stepHeader] {
				return nil
			}
			return ErrTaskIDConflict
		case !errors.Is(err, ErrTaskNotFound):
			return err
		}
		errs, err := b.Enqueue(ctx, []*TaskInfo{t}, broker.EnqueueOptions{})
		if err != nil {
			return err
		}
		if !errors.Is(errs[0], ErrTaskIDConflict) {
			return errs[0]
		}
	}
	return ErrTaskIDConflict
}

// flowHook, when set (tests only), is called at each point of advancing a
// flow, so a test can kill the process there.
var flowHook func(point, step string)

func hook(point, step string) {
	if flowHook != nil {
		flowHook(point, step)
	}
}

// advanceFlow runs a FlowType task of queue: it records the step's end
// and enqueues the steps that became ready, then sends the step's
// notification if it asked for one. Each part is safe to run again.
func (s *Server) advanceFlow(ctx context.Context, queue string, t *Task) error {
	e, err := broker.ParseEnding(queue, t.Payload())
	if err != nil || e.Step == "" {
		return fmt.Errorf("tide: workflow follow-up payload is not one tide wrote (%v): %w", err, SkipRetry)
	}
	_, id, ok := flowRef(e.Flow)
	fl := s.b
	if !ok {
		return fmt.Errorf("tide: workflow follow-up for %q cannot be applied here: %w", e.Flow, SkipRetry)
	}
	hook("advance", e.Step)
	ready, err := fl.EndStep(ctx, id, e.Step, e.TaskID, e.Outcome == broker.OutcomeCompleted, e.Err)
	if errors.Is(err, ErrWorkflowNotFound) {
		return fmt.Errorf("%w: %w", err, SkipRetry)
	}
	if err != nil {
		return err
	}
	hook("ended", e.Step)
	if err := releaseReady(ctx, s.b, fl, id, ready, s.now()); err != nil {
		return err
	}
	if e.Notify != "" {
		return s.post(ctx, e)
	}
	return nil
}

// Repairs of flows whose creator died (engine's repairer): how old an
// unconfirmed creation must be, how often a server looks, and how many
// flows one look takes. Variables for tests.
var (
	repairAge   = 30 * time.Second
	repairEvery time.Duration // 0: engine.RepairEvery
)

const repairBatch = 100

// repairFlows finishes the creation of flows whose creator stopped before
// confirming it (broker.Flows.RepairFlows): it stores the tasks of their
// ready steps that are not stored yet and confirms them (a flow whose
// bookkeeping was not all written is cancelled by ReadySteps). It returns
// how many flows it looked at.
func (s *Server) repairFlows(ctx context.Context) (int, error) {
	fl := s.b
	ids, err := fl.RepairFlows(ctx, repairAge, repairBatch)
	if err != nil {
		return 0, err
	}
	for i, id := range ids {
		ready, err := fl.ReadySteps(ctx, id)
		if err != nil && !errors.Is(err, ErrWorkflowNotFound) {
			return i, err
		}
		if err == nil {
			if err := releaseReady(ctx, s.b, fl, id, ready, s.now()); err != nil {
				return i, fmt.Errorf("tide: repair of workflow %s: %w", id, err)
			}
		}
		if err := fl.ConfirmFlow(ctx, id); err != nil {
			return i, err
		}
	}
	return len(ids), nil
}

// flowLive checks, before a workflow step's or batch task's handler runs,
// that its flow was not cancelled: a step released while (or just before)
// its workflow was cancelled, whose task no canceller reached, is archived
// instead of run (its end is then recorded as cancelled). A flow that is
// gone (kept past WorkflowRetention) does not stop it.
func (s *Server) flowLive(ctx context.Context, m *TaskInfo) error {
	_, id, ok := flowRef(m.Headers[flowHeader])
	fl := s.b
	if !ok {
		return nil
	}
	f, err := fl.GetFlow(ctx, id, false)
	switch {
	case errors.Is(err, ErrWorkflowNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("tide: cannot tell whether workflow %s was cancelled: %w", id, err)
	case f.State == FlowCanceled:
		return fmt.Errorf("tide: not run: its workflow was cancelled: %w", SkipRetry)
	}
	return nil
}

// StepResult returns what the named dependency of the running workflow
// step stored with WriteResult. It returns ErrNotInWorkflow outside a
// step's handler, ErrWorkflowNotFound for a name that is not a step of the
// workflow, an error wrapping ErrStepFailed for a dependency that failed or
// was cancelled (a step that runs on failure sees those), and
// ErrTaskNotFound when the dependency's task is no longer kept
// (WorkflowRetention). A dependency that wrote no result gives nil, nil.
func StepResult(ctx context.Context, step string) ([]byte, error) {
	m, ok := metaFrom(ctx)
	if !ok || m.flow == "" {
		return nil, ErrNotInWorkflow
	}
	kind, id, _ := flowRef(m.flow)
	fl := m.b
	if kind != tidetype.KindWorkflow {
		return nil, ErrNotInWorkflow
	}
	si, err := fl.GetStep(ctx, id, step)
	if err != nil {
		return nil, err
	}
	if si.State != StepSucceeded {
		why := si.State.String()
		if si.Err != "" {
			why += ": " + si.Err
		}
		return nil, fmt.Errorf("%w: step %q is %s", ErrStepFailed, step, why)
	}
	info, err := m.b.GetTask(ctx, si.Queue, si.TaskID)
	if err != nil {
		return nil, fmt.Errorf("tide: result of step %q: %w", step, err)
	}
	return info.Result, nil
}

// GetStepName returns the name of the workflow step (or the index of the
// batch task, "callback" for a batch's callback) a handler is running; ok
// is false when ctx is not a handler's context or the task is not part of
// a workflow or batch.
func GetStepName(ctx context.Context) (name string, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok || m.flow == "" {
		return "", false
	}
	return m.step, true
}

// GetWorkflowID returns the ID of the workflow or batch the running task
// belongs to; ok is false otherwise.
func GetWorkflowID(ctx context.Context) (id string, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok || m.flow == "" {
		return "", false
	}
	_, id, ok = flowRef(m.flow)
	return id, ok
}
