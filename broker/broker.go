// Package broker defines the storage contract of tide.
//
// The root tide package knows storage only through the Broker interface, one
// contract made of parts: Core keeps tasks in queues, hands them out under
// leases and applies the settlement a worker reports; Admin, Flows, Waiter,
// ProgressReporter, EventReader, Registry, Repartitioner and Clock do the
// rest. A broker without a part answers its methods with ErrNotSupported
// (embed Unsupported), so wrappers such as package encrypt are one type. Two
// implementations ship with tide: broker/redisbroker (production) and
// broker/membroker (in-process, for demos and tests). broker/brokertest is
// the behavioural suite both pass, the one definition of behaviour; a new
// implementation must pass it too (it skips the parts a broker lacks).
//
// Every method is safe for concurrent use. Methods that take a slice return one
// error per element (nil when that element succeeded) plus an error for the call
// as a whole; when the call error is non-nil the per-element slice is nil and
// nothing may be assumed about any element.
//
// # Faults
//
// A broker reports a store it cannot reach with an error wrapping
// ErrUnavailable. When a request may have been applied although no answer
// came back (a reply lost or timed out after the request was sent), the error
// also wraps ErrOutcomeUnknown: the caller must not assume either way. Every
// state change is safe to apply twice: a request the transport sends again
// (go-redis re-sends a command whose reply timed out) answers like the first
// run and changes nothing more.
package broker

import (
	"context"
	"errors"
	"time"

	"github.com/tidequeue/tide/tidetype"
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
	// ErrLeaseLost is returned for a settlement, lease extension or result
	// write whose token is no longer the task's current lease: the lease
	// expired and the task was recovered (and possibly handed to another
	// worker), or the task was deleted, or re-created with the same ID.
	ErrLeaseLost = errors.New("tide: lease lost (stale token)")
	// ErrTaskCanceled is returned by Extend for a lease whose task was
	// cancelled (Cancel, Admin.CancelProcessing): the worker stops its
	// handler; the lease itself is still valid so that the worker can
	// settle. It is also the cause of a cancelled handler's context.
	ErrTaskCanceled = errors.New("tide: task cancelled")
	// ErrNotReplicated is returned by Enqueue for a task that asked for
	// replica acknowledgements (EnqueueOptions.WaitReplicas) and did not get
	// them in time. The task is stored on the primary and will most likely
	// be processed; it may be lost only if the primary fails before
	// replicating it.
	ErrNotReplicated = errors.New("tide: task stored but not confirmed by the requested number of replicas")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("tide: broker closed")
	// ErrUnavailable is wrapped by the error of a call that could not reach
	// the store (connection refused or broken, timeout, cluster down,
	// failover in progress). Callers retry with back-off.
	ErrUnavailable = errors.New("tide: broker unavailable")
	// ErrOutcomeUnknown is wrapped, together with ErrUnavailable, by the
	// error of a call whose request was sent but whose answer never came:
	// it may or may not have been applied. A call that surely was not
	// applied (the connection could not be made) wraps ErrUnavailable only.
	ErrOutcomeUnknown = errors.New("tide: outcome unknown (request sent, no reply)")
	// ErrLayout is wrapped by the error of a call on a queue whose
	// partition layout recorded in the store differs from the broker's
	// configuration; the message names both.
	ErrLayout = errors.New("tide: partition layout mismatch")
	// ErrTaskState is wrapped by the error of an operator's action that the
	// task's state does not allow: RunTask of a pending or active task,
	// ArchiveTask of an active, archived or completed one, CancelProcessing
	// of a task that is not active, and an action on a task whose stored
	// record cannot be read (delete it instead). The message names the state.
	ErrTaskState = errors.New("tide: the task's state does not allow this")
)

// Delivery is a task handed to a worker under a lease.
type Delivery struct {
	Task *tidetype.TaskInfo
	// Token is the fencing token of this delivery. Every settlement,
	// extension and result write carries it; a stale token is refused with
	// ErrLeaseLost. A token never repeats for a queue and task ID, not even
	// when the ID is re-created after the old task finished.
	Token uint64
	// LeaseFor is how long the lease lasts from the moment of delivery.
	LeaseFor time.Duration
	// Internal reports that the broker itself stored the task: a
	// follow-up of a followed task's end (FlowType, NotifyType; see
	// Ending). No Enqueue can store a task that is delivered as internal,
	// so a server runs tide's own task types only for internal deliveries.
	// The mark stays with the task through retries, archiving and an
	// operator's run.
	Internal bool
	// Steps are the task's durable records (see Durable) as the lease
	// found them, in the order they were stored, and StepsLoaded reports
	// that the broker filled Steps (nil then means the task has none).
	// Both shipped brokers fill them in the call that grants the lease, so
	// that a durable handler replays its steps, or learns that it has none
	// to replay, without a LoadSteps round trip. A broker or wrapper that
	// leaves StepsLoaded false makes tide load them with LoadSteps when a
	// handler first needs them.
	Steps       []StepRecord
	StepsLoaded bool
}

