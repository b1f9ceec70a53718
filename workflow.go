package tide

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// WorkflowInfo describes a workflow (or a batch) as stored: its state, its
// counts and, from Inspector.GetWorkflow, its steps.
type WorkflowInfo = tidetype.WorkflowInfo

// StepInfo is one step of a workflow (WorkflowInfo.Steps).
type StepInfo = tidetype.StepInfo

// FlowState is where a workflow or batch is in its life: FlowRunning,
// FlowSucceeded, FlowFailed or FlowCanceled.
type FlowState = tidetype.FlowState

// StepState is where a workflow step is: StepWaiting, StepEnqueued,
// StepSucceeded, StepFailed or StepCanceled.
type StepState = tidetype.StepState

// Flow and step states (see tidetype).
const (
	FlowRunning   = tidetype.FlowRunning
	FlowSucceeded = tidetype.FlowSucceeded
	FlowFailed    = tidetype.FlowFailed
	FlowCanceled  = tidetype.FlowCanceled

	StepWaiting   = tidetype.StepWaiting
	StepEnqueued  = tidetype.StepEnqueued
	StepSucceeded = tidetype.StepSucceeded
	StepFailed    = tidetype.StepFailed
	StepCanceled  = tidetype.StepCanceled
)

// Errors of workflows and batches.
var (
	// ErrWorkflowExists is returned by EnqueueWorkflow for an ID that a
	// workflow with other steps uses.
	ErrWorkflowExists = broker.ErrFlowExists
	// ErrWorkflowNotFound is returned for a workflow or batch ID that names
	// nothing stored (never created, or kept past WorkflowRetention).
	ErrWorkflowNotFound = broker.ErrFlowNotFound
	// ErrStepFailed is returned by StepResult for a dependency that did not
	// succeed (possible with RunDependents).
	ErrStepFailed = errors.New("tide: workflow step did not succeed")
	// ErrNotInWorkflow is returned by StepResult outside the handler of a
	// workflow step.
	ErrNotInWorkflow = errors.New("tide: not a workflow step's handler context")
)

// WorkflowRetention is how long a workflow or batch is kept after it ends.
// The tasks of workflow steps and a batch's callback are kept as completed
// at least as long (a longer Retention of their own wins): StepResult reads
// a dependency's result from its task, and a step's task that is still
// there is what makes releasing it twice impossible.
const WorkflowRetention = 24 * time.Hour

// A Workflow is a DAG of named steps, each an ordinary task (retries,
// leases, timeouts, uniqueness, groups) that starts when every step it
// depends on (After) has succeeded. Build it with NewWorkflow and Add, then
// hand it to Client.EnqueueWorkflow. A Workflow is not safe for concurrent
// mutation.
type Workflow struct {
	id     string
	steps  []*workflowStep
	byName map[string]*workflowStep
	err    error
}

type workflowStep struct {
	name   string
	task   *Task
	after  []string
	policy DependencyPolicy
}

// NewWorkflow returns an empty workflow whose ID is id: 1 to
// broker.MaxFlowIDLength bytes of letters, digits and . _ - : (checked by
// EnqueueWorkflow). The ID names the workflow in its queues and tools
// ("fulfil-order-42"); EnqueueWorkflow with an ID in use resumes the
// workflow if it has the same steps and fails with ErrWorkflowExists
// otherwise.
func NewWorkflow(id string) *Workflow {
	return &Workflow{id: id, byName: map[string]*workflowStep{}}
}

// ID returns the workflow's ID.
func (w *Workflow) ID() string { return w.id }

// StepOption configures one step of a workflow (Workflow.Add).
type StepOption interface {
	applyStep(*workflowStep)
}

type stepOptionFunc func(*workflowStep)

func (f stepOptionFunc) applyStep(s *workflowStep) { f(s) }

// After makes the step wait for the named steps: it starts once all of
// them have succeeded. Each must be added to the workflow (before or after
// this step); cycles are refused by EnqueueWorkflow.
func After(steps ...string) StepOption {
	steps = append([]string(nil), steps...)
	return stepOptionFunc(func(s *workflowStep) { s.after = append(s.after, steps...) })
}

