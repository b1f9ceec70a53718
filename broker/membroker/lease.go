package membroker

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Dequeue implements broker.Broker.
func (b *Broker) Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if lease <= 0 {
		return nil, fmt.Errorf("membroker: lease %v is not positive", lease)
	}
	for _, qn := range queues {
		if qn == "" {
			return nil, errors.New("membroker: empty queue name")
		}
	}
	if n <= 0 {
		return nil, nil
	}
	now := b.clock.Now()
	var out []*broker.Delivery
	for _, qn := range queues {
		q := b.queues[qn]
		if q == nil || q.isPaused(now) {
			continue
		}
		q.wake(now)
		for room := q.room(n-len(out), qn, now, b); room > 0; room-- {
			t := b.next(q, now)
			if t == nil {
				break
			}
			q.started(now)
			b.tokens++
			t.token, t.canceled = b.tokens, false
			t.msg.State = tidetype.StateActive
			b.push(&q.active, t, now.Add(lease))
			b.event(q, t, tidetype.EventStarted, "")
			d := &broker.Delivery{Task: clone(&t.msg), Token: t.token, LeaseFor: lease, Internal: t.internal, StepsLoaded: true}
			if len(t.dur) > 0 {
				d.Steps = cloneSteps(t.dur)
			}
			out = append(out, d)
		}
		if len(out) == n {
			break
		}
	}
	return out, nil
}

// Extend implements broker.Broker.
func (b *Broker) Extend(ctx context.Context, leases []broker.LeaseRef, d time.Duration) ([]error, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if d <= 0 {
		return nil, fmt.Errorf("membroker: lease extension %v is not positive", d)
	}
	now := b.clock.Now()
	errs := make([]error, len(leases))
	for i, ref := range leases {
		q, t, err := b.leased(ref)
		if err != nil {
			errs[i] = err
			continue
		}
		t.key = now.Add(d)
		heap.Fix(&q.active, t.idx)
		if t.canceled {
			errs[i] = broker.ErrTaskCanceled
		}
	}
	return errs, nil
}

// Settle implements broker.Broker.
func (b *Broker) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	errs := make([]error, len(ss))
	for i := range ss {
		errs[i] = b.settle(&ss[i], now)
	}
	return errs, nil
}

// followEnd records that t, of queue q, ended (broker.Ending) for whoever
// follows it: a follow-up, an internal task pending at once in q. Every
// step that ends a task calls it once: a settlement done or archived,
// lease recovery that archives, an operator's archive or delete of a
// workflow step (see broker/followup.go).
func (b *Broker) followEnd(q *queue, t *task, outcome broker.Outcome, at time.Time, errMsg string, now time.Time) {
	typ, mr := broker.FollowupType(t.msg.Headers)
	if typ == "" {
		return
	}
	e := broker.Ending{Flow: t.msg.Headers[broker.FlowHeader], Step: t.msg.Headers[broker.StepHeader], Notify: t.msg.Headers[broker.NotifyHeader],
		TaskID: t.msg.ID, Type: t.msg.Type, Outcome: outcome, At: at, Retried: t.msg.Retried, Err: errMsg}
	f := &tidetype.TaskInfo{ID: "tide:f:" + t.msg.ID, Queue: t.msg.Queue, Type: typ, Payload: e.Encode(), MaxRetry: mr,
		State: tidetype.StatePending, NextProcessAt: msTime(now), EnqueuedAt: msTime(now)}
	for k := 2; q.tasks[f.ID] != nil; k++ {
		f.ID = "tide:f:" + t.msg.ID + "#" + strconv.Itoa(k)
	}
	if b.enqueue(f, now, false) == nil {
		q.tasks[f.ID].internal = true
	}
}

