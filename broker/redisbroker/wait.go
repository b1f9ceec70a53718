package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// waitRegistration is how long a waiter's registration lasts in Redis; a
// waiter renews it this often, so a waiter that vanished is forgotten.
const waitRegistration = 10 * time.Minute

// doneChannel is where the scripts announce that a task someone waits for
// ended ("f<id>"), apart from the servers' channel so they never see it.
func (b *Broker) doneChannel(queue string) string { return b.prefix + ":done:" + queue }

// Wait implements broker.Waiter: it registers the waiter in the task's
// partition, then sleeps until the script that ends the task announces it
// on the queue's done channel. Nothing polls: a broken subscription wakes
// every waiter, which looks again and subscribes anew.
func (b *Broker) Wait(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	w, err := b.waits.add(ctx, b, queue, id)
	if err != nil {
		return nil, err
	}
	defer b.waits.remove(queue, id, w)
	var where []found // kept once a pointer led to the task: see resolve
	for {
		info, done, err := b.waitStep(ctx, queue, id, &where)
		if errors.Is(err, broker.ErrTaskNotFound) && where != nil {
			// A pointer led there and the task is gone: a Replace may
			// have moved it to another partition (freeids.go). Look again.
			where = nil
			first := err
			if info, done, err = b.waitStep(ctx, queue, id, &where); errors.Is(err, broker.ErrTaskNotFound) {
				err = first
			}
		}
		if err != nil || done {
			return info, err
		}
		t := time.NewTimer(waitRegistration / 2)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-w:
			t.Stop()
		case <-t.C: // renew the registration
		}
	}
}

// waitStep registers the waiter (or renews it) and reports whether the task
// has ended, with its info.
func (b *Broker) waitStep(ctx context.Context, queue, id string, kept *[]found) (*tidetype.TaskInfo, bool, error) {
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		return nil, false, err
	}
	where := *kept
	if where == nil {
		if where, err = b.resolve(ctx, queue, l, id); err != nil {
			return nil, false, err
		}
		for _, f := range where {
			if f.via != nil {
				*kept = where
			}
		}
	}
	for _, f := range where {
		p := f.p
		c := &call{
			script: b.s.wait,
			keys:   p.keys("t", "wt", "oc", "meta"),
			args:   []any{p.layout, id, waitRegistration.Milliseconds()},
			queue:  queue,
		}
		b.run(ctx, []*call{c})
		if c.err != nil {
			return nil, false, callErr("wait for "+id, c.err)
		}
		res, err := c.cmd.Slice()
		if err != nil || len(res) != 2 {
			return nil, false, fmt.Errorf("tide: redisbroker: wait: unexpected reply %v (%v)", c.cmd.Val(), err)
		}
		code, _ := res[0].(string)
		val, _ := res[1].(string)
		switch code {
		case "e":
			info, err := b.GetTask(ctx, queue, id)
			if errors.Is(err, broker.ErrTaskNotFound) {
				// Trimmed in between: what the record said is enough.
				info, err = codec.DecodeHeader(queue, id, []byte(val))
			}
			return info, err == nil, err
		case "o":
			info, err := parseOutcome(queue, id, val)
			return info, err == nil, err
		case "w":
			return nil, false, nil
		}
	}
	return nil, true, broker.ErrTaskNotFound
}

// parseOutcome reads how a task whose record is gone ended, as w_ended
// (lib.lua) records it: "d<ms>" succeeded and deleted, "c<ms>" completed
// (its kept record trimmed since), "a<ms>" archived (trimmed since), "x"
// deleted or cancelled.
func parseOutcome(queue, id, s string) (*tidetype.TaskInfo, error) {
	if s == "x" {
		return nil, fmt.Errorf("%w: %s was deleted while it was waited for", broker.ErrTaskNotFound, id)
	}
	if len(s) > 1 {
		if ms, err := strconv.ParseInt(s[1:], 10, 64); err == nil && ms >= 0 {
			at := time.UnixMilli(ms)
			switch s[0] {
			case 'd', 'c':
				return &tidetype.TaskInfo{ID: id, Queue: queue, State: tidetype.StateCompleted, CompletedAt: at}, nil
			case 'a':
				return &tidetype.TaskInfo{ID: id, Queue: queue, State: tidetype.StateArchived, LastFailedAt: at}, nil
			}
		}
	}
	return nil, fmt.Errorf("tide: redisbroker: wait: task %s ended with unreadable outcome %q", id, s)
}

