package tide

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/tidequeue/tide/tidetype"
)

// Task is a unit of work: a type that selects the handler, a payload and
// headers carried with it. A Task is not safe for concurrent mutation; build
// it, then hand it to Client.Enqueue.
type Task struct {
	typ     string
	payload []byte
	headers map[string]string
	opts    []Option
	ctx     context.Context // the handler context of a task in a batch (HandleBatch)
}

// NewTask returns a task of the given type with payload. The options are
// defaults for every Enqueue of this task; options given to Enqueue override
// them. NewTask does not validate: Enqueue reports an empty type or an
// over-size payload.
func NewTask(typ string, payload []byte, opts ...Option) *Task {
	return &Task{typ: typ, payload: payload, opts: opts}
}

// Type returns the task type.
func (t *Task) Type() string { return t.typ }

// Context returns the handler context of a task handed to a BatchHandler:
// GetTaskID, GetRetryCount, WriteResult and ReportProgress work on it for
// that task. For any other task it returns context.Background().
func (t *Task) Context() context.Context {
	if t.ctx == nil {
		return context.Background()
	}
	return t.ctx
}

// Payload returns the payload. The slice is shared; do not modify it.
func (t *Task) Payload() []byte { return t.payload }

// Headers returns the headers carried with the task (trace context, ...).
// The map is the task's own: writing to it before Enqueue adds headers.
// It is never nil.
func (t *Task) Headers() map[string]string {
	if t.headers == nil {
		t.headers = make(map[string]string)
	}
	return t.headers
}

// TaskState is where a task is in its life:
//
//	Scheduled/Pending -> Active (leased) -> done (deleted, or Completed
//	for a task with Retention) | Retry (back-off, then Pending) | Archived
type TaskState = tidetype.TaskState

// Task states.
const (
	StatePending   = tidetype.StatePending
	StateActive    = tidetype.StateActive
	StateScheduled = tidetype.StateScheduled
	StateRetry     = tidetype.StateRetry
	StateArchived  = tidetype.StateArchived
	StateCompleted = tidetype.StateCompleted
	// StateWaiting: a durable handler parked the task (Sleep, WaitSignal).
	StateWaiting = tidetype.StateWaiting
)

// TaskInfo describes a stored task: what Enqueue and the Inspector return.
// Its fields are documented on tidetype.TaskInfo, the one definition shared
// with the brokers.
type TaskInfo = tidetype.TaskInfo

// TaskArgs is implemented by the argument structs of typed tasks. TaskType
// returns the task type, and must return the same value for every value of
// the type (it is called on the zero value to route).
type TaskArgs interface {
	TaskType() string
}

// NewTaskFrom returns a task whose type is args.TaskType() and whose payload
// is args encoded as JSON. opts are the task's default options.
func NewTaskFrom[T TaskArgs](args T, opts ...Option) (*Task, error) {
	b, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("tide: encode %s args: %w", args.TaskType(), err)
	}
	return NewTask(args.TaskType(), b, opts...), nil
}
