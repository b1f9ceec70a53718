package tide

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Client enqueues and deletes tasks. It is safe for concurrent use; create
// one per process and share it.
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

// clockOf returns the broker's clock when it has one (membroker with a fake
// clock), so that ProcessIn is measured on the same clock the broker uses.
func clockOf(b broker.Broker) func() time.Time {
	if c, ok := b.(interface{ Now() time.Time }); ok {
		return c.Now
	}
	return time.Now
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
func (c *Client) Enqueue(ctx context.Context, t *Task, opts ...Option) (*TaskInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	m, generated, err := c.message(t, opts)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		errs, err := c.b.Enqueue(ctx, []*broker.Message{m})
		if err != nil {
			return nil, fmt.Errorf("tide: enqueue %s: %w", t.Type(), err)
		}
		if errors.Is(errs[0], ErrTaskIDConflict) && generated && attempt < maxIDRetries {
			c.reroll(m) // a random ID met an existing one: draw again
			continue
		}
		if errs[0] != nil {
			return nil, errs[0]
		}
		return newTaskInfo(m), nil
	}
}

// maxIDRetries bounds how often a generated ID that collided is drawn again.
const maxIDRetries = 3

// reroll gives m a new random ID in the same partition.
func (c *Client) reroll(m *broker.Message) {
	parts := c.b.Partitions(m.Queue)
	want := broker.Partition(m.ID, parts)
	m.ID = newID()
	for broker.Partition(m.ID, parts) != want {
		m.ID = newID()
	}
}

