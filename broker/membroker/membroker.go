package membroker

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"maps"
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
	idx int // index in that heap

	prev, next *task // pending list
}

type uniqueLock struct {
	id      string
	expires time.Time
}

type queue struct {
	tasks map[string]*task
	locks map[string]uniqueLock

	head, tail *task // pending FIFO
	pending    int

	sched     taskHeap // scheduled and retry, by ProcessAt
	active    taskHeap // by lease expiry
	archived  taskHeap // by archive time
	completed taskHeap // by removal time

	paused     bool
	owner      string
	ownerUntil time.Time

	days    map[string]*dayCount   // UTC date -> counters, see count
	minutes map[int64]*minuteCount // Unix minute -> counters, see minute

	subs map[*subscription]struct{}
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
			tasks: make(map[string]*task),
			locks: make(map[string]uniqueLock),
		}
		b.queues[name] = q
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

// pushPending appends t (or prepends it when front) to the pending list.
func (b *Broker) pushPending(qn string, q *queue, t *task, front bool) {
	t.msg.State = tidetype.StatePending
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
	q.pending++
	if q.pending == 1 && !q.paused {
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: qn})
	}
}

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
		q.unlinkPending(t)
	case tidetype.StateScheduled, tidetype.StateRetry:
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

func (b *Broker) archive(q *queue, t *task, errMsg string, at, now time.Time) {
	t.msg.LastErr = errMsg
	t.msg.LastFailedAt = at
	t.msg.State = tidetype.StateArchived
	b.push(&q.archived, t, now)
	q.releaseLock(t)
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

// ---- Broker methods ----

// Enqueue implements broker.Broker.
func (b *Broker) Enqueue(ctx context.Context, msgs []*tidetype.TaskInfo, _ broker.EnqueueOptions) ([]error, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = b.enqueue(m, now)
	}
	return errs, nil
}

func (b *Broker) enqueue(m *tidetype.TaskInfo, now time.Time) error {
	if err := validate(m); err != nil {
		return err
	}
	var ref idemRef
	if m.IdempotencyKey != "" {
		ref = idemRef{m.Queue, m.IdempotencyKey}
		if e, ok := b.idem[ref]; ok && now.Before(e.expires) {
			m.ID = e.id
			return nil
		}
	}
	q := b.queue(m.Queue)
	if m.ID == "" {
		m.ID = broker.NewID()
		for q.tasks[m.ID] != nil {
			m.ID = broker.NewID()
		}
	}
	if _, ok := q.tasks[m.ID]; ok {
		return broker.ErrTaskIDConflict
	}
	if m.UniqueKey != "" {
		if l, ok := q.locks[m.UniqueKey]; ok && now.Before(l.expires) {
			return broker.ErrDuplicateTask
		}
	}
	t := &task{msg: normalize(m), idx: -1}
	t.msg.Result = nil
	if t.msg.NextProcessAt.IsZero() {
		t.msg.NextProcessAt = msTime(now)
	}
	if t.msg.EnqueuedAt.IsZero() {
		t.msg.EnqueuedAt = msTime(now)
	}
	q.tasks[m.ID] = t
	if m.UniqueKey != "" {
		q.locks[m.UniqueKey] = uniqueLock{id: m.ID, expires: now.Add(t.msg.UniqueTTL)}
	}
	if m.State == tidetype.StateScheduled && t.msg.NextProcessAt.After(now) {
		b.pushSched(m.Queue, q, t, tidetype.StateScheduled)
	} else {
		b.pushPending(m.Queue, q, t, false)
	}
	if m.IdempotencyKey != "" {
		b.remember(ref, m.ID, now)
	}
	return nil
}

// remember records an idempotency key, and forgets expired ones whenever
// the map has doubled since the last sweep, so memory follows the keys of
// one window.
func (b *Broker) remember(ref idemRef, id string, now time.Time) {
	b.idem[ref] = idemEntry{id: id, expires: now.Add(b.idemWindow)}
	if len(b.idem) < 2*max(b.idemSwept, 512) {
		return
	}
	for r, e := range b.idem {
		if !now.Before(e.expires) {
			delete(b.idem, r)
		}
	}
	b.idemSwept = len(b.idem)
}

