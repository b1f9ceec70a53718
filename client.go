package tide

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Client enqueues, deletes and cancels tasks. It is safe for concurrent use;
// create one per process and share it.
type Client struct {
	b      broker.Broker
	now    func() time.Time
	closed atomic.Bool
}

// NewClient returns a Client that stores tasks in b. The client does not own
// b: Close leaves it open. NewClient panics if b is nil.
func NewClient(b broker.Broker) *Client {
	if b == nil {
		panic("tide: NewClient: nil broker")
	}
	return &Client{b: b, now: clockOf(b)}
}

// clockOf returns the broker's clock when it is a broker.Clock (the Redis
// server's time for the Redis broker, the fake clock of a membroker in
// tests), so that ProcessIn is measured on the clock the broker decides with.
func clockOf(b broker.Broker) func() time.Time {
	return b.Now
}

// Close marks the client closed; later calls return ErrClientClosed. It does
// not close the broker. Close is idempotent.
func (c *Client) Close() error {
	c.closed.Store(true)
	return nil
}

// Enqueue stores t. opts override the task's own options. A task without
// ProcessIn/ProcessAt (or due now) is pending at once; otherwise it is
// scheduled. Enqueue returns ErrTaskIDConflict, ErrDuplicateTask, or an error
// wrapping ErrInvalidTask that names what is wrong with the task.
//
// When the broker could not be reached the error wraps ErrUnavailable and
// nothing was stored. When the request was sent but no answer came (Redis
// stalled past the client's timeouts) the error also wraps ErrOutcomeUnknown
// and Enqueue returns the task's info as well: the task may or may not
// exist. Enqueue never stores a task twice because an answer was lost.
// ErrNotReplicated (WaitForReplicas) also comes with the info: the task is
// stored.
func (c *Client) Enqueue(ctx context.Context, t *Task, opts ...Option) (*TaskInfo, error) {
	return c.enqueue(ctx, t, opts, false)
}

// enqueue is Enqueue; watch registers a waiter with the task
// (EnqueueAndWait).
func (c *Client) enqueue(ctx context.Context, t *Task, opts []Option, watch bool) (*TaskInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	info, eo, err := c.task(t, opts)
	if err != nil {
		return nil, err
	}
	eo.Watch = watch
	if err := c.checkPlacement(ctx, info); err != nil {
		return nil, err
	}
	errs, err := c.b.Enqueue(ctx, []*TaskInfo{info}, eo)
	if err != nil {
		return nil, fmt.Errorf("tide: enqueue %s: %w", t.Type(), err)
	}
	if err := errs[0]; err != nil {
		if stored(err) {
			return info, err
		}
		return nil, err
	}
	return info, nil
}

// checkPlacement refuses Unique with TaskID on a queue with several
// partitions: the task and its lock must share a partition, which only an
// ID the broker chooses can promise.
func (c *Client) checkPlacement(ctx context.Context, t *TaskInfo) error {
	if t.ID == "" || t.UniqueKey == "" || t.Group != "" {
		// A grouped task's ID and lock both carry the group's tag.
		return nil
	}
	n, err := c.b.Partitions(ctx, t.Queue)
	if err != nil {
		return fmt.Errorf("tide: enqueue %s: %w", t.Type, err)
	}
	if n > 1 {
		return fmt.Errorf("%w: Unique cannot be combined with TaskID on queue %q, which has %d partitions; the task ID already makes the task unique", ErrInvalidTask, t.Queue, n)
	}
	return nil
}

// stored reports an Enqueue error that still comes with the task's info:
// the task is, or may be, stored.
func stored(err error) bool {
	return errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNotReplicated)
}

