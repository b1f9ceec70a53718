package membroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

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
	if t.flowFollowup() {
		return fmt.Errorf("%w (task %s/%s)", broker.ErrInternalTask, queue, id)
	}
	if t.msg.State == tidetype.StateActive {
		return broker.ErrTaskActive
	}
	b.dropOrFail(queue, q, t, deletedErr, tidetype.EventDeleted)
	return nil
}

// deletedErr is the last error of a flow's step that was deleted.
const deletedErr = "tide: deleted by an operator"

// dropOrFail deletes t, which is not active, unless it is a flow's step
// that has not finished (broker.FlowHeader): that one is archived with
// why, its end (failed), which its flow learns from its follow-up. A task
// deleted is recorded as the event kind.
func (b *Broker) dropOrFail(qn string, q *queue, t *task, why string, kind tidetype.TaskEventKind) {
	st := t.msg.State
	if t.msg.Headers[broker.FlowHeader] == "" || (st != tidetype.StatePending && st != tidetype.StateScheduled && st != tidetype.StateRetry && st != tidetype.StateWaiting) {
		b.event(q, t, kind, "")
		b.drop(q, t)
		return
	}
	now := b.clock.Now()
	q.detach(t)
	b.archive(q, t, why, msTime(now), now)
	b.release(q, t, false, true)
}

// Cancel implements broker.Broker.
func (b *Broker) Cancel(ctx context.Context, queue, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cancel(ctx, queue, id)
}

func (b *Broker) cancel(ctx context.Context, queue, id string) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	q := b.queues[queue]
	if q == nil || q.tasks[id] == nil {
		return broker.ErrTaskNotFound
	}
	t := q.tasks[id]
	if t.flowFollowup() {
		return fmt.Errorf("%w (task %s/%s)", broker.ErrInternalTask, queue, id)
	}
	if t.msg.State == tidetype.StateActive {
		if !t.canceled {
			b.event(q, t, tidetype.EventCancelled, "")
		}
		t.canceled = true
		b.emit(q, broker.Event{Kind: broker.EventCancel, Queue: queue, ID: id})
		return nil
	}
	b.dropOrFail(queue, q, t, canceledErr, tidetype.EventCancelled)
	return nil
}

// CancelStepTask implements broker.Flows.
func (b *Broker) CancelStepTask(ctx context.Context, queue, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	q := b.queues[queue]
	var t *task
	if q != nil {
		t = q.tasks[id]
	}
	switch {
	case t == nil:
		// Ended and gone: a follow-up still stored tells the flow.
		for k := 1; q != nil && k <= 8; k++ {
			fid := "tide:f:" + id
			if k > 1 {
				fid += "#" + strconv.Itoa(k)
			}
			if q.tasks[fid] != nil {
				return nil
			}
		}
		return broker.ErrTaskNotFound
	case t.msg.State == tidetype.StateCompleted || t.msg.State == tidetype.StateArchived:
		// Finished: its follow-up was stored when it ended; nothing
		// reports the end of one that is not followed.
		if typ, _ := broker.FollowupType(t.msg.Headers); typ == "" {
			return broker.ErrTaskNotFound
		}
		return nil
	}
	return b.cancel(ctx, queue, id)
}

// Pause implements broker.Broker.
func (b *Broker) Pause(ctx context.Context, queue string) error {
	return b.setPaused(ctx, queue, true, 0)
}

// PauseFor implements broker.Admin.
func (b *Broker) PauseFor(ctx context.Context, queue string, d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("membroker: pause %s for %v: under a millisecond", queue, d)
	}
	return b.setPaused(ctx, queue, true, d)
}

// Unpause implements broker.Broker. It sends EventPending when tasks wait.
func (b *Broker) Unpause(ctx context.Context, queue string) error {
	return b.setPaused(ctx, queue, false, 0)
}

func (b *Broker) setPaused(ctx context.Context, queue string, paused bool, d time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	if queue == "" {
		return errors.New("membroker: empty queue name")
	}
	q := b.queue(queue)
	now := b.clock.Now()
	was := q.isPaused(now)
	q.paused, q.pausedUntil = paused, time.Time{}
	if paused && d > 0 {
		// Rounded up to the millisecond: the pause lasts at least d.
		q.pausedUntil = msTime(now.Add(d + time.Millisecond - 1))
	}
	if was && !paused && q.pending > 0 {
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: queue})
	}
	return nil
}
