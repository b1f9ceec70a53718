package membroker

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Enqueue implements broker.Broker. A grouped task without an ID gets one
// that carries its group as hash tag ("<random>{<group>}"). With
// opts.Replace a task whose ID exists takes the place of a waiting task
// (pending, scheduled, retry), keeping its enqueue sequence, its attempt
// history and, in an ordered group, the place it holds; a finished one
// (completed, archived) is deleted first; an active one is an ID conflict.
func (b *Broker) Enqueue(ctx context.Context, msgs []*tidetype.TaskInfo, opts broker.EnqueueOptions) ([]error, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = b.enqueue(m, now, opts.Replace)
		if errs[i] == nil && opts.Watch {
			if t := b.queue(m.Queue).tasks[m.ID]; t != nil {
				t.watched = true
			}
		}
	}
	return errs, nil
}

func (b *Broker) enqueue(m *tidetype.TaskInfo, now time.Time, replace bool) error {
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
		m.ID = drawID(m.Group)
		for q.tasks[m.ID] != nil {
			m.ID = drawID(m.Group)
		}
	}
	t := q.tasks[m.ID]
	if t != nil && (!replace || t.msg.State == tidetype.StateActive || t.internal || t.msg.Headers[broker.FlowHeader] != "") {
		// An active task, a workflow step or batch task and a task the
		// broker stored itself are never replaced.
		return broker.ErrTaskIDConflict
	}
	if m.UniqueKey != "" {
		if l, ok := q.locks[m.UniqueKey]; ok && now.Before(l.expires) && (t == nil || l.id != m.ID) {
			return broker.ErrDuplicateTask
		}
	}
	if t != nil {
		// Replace: a waiting task of the same group keeps its place; any
		// other is gone, and the new task is a new one.
		st := t.msg.State
		waiting := st == tidetype.StatePending || st == tidetype.StateScheduled || st == tidetype.StateRetry || st == tidetype.StateWaiting
		q.detach(t)
		q.releaseLock(t)
		if !waiting || t.msg.Group != m.Group {
			delete(q.tasks, t.msg.ID)
			b.release(q, t, false, true)
			t = nil
		}
	}
	if t == nil {
		q.eseq++
		t = &task{eseq: q.eseq}
	}
	t.msg, t.idx, t.canceled = normalize(m), -1, false
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
	b.event(q, t, tidetype.EventEnqueued, "")
	return nil
}

// drawID returns a new task ID; a grouped task's carries its group as hash
// tag (see broker.Partition).
func drawID(group string) string {
	if group == "" {
		return broker.NewID()
	}
	return broker.NewID() + "{" + group + "}"
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
		return fmt.Errorf("%w: membroker: task %q: enqueue state must be pending or scheduled, not %s", broker.ErrInvalidTask, m.ID, m.State)
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
	if err := broker.CheckID(m.ID); err != nil {
		return err
	}
	if m.Group != "" {
		// One partition a queue: any ID goes with any group.
		return broker.CheckGroup(m.Group)
	}
	return nil
}
