package tide

import (
	"errors"

	"github.com/tidequeue/tide/broker"
)

// SkipRetry tells the server not to retry a failed task: wrap it in the error a
// handler returns (fmt.Errorf("bad payload: %w", tide.SkipRetry)) and the task
// is archived at once with that error.
//
//lint:ignore ST1012 the API contract names it SkipRetry (it is wrapped, not compared like ErrX values)
var SkipRetry = errors.New("tide: skip retry")

// Errors returned by Client, Server and Inspector. They are the broker's
// sentinels, so errors.Is matches whichever layer reports them.
var (
	// ErrDuplicateTask is returned by Enqueue for a Unique task whose lock is
	// held by an unfinished task with the same queue, type and payload.
	ErrDuplicateTask = broker.ErrDuplicateTask
	// ErrTaskIDConflict is returned by Enqueue when the queue already has a
	// task with the ID given by TaskID.
	ErrTaskIDConflict = broker.ErrTaskIDConflict
	// ErrTaskNotFound is returned when no task has the given queue and ID.
	ErrTaskNotFound = broker.ErrTaskNotFound
	// ErrTaskActive is returned by Delete for a task being processed.
	ErrTaskActive = broker.ErrTaskActive
	// ErrNotReplicated is returned by Enqueue with WaitForReplicas when the
	// replicas did not confirm the task in time; the task is stored.
	ErrNotReplicated = broker.ErrNotReplicated
	// ErrLeaseLost is reported when a worker's lease was taken from it (it
	// expired and the task was recovered); the worker's result is discarded.
	ErrLeaseLost = broker.ErrLeaseLost
	// ErrTaskCanceled is the cause (context.Cause) of a handler's context
	// when the task was cancelled (Client.Cancel,
	// Inspector.CancelProcessing). A cancelled task that returns an error is
	// archived with it.
	ErrTaskCanceled = broker.ErrTaskCanceled
	// ErrClosed is returned by every broker call after the broker was
	// closed.
	ErrClosed = broker.ErrClosed
	// ErrUnavailable is wrapped by the error of a call that could not reach
	// the broker's store (Redis down, a failover in progress). Retry later.
	ErrUnavailable = broker.ErrUnavailable
	// ErrOutcomeUnknown is wrapped (with ErrUnavailable) by the error of a
	// call that was sent but got no answer: it may or may not have taken
	// effect. Enqueue still returns the task's info with its ID; enqueue it
	// again with TaskID(info.ID) to make sure it exists (ErrTaskIDConflict
	// then means the first call stored it), or look it up.
	ErrOutcomeUnknown = broker.ErrOutcomeUnknown
	// ErrLayout is wrapped by the error of a call on a queue whose partition
	// count recorded in Redis differs from the one this process was
	// configured with; Server.Start fails with it.
	ErrLayout = broker.ErrLayout
	// ErrInvalidTask is wrapped by every error that rejects a task or option
	// before it is stored (empty type, bad queue name, negative delay,
	// over-size payload, ...). The message names the problem.
	ErrInvalidTask = broker.ErrInvalidTask
	// ErrQueueNotEmpty is wrapped by the error of Inspector.DeleteQueue for
	// a queue that still holds tasks.
	ErrQueueNotEmpty = broker.ErrQueueNotEmpty
	// ErrFlowStep is wrapped by the error of Inspector.RunTask for an
	// archived workflow step or batch task: its end is recorded with its
	// workflow, so it does not run again (RunAllTasks passes over such
	// tasks).
	ErrFlowStep = broker.ErrFlowStep
	// ErrInternalTask is wrapped by the error of Delete, Cancel,
	// Inspector.ArchiveTask and Inspector.CancelProcessing for a workflow
	// follow-up (FlowType): tide's own bookkeeping of a step's end, which
	// finishes by itself (bulk deletes and archives pass over it).
	ErrInternalTask = broker.ErrInternalTask
	// ErrTaskState is wrapped by the error of Inspector.RunTask,
	// Inspector.ArchiveTask and Inspector.CancelProcessing for a task whose
	// state does not allow the action (running a pending task, archiving an
	// active one, ...); the message names the state.
	ErrTaskState = broker.ErrTaskState
)

// ErrServerClosed is returned by Server.Start and Server.Run after Shutdown.
var ErrServerClosed = errors.New("tide: server closed")

// ErrClientClosed is returned by Client methods after Close.
var ErrClientClosed = errors.New("tide: client closed")

// ErrHandlerNotFound is wrapped by the error ServeMux returns for a task type
// with no handler. It is retried like any failure, so a handler deployed
// later still gets the task.
var ErrHandlerNotFound = errors.New("tide: no handler for task type")

// ErrInvalidConfig is wrapped by the error NewServer stores and Start returns
// for a Config with a bad value.
var ErrInvalidConfig = errors.New("tide: invalid config")

// ErrNotSupported is wrapped by the error of a call that needs a part of
// the broker it does not have (its Admin for the Inspector, Flows for
// workflows, ...; see broker.Broker). The error names what is missing.
var ErrNotSupported = broker.ErrNotSupported