func validate(m *tidetype.TaskInfo) error {
	switch {
	case m == nil:
		return fmt.Errorf("%w: nil task", broker.ErrInvalidTask)
	case m.Queue == "":
		return fmt.Errorf("%w: membroker: task %q has an empty queue name", broker.ErrInvalidTask, m.ID)
	case m.Type == "":
		return fmt.Errorf("%w: membroker: task %q has an empty type", broker.ErrInvalidTask, m.ID)
	case m.State != tidetype.StatePending && m.State != tidetype.StateScheduled:
		return fmt.Errorf("membroker: message %q: enqueue state must be pending or scheduled, not %s", m.ID, m.State)
	case m.State == tidetype.StateScheduled && m.NextProcessAt.IsZero():
		return fmt.Errorf("%w: membroker: task %q: scheduled without ProcessAt", broker.ErrInvalidTask, m.ID)
	case m.MaxRetry < 0 || m.Retried < 0:
		return fmt.Errorf("%w: membroker: task %q: negative MaxRetry or Retried", broker.ErrInvalidTask, m.ID)
	case m.Timeout < 0 || m.Retention < 0 || m.UniqueTTL < 0:
		return fmt.Errorf("%w: membroker: task %q: negative Timeout, Retention or UniqueTTL", broker.ErrInvalidTask, m.ID)
	case len(m.IdempotencyKey) > 255:
		return fmt.Errorf("%w: membroker: idempotency key of %d bytes, over 255", broker.ErrInvalidTask, len(m.IdempotencyKey))
	case m.UniqueKey != "" && m.UniqueTTL < time.Millisecond:
		return fmt.Errorf("%w: membroker: task %q: UniqueKey set without a UniqueTTL of at least 1ms", broker.ErrInvalidTask, m.ID)
	}
	return nil
}

// Dequeue implements broker.Broker.
func (b *Broker) Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if lease <= 0 {
		return nil, fmt.Errorf("membroker: lease %v is not positive", lease)
	}
	for _, qn := range queues {
		if qn == "" {
			return nil, errors.New("membroker: empty queue name")
		}
	}
	if n <= 0 {
		return nil, nil
	}
	now := b.clock.Now()
	var out []*broker.Delivery
	for _, qn := range queues {
		q := b.queues[qn]
		if q == nil || q.paused {
			continue
		}
		for q.head != nil && len(out) < n {
			t := q.head
			q.unlinkPending(t)
			b.tokens++
			t.token, t.canceled = b.tokens, false
			t.msg.State = tidetype.StateActive
			b.push(&q.active, t, now.Add(lease))
			out = append(out, &broker.Delivery{Task: clone(&t.msg), Token: t.token, LeaseFor: lease})
		}
		if len(out) == n {
			break
		}
	}
	return out, nil
}

// Extend implements broker.Broker.
func (b *Broker) Extend(ctx context.Context, leases []broker.LeaseRef, d time.Duration) ([]error, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if d <= 0 {
		return nil, fmt.Errorf("membroker: lease extension %v is not positive", d)
	}
	now := b.clock.Now()
	errs := make([]error, len(leases))
	for i, ref := range leases {
		q, t, err := b.leased(ref)
		if err != nil {
			errs[i] = err
			continue
		}
		t.key = now.Add(d)
		heap.Fix(&q.active, t.idx)
		if t.canceled {
			errs[i] = broker.ErrTaskCanceled
		}
	}
	return errs, nil
}

// Settle implements broker.Broker.
func (b *Broker) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	errs := make([]error, len(ss))
	for i := range ss {
		errs[i] = b.settle(&ss[i], now)
	}
	return errs, nil
}

