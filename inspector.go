package tide

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Inspector reads and changes the state of queues and tasks: the admin API
// behind the CLI and the dashboard. Every call is bounded in cost: listings
// page, and the bulk operations work through a state in chunks. It is safe
// for concurrent use. Methods other than GetTaskInfo, DeleteTask, PauseQueue
// and UnpauseQueue need the broker's Admin part (both shipped brokers have
// it); a broker without it answers ErrNotSupported.
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

// QueueInfo describes a queue: sizes by state, today's counters, pause state
// and latency (see tidetype.QueueInfo).
type QueueInfo = tidetype.QueueInfo

// DailyStats are a queue's counters for one UTC day.
type DailyStats = tidetype.DailyStats

// ServerInfo describes a live server and the tasks it is running.
type ServerInfo = tidetype.ServerInfo

// ActiveTask is a task a server is running.
type ActiveTask = tidetype.ActiveTask

// SchedulerEntry describes a periodic task of a live Scheduler.
type SchedulerEntry = tidetype.SchedulerEntry

// Attempt is one run of a task's handler (TaskInfo.Attempts).
type Attempt = tidetype.Attempt

// Point is one minute of a queue's activity (Inspector.Series).
type Point = tidetype.Point

// TaskFilter selects tasks in Inspector.SearchTasks.
type TaskFilter = tidetype.TaskFilter

// StoreInfo describes the store behind the broker (Inspector.StoreInfo).
type StoreInfo = tidetype.StoreInfo

// QueueLimits bounds how a queue's tasks run across all servers together
// (Inspector.SetQueueLimits, Config.QueueLimits); see tidetype.QueueLimits.
type QueueLimits = tidetype.QueueLimits

// Rate is a number of task starts per period (QueueLimits.Rate); see
// tidetype.Rate.
type Rate = tidetype.Rate

// GroupInfo describes one group of a queue (Inspector.Groups); see
// tidetype.GroupInfo.
type GroupInfo = tidetype.GroupInfo

func checkQueueAndID(queue, id string) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	return validateName("task ID", id)
}

// Queues returns the names of all queues, sorted.
func (in *Inspector) Queues(ctx context.Context) ([]string, error) {
	return in.b.Queues(ctx)
}

// QueueInfo returns sizes by state, today's counters, pause state and
// latency of queue.
func (in *Inspector) QueueInfo(ctx context.Context, queue string) (*QueueInfo, error) {
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	return in.b.QueueInfo(ctx, queue)
}

// History returns the counters of the last n days (1 to 90), newest first.
func (in *Inspector) History(ctx context.Context, queue string, n int) ([]DailyStats, error) {
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	return in.b.History(ctx, queue, n)
}

// GetTaskInfo returns the task with the given queue and ID, or
// ErrTaskNotFound. For an active task it also tells when its lease expires
// and, from the live servers' heartbeats (at most 5 s old), on which server
// it runs and since when; those two stay empty when the heartbeats cannot be
// read.
func (in *Inspector) GetTaskInfo(ctx context.Context, queue, id string) (*TaskInfo, error) {
	if err := checkQueueAndID(queue, id); err != nil {
		return nil, err
	}
	t, err := in.b.GetTask(ctx, queue, id)
	if err == nil && t.State == StateActive {
		in.joinRunning(ctx, []*TaskInfo{t})
	}
	return t, err
}

// MaxPageSize is the largest page ListTasks returns.
const MaxPageSize = 1000

// ListTasks returns page number page (from 1) of size tasks of queue in
// state: pending oldest first, scheduled and retry by due time, archived and
// completed by time, active by lease expiry. size must be 1 to MaxPageSize.
func (in *Inspector) ListTasks(ctx context.Context, queue string, state TaskState, page, size int) ([]*TaskInfo, error) {
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if page < 1 || size < 1 || size > MaxPageSize {
		return nil, fmt.Errorf("%w: page %d, size %d: page must be at least 1 and size 1 to %d", ErrInvalidTask, page, size, MaxPageSize)
	}
	if !state.Valid() {
		return nil, fmt.Errorf("%w: unknown state %d", ErrInvalidTask, state)
	}
	ts, err := in.b.ListTasks(ctx, queue, state, (page-1)*size, size)
	if err == nil && state == StateActive {
		in.joinRunning(ctx, ts)
	}
	return ts, err
}

