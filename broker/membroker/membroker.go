package membroker

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Defaults of the options.
const (
	DefaultMaxArchived = 10000
	DefaultArchiveTTL  = 90 * 24 * time.Hour
)

// leaseExpiredErr is the LastErr of a task recovered after its lease expired.
const leaseExpiredErr = "tide: lease expired: the worker died, stalled or lost the broker while processing the task"

// canceledErr is the LastErr of a task archived because it was cancelled.
const canceledErr = "tide: task cancelled"

// eventBuffer is the capacity of a Subscribe channel; events beyond it are
// dropped (they are hints).
const eventBuffer = 64

// Clock tells the time. The Broker asks it for every time decision. It is
// broker.Clock.
type Clock = broker.Clock

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Option configures a Broker.
type Option func(*Broker)

// WithClock makes the broker use c instead of the real clock. A nil c keeps
// the real clock.
func WithClock(c Clock) Option {
	return func(b *Broker) {
		if c != nil {
			b.clock = c
		}
	}
}

// WithMaxArchived bounds how many archived tasks a queue keeps; Maintain
// deletes the oldest beyond n. The default is DefaultMaxArchived; n <= 0
// removes the bound.
func WithMaxArchived(n int) Option {
	return func(b *Broker) { b.maxArchived = n }
}

// WithArchiveTTL sets how long an archived task is kept; Maintain deletes
// older ones. The default is DefaultArchiveTTL; d <= 0 keeps them regardless
// of age.
func WithArchiveTTL(d time.Duration) Option {
	return func(b *Broker) { b.archiveTTL = d }
}

// WithIdempotencyWindow sets how long an idempotency key
// (tide.IdempotencyKey) is remembered after the Enqueue that used it. The
// default is 24 hours; d <= 0 keeps the default.
func WithIdempotencyWindow(d time.Duration) Option {
	return func(b *Broker) {
		if d > 0 {
			b.idemWindow = d
		}
	}
}

// Broker is an in-memory broker.Broker. Create it with New; it is safe for
// concurrent use.
type Broker struct {
	clock       Clock
	maxArchived int
	archiveTTL  time.Duration

	mu     sync.Mutex
	closed bool
	queues map[string]*queue
	subs   map[*subscription]struct{}
	seq    uint64                    // orders heap entries with equal keys
	tokens uint64                    // the last fencing token handed out
	reg    map[string]*registryEntry // servers and schedulers, see registry

	idemWindow time.Duration
	idem       map[idemRef]idemEntry // idempotency keys in use
	idemSwept  int                   // len(idem) after the last sweep
	events     eventLogs             // task lifecycle events, see events.go

	flowsMu sync.Mutex
	flows   map[string]*flow // workflows and batches, see flows.go

	kept map[string]*keptLimits // deleted queues' limits, see DeleteQueue
}

// idemRef names an idempotency key: keys are per queue and outlive the
// queue's deletion, as in the Redis broker.
type idemRef struct{ queue, key string }

// idemEntry is the task an idempotency key stored and when the key is
// forgotten.
type idemEntry struct {
	id      string
	expires time.Time
}

var (
	_ broker.Broker   = (*Broker)(nil)
	_ broker.Admin    = (*Broker)(nil)
	_ broker.Registry = (*Broker)(nil)
	_ broker.Clock    = (*Broker)(nil)
	_ broker.Flows    = (*Broker)(nil)
)

// New returns an empty broker.
func New(opts ...Option) *Broker {
	b := &Broker{
		clock:       realClock{},
		maxArchived: DefaultMaxArchived,
		archiveTTL:  DefaultArchiveTTL,
		queues:      make(map[string]*queue),
		subs:        make(map[*subscription]struct{}),
		idemWindow:  24 * time.Hour,
		idem:        make(map[idemRef]idemEntry),
		flows:       make(map[string]*flow),
		kept:        make(map[string]*keptLimits),
	}
	for _, o := range opts {
		if o != nil {
			o(b)
		}
	}
	return b
}

