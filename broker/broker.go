// Package broker defines the storage contract of tide.
//
// The root tide package knows storage only through the Broker interface. A
// Broker keeps task messages in queues, hands them out under leases and applies
// the outcome a worker reports. Two implementations ship with tide:
// broker/redisbroker (production) and broker/membroker (in-process, for demos
// and tests). broker/brokertest is the behavioural suite both pass; a new
// implementation must pass it too.
//
// Every method is safe for concurrent use. Methods that take a slice return one
// error per element (nil when that element succeeded) plus an error for the call
// as a whole (the store could not be reached); when the call error is non-nil
// the per-element slice is nil and nothing may be assumed about any element.
package broker

import (
	"context"
	"errors"
	"time"
)

// Errors a Broker reports. The root package re-exports them under the same
// names, so errors.Is works across both.
var (
	// ErrDuplicateTask is returned by Enqueue when a task with the same
	// uniqueness key is still held.
	ErrDuplicateTask = errors.New("tide: task already exists (unique lock held)")
	// ErrTaskIDConflict is returned by Enqueue when a task with the same ID
	// already exists in the queue.
	ErrTaskIDConflict = errors.New("tide: task ID already in use in this queue")
	// ErrTaskNotFound is returned when no task with the given queue and ID exists.
	ErrTaskNotFound = errors.New("tide: task not found")
	// ErrTaskActive is returned by Delete for a task that a worker is
	// processing; cancel it instead.
	ErrTaskActive = errors.New("tide: task is active; cancel it instead of deleting it")
	// ErrLeaseLost is returned for an acknowledgement, lease extension or
	// result write whose token is no longer the task's current lease: the lease
	// expired and the task was recovered (and possibly handed to another
	// worker), or the task was deleted.
	ErrLeaseLost = errors.New("tide: lease lost (stale token)")
	// ErrNotReplicated is returned by Enqueue for a task that asked for
	// replica acknowledgements (WaitReplicas) and did not get them in time.
	// The task is stored on the primary and will most likely be processed;
	// it may be lost only if the primary fails before replicating it.
	ErrNotReplicated = errors.New("tide: task stored but not confirmed by the requested number of replicas")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("tide: broker closed")
)

// State is where a task is in its life.
type State uint8

// Task states. The zero value is not a valid state.
const (
	StatePending State = iota + 1
	StateActive
	StateScheduled
	StateRetry
	StateArchived
	StateCompleted
)

// String returns the lower-case name of the state ("pending", ...).
func (s State) String() string {
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
	}
	return "unknown"
}

