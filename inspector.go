package tide

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Inspector reads and changes the state of queues and tasks: the admin API
// behind the CLI and the dashboard. Every call is bounded in cost: listings
// page, and the bulk operations work through a state in chunks. It is safe
// for concurrent use. Methods other than GetTaskInfo, DeleteTask, PauseQueue
// and UnpauseQueue need a broker that implements broker.Admin (both shipped
// brokers do) and return ErrNotSupported otherwise.
type Inspector struct {
	b     broker.Broker
	admin broker.Admin
}

// NewInspector returns an Inspector of b. It panics if b is nil.
func NewInspector(b broker.Broker) *Inspector {
	if b == nil {
		panic("tide: NewInspector: nil broker")
	}
	a, _ := b.(broker.Admin)
	return &Inspector{b: b, admin: a}
}

// QueueInfo describes a queue.
type QueueInfo struct {
	Queue  string
	Paused bool
	// Size is the number of tasks in every state.
	Size                                                   int
	Pending, Active, Scheduled, Retry, Archived, Completed int
	// Processed and Failed count attempts finished today (UTC); Processed
	// includes the failed ones.
	Processed, Failed int
	// Latency is how long the oldest pending task has been due; 0 when
	// nothing is pending.
	Latency time.Duration
}

// DailyStats are a queue's counters for one UTC day.
type DailyStats struct {
	Queue     string
	Date      time.Time
	Processed int
	Failed    int
}

// ServerInfo describes a live server.
type ServerInfo struct {
	ID          string
	Host        string
	PID         int
	Concurrency int
	Queues      map[string]int
	Strict      bool
	StartedAt   time.Time
	// Active lists the tasks the server is running.
	Active []ActiveTaskInfo
}

// ActiveTaskInfo is a task a server is running.
type ActiveTaskInfo struct {
	Queue, ID, Type string
	StartedAt       time.Time
}

// SchedulerEntryInfo describes a periodic task of a live Scheduler.
type SchedulerEntryInfo struct {
	SchedulerID, ID, Spec, Type, Queue string
	Next, Prev                         time.Time
}

func (in *Inspector) needAdmin() error {
	if in.admin == nil {
		return ErrNotSupported
	}
	return nil
}

func checkQueueAndID(queue, id string) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	return validateName("task ID", id)
}

// Queues returns the names of all queues, sorted.
func (in *Inspector) Queues(ctx context.Context) ([]string, error) {
	if err := in.needAdmin(); err != nil {
		return nil, err
	}
	return in.admin.Queues(ctx)
}

// QueueInfo returns sizes by state, today's counters, pause state and
// latency of queue.
func (in *Inspector) QueueInfo(ctx context.Context, queue string) (*QueueInfo, error) {
	if err := in.needAdmin(); err != nil {
		return nil, err
	}
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	s, err := in.admin.QueueStats(ctx, queue)
	if err != nil {
		return nil, err
	}
	qi := &QueueInfo{
		Queue: queue, Paused: s.Paused, Processed: s.Processed, Failed: s.Failed,
		Pending: s.Sizes[broker.StatePending], Active: s.Sizes[broker.StateActive],
		Scheduled: s.Sizes[broker.StateScheduled], Retry: s.Sizes[broker.StateRetry],
		Archived: s.Sizes[broker.StateArchived], Completed: s.Sizes[broker.StateCompleted],
	}
	qi.Size = qi.Pending + qi.Active + qi.Scheduled + qi.Retry + qi.Archived + qi.Completed
	if !s.OldestPending.IsZero() {
		qi.Latency = max(time.Since(s.OldestPending), 0)
	}
	return qi, nil
}

// History returns the counters of the last n days (1 to 90), newest first.
func (in *Inspector) History(ctx context.Context, queue string, n int) ([]DailyStats, error) {
	if err := in.needAdmin(); err != nil {
		return nil, err
	}
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	ds, err := in.admin.History(ctx, queue, n)
	if err != nil {
		return nil, err
	}
	out := make([]DailyStats, len(ds))
	for i, d := range ds {
		out[i] = DailyStats{Queue: queue, Date: d.Date, Processed: d.Processed, Failed: d.Failed}
	}
	return out, nil
}

// GetTaskInfo returns the task with the given queue and ID, or
// ErrTaskNotFound.
func (in *Inspector) GetTaskInfo(ctx context.Context, queue, id string) (*TaskInfo, error) {
	if err := checkQueueAndID(queue, id); err != nil {
		return nil, err
	}
	m, err := in.b.GetTask(ctx, queue, id)
	if err != nil {
		return nil, err
	}
	return newTaskInfo(m), nil
}

// MaxPageSize is the largest page ListTasks returns.
const MaxPageSize = 1000

