// Package tidetype holds the types that tide's packages share: a task's
// state and stored form, a queue's sizes and counters, a live server and a
// periodic entry. Each is defined once, here; the root package re-exports
// them with type aliases (tide.TaskInfo is tidetype.TaskInfo), the brokers
// store and return them, and the dashboard and CLI show them. Users import
// the root package; this one exists so that the broker contract can name the
// types without importing the root package.
package tidetype

import (
	"strings"
	"time"
)

// TaskState is where a task is in its life:
//
//	Scheduled/Pending -> Active (leased) -> done (deleted, or Completed
//	for a task with Retention) | Retry (back-off, then Pending) | Archived
//	| Waiting (a durable handler parked in tide.Sleep or tide.WaitSignal,
//	then Pending when its time comes or its signal arrives)
//
// The zero value is not a valid state. Waiting was added after Completed,
// so the numbers of the other states did not change.
type TaskState int

// Task states.
const (
	StatePending TaskState = iota + 1
	StateActive
	StateScheduled
	StateRetry
	StateArchived
	StateCompleted
	// StateWaiting: a durable handler parked the task (tide.Sleep,
	// tide.WaitSignal); it holds no worker, lease or slot. TaskInfo.WaitingFor
	// says what it waits for and NextProcessAt until when.
	StateWaiting
)

// States lists every valid state in order.
var States = []TaskState{StatePending, StateActive, StateScheduled, StateRetry, StateArchived, StateCompleted, StateWaiting}

// String returns the lower-case name of the state ("pending", ...), or
// "unknown" for an invalid value.
func (s TaskState) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateActive:
		return "active"
	case StateScheduled:
		return "scheduled"
	case StateRetry:
		return "retry"
	case StateArchived:
		return "archived"
	case StateCompleted:
		return "completed"
	case StateWaiting:
		return "waiting"
	}
	return "unknown"
}

// Valid reports whether s is one of the seven states.
func (s TaskState) Valid() bool { return s >= StatePending && s <= StateWaiting }

// ParseTaskState returns the state named name ("pending", ...).
func ParseTaskState(name string) (TaskState, bool) {
	for _, s := range States {
		if s.String() == name {
			return s, true
		}
	}
	return 0, false
}

// TaskInfo is a task as it is stored: what Client.Enqueue returns, what the
// Inspector lists and what a broker hands to a worker. Times have
// millisecond precision. A TaskInfo is a snapshot: changing it changes
// nothing stored.
type TaskInfo struct {
	ID      string
	Queue   string
	Type    string
	Payload []byte
	Headers map[string]string

	State    TaskState
	MaxRetry int
	Retried  int
	LastErr  string

	// NextProcessAt is when the task is (or was) due: for a pending task
	// when it became ready, for scheduled and retry tasks when it will.
	NextProcessAt time.Time
	EnqueuedAt    time.Time
	LastFailedAt  time.Time
	CompletedAt   time.Time

	Timeout   time.Duration // per attempt; 0 means none
	Deadline  time.Time     // absolute; zero means none
	Retention time.Duration // kept as completed this long; 0 means deleted when done

	// Group is the group the task belongs to in its queue (a tenant, a
	// customer; see tide.Group), or empty. Groups are served round-robin
	// and obey the queue's group limits (QueueLimits).
	Group string

	// UniqueKey, when not empty, names the uniqueness lock the task holds
	// from Enqueue until it finishes or UniqueTTL passes.
	UniqueKey string
	UniqueTTL time.Duration

	// Result is what the handler stored with WriteResult.
	Result []byte

	// Progress is what the task last reported with tide.ReportProgress;
	// zero when it reported nothing.
	Progress Progress

	// IdempotencyKey is the key an Enqueue was made idempotent under (see
	// tide.IdempotencyKey). It is part of the request, not stored with the
	// task.
	IdempotencyKey string

	// Attempts lists the task's latest attempts that failed (at most
	// MaxAttempts, oldest first), and the one that succeeded when the task
	// is kept as completed. A task whose first attempt succeeded has none.
	Attempts []Attempt

	// For an active task, as of the running server's last heartbeat: when
	// the attempt started, on which server, and when its lease runs out
	// unless renewed. Zero for tasks that are not active.
	StartedAt      time.Time
	Server         string
	LeaseExpiresAt time.Time

	// Steps lists what the task's durable handler stored (tide.Step,
	// tide.Sleep, tide.WaitSignal) and the signals sent to it
	// (tide.Client.Signal), in the order they were stored (see StepInfo
	// for how each shows). GetTask fills it; lists of tasks leave it
	// empty.
	Steps []StepInfo
	// WaitingFor, for a task in StateWaiting, says what it waits for:
	// "sleep:<name>" or "signal:<name>"; NextProcessAt is until when.
	WaitingFor string
}