func (b *Broker) settle(s *broker.Settlement, now time.Time) error {
	if s.Kind < broker.SettleDone || s.Kind > broker.SettleRequeue {
		return fmt.Errorf("membroker: task %q: unknown settle kind %d", s.Lease.ID, s.Kind)
	}
	q, t, err := b.leased(s.Lease)
	if err != nil {
		return err
	}
	at := s.At
	if at.IsZero() {
		at = now
	}
	at = msTime(at)
	heap.Remove(&q.active, t.idx)
	kind, errMsg := s.Kind, s.Err
	if t.canceled && (kind == broker.SettleRetry || kind == broker.SettleRequeue) {
		kind, errMsg = broker.SettleArchive, canceledErr
		if s.Err != "" {
			errMsg += "; last error: " + s.Err
		}
	}
	switch kind {
	case broker.SettleDone:
		q.count(now, 1, 0)
	case broker.SettleRetry, broker.SettleArchive:
		q.count(now, 1, 1)
	}
	switch kind {
	case broker.SettleRetry, broker.SettleArchive:
		t.addAttempt(s.Started, at, s.Server, map[broker.SettleKind]string{broker.SettleRetry: "retry", broker.SettleArchive: "archive"}[kind], errMsg)
	case broker.SettleDone:
		if t.msg.Retention > 0 {
			t.addAttempt(s.Started, at, s.Server, "done", "")
		}
	}
	switch kind {
	case broker.SettleDone:
		q.releaseLock(t)
		if t.msg.Retention <= 0 {
			delete(q.tasks, t.msg.ID)
			return nil
		}
		t.msg.State = tidetype.StateCompleted
		t.msg.CompletedAt = at
		b.push(&q.completed, t, at.Add(t.msg.Retention))
		b.trim(q, now)
	case broker.SettleRetry:
		retryAt := s.RetryAt
		if retryAt.IsZero() {
			retryAt = now
		}
		t.msg.Retried++
		t.msg.LastErr = s.Err
		t.msg.LastFailedAt = at
		t.msg.NextProcessAt = msTime(retryAt)
		b.pushSched(s.Lease.Queue, q, t, tidetype.StateRetry)
	case broker.SettleArchive:
		b.archive(q, t, errMsg, at, now)
		b.trim(q, now)
	case broker.SettleRequeue:
		b.pushPending(s.Lease.Queue, q, t, true)
	}
	return nil
}

// SetResult implements broker.Broker.
func (b *Broker) SetResult(ctx context.Context, lease broker.LeaseRef, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	_, t, err := b.leased(lease)
	if err != nil {
		return err
	}
	t.msg.Result = bytes.Clone(data)
	return nil
}

// Partitions implements broker.Broker: a membroker queue has one partition.
func (b *Broker) Partitions(ctx context.Context, _ string) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return 0, err
	}
	return 1, nil
}