func (b *Broker) settle(s *broker.Settlement, now time.Time) error {
	if s.Kind < broker.SettleDone || s.Kind > broker.SettlePark {
		return fmt.Errorf("membroker: task %q: unknown settle kind %d", s.Lease.ID, s.Kind)
	}
	q, t, err := b.leased(s.Lease)
	if err != nil {
		return err
	}
	at := s.At
	if at.IsZero() {
		at = now
	}
	at = msTime(at)
	full := q.limits.Concurrency > 0 && q.active.Len() >= q.limits.Concurrency
	heap.Remove(&q.active, t.idx)
	if full && q.pending > 0 && !q.isPaused(now) {
		// Room under the queue's concurrency limit: wake idle servers.
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: s.Lease.Queue})
	}
	kind, errMsg := s.Kind, s.Err
	if t.canceled && (kind == broker.SettleRetry || kind == broker.SettleRequeue || kind == broker.SettleDefer || kind == broker.SettlePark) {
		kind, errMsg = broker.SettleArchive, canceledErr
		if s.Err != "" {
			errMsg += "; last error: " + s.Err
		}
	}
	retryAt := s.RetryAt
	if s.RetryIn > 0 {
		retryAt = now.Add(s.RetryIn) // on the broker's clock, whatever the server's says
	}
	if retryAt.IsZero() {
		retryAt = now
	}
	if kind == broker.SettleDefer && s.Throttle {
		b.throttle(q, t, msTime(retryAt))
	}
	b.release(q, t, true, kind == broker.SettleDone || kind == broker.SettleArchive)
	switch kind {
	case broker.SettleDone:
		b.event(q, t, tidetype.EventSucceeded, "")
	case broker.SettleRetry, broker.SettleArchive:
		b.event(q, t, tidetype.EventFailed, errMsg)
		if kind == broker.SettleRetry {
			b.event(q, t, tidetype.EventRetrying, errMsg)
		}
	case broker.SettlePark:
		b.event(q, t, tidetype.EventRetrying, "tide: waiting for "+s.WaitFor)
	default: // defer, requeue: it runs again
		b.event(q, t, tidetype.EventRetrying, errMsg)
	}
	switch kind {
	case broker.SettleDone:
		q.count(now, 1, 0)
	case broker.SettleRetry, broker.SettleArchive:
		q.count(now, 1, 1)
	}
	switch kind {
	case broker.SettleRetry, broker.SettleArchive, broker.SettleDefer:
		t.addAttempt(s.Started, at, s.Server, map[broker.SettleKind]string{broker.SettleRetry: "retry", broker.SettleArchive: "archive", broker.SettleDefer: "deferred"}[kind], errMsg)
	case broker.SettleDone:
		if t.msg.Retention > 0 {
			t.addAttempt(s.Started, at, s.Server, "done", "")
		}
	}
	switch kind {
	case broker.SettleDone:
		b.followEnd(q, t, broker.OutcomeCompleted, at, "", now)
		q.releaseLock(t)
		if t.msg.Retention <= 0 {
			delete(q.tasks, t.msg.ID)
			b.ended(q, t, true, &tidetype.TaskInfo{ID: t.msg.ID, Queue: t.msg.Queue, State: tidetype.StateCompleted, CompletedAt: at}, now)
			return nil
		}
		t.msg.State = tidetype.StateCompleted
		t.msg.CompletedAt = at
		b.push(&q.completed, t, at.Add(t.msg.Retention))
		b.ended(q, t, false, nil, now)
		b.trim(q, now)
	case broker.SettleRetry, broker.SettleDefer:
		if kind == broker.SettleRetry {
			t.msg.Retried++
		}
		t.msg.LastErr = s.Err
		t.msg.LastFailedAt = at
		t.msg.NextProcessAt = msTime(retryAt)
		b.pushSched(s.Lease.Queue, q, t, tidetype.StateRetry)
	case broker.SettleArchive:
		b.archive(q, t, errMsg, at, now)
		b.trim(q, now)
	case broker.SettleRequeue:
		b.pushPending(s.Lease.Queue, q, t, true)
	case broker.SettlePark:
		b.park(s.Lease.Queue, q, t, s.WaitFor, msTime(retryAt), now)
	}
	return nil
}

// SetResult implements broker.Broker.
func (b *Broker) SetResult(ctx context.Context, lease broker.LeaseRef, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	_, t, err := b.leased(lease)
	if err != nil {
		return err
	}
	t.msg.Result = bytes.Clone(data)
	return nil
}

// addAttempt appends to t's attempt history, keeping the latest
// tidetype.MaxAttempts.
func (t *task) addAttempt(started, ended time.Time, server, outcome, err string) {
	if len(err) > 1024 {
		err = err[:1024]
	}
	t.attempts = append(t.attempts, tidetype.Attempt{Started: msTime(started), Ended: msTime(ended), Server: server, Outcome: outcome, Err: err})
	if n := len(t.attempts); n > tidetype.MaxAttempts {
		t.attempts = slices.Clone(t.attempts[n-tidetype.MaxAttempts:])
	}
}