// Lease returns the reference to d's lease.
func (d *Delivery) Lease() LeaseRef {
	return LeaseRef{Queue: d.Task.Queue, ID: d.Task.ID, Group: d.Task.Group, Token: d.Token}
}

// LeaseRef names one delivery's lease.
type LeaseRef struct {
	Queue string
	ID    string
	// Group is the task's group ("" for none), as delivered: a broker
	// with several partitions keeps a group's tasks in the group's
	// partition, so it finds a grouped task's lease there whatever the ID.
	Group string
	Token uint64
}

// SettleKind is how a delivery ends.
type SettleKind uint8

// Settle kinds.
const (
	// SettleDone: the handler succeeded. The task is deleted, or kept as
	// completed when its Retention is positive.
	SettleDone SettleKind = iota + 1
	// SettleRetry: the handler failed; the task waits in retry until
	// Settlement.RetryAt with Retried incremented.
	SettleRetry
	// SettleArchive: the task failed for good (SkipRetry, retries
	// exhausted, cancelled, undecodable) and is archived with
	// Settlement.Err.
	SettleArchive
	// SettleRequeue: the worker gives the task back without it counting as
	// an attempt (shutdown); it is pending again at once.
	SettleRequeue
	// SettleDefer: the handler asked to run again later (tide.RetryAfter,
	// an HTTP 429): the task waits in retry until Settlement.RetryAt with
	// Retried unchanged and Settlement.Err as its last error. It counts as
	// neither processed nor failed; the attempt history records it as
	// "deferred".
	SettleDefer
	// SettlePark: a durable handler suspended (tide.Sleep,
	// tide.WaitSignal). The task waits in StateWaiting, holding no lease
	// and no concurrency or group slot (an ordered group keeps its place,
	// as for a retry), until Settlement.RetryAt, when maintenance makes it
	// pending like a due retry task; Settlement.WaitFor says what it waits
	// for ("sleep:<name>", "signal:<name>"). A signal of that name
	// (Durable.Signal) makes it pending at once, and so does one already
	// stored when it parks, or a RetryAt already reached on the broker's
	// clock. Retried is unchanged; it counts as neither processed nor
	// failed. A cancelled task is archived instead, as for a retry.
	SettlePark
)

// String returns "done", "retry", "archive", "requeue", "defer", "park"
// or "unknown".
func (k SettleKind) String() string {
	switch k {
	case SettleDone:
		return "done"
	case SettleRetry:
		return "retry"
	case SettleArchive:
		return "archive"
	case SettleRequeue:
		return "requeue"
	case SettleDefer:
		return "defer"
	case SettlePark:
		return "park"
	}
	return "unknown"
}

// Settlement reports how one delivery ended.
type Settlement struct {
	Lease LeaseRef
	Kind  SettleKind
	// Task is the delivered task; brokers may use it to write the new
	// record without reading the old one.
	Task *tidetype.TaskInfo
	// Err is the failure message for SettleRetry, SettleArchive and
	// SettleDefer.
	Err string
	// RetryAt is when a retried or deferred task becomes pending again.
	RetryAt time.Time
	// RetryIn, when positive, replaces RetryAt for SettleRetry and
	// SettleDefer: the task becomes pending again RetryIn after the broker
	// applies the settlement, on the broker's own clock, and a Throttle
	// holds the group back until then. A server sets it so that the time
	// does not depend on how well its clock agrees with the broker's (a
	// clock stepped back would otherwise end a throttle before it began).
	RetryIn time.Duration
	// At is when the attempt ended (LastFailedAt or CompletedAt).
	At time.Time
	// Started is when the attempt started and Server the server that ran
	// it, for the task's attempt history; both may be zero.
	Started time.Time
	Server  string
	// Throttle, with SettleDefer, also holds back the task's group: no
	// task of the group starts before RetryAt, or RetryIn from when the
	// broker applies the settlement (tide.ThrottleGroup). It is ignored for
	// a task without a group.
	Throttle bool
	// WaitFor, with SettlePark, is what the task waits for:
	// "sleep:<name>" or "signal:<name>".
	WaitFor string
}

// SealedHeader marks a task that a broker wrapper hands back without being
// able to open its payload (encrypt: a workflow step's kept task whose key
// is not in this process), for the same wrapper's Enqueue to store as it
// is. It is never stored; tide refuses it on every task a caller enqueues.
const SealedHeader = "tide-sealed"