// task is one stored message and its bookkeeping. A task is in exactly one
// place besides the queue's map: the pending list or one of the heaps,
// according to msg.State.
type task struct {
	msg      tidetype.TaskInfo  // owned copy; msg.State is the task's state
	token    uint64             // the current (or last) lease's token, from Broker.tokens
	canceled bool               // cancellation requested while active
	attempts []tidetype.Attempt // failed attempts, and the successful one when kept

	// key orders the heap the task is in: ProcessAt (scheduled, retry), lease
	// expiry (active), archive time (archived), removal time (completed).
	key time.Time
	seq uint64
	idx int // index in that heap (for a ready grouped task: in its group's)

	prev, next *task // pending list (ungrouped tasks)

	// eseq is the task's enqueue sequence in its queue: a group's ready
	// tasks start in this order. Replace keeps it.
	eseq uint64

	watched bool // EnqueueOptions.Watch: its outcome is kept when it ends

	// internal: stored by the broker itself, a follow-up (followEnd);
	// delivered with broker.Delivery.Internal. Enqueue never sets it.
	internal bool

	// dur holds the task's durable records (broker.Durable), in the
	// order stored; see durable.go.
	dur []broker.StepRecord
}

// flowFollowup reports whether t is a workflow follow-up: tide's own
// bookkeeping, which operators cannot delete, cancel or archive.
func (t *task) flowFollowup() bool { return t.internal && t.msg.Type == broker.FlowType }

type uniqueLock struct {
	id      string
	expires time.Time
}

type queue struct {
	name  string
	tasks map[string]*task
	locks map[string]uniqueLock

	head, tail *task // pending FIFO of the ungrouped tasks
	pending    int   // ready tasks, grouped ones included

	// Groups, see groups.go: the rotation serves its lanes (the groups with
	// ready tasks and plain, the ungrouped tasks) round-robin.
	groups           map[string]*group
	plain            group
	rotHead, rotTail *group
	held             map[*group]struct{} // out of the rotation until group.until
	eseq             uint64              // the last enqueue sequence handed out
	groupWake        time.Time           // the last held-until time announced

	sched     taskHeap // scheduled and retry, by ProcessAt
	active    taskHeap // by lease expiry
	archived  taskHeap // by archive time
	completed taskHeap // by removal time

	paused      bool
	pausedUntil time.Time            // end of a PauseFor; zero: until Unpause
	limits      tidetype.QueueLimits // see SetQueueLimits
	starts      []time.Time          // starts, with a rate or without, oldest first (see started)
	rateWake    time.Time            // the last room-opens time announced
	owner       string
	ownerUntil  time.Time

	days    map[string]*dayCount   // UTC date -> counters, see count
	minutes map[int64]*minuteCount // Unix minute -> counters, see minute

	subs map[*subscription]struct{}

	waiters  map[string][]chan struct{} // task ID -> Wait calls (wait.go)
	outcomes map[string]outcome         // how waited-for tasks whose record is gone ended
}

type subscription struct {
	ch     chan broker.Event
	queues []string
	stop   func() bool
	closed bool
}

// Now implements broker.Clock: the time on the broker's clock (see
// WithClock). The root package computes due times with it.
func (b *Broker) Now() time.Time { return b.clock.Now() }

// ---- helpers that run with b.mu held ----

func (b *Broker) queue(name string) *queue {
	q := b.queues[name]
	if q == nil {
		q = &queue{
			name:   name,
			tasks:  make(map[string]*task),
			locks:  make(map[string]uniqueLock),
			groups: make(map[string]*group),
			held:   make(map[*group]struct{}),
		}
		b.queues[name] = q
		if k := b.kept[name]; k != nil { // deleted with limits: they hold again
			delete(b.kept, name)
			q.limits, q.starts, q.groups, q.held = k.limits, k.starts, k.groups, k.held
		}
		for s := range b.subs { // subscribed before the queue was deleted
			if !s.closed && slices.Contains(s.queues, name) {
				if q.subs == nil {
					q.subs = make(map[*subscription]struct{})
				}
				q.subs[s] = struct{}{}
			}
		}
	}
	return q
}

func (b *Broker) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.closed {
		return broker.ErrClosed
	}
	return nil
}

func (b *Broker) emit(q *queue, ev broker.Event) {
	for s := range q.subs {
		select {
		case s.ch <- ev:
		default: // full: events are hints
		}
	}
}