// EnqueueMany stores ts in as few round trips as the broker allows (one per
// partition for the Redis broker). opts apply to every task, over each task's
// own options. The returned slice has one entry per task, nil for a task that
// was not stored (see Enqueue for the errors that come with an entry); the
// error joins one error per failed task, each naming its index and matching
// the sentinels (errors.Is(err, ErrDuplicateTask)). Invalid tasks are
// reported without storing any task. One partition that cannot be reached
// fails only its own tasks.
func (c *Client) EnqueueMany(ctx context.Context, ts []*Task, opts ...Option) ([]*TaskInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	infos := make([]*TaskInfo, len(ts))
	var eo broker.EnqueueOptions
	var invalid []error
	replacing := -1 // index of the first task with an ID, when Replace is mixed
	for i, t := range ts {
		info, o, err := c.task(t, opts)
		if err == nil {
			err = c.checkPlacement(ctx, info)
		}
		if err == nil && info.ID != "" {
			switch {
			case replacing < 0:
				replacing, eo.Replace = i, o.Replace
			case o.Replace != eo.Replace:
				err = fmt.Errorf("%w: Replace is given to some tasks with TaskID of this EnqueueMany and not to others (first: task %d); enqueue them in separate calls", ErrInvalidTask, replacing)
			}
		}
		if err != nil {
			invalid = append(invalid, fmt.Errorf("task %d: %w", i, err))
			continue
		}
		infos[i] = info
		eo.WaitReplicas, eo.WaitTimeout = max(eo.WaitReplicas, o.WaitReplicas), max(eo.WaitTimeout, o.WaitTimeout)
	}
	if invalid != nil {
		return nil, errors.Join(invalid...)
	}
	if len(ts) == 0 {
		return nil, nil
	}
	errs, err := c.b.Enqueue(ctx, infos, eo)
	if err != nil {
		return nil, fmt.Errorf("tide: enqueue %d tasks: %w", len(ts), err)
	}
	var failed []error
	for i, e := range errs {
		if e == nil {
			continue
		}
		failed = append(failed, fmt.Errorf("task %d (%s): %w", i, infos[i].ID, e))
		if !stored(e) {
			infos[i] = nil
		}
	}
	return infos, errors.Join(failed...)
}

// Delete removes a pending, scheduled, retry, archived or completed task. It
// returns ErrTaskNotFound when there is no such task and ErrTaskActive when
// the task is being processed (use Cancel, which stops it whatever its
// state). A workflow step or batch task that has not finished is not
// deleted but archived ("deleted by an operator"), which is its end: its
// workflow learns in the same atomic step and cancels the steps after it
// (a batch counts it failed). A workflow follow-up (FlowType) is refused
// with ErrInternalTask.
func (c *Client) Delete(ctx context.Context, queue, id string) error {
	if c.closed.Load() {
		return ErrClientClosed
	}
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return c.b.Delete(ctx, queue, id)
}

// Cancel stops a task whatever its state: "the order was paid, stop the
// timer". A task that is waiting (pending, scheduled, retry) or finished
// (archived, completed) is deleted. A running task has its cancellation
// recorded: its handler's context is cancelled with the cause
// ErrTaskCanceled (at once, and at its server's next lease renewal at the
// latest if the notice is lost), and unless the handler still succeeds the
// task is archived as cancelled, never retried. A waiting workflow step or
// batch task is archived as cancelled instead of deleted, so that its
// workflow learns (see Delete; CancelWorkflow stops a whole workflow). A
// workflow follow-up (FlowType) is refused with ErrInternalTask.
// Cancel returns ErrTaskNotFound when there is no such task.
func (c *Client) Cancel(ctx context.Context, queue, id string) error {
	if c.closed.Load() {
		return ErrClientClosed
	}
	if err := checkQueueAndID(queue, id); err != nil {
		return err
	}
	return c.b.Cancel(ctx, queue, id)
}

// task validates t with opts and builds the task to store (with an empty ID
// unless TaskID gave one: the broker chooses it) and the options of the
// broker call.
func (c *Client) task(t *Task, opts []Option) (*TaskInfo, broker.EnqueueOptions, error) {
	return prepare(t, opts, c.now())
}

// applyOptions applies the task's options and then the call's to o.
func applyOptions(o *enqueueOptions, lists ...[]Option) error {
	for _, list := range lists {
		for _, opt := range list {
			if opt == nil {
				return fmt.Errorf("%w: nil Option", ErrInvalidTask)
			}
			if err := opt.apply(o); err != nil {
				if errors.Is(err, ErrInvalidTask) {
					return err
				}
				return fmt.Errorf("%w: %v", ErrInvalidTask, err)
			}
		}
	}
	return nil
}

