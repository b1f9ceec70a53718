package membroker

import (
	"context"
	"errors"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// SetQueueLimits implements broker.Admin. Dequeue hands out a task of the
// queue only while fewer than Concurrency of its tasks are active and fewer
// than Rate.Limit started within the last Rate.Per (on the broker's clock);
// when a settlement gives room back to a full queue with tasks waiting,
// subscribers get EventPending, and when the rate holds tasks back, an
// EventPending whose At says when room opens. The group limits
// (GroupConcurrency, GroupRate, Ordered; see groups.go) hold per group, not
// split; groups they held back are judged again by the next Dequeue.
func (b *Broker) SetQueueLimits(ctx context.Context, queue string, l tidetype.QueueLimits) error {
	if err := broker.CheckQueueLimits(l); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	if queue == "" {
		return errors.New("membroker: empty queue name")
	}
	q := b.queue(queue)
	q.limits = l
	if l.Rate.Limit == 0 {
		q.starts = nil
	}
	q.limitsChanged(b.clock.Now())
	if q.pending > 0 && (l.Concurrency == 0 || q.active.Len() < l.Concurrency) && !q.isPaused(b.clock.Now()) {
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: queue})
	}
	return nil
}

// QueueLimits implements broker.Admin.
func (b *Broker) QueueLimits(ctx context.Context, queue string) (tidetype.QueueLimits, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return tidetype.QueueLimits{}, err
	}
	if q := b.queues[queue]; q != nil {
		return q.limits, nil
	}
	return tidetype.QueueLimits{}, nil
}

// room is how many more tasks of queue q (named qn) may start at now, at
// most n: what its concurrency and rate limits leave. When the rate leaves
// none while tasks wait, subscribers learn (once) when room opens.
func (q *queue) room(n int, qn string, now time.Time, b *Broker) int {
	if c := q.limits.Concurrency; c > 0 {
		n = min(n, c-q.active.Len())
	}
	if r := q.limits.Rate; r.Limit > 0 {
		drop := 0
		for drop < len(q.starts) && now.Sub(q.starts[drop]) >= r.Per {
			drop++
		}
		q.starts = q.starts[drop:]
		rr := r.Limit - len(q.starts)
		n = min(n, rr)
		if rr <= 0 && q.pending > 0 {
			if at := q.starts[0].Add(r.Per); !at.Equal(q.rateWake) {
				q.rateWake = at
				b.emit(q, broker.Event{Kind: broker.EventPending, Queue: qn, At: at})
			}
		}
	}
	return max(n, 0)
}

// started records a task start for the rate limit.
func (q *queue) started(now time.Time) {
	if q.limits.Rate.Limit > 0 {
		q.starts = append(q.starts, now)
	}
}
