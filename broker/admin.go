package broker

import (
	"context"
	"time"
)

// Admin is the inspection and operations side of a broker: what the
// Inspector, the CLI and the dashboard use. It is separate from Broker so
// that the hot path stays small; both shipped brokers implement it.
//
// Every method is bounded in cost: listings page, bulk operations handle at
// most limit tasks per call (callers loop), and nothing scans all tasks of a
// queue in one step.
type Admin interface {
	// Queues returns the names of all queues ever used, sorted.
	Queues(ctx context.Context) ([]string, error)

	// QueueStats returns sizes by state and today's counters of queue.
	QueueStats(ctx context.Context, queue string) (*QueueStats, error)

	// History returns processed and failed counts of the last days days,
	// newest first (UTC days).
	History(ctx context.Context, queue string, days int) ([]DayStats, error)

	// ListTasks returns up to limit tasks of queue in state, skipping offset:
	// pending oldest first, scheduled and retry by due time, archived and
	// completed by time, active by lease expiry.
	ListTasks(ctx context.Context, queue string, state State, offset, limit int) ([]*Message, error)

	// RunTask makes a scheduled, retry or archived task pending now.
	// ErrTaskNotFound, or an error for a task in another state.
	RunTask(ctx context.Context, queue, id string) error

	// ArchiveTask archives a pending, scheduled or retry task.
	ArchiveTask(ctx context.Context, queue, id string) error

	// RunTasks, ArchiveTasks and DeleteTasks apply the operation to up to
	// limit tasks of queue in state and return how many they handled; 0 means
	// none is left. Active tasks cannot be run, archived or deleted.
	RunTasks(ctx context.Context, queue string, state State, limit int) (int, error)
	ArchiveTasks(ctx context.Context, queue string, state State, limit int) (int, error)
	DeleteTasks(ctx context.Context, queue string, state State, limit int) (int, error)

	// CancelProcessing asks whichever server runs the active task to cancel
	// its handler's context. It returns ErrTaskNotFound when the task does
	// not exist and an error when it is not active.
	CancelProcessing(ctx context.Context, queue, id string) error

	// RegisterServer records (or refreshes) a live server for ttl.
	RegisterServer(ctx context.Context, s ServerInfo, ttl time.Duration) error
	// UnregisterServer removes a server's record (on clean shutdown).
	UnregisterServer(ctx context.Context, id string) error
	// Servers returns the live servers.
	Servers(ctx context.Context) ([]ServerInfo, error)

	// RegisterSchedulerEntries records (or refreshes) a scheduler's entries
	// for ttl, replacing what that scheduler recorded before.
	RegisterSchedulerEntries(ctx context.Context, schedulerID string, entries []SchedulerEntry, ttl time.Duration) error
	// SchedulerEntries returns the entries of all live schedulers.
	SchedulerEntries(ctx context.Context) ([]SchedulerEntry, error)
}

// QueueStats describes one queue.
type QueueStats struct {
	Queue     string
	Paused    bool
	Sizes     map[State]int // every state, 0 included
	Processed int           // attempts finished today (UTC), failed ones included
	Failed    int           // failed attempts today (UTC)
	// OldestPending is when the oldest pending task became due; zero when
	// nothing is pending. Now minus it is the queue's latency.
	OldestPending time.Time
}

// DayStats are one day's counters of a queue.
type DayStats struct {
	Date      time.Time // midnight UTC
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
	Active      []ActiveTask
}

// ActiveTask is a task a server is processing.
type ActiveTask struct {
	Queue     string
	ID        string
	Type      string
	StartedAt time.Time
}

// SchedulerEntry is one periodic task of a scheduler.
type SchedulerEntry struct {
	SchedulerID string
	ID          string
	Spec        string
	Type        string
	Queue       string
	Next        time.Time
	Prev        time.Time // zero before the first tick
}