// prepare applies t's options and opts at now: the task as Enqueue stores it
// and the options of the Enqueue call itself.
func prepare(t *Task, opts []Option, clock time.Time) (*TaskInfo, broker.EnqueueOptions, error) {
	var none broker.EnqueueOptions
	if t == nil {
		return nil, none, fmt.Errorf("%w: nil task", ErrInvalidTask)
	}
	if err := validateName("task type", t.typ); err != nil {
		return nil, none, err
	}
	if err := checkReservedType(t.typ); err != nil {
		return nil, none, err
	}
	if len(t.payload) > MaxPayloadSize {
		return nil, none, fmt.Errorf("%w: %s payload is %d bytes, over the %d-byte limit (MaxPayloadSize)", ErrInvalidTask, t.typ, len(t.payload), MaxPayloadSize)
	}
	if err := checkReservedHeaders(t.headers, false); err != nil {
		return nil, none, err
	}
	hsize := 0
	for k, v := range t.headers {
		hsize += len(k) + len(v)
	}
	if hsize > MaxHeadersSize {
		return nil, none, fmt.Errorf("%w: %s headers are %d bytes, over the %d-byte limit (MaxHeadersSize)", ErrInvalidTask, t.typ, hsize, MaxHeadersSize)
	}
	o := enqueueOptions{queue: DefaultQueue, maxRetry: DefaultMaxRetry}
	if len(t.opts)+len(opts) > 0 {
		// Options write through a pointer, which puts what it points to
		// on the heap: a copy, so that a call without options allocates
		// none.
		po := new(enqueueOptions)
		*po = o
		if err := applyOptions(po, t.opts, opts); err != nil {
			return nil, none, err
		}
		o = *po
	}
	now := clock.Truncate(time.Millisecond)
	due := now
	if o.hasIn {
		due = now.Add(o.processIn)
	} else if !o.processAt.IsZero() && o.processAt.After(now) {
		due = o.processAt
	}
	due = due.Truncate(time.Millisecond)
	info := &TaskInfo{
		ID:            o.id,
		Queue:         o.queue,
		Type:          t.typ,
		Payload:       t.payload,
		Headers:       maps.Clone(t.headers),
		State:         StatePending,
		MaxRetry:      o.maxRetry,
		NextProcessAt: due,
		EnqueuedAt:    now,
		Timeout:       o.timeout,
		Deadline:      o.deadline,
		Retention:     o.retention,
	}
	if due.After(now) {
		info.State = StateScheduled
	}
	if o.uniqueTTL > 0 {
		info.UniqueTTL = o.uniqueTTL
		info.UniqueKey = uniqueKey(o.queue, t.typ, t.payload)
	}
	info.IdempotencyKey = o.idemKey
	if o.group != "" {
		info.Group = o.group
		if info.UniqueKey != "" {
			// The lock lives with the group's tasks: unique within the group.
			info.UniqueKey += "{" + o.group + "}"
		}
		// An ID without the group's tag is the broker's to place (the
		// Redis broker keeps a pointer from the ID's partition to the
		// group's).
	}
	if o.notify != "" {
		if info.Headers == nil {
			info.Headers = map[string]string{}
		}
		info.Headers[notifyHeader] = o.notify
	}
	if o.replace && o.id == "" {
		return nil, none, fmt.Errorf("%w: Replace needs TaskID: it replaces the waiting task with that ID", ErrInvalidTask)
	}
	if o.replace && o.uniqueTTL > 0 {
		return nil, none, fmt.Errorf("%w: Replace cannot be combined with Unique: the task ID already names the one task to keep", ErrInvalidTask)
	}
	return info, broker.EnqueueOptions{WaitReplicas: o.replicas, WaitTimeout: o.waitFor, Replace: o.replace}, nil
}

// uniqueKey digests queue, type and payload into the lock name.
func uniqueKey(queue, typ string, payload []byte) string {
	h := sha256.New()
	h.Write([]byte(queue))
	h.Write([]byte{0})
	h.Write([]byte(typ))
	h.Write([]byte{0})
	h.Write(payload)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}