// Message is a task as the broker stores it. Times are kept with millisecond
// precision.
type Message struct {
	ID      string
	Queue   string
	Type    string
	Payload []byte
	Headers map[string]string

	State    State
	MaxRetry int
	Retried  int
	LastErr  string

	// ProcessAt is when the task is (or was) due. For a pending task it is the
	// time it became ready; for scheduled and retry tasks the time it will.
	ProcessAt    time.Time
	EnqueuedAt   time.Time
	LastFailedAt time.Time
	CompletedAt  time.Time

	Timeout   time.Duration // per attempt; 0 means none
	Deadline  time.Time     // absolute; zero means none
	Retention time.Duration // keep as completed this long; 0 means delete

	// UniqueKey, when not empty, is the uniqueness lock taken at Enqueue and
	// released when the task finishes; UniqueTTL bounds how long it is held.
	UniqueKey string
	UniqueTTL time.Duration

	// Result is what the handler wrote with WriteResult (read-only views).
	Result []byte

	// WaitReplicas, when positive, asks Enqueue to confirm that this many
	// replicas have the task before reporting success, waiting at most
	// WaitTimeout; otherwise the task's error is ErrNotReplicated. Brokers
	// without replicas ignore it.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// Delivery is a message handed to a worker under a lease.
type Delivery struct {
	Message *Message
	// Token is the fencing token of this delivery. Every acknowledgement,
	// extension and result write carries it; a stale token is refused with
	// ErrLeaseLost.
	Token uint64
	// LeaseFor is how long the lease lasts from the moment of delivery.
	LeaseFor time.Duration
}

// LeaseRef names one delivery's lease.
type LeaseRef struct {
	Queue string
	ID    string
	Token uint64
}

// Outcome is what a worker reports for a delivery.
type Outcome uint8

// Outcomes of a delivery.
const (
	// OutcomeDone: the handler succeeded. The task is deleted, or kept as
	// completed when its Retention is positive.
	OutcomeDone Outcome = iota + 1
	// OutcomeRetry: the handler failed; the task waits in retry until
	// Settlement.RetryAt with Retried incremented.
	OutcomeRetry
	// OutcomeArchive: the task failed for good (SkipRetry, retries exhausted,
	// undecodable) and is archived with Settlement.Err.
	OutcomeArchive
	// OutcomeRequeue: the worker gives the task back without it counting as
	// an attempt (shutdown); it is pending again at once.
	OutcomeRequeue
)

// Settlement reports the outcome of one delivery.
type Settlement struct {
	Lease   LeaseRef
	Outcome Outcome
	// Message is the delivered message; brokers may use it to write the new
	// record without reading the old one.
	Message *Message
	// Err is the failure message for OutcomeRetry and OutcomeArchive.
	Err string
	// RetryAt is when a retried task becomes pending again.
	RetryAt time.Time
	// At is when the outcome happened (LastFailedAt or CompletedAt).
	At time.Time
}

// MaintainRequest asks a broker to maintain one partition of a queue.
type MaintainRequest struct {
	Queue     string
	Partition int
	// Owner identifies the calling server. A partition is maintained by one
	// owner at a time; the claim lasts OwnerTTL and is renewed by each call.
	Owner    string
	OwnerTTL time.Duration
	// Now is the caller's clock; tasks due at or before it are forwarded.
	Now time.Time
	// NoTrim skips deleting completed tasks past their retention and
	// trimming the archive; callers that maintain often trim now and then.
	NoTrim bool
}

// MaintainResult reports what Maintain did and when to call again.
type MaintainResult struct {
	// Owned reports whether the caller holds the partition. When false
	// nothing was changed and RetryIn says when the current claim expires.
	Owned   bool
	RetryIn time.Duration
	// Forwarded counts scheduled and retry tasks moved to pending; Recovered
	// counts active tasks whose lease had expired.
	Forwarded, Recovered int
	// NextDue is the due time of the earliest scheduled or retry task, zero
	// when there is none.
	NextDue time.Time
	// NextLeaseIn is how long until the earliest lease of an active task
	// expires; zero when no task is active.
	NextLeaseIn time.Duration
	// Pending is the number of pending tasks after the call.
	Pending int
}

// EventKind says what an Event announces.
type EventKind uint8

// Event kinds.
const (
	// EventPending: tasks became pending in an empty partition.
	EventPending EventKind = iota + 1
	// EventScheduled: a task was scheduled for At, earlier than every other
	// scheduled or retry task of the partition.
	EventScheduled
	// EventCancel: an operator asked to cancel the active task ID (see
	// Admin.CancelProcessing); the server running it cancels its handler.
	EventCancel
)

// Event is a hint that work arrived. Events may be lost (a reconnect) or
// repeated; consumers must also poll, slowly.
type Event struct {
	Kind      EventKind
	Queue     string
	Partition int
	At        time.Time
	ID        string // EventCancel only
}

// Broker stores tasks. See the package documentation for the conventions on
// per-element errors.
type Broker interface {
	// Enqueue stores new messages. Each message has ID, Queue, Type, State
	// (StatePending or StateScheduled) and ProcessAt set. Per-message errors
	// are ErrTaskIDConflict and ErrDuplicateTask.
	Enqueue(ctx context.Context, msgs []*Message) ([]error, error)

	// Dequeue leases up to n pending messages from the queues, trying them in
	// the given order, each for lease. It does not block: it returns an
	// empty slice when nothing is pending. Paused queues are skipped.
	Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*Delivery, error)

	// Extend renews leases by d from now. A lease that is no longer current
	// gets ErrLeaseLost.
	Extend(ctx context.Context, leases []LeaseRef, d time.Duration) ([]error, error)

	// Settle applies outcomes. A settlement whose lease is no longer current
	// gets ErrLeaseLost and changes nothing.
	Settle(ctx context.Context, ss []Settlement) ([]error, error)

	// SetResult stores data as the result of a leased task.
	SetResult(ctx context.Context, lease LeaseRef, data []byte) error

	// Partitions returns how many partitions queue has (at least 1).
	Partitions(queue string) int

	// Maintain claims or renews ownership of one partition and, when owned,
	// forwards due tasks, recovers expired leases (retry, or archive when
	// retries are exhausted) and trims archived and completed tasks.
	Maintain(ctx context.Context, req MaintainRequest) (MaintainResult, error)

	// Subscribe delivers events for the queues until ctx is done, then
	// closes the channel. The channel also closes when the subscription
	// breaks; callers subscribe again.
	Subscribe(ctx context.Context, queues []string) (<-chan Event, error)

	// GetTask returns the message with its current state and result.
	GetTask(ctx context.Context, queue, id string) (*Message, error)

	// Delete removes a pending, scheduled, retry, archived or completed task.
	// It returns ErrTaskNotFound or ErrTaskActive.
	Delete(ctx context.Context, queue, id string) error

	// Pause stops Dequeue from handing out the queue's tasks until Unpause.
	Pause(ctx context.Context, queue string) error
	// Unpause undoes Pause.
	Unpause(ctx context.Context, queue string) error

	// Close releases the broker's resources. It does not close a client the
	// caller passed in.
	Close() error
}

// Partition maps key to one of n partitions (FNV-1a, modulo n). Brokers place a
// task in Partition(ID, n); the client picks IDs of unique tasks so that the
// task and its lock land in the same partition. n < 2 gives 0.
func Partition(key string, n int) int {
	if n < 2 {
		return 0
	}
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= prime
	}
	return int(h % uint32(n))
}
