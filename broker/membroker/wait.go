package membroker

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// outcomeTTL is how long the outcome of a waited-for task whose record is
// gone is kept for a waiter that looks late.
const outcomeTTL = 10 * time.Minute

// outcome is how a waited-for task ended once its record is gone: info is
// nil for a task deleted or cancelled.
type outcome struct {
	info    *tidetype.TaskInfo
	expires time.Time
}

var (
	_ broker.Waiter           = (*Broker)(nil)
	_ broker.ProgressReporter = (*Broker)(nil)
)

// Wait implements broker.Waiter: the waiter sleeps on a channel that the
// step ending the task closes.
func (b *Broker) Wait(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error) {
	for {
		b.mu.Lock()
		if err := b.check(ctx); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		q := b.queues[queue]
		if q == nil {
			b.mu.Unlock()
			return nil, broker.ErrTaskNotFound
		}
		if t := q.tasks[id]; t != nil {
			if st := t.msg.State; st == tidetype.StateArchived || st == tidetype.StateCompleted {
				info := b.info(t)
				b.mu.Unlock()
				return info, nil
			}
		} else {
			o, ok := q.outcomes[id]
			b.mu.Unlock()
			switch {
			case !ok:
				return nil, broker.ErrTaskNotFound
			case o.info == nil:
				return nil, fmt.Errorf("%w: %s was deleted while it was waited for", broker.ErrTaskNotFound, id)
			}
			return clone(o.info), nil
		}
		ch := make(chan struct{})
		if q.waiters == nil {
			q.waiters = map[string][]chan struct{}{}
		}
		q.waiters[id] = append(q.waiters[id], ch)
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			b.mu.Lock()
			ws := q.waiters[id]
			for i, w := range ws {
				if w == ch {
					q.waiters[id] = append(ws[:i:i], ws[i+1:]...)
					break
				}
			}
			if len(q.waiters[id]) == 0 {
				delete(q.waiters, id)
			}
			b.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// ended is called when task t of q ends (completed, archived, deleted):
// its waiters wake, and its outcome is kept for them, for a waiter that
// looks once the record is gone (info: how it ended when its record goes
// now (gone), nil for a deleted task). A task nobody waits for drops the
// outcome kept from an earlier task with its ID. Called with b.mu held.
func (b *Broker) ended(q *queue, t *task, gone bool, info *tidetype.TaskInfo, now time.Time) {
	ws := q.waiters[t.msg.ID]
	if len(ws) == 0 && !t.watched {
		delete(q.outcomes, t.msg.ID)
		return
	}
	t.watched = false // told: what happens to the record now is not an end
	if !gone {
		info = &tidetype.TaskInfo{ID: t.msg.ID, Queue: t.msg.Queue, State: t.msg.State, CompletedAt: t.msg.CompletedAt, LastFailedAt: t.msg.LastFailedAt}
	}
	if q.outcomes == nil {
		q.outcomes = map[string]outcome{}
	}
	for id, o := range q.outcomes {
		if now.After(o.expires) {
			delete(q.outcomes, id)
		}
	}
	q.outcomes[t.msg.ID] = outcome{info: info, expires: now.Add(outcomeTTL)}
	for _, w := range ws {
		close(w)
	}
	delete(q.waiters, t.msg.ID)
}

// wakeAll wakes every waiter (Close): they find the broker closed.
func (b *Broker) wakeAll() {
	for _, q := range b.queues {
		for id, ws := range q.waiters {
			for _, w := range ws {
				close(w)
			}
			delete(q.waiters, id)
		}
	}
}

// SetProgress implements broker.ProgressReporter.
func (b *Broker) SetProgress(ctx context.Context, lease broker.LeaseRef, p tidetype.Progress) error {
	if p.Percent < 0 || p.Percent > 100 || len(p.Note) > tidetype.MaxProgressNote {
		return fmt.Errorf("%w: progress %d%% with a %d-byte note (0 to 100%%, at most %d bytes)", broker.ErrInvalidTask, p.Percent, len(p.Note), tidetype.MaxProgressNote)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	_, t, err := b.leased(lease)
	if err != nil {
		return err
	}
	p.At = msTime(p.At)
	t.msg.Progress = p
	return nil
}