// joinRunning fills in, for active tasks, when they started and on which
// server, from the live servers' heartbeats (at most 5 s old).
func (in *Inspector) joinRunning(ctx context.Context, ts []*TaskInfo) {
	if len(ts) == 0 {
		return
	}
	ss, err := in.b.Servers(ctx)
	if err != nil {
		return // the tasks are shown without it
	}
	type key struct{ queue, id string }
	running := map[key]*ActiveTask{}
	server := map[key]string{}
	for _, s := range ss {
		for i := range s.Active {
			a := &s.Active[i]
			running[key{a.Queue, a.ID}], server[key{a.Queue, a.ID}] = a, s.ID
		}
	}
	for _, t := range ts {
		if a := running[key{t.Queue, t.ID}]; a != nil {
			t.Server, t.StartedAt = server[key{t.Queue, t.ID}], a.StartedAt
		}
	}
}

// SearchTasks returns up to limit tasks of queue in state that match f
// (substrings of the ID, type, payload and last error; empty fields match
// all), reading from offset in the order of ListTasks, and the offset to
// continue from (-1 when nothing is left). One call reads a bounded number
// of tasks, so it may return fewer than limit with a next offset.
func (in *Inspector) SearchTasks(ctx context.Context, queue string, state TaskState, f TaskFilter, offset, limit int) ([]*TaskInfo, int, error) {
	if err := ValidateQueueName(queue); err != nil {
		return nil, -1, err
	}
	if offset < 0 || limit < 1 || limit > MaxPageSize {
		return nil, -1, fmt.Errorf("%w: offset %d, limit %d: offset must not be negative and limit 1 to %d", ErrInvalidTask, offset, limit, MaxPageSize)
	}
	if !state.Valid() {
		return nil, -1, fmt.Errorf("%w: unknown state %d", ErrInvalidTask, state)
	}
	ts, next, err := in.b.SearchTasks(ctx, queue, state, f, offset, limit)
	if err == nil && state == StateActive {
		in.joinRunning(ctx, ts)
	}
	return ts, next, err
}

// Series returns a queue's activity minute by minute from since (at most
// three hours back; the broker keeps two) to now: attempts processed and
// failed, and the pending count. It feeds the dashboard's live view.
func (in *Inspector) Series(ctx context.Context, queue string, since time.Time) ([]Point, error) {
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	return in.b.Series(ctx, queue, since)
}

// StoreInfo describes the store behind the broker: for Redis its version,
// memory used and limit, eviction policy and connected clients.
func (in *Inspector) StoreInfo(ctx context.Context) (*StoreInfo, error) {
	return in.b.StoreInfo(ctx)
}

// DeleteTask deletes a task that is not active; see Client.Delete.
func (in *Inspector) DeleteTask(ctx context.Context, queue, id string) error {
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.b.Delete(ctx, queue, id)
}

// RunTask makes a scheduled, retry or archived task pending now. An
// archived workflow step or batch task is refused with ErrFlowStep: its
// end (failed) is recorded with its workflow, which has moved on.
func (in *Inspector) RunTask(ctx context.Context, queue, id string) error {
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.b.RunTask(ctx, queue, id)
}

// ArchiveTask archives a pending, scheduled or retry task. Archiving is the
// task's end: a workflow step fails (its workflow cancels the steps after
// it, a batch counts it failed) and a task with a NotifyURL notifies, in
// the same atomic step. A workflow follow-up (FlowType) is refused with
// ErrInternalTask.
func (in *Inspector) ArchiveTask(ctx context.Context, queue, id string) error {
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.b.ArchiveTask(ctx, queue, id)
}

// bulkChunk is how many tasks one step of a bulk operation handles.
const bulkChunk = 500

