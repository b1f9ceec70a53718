package broker

import (
	"context"
	"errors"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

// Errors of workflows and batches.
var (
	// ErrFlowExists is returned by CreateFlow for an ID that another flow
	// (other steps or tasks) already uses.
	ErrFlowExists = errors.New("tide: workflow ID already in use by another workflow")
	// ErrFlowNotFound is returned for a workflow or batch ID that names
	// nothing stored (never created, or its retention passed).
	ErrFlowNotFound = errors.New("tide: workflow or batch not found")
)

// Limits of flows.
const (
	// MaxFlowSteps is the most steps a workflow (tasks a batch) may have.
	MaxFlowSteps = 100_000
	// MaxFlowIDLength bounds workflow IDs and step names, in bytes.
	MaxFlowIDLength = 128
)

// FlowStep is one step of a flow as the client builds it.
type FlowStep struct {
	Name string
	// Task is the step's task, ready to enqueue: Queue and ID set, and the
	// flow's headers (the root package's). Brokers store it until the
	// step is released and hand it back when it is ready (ReadyStep), so
	// that whoever releases a step, the creator or a repair, has it.
	Task *tidetype.TaskInfo
	// After names the steps it depends on; Dependents the steps that
	// depend on it (the client computes both).
	After, Dependents []string
	// RunOnFailure: the step runs when a step it depends on fails.
	RunOnFailure bool
}

// Flow is a workflow or batch to create.
type Flow struct {
	ID   string
	Kind tidetype.FlowKind
	// Digest identifies the steps: creating a flow again with the same ID
	// and Digest resumes the first creation; another Digest is
	// ErrFlowExists.
	Digest string
	Steps  []FlowStep
	// Callback names a batch's callback step, or "". It is not counted
	// with the others (WorkflowInfo's counts are of the batch's tasks).
	Callback string
	// Retention is how long the flow is kept after it ends.
	Retention time.Duration
	CreatedAt time.Time
}

// ReadyStep is a step whose dependencies have finished (or that has none):
// its task is to be enqueued, then confirmed with ReleaseSteps.
type ReadyStep struct {
	Name string
	Task *tidetype.TaskInfo
}

// Flows is the part of Broker that keeps workflows and batches; both
// shipped brokers have it. A flow's bookkeeping lives in one place (one hash slot
// of Redis Cluster) apart from its tasks; every method is safe to run twice:
// a second run changes nothing and answers like the first, so a caller that
// lost an answer calls again.
//
// The protocol: CreateFlow stores the flow and names the steps without
// dependencies; the caller enqueues their tasks and confirms with
// ReleaseSteps. When a step's task finishes, EndStep records it and returns
// the dependents now ready, which are enqueued and released the same way.
// A caller that dies between EndStep and ReleaseSteps leaves the steps
// ready: EndStep run again for the same step returns them again (its
// follow-up task is retried). A creator that dies before it confirmed the
// creation (ConfirmFlow) leaves the flow on the list that RepairFlows
// reads: whoever repairs it releases its ready steps (ReadySteps), or
// cancels a flow whose steps were not all stored.
type Flows interface {
	// CreateFlow stores f and returns the steps without dependencies that
	// are not released yet. A flow with f's ID and Digest is not stored
	// again: its unreleased ready steps are returned. Another flow with the
	// ID gives ErrFlowExists.
	CreateFlow(ctx context.Context, f *Flow) ([]ReadyStep, error)

	// EndStep records that the task taskID of the flow's step ended:
	// succeeded, or failed with reason. It returns the steps that are
	// ready because of it (and not released yet). A failed step cancels
	// the dependents that do not run on failure, and theirs in turn. A step
	// that already ended keeps its first outcome, but for one that
	// CancelFlow cancelled while it was ready and returned (its task may
	// have been stored by a release that was not confirmed): when that
	// task succeeded, the step is recorded succeeded, as an enqueued
	// step's is. A taskID that is not the step's gives ErrFlowNotFound.
	EndStep(ctx context.Context, flow, step, taskID string, succeeded bool, reason string) ([]ReadyStep, error)

	// ReleaseSteps confirms that the tasks of ready steps are stored. It
	// returns those among steps that were cancelled meanwhile (their tasks
	// are to be cancelled).
	ReleaseSteps(ctx context.Context, flow string, steps []string) ([]string, error)

	// CancelFlow cancels the flow: steps not started are cancelled, and
	// the enqueued ones are returned for the caller to cancel their tasks.
	// A flow that ended is left as it is (nothing is returned).
	CancelFlow(ctx context.Context, flow string) ([]tidetype.StepInfo, error)

	// CancelStepTask cancels the task id of queue, a step of a cancelled
	// flow (one CancelFlow returned), so that its end reaches the flow
	// once, whatever the task did meanwhile: a waiting task is archived
	// ("tide: task cancelled") with its follow-up; a running one has its
	// cancellation recorded as by Cancel (its settlement stores the
	// follow-up); a finished one is left as it is, its outcome and result
	// kept, since its follow-up was stored when it ended. It returns
	// ErrTaskNotFound only when nothing will report the step's end: the
	// task is gone (deleted in bulk, trimmed, unreadable) and no follow-up
	// of it is stored; the caller then ends the step itself (EndStep). A
	// task that is not followed (no flow headers) is cancelled as by
	// Cancel. Run again, it answers like the first run.
	CancelStepTask(ctx context.Context, queue, id string) error

	// GetFlow returns the flow; with steps false, without its Steps.
	GetFlow(ctx context.Context, flow string, steps bool) (*tidetype.WorkflowInfo, error)

	// GetStep returns one step of the flow; ErrFlowNotFound when the flow
	// or the step does not exist.
	GetStep(ctx context.Context, flow, step string) (*tidetype.StepInfo, error)

	// ListFlows returns up to limit flows of kind, newest first, from
	// offset, without their steps, and how many there are.
	ListFlows(ctx context.Context, kind tidetype.FlowKind, offset, limit int) ([]*tidetype.WorkflowInfo, int, error)

	// ConfirmFlow records that the creator of a flow released every step
	// CreateFlow returned: the flow leaves the list of RepairFlows.
	ConfirmFlow(ctx context.Context, flow string) error

	// RepairFlows returns up to limit flows whose creation began more than
	// olderThan ago and was never confirmed (ConfirmFlow): their creator
	// may have died with steps ready and not released.
	RepairFlows(ctx context.Context, olderThan time.Duration, limit int) ([]string, error)

	// ReadySteps returns the ready steps of a flow that are not released,
	// with their tasks, for a repair to release them. A flow whose steps
	// were not all stored (its creation stopped halfway) is cancelled
	// instead ("tide: the workflow's creation did not finish"), and none is
	// returned. It returns ErrFlowNotFound for a flow that is not stored.
	ReadySteps(ctx context.Context, flow string) ([]ReadyStep, error)
}