// pushPending makes t ready: an ungrouped task is appended to the pending
// list (prepended when front), a grouped one joins its group's ready tasks
// in enqueue order. Subscribers learn when the queue had nothing pending or
// a lane joined the rotation (its tasks may start now).
func (b *Broker) pushPending(qn string, q *queue, t *task, front bool) {
	t.msg.State = tidetype.StatePending
	joined := false
	if t.msg.Group != "" {
		joined = q.addReady(t)
	} else {
		t.prev, t.next = nil, nil
		switch {
		case q.head == nil:
			q.head, q.tail = t, t
		case front:
			t.next = q.head
			q.head.prev = t
			q.head = t
		default:
			t.prev = q.tail
			q.tail.next = t
			q.tail = t
		}
		if !q.plain.inRot {
			q.rotPush(&q.plain)
			joined = true
		}
	}
	q.pending++
	if (q.pending == 1 || joined) && !q.isPaused(b.clock.Now()) {
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: qn})
	}
}

// isPaused reports whether the queue is paused at now.
func (q *queue) isPaused(now time.Time) bool {
	return q.paused && (q.pausedUntil.IsZero() || now.Before(q.pausedUntil))
}

// unlinkPending takes an ungrouped ready task out of the pending list.
func (q *queue) unlinkPending(t *task) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		q.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		q.tail = t.prev
	}
	t.prev, t.next = nil, nil
	q.pending--
}

// pushSched puts t into the scheduled/retry heap with state st.
func (b *Broker) pushSched(qn string, q *queue, t *task, st tidetype.TaskState) {
	t.msg.State = st
	earliest := len(q.sched) == 0 || t.msg.NextProcessAt.Before(q.sched[0].key)
	b.push(&q.sched, t, t.msg.NextProcessAt)
	if earliest {
		b.emit(q, broker.Event{Kind: broker.EventScheduled, Queue: qn, At: t.msg.NextProcessAt})
	}
}

func (b *Broker) push(h *taskHeap, t *task, key time.Time) {
	b.seq++
	t.key, t.seq = key, b.seq
	heap.Push(h, t)
}

// detach takes t out of whichever structure its state puts it in.
func (q *queue) detach(t *task) {
	switch t.msg.State {
	case tidetype.StatePending:
		if t.msg.Group != "" {
			q.unready(t)
		} else {
			q.unlinkPending(t)
		}
	case tidetype.StateScheduled, tidetype.StateRetry, tidetype.StateWaiting:
		heap.Remove(&q.sched, t.idx)
	case tidetype.StateActive:
		heap.Remove(&q.active, t.idx)
	case tidetype.StateArchived:
		heap.Remove(&q.archived, t.idx)
	case tidetype.StateCompleted:
		heap.Remove(&q.completed, t.idx)
	}
}

// releaseLock drops t's unique lock if t still holds it.
func (q *queue) releaseLock(t *task) {
	if k := t.msg.UniqueKey; k != "" {
		if l, ok := q.locks[k]; ok && l.id == t.msg.ID {
			delete(q.locks, k)
		}
	}
}

// archive moves t to the archive, its end: whoever follows it gets its
// follow-up (followEnd) with why as the reason (errMsg, or why when errMsg
// is empty).
func (b *Broker) archive(q *queue, t *task, errMsg string, at, now time.Time) {
	why := errMsg
	if why == "" {
		why = "tide: archived by an operator"
	}
	b.followEnd(q, t, broker.OutcomeArchived, at, why, now)
	b.event(q, t, tidetype.EventArchived, errMsg)
	t.msg.LastErr = errMsg
	t.msg.LastFailedAt = at
	t.msg.State = tidetype.StateArchived
	b.push(&q.archived, t, now)
	q.releaseLock(t)
	b.ended(q, t, false, nil, now)
}

// leased returns the active task that ref names, or ErrLeaseLost.
func (b *Broker) leased(ref broker.LeaseRef) (*queue, *task, error) {
	q := b.queues[ref.Queue]
	if q == nil {
		return nil, nil, broker.ErrLeaseLost
	}
	t := q.tasks[ref.ID]
	if t == nil || t.msg.State != tidetype.StateActive || t.token != ref.Token {
		return nil, nil, broker.ErrLeaseLost
	}
	return q, t, nil
}

// Close implements broker.Broker: it drops all tasks and closes every
// Subscribe channel. Afterwards every method returns broker.ErrClosed.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	b.closed = true
	for s := range b.subs {
		s.stop()
		b.unsubscribe(s)
	}
	b.wakeAll()
	b.queues = nil
	return nil
}
