package membroker

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// SetQueueLimits implements broker.Admin. Dequeue hands out a task of the
// queue only while fewer than Concurrency of its tasks are active and fewer
// than Rate.Limit started within the last Rate.Per (on the broker's clock;
// starts made before a rate was set or changed count too, see started);
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
	if k := b.kept[queue]; k != nil {
		return k.limits, nil
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
		// The starts within the window, oldest first.
		in := q.starts[sort.Search(len(q.starts), func(i int) bool { return now.Sub(q.starts[i]) < r.Per }):]
		rr := r.Limit - len(in)
		n = min(n, rr)
		if rr <= 0 && q.pending > 0 {
			// Room opens when the start that leaves the last one too
			// many has left the window.
			if at := in[-rr].Add(r.Per); !at.Equal(q.rateWake) {
				q.rateWake = at
				b.emit(q, broker.Event{Kind: broker.EventPending, Queue: qn, At: at})
			}
		}
	}
	return max(n, 0)
}

// started records a task start, with a rate limit or without, so that a
// rate set or changed later counts the starts made in its period before
// the change. Starts are kept for broker.MaxRatePer, the longest period a
// rate may have, and at most the newest broker.MaxQueueRate (no rate counts
// more).
func (q *queue) started(now time.Time) {
	q.starts = append(q.starts, now)
	drop := 0
	for drop < len(q.starts) && now.Sub(q.starts[drop]) >= broker.MaxRatePer {
		drop++
	}
	drop = max(drop, len(q.starts)-broker.MaxQueueRate)
	if drop > 0 {
		q.starts = q.starts[drop:]
	}
}
