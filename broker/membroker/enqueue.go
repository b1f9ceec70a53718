package membroker

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

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
