package membroker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

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
		exhausted := t.canceled || t.msg.Retried >= t.msg.MaxRetry
		b.release(q, t, true, exhausted)
		b.event(q, t, tidetype.EventFailed, leaseExpiredErr)
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
			b.event(q, t, tidetype.EventRetrying, leaseExpiredErr)
			if d <= 0 {
				b.pushPending(req.Queue, q, t, false)
			} else {
				b.pushSched(req.Queue, q, t, tidetype.StateRetry)
			}
		default:
			b.archive(q, t, leaseExpiredErr+"; no retries left", msTime(now), now)
		}
	}
	if res.Recovered > 0 && q.limits.Concurrency > 0 && q.pending > 0 && !q.isPaused(now) {
		// The recovered leases freed slots of the queue's Concurrency
		// that waiting tasks may take.
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: req.Queue})
	}
	// Trim completed past retention and archived past count or age.
	res.Trimmed = b.trim(q, now)
	q.sweepGroups(now)
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
