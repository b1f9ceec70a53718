package redisbroker

import (
	"context"
	"sync"
	"time"
)

// rebalancing is a process's state of the rebalances of one queue that
// Dequeue and Maintain ask for (kick).
type rebalancing struct {
	running bool      // a goroutine runs rebalanceLoop
	dirty   bool      // asked for since the last run began
	last    time.Time // when the last run ended
	swept   time.Time // when Maintain last asked
}

// rebalanceGap is the least time between two rebalances of a queue that
// one process runs in the background.
const rebalanceGap = 20 * time.Millisecond

// sweepEvery is how often Maintain asks for a rebalance of its queue, in
// case a transfer was left outstanding by a crash or a wish was lost.
const sweepEvery = 3 * time.Second

// rebalancer holds a broker's background rebalances; Close stops them.
type rebalancer struct {
	mu     sync.Mutex
	queues map[string]*rebalancing
	wg     sync.WaitGroup
	ctx    context.Context
	stop   context.CancelFunc
}

// kick asks for a rebalance of queue in the background: at once unless one
// ran within rebalanceGap, and only one at a time per queue and process.
func (b *Broker) kick(queue string) {
	r := &b.reb
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.closed.Load() || r.ctx.Err() != nil {
		return
	}
	q := r.queues[queue]
	if q == nil {
		if r.queues == nil {
			r.queues = map[string]*rebalancing{}
		}
		q = &rebalancing{}
		r.queues[queue] = q
	}
	q.dirty = true
	if q.running {
		return
	}
	q.running = true
	r.wg.Add(1)
	go b.rebalanceLoop(queue, q)
}

// sweep is kick at most every sweepEvery per queue.
func (b *Broker) sweep(queue string) {
	r := &b.reb
	r.mu.Lock()
	if q := r.queues[queue]; q != nil && time.Since(q.swept) < sweepEvery {
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	b.kick(queue)
	r.mu.Lock()
	if q := r.queues[queue]; q != nil {
		q.swept = time.Now()
	}
	r.mu.Unlock()
}

func (b *Broker) rebalanceLoop(queue string, q *rebalancing) {
	r := &b.reb
	defer r.wg.Done()
	for {
		r.mu.Lock()
		if !q.dirty || r.ctx.Err() != nil {
			q.running = false
			r.mu.Unlock()
			return
		}
		q.dirty = false
		wait := rebalanceGap - time.Since(q.last)
		r.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-r.ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		if err := b.rebalance(ctx, queue); err != nil && r.ctx.Err() == nil {
			b.log.Debug("tide: redisbroker: rebalancing the slots of the queue's limits failed; it is tried again", "queue", queue, "err", err)
		}
		cancel()
		r.mu.Lock()
		q.last = time.Now()
		r.mu.Unlock()
	}
}