// DependencyPolicy says what a step does when a step it depends on fails
// (OnDependencyFailure).
type DependencyPolicy uint8

const (
	// CancelDependents (the default): the step is cancelled without
	// running, and so, in turn, are the steps that depend on it unless they
	// run on failure.
	CancelDependents DependencyPolicy = iota
	// RunDependents: the step runs once all its dependencies have finished,
	// however they ended; StepResult of a failed one returns ErrStepFailed.
	RunDependents
)

// OnDependencyFailure sets what the step does when a step it depends on
// fails (archived, deleted or cancelled): CancelDependents, the default,
// or RunDependents (a clean-up or report step).
func OnDependencyFailure(p DependencyPolicy) StepOption {
	return stepOptionFunc(func(s *workflowStep) { s.policy = p })
}

// Add adds a step named name that runs t. The name is 1 to
// broker.MaxFlowIDLength bytes of letters, digits and . _ - : and unique in
// the workflow; the step's task ID is "<workflow ID>/<name>" (with the
// group's tag appended for a grouped task). t's own options apply (Queue,
// MaxRetry, Timeout, Group, Unique, ...) over those given to
// EnqueueWorkflow; TaskID and Replace are refused, and so are ProcessIn and
// ProcessAt for a step with dependencies. Mistakes are reported by
// EnqueueWorkflow. Add returns w.
func (w *Workflow) Add(name string, t *Task, opts ...StepOption) *Workflow {
	s := &workflowStep{name: name, task: t}
	for _, o := range opts {
		if o == nil {
			w.fail(fmt.Errorf("step %q: nil StepOption", name))
			continue
		}
		o.applyStep(s)
	}
	if _, dup := w.byName[name]; dup {
		w.fail(fmt.Errorf("step %q added twice", name))
		return w
	}
	w.byName[name] = s
	w.steps = append(w.steps, s)
	return w
}

func (w *Workflow) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

// EnqueueWorkflow stores wf and enqueues its steps without dependencies; the
// others are enqueued as their dependencies succeed. opts apply to every
// step under the step's own options. Finishing a step and releasing its
// dependents cannot be separated by a crash: the step's end is recorded in
// the same atomic step as its outcome (a follow-up task of type FlowType),
// and releasing a dependent twice stores it once.
//
// EnqueueWorkflow is idempotent by workflow ID: called again with the same
// ID and steps (after an error, or from another process) it finishes what
// the first call started and returns the workflow; with other steps it
// returns ErrWorkflowExists. A workflow whose enqueue stopped halfway and
// is not enqueued again is finished by a server after a while: it stores
// the steps that are ready (or cancels a workflow whose bookkeeping was
// not all written). Invalid workflows (no steps, an unknown or
// cyclic dependency, a bad name or task) give an error wrapping
// ErrInvalidTask and store nothing. It needs a broker.Flows (both shipped
// brokers are) and returns ErrNotSupported otherwise.
func (c *Client) EnqueueWorkflow(ctx context.Context, wf *Workflow, opts ...Option) (*WorkflowInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	fl := c.b
	if wf == nil {
		return nil, fmt.Errorf("%w: nil workflow", ErrInvalidTask)
	}
	f, err := c.buildWorkflow(ctx, wf, opts)
	if err != nil {
		return nil, err
	}
	ready, err := fl.CreateFlow(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("tide: enqueue workflow %s: %w", wf.id, err)
	}
	if err := releaseReady(ctx, c.b, fl, f.ID, ready, c.now()); err != nil {
		return nil, fmt.Errorf("tide: enqueue workflow %s: %w", wf.id, err)
	}
	// Unconfirmed, a server's repair would look at it in a while and
	// find nothing to release: not worth an error.
	_ = fl.ConfirmFlow(ctx, f.ID)
	return infoOf(f), nil
}

