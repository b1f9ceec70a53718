package redisbroker

import (
	"context"
	"sync"

	"github.com/tidequeue/tide/broker"
)

// maxBatchTasks caps how many tasks one shared round trip carries.
const maxBatchTasks = 1000

// batcher lets concurrent Enqueue calls share round trips (group commit).
// A caller that finds fewer than maxInflight round trips on the wire sends
// its own tasks at once (no added latency for a lone caller). Callers that
// arrive while the wire is full queue up; when a round trip returns, the
// first of them leads the next one and sends everything queued in one
// pipeline. No goroutine is started, so nothing outlives the callers.
type batcher struct {
	send func(ctx context.Context, items []item, opts broker.EnqueueOptions) ([]error, error)

	mu       sync.Mutex
	inflight int // batches on the wire, at most maxInflight
	queue    []*enqReq
}

// maxInflight is how many shared round trips may be on the wire at once:
// with two, one batch fills while the other is sent.
const maxInflight = 2

type enqReq struct {
	ctx   context.Context
	items []item
	errs  []error
	err   error
	done  chan struct{} // closed when errs/err are set
	lead  chan struct{} // closed when this queued request must lead a batch
}

func (bt *batcher) enqueue(ctx context.Context, items []item) ([]error, error) {
	r := &enqReq{ctx: ctx, items: items, done: make(chan struct{})}
	bt.mu.Lock()
	if bt.inflight >= maxInflight {
		r.lead = make(chan struct{})
		bt.queue = append(bt.queue, r)
		bt.mu.Unlock()
		select {
		case <-r.done:
			return r.errs, r.err
		case <-r.lead:
			// Taken off the queue and handed an in-flight slot.
		}
		bt.mu.Lock()
	} else {
		bt.inflight++
	}
	batch := append([]*enqReq{r}, bt.take(len(r.items))...)
	bt.mu.Unlock()

	bt.run(batch)

	bt.mu.Lock()
	if len(bt.queue) > 0 {
		next := bt.queue[0]
		bt.queue = bt.queue[1:]
		close(next.lead) // hand over the slot
	} else {
		bt.inflight--
	}
	bt.mu.Unlock()
	<-r.done
	return r.errs, r.err
}

// take removes queued requests, up to maxBatchTasks tasks in all counting
// the have already in the batch. The caller holds mu.
func (bt *batcher) take(have int) []*enqReq {
	n := 0
	for n < len(bt.queue) && have+len(bt.queue[n].items) <= maxBatchTasks {
		have += len(bt.queue[n].items)
		n++
	}
	batch := make([]*enqReq, n)
	copy(batch, bt.queue[:n])
	bt.queue = bt.queue[n:]
	return batch
}

// run sends a batch in one call and hands each request its results. Requests
// whose context is already done are answered with their context's error
// without being sent.
func (bt *batcher) run(batch []*enqReq) {
	live := batch[:0:0]
	var all []item
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			close(r.done)
			continue
		}
		live = append(live, r)
		all = append(all, r.items...)
	}
	if len(live) == 0 {
		return
	}
	// The leader's context bounds the shared call; it must not be cancelled
	// by one caller giving up while others wait, so only its values are kept.
	ctx := live[0].ctx
	if len(live) > 1 {
		ctx = context.WithoutCancel(ctx)
	}
	errs, err := bt.send(ctx, all, broker.EnqueueOptions{})
	off := 0
	for _, r := range live {
		if err != nil {
			r.err = err
		} else {
			r.errs = errs[off : off+len(r.items)]
		}
		off += len(r.items)
		close(r.done)
	}
}
