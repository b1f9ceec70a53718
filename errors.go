package tide

import (
	"errors"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/engine"
)

// SkipRetry tells the server not to retry a failed task: wrap it in the error a
// handler returns (fmt.Errorf("bad payload: %w", tide.SkipRetry)) and the task
// is archived at once with that error.
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
)

// ErrServerClosed is returned by Server.Start and Server.Run after Shutdown.
var ErrServerClosed = errors.New("tide: server closed")

// ErrClientClosed is returned by Client methods after Close.
var ErrClientClosed = errors.New("tide: client closed")

// ErrInvalidTask is wrapped by every error that rejects a task or option
// before it reaches the broker (empty type, bad queue name, negative delay,
// over-size payload, ...). The message names the problem.
var ErrInvalidTask = errors.New("tide: invalid task")

// ErrHandlerNotFound is wrapped by the error ServeMux returns for a task type
// with no handler. It is retried like any failure, so a handler deployed
// later still gets the task.
var ErrHandlerNotFound = errors.New("tide: no handler for task type")

// ErrInvalidConfig is wrapped by the error NewServer stores and Start returns
// for a Config with a bad value.
var ErrInvalidConfig = errors.New("tide: invalid config")

// ErrTaskCanceled is the cause (context.Cause) of a handler's context when an
// operator cancelled the task with Inspector.CancelProcessing. A cancelled
// task that returns an error is archived with this error.
var ErrTaskCanceled = engine.ErrCanceled

// ErrNotSupported is returned by Inspector methods when the broker does not
// implement broker.Admin.
var ErrNotSupported = errors.New("tide: the broker does not support inspection (broker.Admin)")
