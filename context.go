package tide

import (
	"context"
	"errors"
	"time"

	"github.com/tidequeue/tide/broker"
)

type taskCtxKey struct{}

// taskMeta is what a handler's context carries about its task.
type taskMeta struct {
	id, queue, group  string
	retried, maxRetry int
	due               time.Time
	lease             broker.LeaseRef
	b                 broker.Broker
	flow, step        string     // the flow and step headers of a workflow step or batch task
	batch             *BatchInfo // a batch's callback: its batch, loaded before the handler runs
	dur               *durState  // durable records (durable.go); nil outside handlers the server runs
}

func withTaskMeta(ctx context.Context, m *taskMeta) context.Context {
	return context.WithValue(ctx, taskCtxKey{}, m)
}

func metaFrom(ctx context.Context) (*taskMeta, bool) {
	m, ok := ctx.Value(taskCtxKey{}).(*taskMeta)
	return m, ok
}

// GetTaskID returns the ID of the task a handler is processing; ok is false
// when ctx is not a handler's context.
func GetTaskID(ctx context.Context) (id string, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok {
		return "", false
	}
	return m.id, true
}

// GetQueueName returns the queue of the task a handler is processing.
func GetQueueName(ctx context.Context) (queue string, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok {
		return "", false
	}
	return m.queue, true
}

// GetGroup returns the group (Group) of the task a handler is processing:
// empty for a task without one; ok is false when ctx is not a handler's
// context.
func GetGroup(ctx context.Context) (group string, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok {
		return "", false
	}
	return m.group, true
}

// GetRetryCount returns how many times the task has been retried before this
// attempt (0 on the first attempt).
func GetRetryCount(ctx context.Context) (n int, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok {
		return 0, false
	}
	return m.retried, true
}

// GetMaxRetry returns the task's MaxRetry.
func GetMaxRetry(ctx context.Context) (n int, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok {
		return 0, false
	}
	return m.maxRetry, true
}

// GetDueTime returns when the task a handler is processing was due: its
// ProcessAt, retry time, or enqueue time for an immediate task. Handler start
// minus due time is the task's lateness.
func GetDueTime(ctx context.Context) (due time.Time, ok bool) {
	m, ok := metaFrom(ctx)
	if !ok {
		return time.Time{}, false
	}
	return m.due, true
}

// WriteResult stores data as the result of the task a handler is processing;
// it is kept with the task while the task is retained (see Retention) and
// visible through TaskInfo.Result. A later call replaces an earlier one. It
// fails with ErrLeaseLost when the task's lease was lost, and with an error
// when ctx is not a handler's context or data exceeds MaxPayloadSize.
func WriteResult(ctx context.Context, data []byte) error {
	m, ok := metaFrom(ctx)
	if !ok {
		return errors.New("tide: WriteResult called outside a task handler")
	}
	if len(data) > MaxPayloadSize {
		return errors.New("tide: WriteResult: result over MaxPayloadSize")
	}
	return m.b.SetResult(ctx, m.lease, data)
}