// ReservedIDPrefix starts the ID of every task a broker stores itself (the
// follow-ups of followed tasks: "tide:f<n>{<tag>}", where tag places the
// follow-up in the partition of the task it follows). tide refuses it in the
// IDs callers choose (tide.TaskID, EnqueuePrepared), so such an ID is never
// taken before the broker needs it.
const ReservedIDPrefix = "tide:"

// EnqueueOptions apply to one Enqueue call.
type EnqueueOptions struct {
	// WaitReplicas, when positive, asks Enqueue to confirm that this many
	// replicas have the tasks before reporting success, waiting at most
	// WaitTimeout; otherwise each task's error is ErrNotReplicated. Brokers
	// without replicas ignore it.
	WaitReplicas int
	WaitTimeout  time.Duration
	// Replace makes a task with an ID (tide.Replace) replace a waiting
	// task (pending, scheduled or retry) with that ID: it takes the new
	// task's payload, headers, options and due time, keeping its place in
	// its group's order. A finished task (completed, archived) with the ID
	// is replaced by the new one, a new task that takes a new place in its
	// group's order (after the tasks enqueued before it); an active one, a
	// step of a workflow or batch (FlowHeader) and an internal task
	// (Delivery.Internal) get ErrTaskIDConflict.
	Replace bool
	// Watch registers a waiter for each task as it is stored (see Waiter),
	// so that a Wait that starts after Enqueue returns still learns how
	// the task ended, however fast it ran.
	Watch bool
}

// MaintainRequest asks a broker to maintain one partition of a queue.
type MaintainRequest struct {
	Queue     string
	Partition int
	// Owner identifies the calling server. A partition is maintained by one
	// owner at a time; the claim lasts OwnerTTL and is renewed by each call.
	Owner    string
	OwnerTTL time.Duration
	// Release gives up the caller's claim (a clean shutdown) instead of
	// maintaining, so that another server takes the partition over at once.
	Release bool
	// RecoverBackoff is how long a task recovered after its lease expired
	// waits in retry before its first retry; it doubles with every retry
	// the task has used, up to an hour. Zero makes it pending at once.
	RecoverBackoff time.Duration
}

// MaintainResult reports what Maintain did and when to call again.
type MaintainResult struct {
	// Owned reports whether the caller holds the partition. When false
	// nothing was changed and RetryIn says when the current claim expires.
	Owned   bool
	RetryIn time.Duration
	// Forwarded counts scheduled and retry tasks moved to pending; Recovered
	// counts active tasks whose lease had expired; Trimmed counts completed
	// and archived tasks deleted for their age or the archive's size.
	Forwarded, Recovered, Trimmed int
	// More reports that a step stopped at its limit: call again at once.
	More bool
	// NextDue is the due time of the earliest scheduled or retry task, on
	// the broker's clock; zero when there is none.
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
	// EventPending: tasks became pending in an empty partition, or room
	// opened under the queue's limits for tasks that wait. When At is
	// set, the tasks wait for the queue's rate limit: they may start from
	// At on (the broker's clock).
	EventPending EventKind = iota + 1
	// EventScheduled: a task was scheduled for At, earlier than every other
	// scheduled or retry task of the partition.
	EventScheduled
	// EventCancel: the active task ID was cancelled; the server running it
	// cancels its handler. The cancellation is also recorded, and Extend
	// reports it, so a lost event delays it by one lease renewal at most.
	EventCancel
	// EventReleased: the owner of the partition gave up its claim (a clean
	// shutdown); another server may claim it now.
	EventReleased
	// EventLayout: the queue's partitions changed (a repartition started or
	// ended); servers read its layout again.
	EventLayout
)

// String returns "pending", "scheduled", "cancel", "released", "layout" or
// "unknown".
func (k EventKind) String() string {
	switch k {
	case EventPending:
		return "pending"
	case EventScheduled:
		return "scheduled"
	case EventCancel:
		return "cancel"
	case EventReleased:
		return "released"
	case EventLayout:
		return "layout"
	}
	return "unknown"
}

// Event is a hint that work arrived. Events may be lost (a reconnect) or
// repeated; consumers must also poll, slowly.
type Event struct {
	Kind      EventKind
	Queue     string
	Partition int
	At        time.Time
	ID        string // EventCancel only
}

// Broker is the whole storage contract: the task life every broker
// carries (Core) and the parts around it. A broker that lacks a part
// answers its methods with an error wrapping ErrNotSupported (embed
// Unsupported to get those answers), so that wrappers and callers deal
// with one type; brokertest checks each part where the broker has it. Both
// shipped brokers have every part but the in-memory broker's
// Repartitioner.
type Broker interface {
	Core
	Clock
	Admin
	Registry
	Flows
	Waiter
	ProgressReporter
	EventReader
	Repartitioner
	Durable
}

// ErrNotSupported is wrapped by the error of a method of a part of Broker
// that the broker does not have (see Unsupported).
var ErrNotSupported = errors.New("tide: not supported by the broker")