// waitHub shares one subscription to a queue's done channel among the
// broker's waiters on that queue.
type waitHub struct {
	mu     sync.Mutex
	queues map[string]*waitQueue
}

type waitQueue struct {
	waiters map[string]map[chan struct{}]bool // task ID -> its waiters
	ready   chan struct{}                     // closed once subscribed
	err     error                             // why subscribing failed (set before ready closes)
	stop    func()
}

// add registers a waiter for queue/id and returns the channel that is
// signalled when the task may have ended (or the subscription broke). It
// returns once the queue's subscription is in place, so that no
// announcement made after the waiter's first look is missed.
func (h *waitHub) add(ctx context.Context, b *Broker, queue, id string) (chan struct{}, error) {
	w := make(chan struct{}, 1)
	h.mu.Lock()
	if h.queues == nil {
		h.queues = map[string]*waitQueue{}
	}
	q := h.queues[queue]
	if q == nil {
		q = &waitQueue{waiters: map[string]map[chan struct{}]bool{}, ready: make(chan struct{})}
		h.queues[queue] = q
		h.start(b, queue, q)
	}
	if q.waiters[id] == nil {
		q.waiters[id] = map[chan struct{}]bool{}
	}
	q.waiters[id][w] = true
	h.mu.Unlock()
	select {
	case <-q.ready:
		if q.err != nil {
			h.remove(queue, id, w)
			return nil, q.err
		}
		return w, nil
	case <-ctx.Done():
		h.remove(queue, id, w)
		return nil, ctx.Err()
	}
}

// remove forgets a waiter; the last one of a queue ends its subscription.
func (h *waitHub) remove(queue, id string, w chan struct{}) {
	h.mu.Lock()
	q := h.queues[queue]
	if q == nil {
		h.mu.Unlock()
		return
	}
	delete(q.waiters[id], w)
	if len(q.waiters[id]) == 0 {
		delete(q.waiters, id)
	}
	last := len(q.waiters) == 0
	if last {
		delete(h.queues, queue)
	}
	h.mu.Unlock()
	if last {
		q.stop() // outside the lock: the subscription may be notifying
	}
}

// notify signals the waiters of id, or every waiter of the queue for "".
func (h *waitHub) notify(queue, id string, q *waitQueue) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for tid, ws := range q.waiters {
		if id != "" && tid != id {
			continue
		}
		for w := range ws {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
}

// start runs the queue's subscription until stop is called or the broker
// closes; a subscription that breaks is made again, and every waiter looks
// again in case an announcement was lost. Called with h.mu held.
func (h *waitHub) start(b *Broker, queue string, q *waitQueue) {
	// After Close the context is cancelled at once and the loop ends.
	ctx, release, _ := b.track(context.Background())
	var wg sync.WaitGroup
	q.stop = func() { release(); wg.Wait() }
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer release()
		first := true
		for ctx.Err() == nil {
			ps := b.rdb.Subscribe(ctx, b.doneChannel(queue))
			_, err := ps.Receive(ctx)
			if first {
				first = false
				if err != nil {
					q.err = callErr("wait: subscribe", classify(err))
				}
				close(q.ready)
			} else if err == nil {
				h.notify(queue, "", q) // look again: something may have ended meanwhile
			}
			if err == nil {
				h.receive(ctx, queue, q, ps)
			}
			_ = ps.Close()
			if q.err != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// receive hands the done channel's announcements to the waiters until the
// subscription breaks or ctx ends.
func (h *waitHub) receive(ctx context.Context, queue string, q *waitQueue, ps *redis.PubSub) {
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	for {
		msg, err := ps.ReceiveTimeout(ctx, subscriptionIdle)
		if err != nil {
			var ne interface{ Timeout() bool }
			if ctx.Err() == nil && errors.As(err, &ne) && ne.Timeout() && ps.Ping(ctx) == nil {
				continue
			}
			return
		}
		if m, ok := msg.(*redis.Message); ok && len(m.Payload) > 1 && m.Payload[0] == 'f' {
			h.notify(queue, m.Payload[1:], q)
		}
	}
}