func (in *Inspector) bulk(ctx context.Context, queue string, state TaskState,
	step func(context.Context, string, TaskState, int) (int, error)) (int, error) {
	if err := ValidateQueueName(queue); err != nil {
		return 0, err
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := step(ctx, queue, state, bulkChunk)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// DeleteAllTasks deletes every task of queue in state (not active) in
// chunks, and returns how many it deleted. As Client.Delete, it archives
// workflow steps and batch tasks that have not finished (their end), and
// it passes over workflow follow-ups.
func (in *Inspector) DeleteAllTasks(ctx context.Context, queue string, state TaskState) (int, error) {
	return in.bulk(ctx, queue, state, func(ctx context.Context, q string, s TaskState, n int) (int, error) {
		return in.b.DeleteTasks(ctx, q, s, n)
	})
}

// RunAllTasks makes every scheduled, retry or archived task of queue in
// state pending now, in chunks, and returns how many it moved. Archived
// workflow steps and batch tasks are passed over (see RunTask).
func (in *Inspector) RunAllTasks(ctx context.Context, queue string, state TaskState) (int, error) {
	return in.bulk(ctx, queue, state, func(ctx context.Context, q string, s TaskState, n int) (int, error) {
		return in.b.RunTasks(ctx, q, s, n)
	})
}

// ArchiveAllTasks archives every pending, scheduled or retry task of queue
// in state, in chunks, and returns how many it archived: each one's end,
// as ArchiveTask. Workflow follow-ups are passed over.
func (in *Inspector) ArchiveAllTasks(ctx context.Context, queue string, state TaskState) (int, error) {
	return in.bulk(ctx, queue, state, func(ctx context.Context, q string, s TaskState, n int) (int, error) {
		return in.b.ArchiveTasks(ctx, q, s, n)
	})
}

// CancelProcessing cancels the handler's context of an active task on
// whichever server runs it (the cause is ErrTaskCanceled); a handler that
// then returns an error has its task archived. The cancellation is recorded
// with the task, so a server that misses the notice applies it at its next
// lease renewal. It returns ErrTaskNotFound, or an error when the task is
// not active (Client.Cancel stops a task in any state).
func (in *Inspector) CancelProcessing(ctx context.Context, queue, id string) error {
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return in.b.CancelProcessing(ctx, queue, id)
}

// DeleteQueue forgets an empty queue: it disappears from Queues and its
// counters, pause flag and partition count are deleted. It returns an error
// wrapping ErrQueueNotEmpty while the queue holds a task in any state (delete
// them first with DeleteAllTasks); a later Enqueue creates the queue again.
// A queue that was repartitioned (Repartition) keeps the count it was given
// (the partitions a repartition retired are never used again; repartition
// the queue created again to change it). The queue's limits (SetQueueLimits, Config.QueueLimits) are configuration
// and outlive the deletion, with what they count (a Rate's recent starts,
// group throttles) and the partition count they are shared on, so that
// running servers keep their limits when the queue comes back; set the zero
// QueueLimits first to forget them too.
func (in *Inspector) DeleteQueue(ctx context.Context, queue string) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	return in.b.DeleteQueue(ctx, queue)
}

// PauseQueue stops servers from taking tasks of queue until UnpauseQueue.
// Tasks keep being enqueued, and scheduled tasks keep becoming pending.
func (in *Inspector) PauseQueue(ctx context.Context, queue string) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	return in.b.Pause(ctx, queue)
}

// MaxPauseFor is the longest pause PauseQueueFor accepts.
const MaxPauseFor = 365 * 24 * time.Hour

// PauseQueueFor pauses queue like PauseQueue, for d (1 ms to MaxPauseFor):
// the queue resumes by itself when d has passed (servers pick its tasks up
// within a few seconds of that) or at once with UnpauseQueue. Use it to
// back off from a downstream that is down for a known while. A later
// PauseQueue makes the pause indefinite; QueueInfo.PausedUntil tells when
// it ends. It needs a broker that implements broker.Admin.
func (in *Inspector) PauseQueueFor(ctx context.Context, queue string, d time.Duration) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	if d < time.Millisecond || d > MaxPauseFor {
		return fmt.Errorf("%w: PauseQueueFor(%q, %v): the pause must be 1ms to %v", ErrInvalidTask, queue, d, MaxPauseFor)
	}
	return in.b.PauseFor(ctx, queue, d)
}