// Core stores tasks: what every broker does. See the package documentation
// for the conventions on per-element errors and faults.
type Core interface {
	// Enqueue stores new tasks. Each has Queue, Type, State (StatePending
	// or StateScheduled) and NextProcessAt set. A task with an empty ID gets
	// one from the broker (written to its ID field), chosen so that it does
	// not meet an existing task (a grouped task's carries its group as
	// hash tag); a task with an ID keeps it. An ID names one task of the
	// queue whatever its group. Per-task errors are ErrTaskIDConflict,
	// ErrDuplicateTask, ErrNotReplicated, and ErrInvalidTask for a grouped
	// task whose ID the broker cannot place now (the Redis broker takes an
	// ID without the group's tag on any partition count, but not while the
	// queue is repartitioned).
	Enqueue(ctx context.Context, tasks []*tidetype.TaskInfo, opts EnqueueOptions) ([]error, error)

	// Dequeue leases up to n pending tasks from the queues, trying them in
	// the given order, each for lease. It does not block: it returns an
	// empty slice when nothing is pending. Paused queues are skipped. A
	// scheduled or retry task is never handed out before it is due on the
	// broker's clock.
	Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*Delivery, error)

	// Extend renews leases by d from now. A lease that is no longer current
	// gets ErrLeaseLost; a lease whose task was cancelled is renewed and
	// gets ErrTaskCanceled.
	Extend(ctx context.Context, leases []LeaseRef, d time.Duration) ([]error, error)

	// Settle applies settlements. One whose lease is no longer current
	// gets ErrLeaseLost and changes nothing.
	Settle(ctx context.Context, ss []Settlement) ([]error, error)

	// SetResult stores data as the result of a leased task.
	SetResult(ctx context.Context, lease LeaseRef, data []byte) error

	// Partitions returns how many partitions queue has (at least 1), as
	// recorded in the store. A broker configured with another count for
	// the queue returns an error wrapping ErrLayout.
	Partitions(ctx context.Context, queue string) (int, error)

	// Maintain claims or renews ownership of one partition and, when owned,
	// forwards due tasks, recovers expired leases (retry after
	// RecoverBackoff, or archive when retries are exhausted or the task was
	// cancelled; LastErr says the lease expired) and trims archived and
	// completed tasks.
	Maintain(ctx context.Context, req MaintainRequest) (MaintainResult, error)

	// Subscribe delivers events for the queues until ctx is done, then
	// closes the channel. The channel also closes when the subscription
	// breaks; callers subscribe again.
	Subscribe(ctx context.Context, queues []string) (<-chan Event, error)

	// GetTask returns the task with its current state and result, its
	// attempt history where the broker keeps one, and for an active task
	// the expiry of its lease (LeaseExpiresAt).
	GetTask(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error)

	// Delete removes a pending, scheduled, retry, archived or completed task.
	// It returns ErrTaskNotFound or ErrTaskActive.
	Delete(ctx context.Context, queue, id string) error

	// Cancel stops a task whatever its state: a task that is not active is
	// deleted; an active one has its cancellation recorded (Extend reports
	// it to the worker, an EventCancel tells it at once). It returns
	// ErrTaskNotFound when there is no such task.
	Cancel(ctx context.Context, queue, id string) error

	// Pause stops Dequeue from handing out the queue's tasks until Unpause.
	Pause(ctx context.Context, queue string) error
	// Unpause undoes Pause.
	Unpause(ctx context.Context, queue string) error

	// Close releases the broker's resources. It does not close a client the
	// caller passed in.
	Close() error
}

// Clock is the broker's time. Due times, leases and retention are decided
// on the broker's clock; a client or server computes due times with it, so
// that a process whose own clock is off neither starts tasks early nor
// schedules them late. The Redis broker's clock is the Redis server's;
// membroker's is the clock it was given (WithClock); a broker without a
// clock of its own answers time.Now (Unsupported).
type Clock interface {
	Now() time.Time
}

// Partition maps key to one of n partitions (FNV-1a, modulo n). Brokers place a
// task in Partition(ID, n). n < 2 gives 0. Like a Redis Cluster hash tag, a
// key that holds a non-empty "{tag}" is mapped by the tag alone (the text
// between its first '{' and the next '}'): the tasks of group G are kept in
// Partition(G, n), so a grouped task whose ID carries "{G}" is found there
// by its ID directly (one whose ID does not is found through an index, see
// FreeGroupID).
func Partition(key string, n int) int {
	if n < 2 {
		return 0
	}
	key = HashTag(key)
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= prime
	}
	return int(h % uint32(n))
}

// HashTag returns the part of key that Partition hashes: the text between
// its first '{' and the next '}' when that is not empty, else key.
func HashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					return key[i+1 : j]
				}
				return key
			}
		}
		return key
	}
	return key
}
