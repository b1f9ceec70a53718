package encrypt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Wrap returns a broker that stores the payloads and results of b's tasks
// encrypted with AES-256-GCM. The first key encrypts; every key decrypts, so
// that values sealed before a rotation stay readable. Values written before
// encryption was turned on are read as they are.
//
// The returned broker implements exactly the optional interfaces b
// implements: broker.Admin (ListTasks decrypts), broker.Registry,
// broker.Clock and broker.Repartitioner (passed through). It is also always
// a broker.Waiter, broker.ProgressReporter and broker.EventReader, which
// pass through (events carry no payload) and fail when b is not one.
// Closing it closes b.
//
// Wrap copies what it needs from keys; it returns an error, naming the key by
// ID and never showing a secret, when there is no key, a key has ID 0 or a
// secret that is not 32 bytes, or an ID is given twice.
func Wrap(b broker.Broker, keys ...Key) (broker.Broker, error) {
	if b == nil {
		return nil, errors.New("encrypt: Wrap: nil broker")
	}
	kr, err := newKeyring(keys)
	if err != nil {
		return nil, err
	}
	return &wrapper{Broker: b, b: b, kr: kr, now: b.Now}, nil
}

// wrapper is the broker Wrap returns. It embeds the wrapped broker, so that
// every method passes through, and overrides those that carry payloads or
// results: Enqueue, Settle and SetResult seal them; Dequeue, GetTask, Wait,
// ListTasks, SearchTasks and the flows' CreateFlow, EndStep and ReadySteps
// open them (TestEveryTaskMethodWrapped checks that no method carrying a
// task is left to pass through).
type wrapper struct {
	broker.Broker
	b   broker.Broker // the same, named for the overrides
	kr  *keyring
	now func() time.Time // the broker's clock
}

// maxRedraws bounds how often a task ID the wrapper drew, which met another
// task, is drawn again (as the brokers bound their own).
const maxRedraws = 5

// maxDequeueRounds bounds how often one Dequeue asks again for tasks to
// replace those it archived because they would not decrypt.
const maxDequeueRounds = 8

// Enqueue implements broker.Broker. Each payload is sealed bound to its
// queue and task ID. A task without an ID gets one here (broker.NewID), so
// that the ID is known before sealing; the broker keeps a caller's ID. The
// exception is a task with a unique key and no ID: its ID must be drawn by
// the broker, in the partition of its lock, so its payload is bound to the
// queue and unique key instead. Empty payloads are stored as they are.
func (w *wrapper) Enqueue(ctx context.Context, tasks []*tidetype.TaskInfo, opts broker.EnqueueOptions) ([]error, error) {
	send := make([]*tidetype.TaskInfo, len(tasks))
	drawn := make([]bool, len(tasks))
	for i, t := range tasks {
		send[i] = t
		if t != nil && t.Headers[broker.SealedHeader] != "" {
			// A flow's kept task whose payload this process could not open
			// (openReady): stored sealed as it was, without the mark.
			c := *t
			c.Headers = maps.Clone(t.Headers)
			delete(c.Headers, broker.SealedHeader)
			if !IsSealed(c.Payload) || c.ID == "" {
				return nil, fmt.Errorf("encrypt: enqueue: header %s on a task that was not kept sealed by a flow", broker.SealedHeader)
			}
			send[i] = &c
			continue
		}
		if t == nil || (len(t.Payload) == 0 && len(t.Result) == 0) {
			continue // nothing to hide; the broker validates and assigns as usual
		}
		c := *t
		bind := byte(bindID)
		switch {
		case c.ID != "":
		case c.UniqueKey != "":
			bind = bindUnique
		default:
			id, err := w.drawID(ctx, &c)
			if err != nil {
				return nil, err
			}
			c.ID, drawn[i] = id, true
		}
		w.sealTask(&c, c.Queue, c.ID, bind, t)
		send[i] = &c
	}
	// The broker writes the IDs it draws into send; hand them (and ours)
	// back, as the contract asks, however the call ends.
	defer func() {
		for i, t := range tasks {
			if t != nil && send[i] != t {
				t.ID = send[i].ID
			}
		}
	}()
	errs, err := w.b.Enqueue(ctx, send, opts)
	if err != nil || len(errs) != len(tasks) {
		return errs, err
	}
	var todo []int
	for i := range tasks {
		if drawn[i] && errors.Is(errs[i], broker.ErrTaskIDConflict) {
			todo = append(todo, i)
		}
	}
	for round := 0; len(todo) > 0; round++ {
		var again []int
		for _, i := range todo {
			switch w.holder(ctx, send[i], tasks[i]) {
			case heldByThis:
				errs[i] = nil
			case heldByOther:
				if round >= maxRedraws {
					errs[i] = fmt.Errorf("encrypt: enqueue: %d task IDs drawn at random all met existing tasks: %w", maxRedraws+1, broker.ErrTaskIDConflict)
					continue
				}
				id, err := w.drawID(ctx, send[i])
				if err != nil {
					return nil, err
				}
				send[i].ID = id
				w.sealTask(send[i], send[i].Queue, send[i].ID, bindID, tasks[i])
				again = append(again, i)
			default:
				errs[i] = fmt.Errorf("encrypt: enqueue: the task ID %s drawn for the task met a task that could not be looked at: %w", send[i].ID, broker.ErrTaskIDConflict)
			}
		}
		todo = todo[:0]
		if len(again) == 0 {
			break
		}
		sub := make([]*tidetype.TaskInfo, len(again))
		for j, i := range again {
			sub[j] = send[i]
		}
		subErrs, err := w.b.Enqueue(ctx, sub, opts)
		for j, i := range again {
			switch {
			case err != nil:
				errs[i] = err
			case j < len(subErrs):
				errs[i] = subErrs[j]
				if errors.Is(subErrs[j], broker.ErrTaskIDConflict) {
					todo = append(todo, i)
				}
			}
		}
	}
	return errs, nil
}