// MaxAttempts is how many attempts a task's history keeps.
const MaxAttempts = 10

// Attempt is one run of a task's handler.
type Attempt struct {
	Started, Ended time.Time // Started is zero when unknown (lease expired)
	Server         string
	// Outcome is "retry", "archive", "done", "lease expired" or "deferred"
	// (the handler returned tide.RetryAfter).
	Outcome string
	Err     string // bounded to 1 KiB
}

// QueueInfo describes a queue: its sizes by state, today's counters and its
// pause state.
type QueueInfo struct {
	Queue  string
	Paused bool
	// PausedUntil is when a pause made with a duration (PauseQueueFor)
	// ends; zero when the queue is not paused or paused until unpaused.
	PausedUntil time.Time
	// Size is the number of tasks in every state together. Retry also
	// counts the tasks parked by a durable handler (StateWaiting), which
	// wait for their time like retry tasks.
	Size                                                   int
	Pending, Active, Scheduled, Retry, Archived, Completed int
	// Processed and Failed count attempts finished today (UTC); Processed
	// includes the failed ones.
	Processed, Failed int
	// OldestPending is when the oldest pending task became due; zero when
	// nothing is pending. Latency is how long ago that was.
	OldestPending time.Time
	Latency       time.Duration
	// Overdue counts scheduled and retry tasks whose due time has passed
	// but that are not pending yet: nonzero for more than a moment means
	// no server maintains the queue.
	Overdue int
}

// Point is one minute of a queue's activity.
type Point struct {
	At        time.Time // the minute's start
	Processed int       // attempts finished in the minute, failed ones included
	Failed    int
	Pending   int // tasks pending at the minute's last sample (-1: no sample)
}

// TaskFilter selects tasks in a search. Empty fields match everything;
// strings match as substrings, case-sensitively.
type TaskFilter struct {
	ID      string
	Type    string
	Payload string
	Err     string
}

// Match reports whether t passes the filter.
func (f TaskFilter) Match(t *TaskInfo) bool {
	return strings.Contains(t.ID, f.ID) && strings.Contains(t.Type, f.Type) &&
		strings.Contains(string(t.Payload), f.Payload) && strings.Contains(t.LastErr, f.Err)
}

// StoreInfo describes the store behind a broker (for the Redis broker, the
// Redis server or cluster).
type StoreInfo struct {
	Kind             string // "redis", "memory"
	Version          string
	Mode             string // "standalone", "cluster", "sentinel", ""
	UsedMemory       int64  // bytes; summed over a cluster's primaries
	MaxMemory        int64  // 0: no limit
	EvictionPolicy   string
	ConnectedClients int
	Nodes            int // primaries in a cluster, 1 otherwise
}

// Count returns the number of tasks in state s.
func (q *QueueInfo) Count(s TaskState) int {
	switch s {
	case StatePending:
		return q.Pending
	case StateActive:
		return q.Active
	case StateScheduled:
		return q.Scheduled
	case StateRetry:
		return q.Retry
	case StateArchived:
		return q.Archived
	case StateCompleted:
		return q.Completed
	}
	return 0
}

