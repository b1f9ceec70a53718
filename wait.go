package tide

import (
	"context"
)

// Wait blocks until the task is completed or archived and returns it, or
// until ctx ends (then it returns ctx's error). It does not poll: the step
// that ends the task wakes the waiter, so Wait returns within a round trip
// of the end. A task with Retention is returned whole, its result
// included; one deleted when it succeeded is returned with its ID, queue,
// StateCompleted and CompletedAt only (give the task a Retention to read
// its result). A task archived after failing is returned with State
// StateArchived and its last error. Wait returns ErrTaskNotFound when there
// is no such task or it is deleted or cancelled while waited for, and
// ErrNotSupported when the broker cannot wait (it does not implement
// broker.Waiter; both shipped brokers do). Wait is safe for concurrent use;
// many waiters share one subscription per queue.
func (c *Client) Wait(ctx context.Context, queue, id string) (*TaskInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	if err := checkQueueAndID(queue, id); err != nil {
		return nil, err
	}
	w := c.b
	return w.Wait(ctx, queue, id)
}

// EnqueueAndWait enqueues t like Enqueue and waits for it like Wait: the
// request/response shape ("resize this image and give me the URL"). Give
// the task a Retention to read its result (TaskInfo.Result). When ctx ends
// first, the task is not cancelled: it still runs, and the error is ctx's.
func (c *Client) EnqueueAndWait(ctx context.Context, t *Task, opts ...Option) (*TaskInfo, error) {
	// The waiter is registered with the task, so a task that ends before
	// Wait looks is still reported.
	info, err := c.enqueue(ctx, t, opts, true)
	if err != nil {
		return nil, err
	}
	return c.Wait(ctx, info.Queue, info.ID)
}
