package broker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

// ErrInvalidTask is wrapped by every error that rejects a task or an option
// before it is stored (empty type, bad queue name, negative delay, over-size
// payload, ...). The message names the problem. The root package re-exports
// it.
var ErrInvalidTask = errors.New("tide: invalid task")

// ErrQueueNotEmpty is wrapped by the error of Admin.DeleteQueue for a queue
// that still holds tasks.
var ErrQueueNotEmpty = errors.New("tide: queue is not empty")

// Admin is the operator side of a broker (a part of Broker): what the
// Inspector, the CLI and the dashboard use; both shipped brokers have it.
//
// Every method is bounded in cost: listings page, bulk operations handle at
// most limit tasks per call (callers loop), and nothing scans all tasks of a
// queue in one step.
type Admin interface {
	// Queues returns the names of all queues ever used, sorted.
	Queues(ctx context.Context) ([]string, error)

	// QueueInfo returns sizes by state, today's counters and the pause
	// state of queue.
	QueueInfo(ctx context.Context, queue string) (*tidetype.QueueInfo, error)

	// History returns processed and failed counts of the last days days,
	// newest first (UTC days).
	History(ctx context.Context, queue string, days int) ([]tidetype.DailyStats, error)

	// ListTasks returns up to limit tasks of queue in state, skipping offset:
	// pending oldest first, scheduled and retry by due time, archived and
	// completed by time, active by lease expiry. Retry and waiting tasks
	// lie together: listing either state lists both, by due time, a
	// waiting one with TaskInfo.WaitingFor and Steps (SearchTasks keeps
	// one state only).
	ListTasks(ctx context.Context, queue string, state tidetype.TaskState, offset, limit int) ([]*tidetype.TaskInfo, error)

	// SearchTasks reads the tasks of queue in state from offset, in the
	// order of ListTasks, and returns up to limit that match f, with the
	// offset to continue from (-1 when the state holds no more). A call
	// looks at a bounded number of tasks, so it may return fewer than limit
	// with a next offset: call again. Unlike ListTasks, which lists the
	// retry and waiting tasks together (they lie together, by due time),
	// it returns only tasks in state: a search of StateWaiting lists the
	// parked tasks alone, with TaskInfo.WaitingFor.
	SearchTasks(ctx context.Context, queue string, state tidetype.TaskState, f tidetype.TaskFilter, offset, limit int) (tasks []*tidetype.TaskInfo, next int, err error)

	// Series returns one point per minute from since (at most three hours
	// back) to now: attempts processed and failed in the minute, and the
	// pending count sampled in it.
	Series(ctx context.Context, queue string, since time.Time) ([]tidetype.Point, error)

	// StoreInfo describes the store: version, memory, eviction policy,
	// clients.
	StoreInfo(ctx context.Context) (*tidetype.StoreInfo, error)

	// RunTask makes a scheduled, retry or archived task pending now.
	// ErrTaskNotFound, or an error for a task in another state.
	RunTask(ctx context.Context, queue, id string) error

	// ArchiveTask archives a pending, scheduled or retry task.
	ArchiveTask(ctx context.Context, queue, id string) error

	// RunTasks, ArchiveTasks and DeleteTasks apply the operation to up to
	// limit tasks of queue in state and return how many they handled; 0 means
	// none is left. Active tasks cannot be run, archived or deleted.
	RunTasks(ctx context.Context, queue string, state tidetype.TaskState, limit int) (int, error)
	ArchiveTasks(ctx context.Context, queue string, state tidetype.TaskState, limit int) (int, error)
	DeleteTasks(ctx context.Context, queue string, state tidetype.TaskState, limit int) (int, error)

	// PauseFor pauses queue like Broker.Pause, for d: Dequeue hands out
	// none of its tasks until d has passed (then the queue resumes by
	// itself) or Unpause is called. A later Pause makes the pause
	// indefinite again; d is at least a millisecond.
	PauseFor(ctx context.Context, queue string, d time.Duration) error

	// DeleteQueue forgets an empty queue: it disappears from Queues and its
	// bookkeeping (counters, pause flag, partition count) is deleted. It
	// returns an error wrapping ErrQueueNotEmpty while the queue holds a task
	// in any state; a later Enqueue creates the queue again. Limits set with
	// SetQueueLimits are configuration and outlive it, with what they count
	// (recent starts, group throttles and rate windows) and, where limits are
	// shared among partitions, the partition count: servers started with
	// limits for the queue keep them when it comes back. To forget them too,
	// set the zero limits before deleting the queue. A broker whose queues
	// can be repartitioned keeps a repartitioned queue's partition count
	// (the partitions a repartition retired are never used again).
	DeleteQueue(ctx context.Context, queue string) error

	// CancelProcessing records the cancellation of an active task; the
	// server running it cancels its handler's context (see Broker.Cancel).
	// It returns ErrTaskNotFound when the task does not exist and an error
	// when it is not active.
	CancelProcessing(ctx context.Context, queue, id string) error

	// SetQueueLimits records the limits of queue (see tidetype.QueueLimits),
	// replacing the ones it had; the zero value removes them. Dequeue obeys
	// the new limits from its next call on, on every server: a lower
	// Concurrency hands out nothing until enough running tasks have
	// finished, a higher one wakes idle servers; a rate counts the starts
	// made in its period before the change, also without a rate or under
	// one with a shorter period (a broker records every start for
	// MaxRatePer, at most MaxQueueRate of them). The limits are the
	// queue's, whatever its partition count. Limits that CheckQueueLimits
	// refuses are refused with an error wrapping ErrInvalidTask.
	SetQueueLimits(ctx context.Context, queue string, l tidetype.QueueLimits) error

	// QueueLimits returns the limits recorded for queue; the zero value
	// when it has none.
	QueueLimits(ctx context.Context, queue string) (tidetype.QueueLimits, error)

	// Groups returns up to n groups of queue that have tasks waiting,
	// running or held back by a throttle, the largest backlogs first
	// (ties by name); n is at most MaxGroupsListed.
	Groups(ctx context.Context, queue string, n int) ([]tidetype.GroupInfo, error)

	// Servers returns the live servers.
	Servers(ctx context.Context) ([]tidetype.ServerInfo, error)
	// SchedulerEntries returns the entries of all live schedulers.
	SchedulerEntries(ctx context.Context) ([]tidetype.SchedulerEntry, error)
}