// SetCount sets the number of tasks in state s and keeps Size the sum.
func (q *QueueInfo) SetCount(s TaskState, n int) {
	switch s {
	case StatePending:
		q.Pending = n
	case StateActive:
		q.Active = n
	case StateScheduled:
		q.Scheduled = n
	case StateRetry:
		q.Retry = n
	case StateArchived:
		q.Archived = n
	case StateCompleted:
		q.Completed = n
	}
	q.Size = q.Pending + q.Active + q.Scheduled + q.Retry + q.Archived + q.Completed
}

// DailyStats are a queue's counters for one UTC day.
type DailyStats struct {
	Queue     string
	Date      time.Time // midnight UTC
	Processed int       // attempts finished, failed ones included
	Failed    int
}

// ServerInfo describes a live server, as of its last heartbeat.
type ServerInfo struct {
	ID             string
	Host           string
	PID            int
	Concurrency    int
	Queues         map[string]int
	StrictPriority bool
	StartedAt      time.Time
	// Active lists the tasks the server is running.
	Active []ActiveTask
}

// ActiveTask is a task a server is running.
type ActiveTask struct {
	Queue     string
	ID        string
	Type      string
	StartedAt time.Time
}

// SchedulerEntry is one periodic task of a live Scheduler.
type SchedulerEntry struct {
	SchedulerID string
	ID          string
	Spec        string
	Type        string
	Queue       string
	Next        time.Time
	Prev        time.Time // zero before the first tick
	// Location names the time zone the spec is read in when it has no
	// CRON_TZ= prefix ("UTC" by default).
	Location string
}

// QueueLimits bounds how a queue's tasks run, across all servers together.
// The zero value sets no limit. Limits are kept in the store, so they hold
// for every server and change without restarting any.
type QueueLimits struct {
	// Concurrency is the most tasks of the queue that run at once, counted
	// over all servers; 0 means no limit. A task counts from the moment it
	// is handed to a worker until it is settled or its lease expires and is
	// recovered. It is the queue's, however many partitions the queue has:
	// a broker with partitions lets the limit's slots follow the backlog,
	// so that tasks waiting in one partition can run up to the whole limit.
	Concurrency int

	// Rate is the most tasks of the queue that start in any period of
	// Rate.Per, counted over all servers; the zero Rate means no limit.
	// Like Concurrency it is the queue's, whatever its partition count. A
	// task waiting for its turn stays pending: waiting uses no retry. A
	// Rate set, raised, lowered or lengthened counts the starts made before
	// the change within its period.
	Rate Rate

	// GroupConcurrency is the most tasks of one group (tide.Group) that run
	// at once, counted over all servers; 0 means no limit. A group's tasks
	// live in one partition, so the limit is not split.
	GroupConcurrency int

	// GroupRate is the most tasks of one group that start in any period of
	// GroupRate.Per (a sliding window); the zero Rate means no limit.
	// Unlike Rate, a GroupRate set anew or given a longer Per counts only
	// the starts made after the change (a group's starts are kept only
	// while the queue has a GroupRate, and only within its Per); changing
	// its Limit, or shortening its Per, keeps counting.
	GroupRate Rate

	// Ordered makes every group a sequence: its tasks start one at a time,
	// in enqueue order, the next only after the previous finished
	// (succeeded, archived or deleted). A task waiting to be retried, or
	// deferred with RetryAfter, holds its group's place.
	Ordered bool
}

// Grouped reports whether l sets a limit on groups (GroupConcurrency,
// GroupRate or Ordered).
func (l QueueLimits) Grouped() bool {
	return l.GroupConcurrency > 0 || l.GroupRate.Limit > 0 || l.Ordered
}

// GroupInfo describes one group of a queue (tide.Group): its backlog and
// whether it is held back.
type GroupInfo struct {
	Queue string
	Group string
	// Waiting counts the group's tasks that are ready to start (pending);
	// Running those that are active.
	Waiting, Running int
	// ThrottledUntil is when a throttle (tide.ThrottleGroup) or the group's
	// rate limit stops holding the group back; zero when neither does.
	ThrottledUntil time.Time
}

// Rate is a number of task starts per period: Limit starts in any window of
// length Per (a sliding window, exact to the millisecond). The zero Rate
// means no limit.
type Rate struct {
	Limit int
	Per   time.Duration
}
