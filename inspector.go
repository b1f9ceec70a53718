package tide

import (
	"context"

	"github.com/tidequeue/tide/broker"
)

// Inspector reads and changes the state of queues and tasks: the admin API
// behind the CLI and the dashboard. It is safe for concurrent use.
type Inspector struct {
	b broker.Broker
}

// NewInspector returns an Inspector of b. It panics if b is nil.
func NewInspector(b broker.Broker) *Inspector {
	if b == nil {
		panic("tide: NewInspector: nil broker")
	}
	return &Inspector{b: b}
}

// GetTaskInfo returns the task with the given queue and ID, or
// ErrTaskNotFound.
func (in *Inspector) GetTaskInfo(ctx context.Context, queue, id string) (*TaskInfo, error) {
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if err := validateName("task ID", id); err != nil {
		return nil, err
	}
	m, err := in.b.GetTask(ctx, queue, id)
	if err != nil {
		return nil, err
	}
	return newTaskInfo(m), nil
}

// DeleteTask deletes a task that is not active; see Client.Delete.
func (in *Inspector) DeleteTask(ctx context.Context, queue, id string) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	if err := validateName("task ID", id); err != nil {
		return err
	}
	return in.b.Delete(ctx, queue, id)
}

// PauseQueue stops servers from taking tasks of queue until UnpauseQueue.
// Tasks keep being enqueued, and scheduled tasks keep becoming pending.
func (in *Inspector) PauseQueue(ctx context.Context, queue string) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	return in.b.Pause(ctx, queue)
}

// UnpauseQueue resumes a paused queue.
func (in *Inspector) UnpauseQueue(ctx context.Context, queue string) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	return in.b.Unpause(ctx, queue)
}