// Bounds of QueueLimits that brokers accept.
const (
	// MaxQueueConcurrency is the largest QueueLimits.Concurrency.
	MaxQueueConcurrency = 1 << 20
	// MaxQueueRate is the largest QueueLimits.Rate.Limit: a broker keeps
	// the start time of each task started within the last Rate.Per.
	MaxQueueRate = 100000
	// MaxRatePer is the longest QueueLimits.Rate.Per.
	MaxRatePer = 7 * 24 * time.Hour
	// MaxGroupRate is the largest QueueLimits.GroupRate.Limit: a broker
	// keeps the start time of each task a group started within the last
	// GroupRate.Per.
	MaxGroupRate = 1000
	// MaxGroupLen is the longest group key, in bytes.
	MaxGroupLen = 128
	// MaxGroupsListed is the most groups Admin.Groups returns.
	MaxGroupsListed = 1000
)

// MaxIDLen is the longest task ID a broker stores, in bytes: above the
// longest that callers may choose (tide.MaxIDLength) with room for the IDs
// brokers derive from them (follow-ups, workflow steps).
const MaxIDLen = 1024

// CheckID reports a task ID that brokers cannot keep: longer than MaxIDLen
// bytes, or holding a control character (brokers keep an ID's own records
// under names made with control characters, such as "\x00"+id, so an ID
// that held one could name another task's). An empty ID is valid: the broker
// chooses one. The error wraps ErrInvalidTask. Brokers call it on every task
// they are asked to store, whatever its path (tide checks IDs earlier, with
// its own, stricter, rules); it is safe for concurrent use.
func CheckID(id string) error {
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: task ID is %d bytes, over %d", ErrInvalidTask, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: task ID %q has a control character at byte %d", ErrInvalidTask, id, i)
		}
	}
	return nil
}

// CheckGroup reports a group key that brokers cannot keep: empty, over
// MaxGroupLen bytes, or holding a control character, '{' or '}' (the
// braces make the hash tag that keeps a group's tasks together, see
// Partition). The error wraps ErrInvalidTask.
func CheckGroup(g string) error {
	if g == "" || len(g) > MaxGroupLen {
		return fmt.Errorf("%w: group key is %d bytes, want 1 to %d", ErrInvalidTask, len(g), MaxGroupLen)
	}
	for i := 0; i < len(g); i++ {
		if c := g[i]; c < 0x20 || c == 0x7f || c == '{' || c == '}' {
			return fmt.Errorf("%w: group key %q has invalid character %q at byte %d (no control characters, braces)", ErrInvalidTask, g, c, i)
		}
	}
	return nil
}

// FreeGroupID reports whether id is the ID of a task of group g that does
// not carry the group as its hash tag: on a queue of several partitions its
// ID's partition may not be its group's, and a broker finds it by its ID
// through an index (the Redis broker: a pointer in the ID's partition).
func FreeGroupID(id, g string) bool {
	return g != "" && id != "" && HashTag(id) != g
}