// EnqueueMany stores ts in as few round trips as the broker allows (one per
// partition for the Redis broker). opts apply to every task, over each task's
// own options. The returned slice has one entry per task, nil for a task that
// was not stored; the error joins one error per failed task, each naming its
// index and matching the sentinels (errors.Is(err, ErrDuplicateTask)).
// Invalid tasks are reported without storing any task.
func (c *Client) EnqueueMany(ctx context.Context, ts []*Task, opts ...Option) ([]*TaskInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	msgs := make([]*broker.Message, len(ts))
	generated := make([]bool, len(ts))
	var invalid []error
	for i, t := range ts {
		m, gen, err := c.message(t, opts)
		if err != nil {
			invalid = append(invalid, fmt.Errorf("task %d: %w", i, err))
			continue
		}
		msgs[i], generated[i] = m, gen
	}
	if invalid != nil {
		return nil, errors.Join(invalid...)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	errs, err := c.b.Enqueue(ctx, msgs)
	if err != nil {
		return nil, fmt.Errorf("tide: enqueue %d tasks: %w", len(ts), err)
	}
	// Random IDs that met existing ones are drawn again and sent again.
	for attempt := 0; attempt < maxIDRetries; attempt++ {
		var again []*broker.Message
		var at []int
		for i, e := range errs {
			if generated[i] && errors.Is(e, ErrTaskIDConflict) {
				c.reroll(msgs[i])
				again, at = append(again, msgs[i]), append(at, i)
			}
		}
		if len(again) == 0 {
			break
		}
		errs2, err := c.b.Enqueue(ctx, again)
		if err != nil {
			return nil, fmt.Errorf("tide: enqueue %d tasks: %w", len(again), err)
		}
		for j, i := range at {
			errs[i] = errs2[j]
		}
	}
	infos := make([]*TaskInfo, len(ts))
	var failed []error
	for i, m := range msgs {
		if errs[i] != nil {
			failed = append(failed, fmt.Errorf("task %d (%s): %w", i, m.ID, errs[i]))
			continue
		}
		infos[i] = newTaskInfo(m)
	}
	return infos, errors.Join(failed...)
}

// Delete removes a pending, scheduled, retry, archived or completed task. It
// returns ErrTaskNotFound when there is no such task and ErrTaskActive when
// the task is being processed (cancel it with Inspector.CancelProcessing).
func (c *Client) Delete(ctx context.Context, queue, id string) error {
	if c.closed.Load() {
		return ErrClientClosed
	}
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	if err := validateName("task ID", id); err != nil {
		return err
	}
	return c.b.Delete(ctx, queue, id)
}

// message validates t with opts and builds the broker message; generated
// reports that its ID was drawn at random (not given with TaskID).
func (c *Client) message(t *Task, opts []Option) (m *broker.Message, generated bool, err error) {
	if t == nil {
		return nil, false, fmt.Errorf("%w: nil task", ErrInvalidTask)
	}
	if err := validateName("task type", t.typ); err != nil {
		return nil, false, err
	}
	if len(t.payload) > MaxPayloadSize {
		return nil, false, fmt.Errorf("%w: %s payload is %d bytes, over the %d-byte limit (MaxPayloadSize)", ErrInvalidTask, t.typ, len(t.payload), MaxPayloadSize)
	}
	hsize := 0
	for k, v := range t.headers {
		hsize += len(k) + len(v)
	}
	if hsize > MaxHeadersSize {
		return nil, false, fmt.Errorf("%w: %s headers are %d bytes, over the %d-byte limit (MaxHeadersSize)", ErrInvalidTask, t.typ, hsize, MaxHeadersSize)
	}
	o := enqueueOptions{queue: DefaultQueue, maxRetry: DefaultMaxRetry}
	for _, list := range [][]Option{t.opts, opts} {
		for _, opt := range list {
			if opt == nil {
				return nil, false, fmt.Errorf("%w: nil Option", ErrInvalidTask)
			}
			if err := opt.apply(&o); err != nil {
				if errors.Is(err, ErrInvalidTask) {
					return nil, false, err
				}
				return nil, false, fmt.Errorf("%w: %v", ErrInvalidTask, err)
			}
		}
	}
	now := c.now().Truncate(time.Millisecond)
	due := now
	if o.hasIn {
		due = now.Add(o.processIn)
	} else if !o.processAt.IsZero() && o.processAt.After(now) {
		due = o.processAt
	}
	due = due.Truncate(time.Millisecond)
	m = &broker.Message{
		ID:         o.id,
		Queue:      o.queue,
		Type:       t.typ,
		Payload:    t.payload,
		Headers:    maps.Clone(t.headers),
		State:      broker.StatePending,
		MaxRetry:   o.maxRetry,
		ProcessAt:  due,
		EnqueuedAt: now,
		Timeout:    o.timeout,
		Deadline:   o.deadline,
		Retention:  o.retention,

		WaitReplicas: o.replicas,
		WaitTimeout:  o.waitFor,
	}
	if due.After(now) {
		m.State = broker.StateScheduled
	}
	parts := c.b.Partitions(o.queue)
	if o.uniqueTTL > 0 {
		m.UniqueTTL = o.uniqueTTL
		m.UniqueKey = uniqueKey(o.queue, t.typ, t.payload)
		if m.ID != "" && parts > 1 {
			return nil, false, fmt.Errorf("%w: Unique cannot be combined with TaskID on queue %q, which has %d partitions; the task ID already makes the task unique", ErrInvalidTask, o.queue, parts)
		}
	}
	if m.ID == "" {
		generated = true
		m.ID = newID()
		if m.UniqueKey != "" && parts > 1 {
			// Place the task in its lock's partition so one script sees both.
			want := broker.Partition(m.UniqueKey, parts)
			for broker.Partition(m.ID, parts) != want {
				m.ID = newID()
			}
		}
	}
	return m, generated, nil
}

// newID returns 72 random bits as 12 base64url characters. An ID is stored
// twice per task (record field and index), so its length is memory: 12
// characters fit Redis's 16-byte allocation class, where a 22-character form
// of a UUID needs 32 bytes and the 36-character text form 48. A collision is
// unlikely (about one in ten thousand among a billion live tasks) and
// harmless: the broker refuses it (ErrTaskIDConflict) and the client draws
// again, so tasks are never merged and Enqueue does not fail for it.
func newID() string {
	var b [9]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("tide: no randomness for task IDs: " + err.Error()) // crypto/rand never fails on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
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