// buildWorkflow checks wf and builds the flow to store.
func (c *Client) buildWorkflow(ctx context.Context, wf *Workflow, opts []Option) (*broker.Flow, error) {
	if err := checkFlowName("workflow ID", wf.id); err != nil {
		return nil, err
	}
	if wf.err != nil {
		return nil, fmt.Errorf("%w: workflow %s: %v", ErrInvalidTask, wf.id, wf.err)
	}
	if len(wf.steps) == 0 {
		return nil, fmt.Errorf("%w: workflow %s has no steps", ErrInvalidTask, wf.id)
	}
	if len(wf.steps) > broker.MaxFlowSteps {
		return nil, fmt.Errorf("%w: workflow %s has %d steps, over the %d limit", ErrInvalidTask, wf.id, len(wf.steps), broker.MaxFlowSteps)
	}
	now := c.now()
	f := &broker.Flow{ID: wf.id, Kind: tidetype.KindWorkflow, Retention: WorkflowRetention, CreatedAt: now, Steps: make([]broker.FlowStep, len(wf.steps))}
	index := make(map[string]int, len(wf.steps))
	for i, s := range wf.steps {
		index[s.name] = i
	}
	for i, s := range wf.steps {
		if err := checkFlowName("step name", s.name); err != nil {
			return nil, fmt.Errorf("workflow %s: %w", wf.id, err)
		}
		seen := map[string]bool{}
		for _, a := range s.after {
			if _, ok := index[a]; !ok {
				return nil, fmt.Errorf("%w: workflow %s: step %q runs after %q, which is not a step", ErrInvalidTask, wf.id, s.name, a)
			}
			if a == s.name || seen[a] {
				return nil, fmt.Errorf("%w: workflow %s: step %q lists %q twice or depends on itself", ErrInvalidTask, wf.id, s.name, a)
			}
			seen[a] = true
		}
		t, err := stepTask(s.task, opts, now, wf.id, s.name, "w:"+wf.id, len(s.after) > 0, false)
		if err != nil {
			return nil, fmt.Errorf("workflow %s: step %q: %w", wf.id, s.name, err)
		}
		if err := c.checkPlacement(ctx, t); err != nil {
			return nil, fmt.Errorf("workflow %s: step %q: %w", wf.id, s.name, err)
		}
		t.Retention = max(t.Retention, WorkflowRetention)
		f.Steps[i] = broker.FlowStep{Name: s.name, Task: t, After: s.after, RunOnFailure: s.policy == RunDependents}
	}
	for i, s := range wf.steps {
		for _, a := range s.after {
			j := index[a]
			f.Steps[j].Dependents = append(f.Steps[j].Dependents, f.Steps[i].Name)
		}
	}
	if cyc := cycle(f.Steps, index); cyc != "" {
		return nil, fmt.Errorf("%w: workflow %s: step %q depends on itself through its dependencies", ErrInvalidTask, wf.id, cyc)
	}
	f.Digest = digest(f)
	return f, nil
}