// Maintain implements broker.Broker.
func (b *Broker) Maintain(ctx context.Context, req broker.MaintainRequest) (broker.MaintainResult, error) {
	var res broker.MaintainResult
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return res, err
	}
	switch {
	case req.Queue == "":
		return res, errors.New("membroker: maintain: empty queue name")
	case req.Partition != 0:
		return res, fmt.Errorf("membroker: maintain: partition %d out of range (membroker has 1)", req.Partition)
	case req.Owner == "":
		return res, errors.New("membroker: maintain: empty owner")
	case req.OwnerTTL <= 0:
		return res, fmt.Errorf("membroker: maintain: owner TTL %v is not positive", req.OwnerTTL)
	}
	now := b.clock.Now()
	due := now
	q := b.queue(req.Queue)
	if req.Release {
		if q.owner == req.Owner {
			q.owner, q.ownerUntil = "", time.Time{}
			b.emit(q, broker.Event{Kind: broker.EventReleased, Queue: req.Queue})
		}
		return res, nil
	}
	if q.owner != "" && q.owner != req.Owner && now.Before(q.ownerUntil) {
		res.RetryIn = max(q.ownerUntil.Sub(now), time.Millisecond)
		return res, nil
	}
	q.owner, q.ownerUntil = req.Owner, now.Add(req.OwnerTTL)
	res.Owned = true

	// Forward due scheduled and retry tasks, earliest first.
	for len(q.sched) > 0 && !q.sched[0].key.After(due) {
		t := heap.Pop(&q.sched).(*task)
		b.pushPending(req.Queue, q, t, false)
		res.Forwarded++
	}
	// Recover expired leases.
	for len(q.active) > 0 && !q.active[0].key.After(now) {
		t := heap.Pop(&q.active).(*task)
		res.Recovered++
		q.count(now, 1, 1)
		t.addAttempt(time.Time{}, msTime(now), "", "lease expired", leaseExpiredErr)
		switch {
		case t.canceled:
			b.archive(q, t, canceledErr+"; "+leaseExpiredErr, msTime(now), now)
		case t.msg.Retried < t.msg.MaxRetry:
			// Back off like a failed attempt: a task that kills its worker
			// must not hit the fleet again at once.
			d := min(req.RecoverBackoff<<min(t.msg.Retried, 20), time.Hour)
			t.msg.Retried++
			t.msg.LastErr = leaseExpiredErr
			t.msg.LastFailedAt = msTime(now)
			t.msg.NextProcessAt = msTime(now.Add(d))
			if d <= 0 {
				b.pushPending(req.Queue, q, t, false)
			} else {
				b.pushSched(req.Queue, q, t, tidetype.StateRetry)
			}
		default:
			b.archive(q, t, leaseExpiredErr+"; no retries left", msTime(now), now)
		}
	}
	// Trim completed past retention and archived past count or age.
	res.Trimmed = b.trim(q, now)
	q.minute(now).pending = q.pending

	if len(q.sched) > 0 {
		res.NextDue = q.sched[0].key
	}
	if len(q.active) > 0 {
		res.NextLeaseIn = q.active[0].key.Sub(now)
	}
	res.Pending = q.pending
	return res, nil
}

// Subscribe implements broker.Broker. The channel is buffered; events that
// do not fit are dropped.
func (b *Broker) Subscribe(ctx context.Context, queues []string) (<-chan broker.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if len(queues) == 0 {
		return nil, errors.New("membroker: subscribe: no queues")
	}
	for _, qn := range queues {
		if qn == "" {
			return nil, errors.New("membroker: subscribe: empty queue name")
		}
	}
	queues = slices.Clone(queues)
	s := &subscription{ch: make(chan broker.Event, eventBuffer), queues: queues}
	for _, qn := range queues {
		q := b.queue(qn)
		if q.subs == nil {
			q.subs = make(map[*subscription]struct{})
		}
		q.subs[s] = struct{}{}
	}
	b.subs[s] = struct{}{}
	s.stop = context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.unsubscribe(s)
	})
	return s.ch, nil
}

func (b *Broker) unsubscribe(s *subscription) {
	if s.closed {
		return
	}
	s.closed = true
	for _, qn := range s.queues {
		if q := b.queues[qn]; q != nil {
			delete(q.subs, s)
		}
	}
	delete(b.subs, s)
	close(s.ch)
}

// GetTask implements broker.Broker.
func (b *Broker) GetTask(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	q := b.queues[queue]
	if q == nil {
		return nil, broker.ErrTaskNotFound
	}
	t := q.tasks[id]
	if t == nil {
		return nil, broker.ErrTaskNotFound
	}
	return b.info(t), nil
}

// Delete implements broker.Broker.
func (b *Broker) Delete(ctx context.Context, queue, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	q := b.queues[queue]
	if q == nil {
		return broker.ErrTaskNotFound
	}
	t := q.tasks[id]
	if t == nil {
		return broker.ErrTaskNotFound
	}
	if t.msg.State == tidetype.StateActive {
		return broker.ErrTaskActive
	}
	q.detach(t)
	q.releaseLock(t)
	delete(q.tasks, id)
	return nil
}

// Cancel implements broker.Broker.
func (b *Broker) Cancel(ctx context.Context, queue, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	q := b.queues[queue]
	if q == nil || q.tasks[id] == nil {
		return broker.ErrTaskNotFound
	}
	t := q.tasks[id]
	if t.msg.State == tidetype.StateActive {
		t.canceled = true
		b.emit(q, broker.Event{Kind: broker.EventCancel, Queue: queue, ID: id})
		return nil
	}
	q.detach(t)
	q.releaseLock(t)
	delete(q.tasks, id)
	return nil
}

