package tidetype

import "time"

// FlowKind says whether a flow is a workflow or a batch.
type FlowKind uint8

// Flow kinds.
const (
	// KindWorkflow: a DAG of named steps (tide.NewWorkflow).
	KindWorkflow FlowKind = iota + 1
	// KindBatch: tasks whose callback runs once all have finished
	// (tide.Client.EnqueueBatch).
	KindBatch
)

// String returns "workflow", "batch" or "unknown".
func (k FlowKind) String() string {
	switch k {
	case KindWorkflow:
		return "workflow"
	case KindBatch:
		return "batch"
	}
	return "unknown"
}

// FlowState is where a workflow or batch is in its life.
type FlowState uint8

// Flow states.
const (
	// FlowRunning: some step has not finished.
	FlowRunning FlowState = iota + 1
	// FlowSucceeded: every step succeeded.
	FlowSucceeded
	// FlowFailed: every step finished and at least one failed or was
	// cancelled because a step it depends on failed.
	FlowFailed
	// FlowCanceled: the flow was cancelled (tide.Client.CancelWorkflow);
	// steps that were running end on their own.
	FlowCanceled
)

// String returns "running", "succeeded", "failed", "cancelled" or "unknown".
func (s FlowState) String() string {
	switch s {
	case FlowRunning:
		return "running"
	case FlowSucceeded:
		return "succeeded"
	case FlowFailed:
		return "failed"
	case FlowCanceled:
		return "cancelled"
	}
	return "unknown"
}

// StepState is where one step of a workflow or batch is.
type StepState uint8

// Step states.
const (
	// StepWaiting: a step it depends on has not finished.
	StepWaiting StepState = iota + 1
	// StepEnqueued: the step's task is stored and runs, or waits to run,
	// like any task (its TaskState tells which).
	StepEnqueued
	// StepSucceeded: the step's task completed.
	StepSucceeded
	// StepFailed: the step's task was archived (retries exhausted,
	// SkipRetry, cancelled while it ran) or deleted.
	StepFailed
	// StepCanceled: the step never ran: a step it depends on failed (and
	// it does not run on failure), or the flow was cancelled.
	StepCanceled
)

// String returns "waiting", "enqueued", "succeeded", "failed", "cancelled"
// or "unknown".
func (s StepState) String() string {
	switch s {
	case StepWaiting:
		return "waiting"
	case StepEnqueued:
		return "enqueued"
	case StepSucceeded:
		return "succeeded"
	case StepFailed:
		return "failed"
	case StepCanceled:
		return "cancelled"
	}
	return "unknown"
}

// Final reports whether the step has finished (succeeded, failed or
// cancelled).
func (s StepState) Final() bool { return s >= StepSucceeded && s <= StepCanceled }

// StepInfo is one step of a workflow or batch (WorkflowInfo.Steps), or
// one record of a durable handler (TaskInfo.Steps): a tide.Step, named as
// given, StepSucceeded once its result is stored; a tide.Sleep, named
// "sleep:<name>", and a tide.WaitSignal, "wait:<name>", StepWaiting with
// their deadline as FinishedAt, or StepFailed for a wait that timed out
// (Err says so); a signal received, "signal:<name>", StepSucceeded at
// FinishedAt.
type StepInfo struct {
	Name   string
	Queue  string
	TaskID string
	// After lists the steps this one depends on.
	After []string
	// RunOnFailure: the step runs even when a step it depends on failed
	// (tide.RunDependents); otherwise such a step is cancelled.
	RunOnFailure bool
	State        StepState
	// Err says why a step failed or was cancelled.
	Err string
	// TaskState is the state of the step's task while it is enqueued, when
	// the reader looked it up (Inspector.GetWorkflow does); zero otherwise.
	TaskState TaskState

	// For a durable handler's record: the size of its stored result or
	// signal payload in bytes, when the step started and when it finished
	// (for a sleep or wait, its deadline).
	ResultSize            int
	StartedAt, FinishedAt time.Time
}

// WorkflowInfo is a workflow or batch as stored. Counts are of steps; a
// batch's callback is one of its steps but is left out of the counts.
type WorkflowInfo struct {
	ID    string
	Kind  FlowKind
	State FlowState
	// Total is the number of steps; Succeeded, Failed and Canceled count
	// those that finished each way.
	Total, Succeeded, Failed, Canceled int
	CreatedAt                          time.Time
	// FinishedAt is when the last step finished (or the flow was
	// cancelled); zero while it runs.
	FinishedAt time.Time
	// Steps in the order they were added; empty when the reader asked for
	// the counts only.
	Steps []StepInfo
	// FailedIDs are the task IDs of the steps that failed, in the order
	// they failed.
	FailedIDs []string
	// Callback names the batch's callback step ("" for none and for
	// workflows).
	Callback string
}

// BatchInfo describes a batch: its members and their outcomes. It is what
// the callback of a batch sees (tide.GetBatch).
type BatchInfo struct {
	ID    string
	State FlowState
	// Total is the number of tasks in the batch, the callback not counted.
	Total int
	// Succeeded and Failed count the members that finished each way.
	Succeeded, Failed int
	// FailedIDs are the task IDs of the members that failed.
	FailedIDs []string
	// CallbackID is the task ID of the callback (tide.OnBatchDone), or
	// empty.
	CallbackID string
	CreatedAt  time.Time
	FinishedAt time.Time
}