// ListTasks returns page number page (from 1) of size tasks of queue in
// state: pending oldest first, scheduled and retry by due time, archived and
// completed by time, active by lease expiry. size must be 1 to MaxPageSize.
func (in *Inspector) ListTasks(ctx context.Context, queue string, state TaskState, page, size int) ([]*TaskInfo, error) {
	if err := in.needAdmin(); err != nil {
		return nil, err
	}
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if page < 1 || size < 1 || size > MaxPageSize {
		return nil, fmt.Errorf("%w: page %d, size %d: page must be at least 1 and size 1 to %d", ErrInvalidTask, page, size, MaxPageSize)
	}
	if state < StatePending || state > StateCompleted {
		return nil, fmt.Errorf("%w: unknown state %d", ErrInvalidTask, state)
	}
	ms, err := in.admin.ListTasks(ctx, queue, broker.State(state), (page-1)*size, size)
	if err != nil {
		return nil, err
	}
	out := make([]*TaskInfo, len(ms))
	for i, m := range ms {
		out[i] = newTaskInfo(m)
	}
	return out, nil
}

// DeleteTask deletes a task that is not active; see Client.Delete.
func (in *Inspector) DeleteTask(ctx context.Context, queue, id string) error {
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.b.Delete(ctx, queue, id)
}

// RunTask makes a scheduled, retry or archived task pending now.
func (in *Inspector) RunTask(ctx context.Context, queue, id string) error {
	if err := in.needAdmin(); err != nil {
		return err
	}
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.admin.RunTask(ctx, queue, id)
}

// ArchiveTask archives a pending, scheduled or retry task.
func (in *Inspector) ArchiveTask(ctx context.Context, queue, id string) error {
	if err := in.needAdmin(); err != nil {
		return err
	}
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.admin.ArchiveTask(ctx, queue, id)
}

// bulkChunk is how many tasks one step of a bulk operation handles.
const bulkChunk = 500

func (in *Inspector) bulk(ctx context.Context, queue string, state TaskState,
	step func(context.Context, string, broker.State, int) (int, error)) (int, error) {
	if err := in.needAdmin(); err != nil {
		return 0, err
	}
	if err := ValidateQueueName(queue); err != nil {
		return 0, err
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := step(ctx, queue, broker.State(state), bulkChunk)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// DeleteAllTasks deletes every task of queue in state (not active) in
// chunks, and returns how many it deleted.
func (in *Inspector) DeleteAllTasks(ctx context.Context, queue string, state TaskState) (int, error) {
	return in.bulk(ctx, queue, state, func(ctx context.Context, q string, s broker.State, n int) (int, error) {
		return in.admin.DeleteTasks(ctx, q, s, n)
	})
}

// RunAllTasks makes every scheduled, retry or archived task of queue in
// state pending now, in chunks, and returns how many it moved.
func (in *Inspector) RunAllTasks(ctx context.Context, queue string, state TaskState) (int, error) {
	return in.bulk(ctx, queue, state, func(ctx context.Context, q string, s broker.State, n int) (int, error) {
		return in.admin.RunTasks(ctx, q, s, n)
	})
}

// ArchiveAllTasks archives every pending, scheduled or retry task of queue
// in state, in chunks, and returns how many it archived.
func (in *Inspector) ArchiveAllTasks(ctx context.Context, queue string, state TaskState) (int, error) {
	return in.bulk(ctx, queue, state, func(ctx context.Context, q string, s broker.State, n int) (int, error) {
		return in.admin.ArchiveTasks(ctx, q, s, n)
	})
}

// CancelProcessing cancels the handler's context of an active task on
// whichever server runs it (the cause is ErrTaskCanceled); a handler that
// then returns an error has its task archived. It returns ErrTaskNotFound,
// or an error when the task is not active.
func (in *Inspector) CancelProcessing(ctx context.Context, queue, id string) error {
	if err := in.needAdmin(); err != nil {
		return err
	}
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.admin.CancelProcessing(ctx, queue, id)
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

// Servers returns the live servers and the tasks they are running (as of
// their last heartbeat, at most 5 s old).
func (in *Inspector) Servers(ctx context.Context) ([]*ServerInfo, error) {
	if err := in.needAdmin(); err != nil {
		return nil, err
	}
	ss, err := in.admin.Servers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*ServerInfo, len(ss))
	for i, s := range ss {
		si := &ServerInfo{ID: s.ID, Host: s.Host, PID: s.PID, Concurrency: s.Concurrency, Queues: s.Queues, Strict: s.Strict, StartedAt: s.StartedAt}
		for _, a := range s.Active {
			si.Active = append(si.Active, ActiveTaskInfo{Queue: a.Queue, ID: a.ID, Type: a.Type, StartedAt: a.StartedAt})
		}
		out[i] = si
	}
	return out, nil
}

// SchedulerEntries returns the periodic tasks of the live schedulers.
func (in *Inspector) SchedulerEntries(ctx context.Context) ([]*SchedulerEntryInfo, error) {
	if err := in.needAdmin(); err != nil {
		return nil, err
	}
	es, err := in.admin.SchedulerEntries(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*SchedulerEntryInfo, len(es))
	for i, e := range es {
		out[i] = &SchedulerEntryInfo{SchedulerID: e.SchedulerID, ID: e.ID, Spec: e.Spec, Type: e.Type, Queue: e.Queue, Next: e.Next, Prev: e.Prev}
	}
	return out, nil
}