// trim deletes completed tasks past their retention and archived tasks past
// the archive's age or size, and returns how many.
func (b *Broker) trim(q *queue, now time.Time) int {
	n := 0
	for len(q.completed) > 0 && !q.completed[0].key.After(now) {
		t := heap.Pop(&q.completed).(*task)
		delete(q.tasks, t.msg.ID)
		n++
	}
	for len(q.archived) > 0 && (b.maxArchived > 0 && len(q.archived) > b.maxArchived ||
		b.archiveTTL > 0 && !q.archived[0].key.After(now.Add(-b.archiveTTL))) {
		t := heap.Pop(&q.archived).(*task)
		delete(q.tasks, t.msg.ID)
		n++
	}
	return n
}

// Pause implements broker.Broker.
func (b *Broker) Pause(ctx context.Context, queue string) error {
	return b.setPaused(ctx, queue, true)
}

// Unpause implements broker.Broker. It sends EventPending when tasks wait.
func (b *Broker) Unpause(ctx context.Context, queue string) error {
	return b.setPaused(ctx, queue, false)
}

func (b *Broker) setPaused(ctx context.Context, queue string, paused bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	if queue == "" {
		return errors.New("membroker: empty queue name")
	}
	q := b.queue(queue)
	was := q.paused
	q.paused = paused
	if was && !paused && q.pending > 0 {
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: queue})
	}
	return nil
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
	b.queues = nil
	return nil
}

// addAttempt appends to t's attempt history, keeping the latest
// tidetype.MaxAttempts.
func (t *task) addAttempt(started, ended time.Time, server, outcome, err string) {
	if len(err) > 1024 {
		err = err[:1024]
	}
	t.attempts = append(t.attempts, tidetype.Attempt{Started: msTime(started), Ended: msTime(ended), Server: server, Outcome: outcome, Err: err})
	if n := len(t.attempts); n > tidetype.MaxAttempts {
		t.attempts = slices.Clone(t.attempts[n-tidetype.MaxAttempts:])
	}
}

// ---- copies ----

// normalize returns a deep copy of m with times and durations truncated to
// milliseconds.
func normalize(m *tidetype.TaskInfo) tidetype.TaskInfo {
	c := *clone(m)
	c.NextProcessAt = msTime(c.NextProcessAt)
	c.EnqueuedAt = msTime(c.EnqueuedAt)
	c.LastFailedAt = msTime(c.LastFailedAt)
	c.CompletedAt = msTime(c.CompletedAt)
	c.Deadline = msTime(c.Deadline)
	c.Timeout = c.Timeout.Truncate(time.Millisecond)
	c.Retention = c.Retention.Truncate(time.Millisecond)
	c.UniqueTTL = c.UniqueTTL.Truncate(time.Millisecond)
	return c
}

// clone returns a deep copy of m.
func clone(m *tidetype.TaskInfo) *tidetype.TaskInfo {
	c := *m
	c.Payload = bytes.Clone(m.Payload)
	c.Headers = maps.Clone(m.Headers)
	c.Result = bytes.Clone(m.Result)
	return &c
}

// msTime truncates t to Unix milliseconds, dropping its monotonic reading and
// location; the zero time stays zero.
func msTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.UnixMilli(t.UnixMilli())
}

// ---- heap ----

// taskHeap is a min-heap of tasks by key, then by insertion order.
type taskHeap []*task

func (h taskHeap) Len() int { return len(h) }
func (h taskHeap) Less(i, j int) bool {
	if h[i].key.Equal(h[j].key) {
		return h[i].seq < h[j].seq
	}
	return h[i].key.Before(h[j].key)
}
func (h taskHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *taskHeap) Push(x any) {
	t := x.(*task)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *taskHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.idx = -1
	*h = old[:n-1]
	return t
}