// drawID draws an ID for t. A task with an idempotency key gets an ID in
// the key's partition, as the broker would draw it: the key is kept beside
// its task.
func (w *wrapper) drawID(ctx context.Context, t *tidetype.TaskInfo) (string, error) {
	id := broker.NewID()
	if t.Group != "" {
		// The group's tag keeps the task with its group (see broker.Partition).
		return id + "{" + t.Group + "}", nil
	}
	if t.IdempotencyKey == "" {
		return id, nil
	}
	n, err := w.b.Partitions(ctx, t.Queue)
	if err != nil {
		return "", fmt.Errorf("encrypt: enqueue: %w", err)
	}
	for n > 1 && broker.Partition(id, n) != broker.Partition(t.IdempotencyKey, n) {
		id = broker.NewID()
	}
	return id, nil
}

// sealTask replaces c's payload and result by orig's, sealed for queue and
// id (or c's unique key when bind is bindUnique).
func (w *wrapper) sealTask(c *tidetype.TaskInfo, queue, id string, bind byte, orig *tidetype.TaskInfo) {
	at := where{field: fieldPayload, queue: queue, id: id, uniqueKey: c.UniqueKey}
	if len(orig.Payload) > 0 {
		c.Payload = w.kr.seal(at, bind, orig.Payload)
	}
	if len(orig.Result) > 0 {
		at.field = fieldResult
		c.Result = w.kr.seal(at, bind, orig.Result)
	}
}

type holding int

const (
	heldUnknown holding = iota
	heldByThis
	heldByOther
)

// holder tells who holds the ID of sent, which the broker refused as taken:
// this very task (the request ran twice; the broker's reply cache makes that
// all but impossible), another one (a collision: draw again), or unknown (the
// task is gone or could not be read: report the conflict rather than risk
// storing the task twice). A sealed payload is unique, so an equal one proves
// the record is this task's; a record re-sealed since (a completed task kept
// with Retention) is this task's when its plaintext, type and enqueue time
// match.
func (w *wrapper) holder(ctx context.Context, sent, orig *tidetype.TaskInfo) holding {
	if len(sent.Payload) == 0 {
		return heldUnknown // no sealed payload to recognise the task by
	}
	got, err := w.b.GetTask(ctx, sent.Queue, sent.ID)
	if err != nil || got == nil {
		return heldUnknown
	}
	if bytes.Equal(got.Payload, sent.Payload) {
		return heldByThis
	}
	if IsSealed(got.Payload) && got.Type == orig.Type && !orig.EnqueuedAt.IsZero() &&
		got.EnqueuedAt.UnixMilli() == orig.EnqueuedAt.UnixMilli() {
		if p, err := w.kr.open(where{fieldPayload, got.Queue, got.ID, got.UniqueKey}, got.Payload); err == nil && bytes.Equal(p, orig.Payload) {
			return heldByThis
		}
	}
	return heldByOther
}

