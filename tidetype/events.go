package tidetype

import "time"

// TaskEventKind says what happened to a task in a TaskEvent. The zero value
// is not a valid kind.
type TaskEventKind uint8

// Task event kinds, in the order a task's life usually produces them.
const (
	// EventEnqueued: the task was stored (Enqueue, a replacement with
	// tide.Replace, a follow-up task a settlement stores).
	EventEnqueued TaskEventKind = iota + 1
	// EventStarted: a worker leased the task and its handler starts.
	EventStarted
	// EventSucceeded: the handler succeeded; the task is deleted, or kept
	// as completed when it has a Retention.
	EventSucceeded
	// EventFailed: an attempt failed (the handler's error, or its lease
	// expired); Err says why. An EventRetrying or EventArchived follows.
	EventFailed
	// EventRetrying: the task will run again: after a failure, when its
	// handler asked to run later (tide.RetryAfter), when a stopping server
	// gave it back, or when an operator ran it (Inspector.RunTask).
	EventRetrying
	// EventArchived: the task failed for good (retries exhausted,
	// SkipRetry, cancelled while running) or an operator archived it.
	EventArchived
	// EventDeleted: the task was deleted (Delete, Inspector.DeleteTask,
	// DeleteAllTasks).
	EventDeleted
	// EventCancelled: the task was cancelled (Cancel, CancelProcessing).
	// A task that was not running is deleted with it; a running one is
	// told to stop, and its end (usually EventFailed then EventArchived)
	// follows.
	EventCancelled
)

// TaskEventKinds lists every valid kind in order.
var TaskEventKinds = []TaskEventKind{EventEnqueued, EventStarted, EventSucceeded, EventFailed, EventRetrying, EventArchived, EventDeleted, EventCancelled}

// String returns the lower-case name of the kind ("enqueued", "started",
// "succeeded", "failed", "retrying", "archived", "deleted", "cancelled"),
// or "unknown".
func (k TaskEventKind) String() string {
	switch k {
	case EventEnqueued:
		return "enqueued"
	case EventStarted:
		return "started"
	case EventSucceeded:
		return "succeeded"
	case EventFailed:
		return "failed"
	case EventRetrying:
		return "retrying"
	case EventArchived:
		return "archived"
	case EventDeleted:
		return "deleted"
	case EventCancelled:
		return "cancelled"
	}
	return "unknown"
}

// Valid reports whether k is one of the eight kinds.
func (k TaskEventKind) Valid() bool { return k >= EventEnqueued && k <= EventCancelled }

// ParseTaskEventKind returns the kind named name ("started", ...).
func ParseTaskEventKind(name string) (TaskEventKind, bool) {
	for _, k := range TaskEventKinds {
		if k.String() == name {
			return k, true
		}
	}
	return 0, false
}

// TaskEvent is one step of a task's life, as recorded by the broker in the
// same atomic step that made it (see tide.Inspector.Events). It carries no
// payload.
type TaskEvent struct {
	// ID is the resume token of the event: reading events again after it
	// (tide.EventsFrom.After) continues with the event that followed it,
	// with no gap and no repeat. It is opaque, and names the position in
	// every stream the reading covered.
	ID string
	// Queue, TaskID and Type name the task.
	Queue, TaskID, Type string
	// Kind is what happened.
	Kind TaskEventKind
	// At is when the broker recorded it (its clock, millisecond precision).
	At time.Time
	// Err is the error that made the task fail, retry or be archived
	// (at most MaxEventErr bytes); empty for other kinds and when there is
	// none.
	Err string
}

// MaxEventErr bounds TaskEvent.Err: longer errors are cut.
const MaxEventErr = 256