// CheckQueueLimits reports limits that make no sense (a negative or huge
// Concurrency or GroupConcurrency; a Rate or GroupRate with a negative or
// huge Limit, or whose Per is under a millisecond, not whole milliseconds,
// over MaxRatePer, or set without a Limit) with an error wrapping
// ErrInvalidTask that names the field.
func CheckQueueLimits(l tidetype.QueueLimits) error {
	for _, c := range []struct {
		name string
		v    int
	}{{"Concurrency", l.Concurrency}, {"GroupConcurrency", l.GroupConcurrency}} {
		if c.v < 0 || c.v > MaxQueueConcurrency {
			return fmt.Errorf("%w: QueueLimits.%s %d must be 0 (no limit) to %d", ErrInvalidTask, c.name, c.v, MaxQueueConcurrency)
		}
	}
	if err := checkRate("Rate", l.Rate, MaxQueueRate); err != nil {
		return err
	}
	return checkRate("GroupRate", l.GroupRate, MaxGroupRate)
}

// checkRate checks the rate QueueLimits.<name> against its largest Limit.
func checkRate(name string, r tidetype.Rate, maxLimit int) error {
	switch {
	case r.Limit < 0 || r.Limit > maxLimit:
		return fmt.Errorf("%w: QueueLimits.%s.Limit %d must be 0 (no limit) to %d", ErrInvalidTask, name, r.Limit, maxLimit)
	case r.Limit == 0 && r.Per != 0:
		return fmt.Errorf("%w: QueueLimits.%s.Per %v is set but %s.Limit is 0; leave both zero for no limit", ErrInvalidTask, name, r.Per, name)
	case r.Limit > 0 && (r.Per < time.Millisecond || r.Per > MaxRatePer):
		return fmt.Errorf("%w: QueueLimits.%s.Per %v must be 1ms to %v when %s.Limit is set", ErrInvalidTask, name, r.Per, MaxRatePer, name)
	case r.Per%time.Millisecond != 0:
		return fmt.Errorf("%w: QueueLimits.%s.Per %v must be a whole number of milliseconds", ErrInvalidTask, name, r.Per)
	}
	return nil
}

// Share is partition p's part of a limit split among n partitions: the
// shares differ by at most one, the first ones get the remainder, and they
// add up to limit (10 on 4 partitions: 3, 3, 2, 2).
func Share(limit, n, p int) int {
	if n < 1 {
		return limit
	}
	s := limit / n
	if p < limit%n {
		s++
	}
	return s
}

// Repartitioner is the part of Broker that changes a queue's partitions
// while it is in use (the Redis broker; the in-memory broker has no
// partitions and answers ErrNotSupported).
type Repartitioner interface {
	// Repartition changes queue to n partitions without losing or doubling
	// a task while servers and clients keep working, and returns when it is
	// done; calling it again resumes one that stopped. progress, when not
	// nil, is called with the tasks moved so far and those still to move.
	// The queue's limits hold throughout, over both sets of partitions
	// together.
	Repartition(ctx context.Context, queue string, n int, progress func(moved, left int)) error
}

// Registry is where servers and schedulers announce themselves (a part of
// Broker): what Admin.Servers and Admin.SchedulerEntries read. Both shipped
// brokers have it; a server on a broker without it runs unlisted.
type Registry interface {
	// RegisterServer records (or refreshes) a live server for ttl.
	RegisterServer(ctx context.Context, s tidetype.ServerInfo, ttl time.Duration) error
	// UnregisterServer removes a server's record (on clean shutdown).
	UnregisterServer(ctx context.Context, id string) error
	// RegisterSchedulerEntries records (or refreshes) a scheduler's entries
	// for ttl, replacing what that scheduler recorded before.
	RegisterSchedulerEntries(ctx context.Context, schedulerID string, entries []tidetype.SchedulerEntry, ttl time.Duration) error
}

// NewID returns a new random task ID: 72 random bits as 12 base64url
// characters. An ID is stored twice per task (record field and index), so
// its length is memory: 12 characters fit Redis's 16-byte allocation class,
// where a 22-character form of a UUID needs 32 bytes and the 36-character
// text form 48. Brokers assign it to tasks enqueued without an ID; a
// collision with an existing task (about one in ten thousand among a billion
// live tasks) is detected by the broker, which draws again.
func NewID() string {
	var b [9]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("tide: no randomness for task IDs: " + err.Error()) // crypto/rand never fails on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}