// cycle returns a step on a dependency cycle, or "" when there is none
// (Kahn's algorithm).
func cycle(steps []broker.FlowStep, index map[string]int) string {
	left := make([]int, len(steps))
	var ready []int
	for i, s := range steps {
		left[i] = len(s.After)
		if left[i] == 0 {
			ready = append(ready, i)
		}
	}
	done := 0
	for len(ready) > 0 {
		i := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		done++
		for _, d := range steps[i].Dependents {
			j := index[d]
			if left[j]--; left[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	if done == len(steps) {
		return ""
	}
	for i := range steps {
		if left[i] > 0 {
			return steps[i].Name
		}
	}
	return ""
}

// infoOf is what EnqueueWorkflow and EnqueueBatch report: the flow as just
// created, steps without dependencies enqueued.
func infoOf(f *broker.Flow) *WorkflowInfo {
	info := &WorkflowInfo{ID: f.ID, Kind: f.Kind, State: FlowRunning, Total: len(f.Steps), CreatedAt: f.CreatedAt}
	info.Steps = make([]StepInfo, len(f.Steps))
	for i, s := range f.Steps {
		st := StepEnqueued
		if len(s.After) > 0 {
			st = StepWaiting
		}
		info.Steps[i] = StepInfo{Name: s.Name, Queue: s.Task.Queue, TaskID: s.Task.ID, After: s.After, RunOnFailure: s.RunOnFailure, State: st}
	}
	return info
}

// CancelWorkflow cancels a workflow or batch: steps that have not started
// never will, and the tasks of enqueued steps are cancelled (archived when
// waiting, their handlers cancelled when running). The workflow's state
// becomes FlowCanceled; steps already finished keep their outcome, also a
// step whose task finished just before and whose end the workflow has not
// recorded yet (its task and result are kept). A workflow that has ended is
// left as it is. Calling it again is safe. It returns ErrWorkflowNotFound
// for an unknown ID.
func (c *Client) CancelWorkflow(ctx context.Context, id string) error {
	if c.closed.Load() {
		return ErrClientClosed
	}
	fl := c.b
	if err := checkFlowName("workflow ID", id); err != nil {
		return err
	}
	running, err := fl.CancelFlow(ctx, id)
	if err != nil {
		return fmt.Errorf("tide: cancel workflow %s: %w", id, err)
	}
	var errs []error
	for _, s := range running {
		// A step whose task has ended meanwhile keeps its outcome: its
		// follow-up reports it. Only a task gone without one (deleted in
		// bulk, trimmed) leaves the end to record here.
		err := fl.CancelStepTask(ctx, s.Queue, s.TaskID)
		if errors.Is(err, ErrTaskNotFound) {
			_, err = fl.EndStep(ctx, id, s.Name, s.TaskID, false, "tide: workflow cancelled; the step's task was gone")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("step %s (task %s): %w", s.Name, s.TaskID, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("tide: cancel workflow %s: %w", id, errors.Join(errs...))
	}
	return nil
}

// GetWorkflow returns the workflow (or batch) with its steps. For steps
// whose task is enqueued, StepInfo.TaskState tells whether it waits, runs
// or retries (looked up for the first 500 such steps). It returns
// ErrWorkflowNotFound for an unknown ID.
func (in *Inspector) GetWorkflow(ctx context.Context, id string) (*WorkflowInfo, error) {
	fl := in.b
	if err := checkFlowName("workflow ID", id); err != nil {
		return nil, err
	}
	f, err := fl.GetFlow(ctx, id, true)
	if err != nil {
		return nil, err
	}
	looked := 0
	for i := range f.Steps {
		s := &f.Steps[i]
		if s.State != StepEnqueued || looked >= 500 {
			continue
		}
		looked++
		if t, err := in.b.GetTask(ctx, s.Queue, s.TaskID); err == nil {
			s.TaskState = t.State
		} else if !errors.Is(err, ErrTaskNotFound) {
			return nil, err
		}
	}
	return f, nil
}

// Workflows lists workflows, newest first, from offset (at most limit, 1 to
// 1000), without their steps, and how many there are.
func (in *Inspector) Workflows(ctx context.Context, offset, limit int) ([]*WorkflowInfo, int, error) {
	return in.listFlows(ctx, tidetype.KindWorkflow, offset, limit)
}

func (in *Inspector) listFlows(ctx context.Context, kind tidetype.FlowKind, offset, limit int) ([]*WorkflowInfo, int, error) {
	fl := in.b
	if offset < 0 || limit < 1 || limit > 1000 {
		return nil, 0, fmt.Errorf("%w: offset %d and limit %d (offset ≥ 0, limit 1 to 1000)", ErrInvalidTask, offset, limit)
	}
	return fl.ListFlows(ctx, kind, offset, limit)
}

// ValidateWorkflowID reports whether id can name a workflow or batch (or a
// step): 1 to broker.MaxFlowIDLength bytes of ASCII letters, digits and
// . _ - : The error wraps ErrInvalidTask.
func ValidateWorkflowID(id string) error { return checkFlowName("workflow ID", id) }

// checkFlowName checks a workflow ID, batch ID or step name.
func checkFlowName(what, s string) error {
	if s == "" || len(s) > broker.MaxFlowIDLength {
		return fmt.Errorf("%w: %s %q: want 1 to %d bytes", ErrInvalidTask, what, s, broker.MaxFlowIDLength)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':' {
			continue
		}
		return fmt.Errorf("%w: %s %q has invalid character %q at byte %d (allowed: letters, digits, . _ - :)", ErrInvalidTask, what, s, c, i)
	}
	return nil
}