// Dequeue implements broker.Broker. Deliveries come back decrypted. A task
// whose payload does not decrypt (unknown key, altered or moved value) is
// not handed out: it is archived at once with the reason as its error (its
// stored payload untouched, so that it can be run again once the key is
// there), and further tasks are dequeued in its place. A delivery's result
// that does not decrypt is dropped from the delivery (handlers do not see
// results). Its durable records (Delivery.Steps) come back decrypted; when
// one does not decrypt they are dropped from the delivery, and the
// handler's first step loads them with LoadSteps, which fails with the
// reason.
func (w *wrapper) Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	var out []*broker.Delivery
	want := n
	for round := 1; ; round++ {
		ds, err := w.b.Dequeue(ctx, queues, want, lease)
		var bad []broker.Settlement
		for _, d := range ds {
			if d == nil || d.Task == nil {
				out = append(out, d)
				continue
			}
			if oerr := w.openDelivery(d.Task); oerr != nil {
				bad = append(bad, broker.Settlement{
					Lease: d.Lease(), Kind: broker.SettleArchive, Task: d.Task,
					Err: oerr.Error(), At: w.now(),
				})
				continue
			}
			w.openSteps(d)
			out = append(out, d)
		}
		if len(bad) > 0 {
			// When this fails the lease runs out and the task comes back
			// through lease recovery; the next Dequeue archives it.
			_, _ = w.b.Settle(ctx, bad)
		}
		if err != nil || len(bad) == 0 || len(ds) < want || round >= maxDequeueRounds {
			return out, err
		}
		want = n - len(out)
	}
}

// openDelivery decrypts a delivered task in place. It returns the error of a
// payload that does not decrypt and then leaves t untouched.
func (w *wrapper) openDelivery(t *tidetype.TaskInfo) error {
	at := where{field: fieldPayload, queue: t.Queue, id: t.ID, uniqueKey: t.UniqueKey}
	p, err := w.kr.open(at, t.Payload)
	if err != nil {
		return err
	}
	at.field = fieldResult
	r, err := w.kr.open(at, t.Result)
	if err != nil {
		r = nil
	}
	t.Payload, t.Result = p, r
	return nil
}

// Settle implements broker.Broker. The task a settlement carries (which a
// broker may write back, as the Redis broker does for a completed task kept
// with Retention) is sealed again, bound to its lease's queue and ID; the
// caller's task is not changed.
func (w *wrapper) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	out, copied := ss, false
	for i, s := range ss {
		if s.Task == nil || (len(s.Task.Payload) == 0 && len(s.Task.Result) == 0) {
			continue
		}
		if !copied {
			out, copied = slices.Clone(ss), true
		}
		c := *s.Task
		w.sealTask(&c, s.Lease.Queue, s.Lease.ID, bindID, s.Task)
		out[i].Task = &c
	}
	return w.b.Settle(ctx, out)
}

// SetResult implements broker.Broker: the result is sealed bound to the
// lease's queue and task ID.
func (w *wrapper) SetResult(ctx context.Context, lease broker.LeaseRef, data []byte) error {
	if len(data) > 0 {
		data = w.kr.seal(where{field: fieldResult, queue: lease.Queue, id: lease.ID}, bindID, data)
	}
	return w.b.SetResult(ctx, lease, data)
}

// GetTask implements broker.Broker. The task comes back decrypted; a payload
// or result that does not decrypt is returned as nil and the reason is put
// in front of LastErr (see openTask).
func (w *wrapper) GetTask(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error) {
	t, err := w.b.GetTask(ctx, queue, id)
	if err != nil || t == nil {
		return t, err
	}
	w.kr.openTask(t)
	return t, nil
}

// Wait implements broker.Waiter: the task comes back decrypted, as GetTask
// returns it.
func (w *wrapper) Wait(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error) {
	t, err := w.b.Wait(ctx, queue, id)
	if err != nil || t == nil {
		return t, err
	}
	w.kr.openTask(t)
	return t, nil
}

// openTask decrypts a task read for inspection in place. A payload or result
// that does not decrypt becomes nil, and LastErr starts with why ("encrypt:
// cannot decrypt payload: unknown key 3 (this process has keys 2, 1)"),
// followed by the task's own last error, if any, on the next line.
func (kr *keyring) openTask(t *tidetype.TaskInfo) {
	at := where{field: fieldPayload, queue: t.Queue, id: t.ID, uniqueKey: t.UniqueKey}
	var why []string
	if p, err := kr.open(at, t.Payload); err != nil {
		t.Payload, why = nil, append(why, err.Error())
	} else {
		t.Payload = p
	}
	at.field = fieldResult
	if r, err := kr.open(at, t.Result); err != nil {
		t.Result, why = nil, append(why, err.Error())
	} else {
		t.Result = r
	}
	if why == nil {
		return
	}
	mark := strings.Join(why, "\n")
	switch {
	case t.LastErr == "":
		t.LastErr = mark
	case !strings.HasPrefix(t.LastErr, mark):
		t.LastErr = mark + "\nlast error: " + t.LastErr
	}
}
