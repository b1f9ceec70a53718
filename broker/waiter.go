package broker

import (
	"context"

	"github.com/tidequeue/tide/tidetype"
)

// Waiter is the part of Broker that tells when a task ends (both shipped
// brokers have it): what tide.Client.Wait uses.
type Waiter interface {
	// Wait blocks until the task is completed or archived and returns it,
	// or until ctx ends. A task deleted when it succeeded (no Retention) is
	// returned with its ID, queue, StateCompleted and CompletedAt only. A
	// task that does not exist, or is deleted or cancelled while waited
	// for, gives an error wrapping ErrTaskNotFound. It does not poll: the
	// step that ends the task wakes the waiter.
	Wait(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error)
}

// ProgressReporter is the part of Broker that keeps a running task's
// progress (tide.ReportProgress); both shipped brokers have it.
type ProgressReporter interface {
	// SetProgress records p for the task of lease; a lease that is no
	// longer current gets ErrLeaseLost. The progress is kept with the
	// task (TaskInfo.Progress) until the task is deleted.
	SetProgress(ctx context.Context, lease LeaseRef, p tidetype.Progress) error
}