// SetQueueLimits records queue's limits in the broker, replacing the ones it
// had; the zero QueueLimits removes them. Every server obeys them from its
// next fetch on (well within a second), without a restart: a lower
// Concurrency starts nothing until enough running tasks have finished, a
// higher one wakes idle servers, and a new Rate counts the starts made in
// its period before the change, also while the queue had no Rate (brokers
// record every start for broker.MaxRatePer). Invalid limits are refused
// with an error wrapping ErrInvalidTask that names the field: a negative
// Concurrency or one over broker.MaxQueueConcurrency; a Rate.Limit that is
// negative or over
// broker.MaxQueueRate; a Rate.Per under a millisecond, over
// broker.MaxRatePer or not whole milliseconds when Rate.Limit is set, or set
// without Rate.Limit. The limits are the queue's whatever its partition
// count: any Concurrency or Rate.Limit of at least 1 is accepted. A server
// started with Config.QueueLimits for the queue writes its own limits again
// at Start. An error does not always mean the limits are unchanged: one
// that comes after the broker recorded them (a reply lost, a layout that
// kept changing under a repartition) may leave them in force; calling
// again with the same limits is safe.
// It needs a broker that implements broker.Admin.
func (in *Inspector) SetQueueLimits(ctx context.Context, queue string, l QueueLimits) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	if err := broker.CheckQueueLimits(l); err != nil {
		return err
	}
	return in.b.SetQueueLimits(ctx, queue, l)
}

// QueueLimits returns the limits recorded for queue: the zero QueueLimits
// when it has none. It needs a broker that implements broker.Admin.
func (in *Inspector) QueueLimits(ctx context.Context, queue string) (QueueLimits, error) {
	if err := ValidateQueueName(queue); err != nil {
		return QueueLimits{}, err
	}
	return in.b.QueueLimits(ctx, queue)
}

// Groups returns up to n groups (Group) of queue that have tasks waiting or
// running or that are throttled, the largest backlogs first: the tenants
// that fill the queue. n is 1 to broker.MaxGroupsListed (1000). It needs a
// broker that implements broker.Admin.
func (in *Inspector) Groups(ctx context.Context, queue string, n int) ([]GroupInfo, error) {
	if err := ValidateQueueName(queue); err != nil {
		return nil, err
	}
	if n < 1 || n > broker.MaxGroupsListed {
		return nil, fmt.Errorf("%w: Groups(%q, %d): n must be 1 to %d", ErrInvalidTask, queue, n, broker.MaxGroupsListed)
	}
	return in.b.Groups(ctx, queue, n)
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
func (in *Inspector) Servers(ctx context.Context) ([]ServerInfo, error) {
	return in.b.Servers(ctx)
}

// SchedulerEntries returns the periodic tasks of the live schedulers.
func (in *Inspector) SchedulerEntries(ctx context.Context) ([]SchedulerEntry, error) {
	return in.b.SchedulerEntries(ctx)
}

// Repartition changes queue to n partitions (1 to 1024) while servers and
// clients keep working: new tasks go to the new partitions at once, waiting
// tasks are moved over, running ones finish where they are, and nothing is
// lost or doubled, whatever step a crash interrupts; calling it again with
// the same n finishes a repartition that stopped. It returns when the old
// partitions are retired, or with ctx's error. progress, when not nil, is
// called with the tasks moved so far and those left in the old partitions.
// It returns ErrNotSupported for a broker without partitions (membroker).
func (in *Inspector) Repartition(ctx context.Context, queue string, n int, progress func(moved, left int)) error {
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	r := in.b
	return r.Repartition(ctx, queue, n, progress)
}
