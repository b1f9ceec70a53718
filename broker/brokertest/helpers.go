package brokertest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// recoverBackoff is the MaintainRequest.RecoverBackoff the suite uses: a
// recovered task waits in retry this long before it is pending again.
const recoverBackoff = 50 * time.Millisecond

// allStates lists every task state, for tests that cover each.
func allStates() []tidetype.TaskState {
	return []tidetype.TaskState{
		tidetype.StatePending, tidetype.StateScheduled, tidetype.StateActive,
		tidetype.StateRetry, tidetype.StateArchived, tidetype.StateCompleted,
	}
}

// newMsg returns a pending message due now.
func newMsg(queue, id string) *tidetype.TaskInfo {
	now := time.Now()
	return &tidetype.TaskInfo{
		ID:            id,
		Queue:         queue,
		Type:          taskType,
		Payload:       []byte("payload of " + id),
		State:         tidetype.StatePending,
		MaxRetry:      3,
		NextProcessAt: now,
		EnqueuedAt:    now,
	}
}

// uniqueID returns an ID starting with base that lands in the same partition
// of queue as the unique key, as the client arranges for unique tasks.
func uniqueID(t *testing.T, b broker.Broker, queue, base, key string) string {
	n := partitions(t, b, queue)
	if n < 2 {
		return base
	}
	want := broker.Partition(key, n)
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s-%d", base, i); broker.Partition(id, n) == want {
			return id
		}
	}
}

// putInState creates task id in queue (which must hold nothing else) and
// brings it to st.
func putInState(t *testing.T, b broker.Broker, queue, id string, st tidetype.TaskState) {
	t.Helper()
	m := newMsg(queue, id)
	switch st {
	case tidetype.StateScheduled:
		m.State, m.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
	case tidetype.StateCompleted:
		m.Retention = time.Hour
	}
	enqueue(t, b, m)
	switch st {
	case tidetype.StateActive, tidetype.StateRetry, tidetype.StateArchived, tidetype.StateCompleted:
		d := dequeueOne(t, b, queue, time.Minute)
		if d.Task.ID != id {
			t.Fatalf("putInState: dequeued %q, want %q", d.Task.ID, id)
		}
		switch st {
		case tidetype.StateRetry:
			settleOK(t, b, retryOf(d, time.Now().Add(time.Hour), "boom"))
		case tidetype.StateArchived:
			s := outcomeOf(d, broker.SettleArchive)
			s.Err = "bad"
			settleOK(t, b, s)
		case tidetype.StateCompleted:
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
		}
	}
	if got := get(t, b, queue, id).State; got != st {
		t.Fatalf("putInState: task is %v, want %v", got, st)
	}
}

// needs skips the test when err, the answer of a probe of one part of the
// broker, says that the broker does not have the part.
func needs(t *testing.T, part string, err error) {
	t.Helper()
	if errors.Is(err, broker.ErrNotSupported) {
		t.Skipf("the broker has no %s (%v)", part, err)
	}
}

func enqueueErrs(t *testing.T, b broker.Broker, msgs ...*tidetype.TaskInfo) []error {
	t.Helper()
	return enqueueErrsOpts(t, b, broker.EnqueueOptions{}, msgs...)
}

func enqueueErrsOpts(t *testing.T, b broker.Broker, opts broker.EnqueueOptions, msgs ...*tidetype.TaskInfo) []error {
	t.Helper()
	errs, err := b.Enqueue(t.Context(), msgs, opts)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	if len(errs) != len(msgs) {
		t.Fatalf("Enqueue of %d messages returned %d errors", len(msgs), len(errs))
	}
	return errs
}

func enqueue(t *testing.T, b broker.Broker, msgs ...*tidetype.TaskInfo) {
	t.Helper()
	for i, err := range enqueueErrs(t, b, msgs...) {
		if err != nil {
			t.Fatalf("Enqueue %s/%s: %v", msgs[i].Queue, msgs[i].ID, err)
		}
	}
}

func dequeue(t *testing.T, b broker.Broker, queues []string, n int, lease time.Duration) []*broker.Delivery {
	t.Helper()
	ds, err := b.Dequeue(t.Context(), queues, n, lease)
	if err != nil {
		t.Fatalf("Dequeue: %v", err)
	}
	if len(ds) > n {
		t.Fatalf("Dequeue(n=%d) returned %d deliveries", n, len(ds))
	}
	for _, d := range ds {
		if d == nil || d.Task == nil {
			t.Fatalf("Dequeue returned a nil delivery or message")
		}
	}
	return ds
}

// dequeueOne takes one task that is pending now.
func dequeueOne(t *testing.T, b broker.Broker, queue string, lease time.Duration) *broker.Delivery {
	t.Helper()
	ds := dequeue(t, b, []string{queue}, 1, lease)
	if len(ds) != 1 {
		t.Fatalf("Dequeue(%s) returned %d deliveries, want 1", queue, len(ds))
	}
	return ds[0]
}

// dequeueNoneBefore checks that nothing is handed out from queue before due.
// When the machine was too slow to tell, a task it got is handed back.
func dequeueNoneBefore(t *testing.T, b broker.Broker, queue string, due time.Time) {
	t.Helper()
	ds := dequeue(t, b, []string{queue}, 10, time.Minute)
	if len(ds) == 0 {
		return
	}
	if time.Now().Before(due) {
		t.Fatalf("task %q was dequeued before it was due at %v", ds[0].Task.ID, due)
	}
	for _, d := range ds {
		settleOK(t, b, outcomeOf(d, broker.SettleRequeue))
	}
}

// redeliver maintains queue until a task can be dequeued from it.
func redeliver(t *testing.T, b broker.Broker, queue string, lease time.Duration) *broker.Delivery {
	t.Helper()
	var d *broker.Delivery
	eventually(t, waitLong, "a task to be redelivered from "+queue, func() bool {
		maintain(t, b, queue)
		if ds := dequeue(t, b, []string{queue}, 1, lease); len(ds) == 1 {
			d = ds[0]
		}
		return d != nil
	})
	return d
}

// awaitRecovered maintains queue until n tasks in all have been recovered.
func awaitRecovered(t *testing.T, b broker.Broker, queue string, n int) {
	t.Helper()
	total := 0
	eventually(t, waitLong, fmt.Sprintf("Maintain to recover %d tasks of %s", n, queue), func() bool {
		total += maintain(t, b, queue).Recovered
		if total > n {
			t.Fatalf("Maintain recovered %d tasks, want %d", total, n)
		}
		return total == n
	})
}

// awaitState maintains queue until task id is in state st.
func awaitState(t *testing.T, b broker.Broker, queue, id string, st tidetype.TaskState) {
	t.Helper()
	eventually(t, waitLong, fmt.Sprintf("task %s/%s to become %v", queue, id, st), func() bool {
		maintain(t, b, queue)
		return get(t, b, queue, id).State == st
	})
}

// maintain maintains every partition of queue as the suite's owner and sums
// the results (NextDue and NextLeaseIn are the earliest).
func maintain(t *testing.T, b broker.Broker, queue string) broker.MaintainResult {
	t.Helper()
	agg := broker.MaintainResult{Owned: true}
	for p := range partitions(t, b, queue) {
		r, err := b.Maintain(t.Context(), broker.MaintainRequest{
			Queue: queue, Partition: p, Owner: owner, OwnerTTL: time.Minute, RecoverBackoff: recoverBackoff,
		})
		if err != nil {
			t.Fatalf("Maintain(%s, %d): %v", queue, p, err)
		}
		if !r.Owned {
			t.Fatalf("Maintain(%s, %d): not owned by the only owner", queue, p)
		}
		agg.Forwarded += r.Forwarded
		agg.Recovered += r.Recovered
		agg.Trimmed += r.Trimmed
		agg.Pending += r.Pending
		if !r.NextDue.IsZero() && (agg.NextDue.IsZero() || r.NextDue.Before(agg.NextDue)) {
			agg.NextDue = r.NextDue
		}
		if r.NextLeaseIn > 0 && (agg.NextLeaseIn == 0 || r.NextLeaseIn < agg.NextLeaseIn) {
			agg.NextLeaseIn = r.NextLeaseIn
		}
	}
	return agg
}

// partitions returns how many partitions queue has.
func partitions(t *testing.T, b broker.Broker, queue string) int {
	t.Helper()
	n, err := b.Partitions(t.Context(), queue)
	if err != nil {
		t.Fatalf("Partitions(%s): %v", queue, err)
	}
	return n
}

func get(t *testing.T, b broker.Broker, queue, id string) *tidetype.TaskInfo {
	t.Helper()
	m, err := b.GetTask(t.Context(), queue, id)
	if err != nil {
		t.Fatalf("GetTask(%s, %s): %v", queue, id, err)
	}
	if m.ID != id || m.Queue != queue {
		t.Fatalf("GetTask(%s, %s) returned %s/%s", queue, id, m.Queue, m.ID)
	}
	return m
}

func leaseOf(d *broker.Delivery) broker.LeaseRef {
	return d.Lease()
}

func outcomeOf(d *broker.Delivery, o broker.SettleKind) broker.Settlement {
	return broker.Settlement{Lease: leaseOf(d), Kind: o, Task: d.Task, At: time.Now()}
}

func retryOf(d *broker.Delivery, at time.Time, msg string) broker.Settlement {
	s := outcomeOf(d, broker.SettleRetry)
	s.RetryAt, s.Err = at, msg
	return s
}

func settle(t *testing.T, b broker.Broker, s broker.Settlement) error {
	t.Helper()
	errs, err := b.Settle(t.Context(), []broker.Settlement{s})
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if len(errs) != 1 {
		t.Fatalf("Settle of 1 settlement returned %d errors", len(errs))
	}
	return errs[0]
}

func settleOK(t *testing.T, b broker.Broker, s broker.Settlement) {
	t.Helper()
	if err := settle(t, b, s); err != nil {
		t.Fatalf("Settle %s/%s (outcome %d): %v", s.Lease.Queue, s.Lease.ID, s.Kind, err)
	}
}

func extendOK(t *testing.T, b broker.Broker, d *broker.Delivery, by time.Duration) {
	t.Helper()
	errs, err := b.Extend(t.Context(), []broker.LeaseRef{leaseOf(d)}, by)
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if len(errs) != 1 || errs[0] != nil {
		t.Fatalf("Extend of the current lease: %v", errs)
	}
}

func queuesOf(ds []*broker.Delivery) []string {
	qs := make([]string, len(ds))
	for i, d := range ds {
		qs[i] = d.Task.Queue
	}
	return qs
}

// eventually polls cond until it returns true or timeout passes, failing t
// naming what it waited for.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, timeout, what, cond)
}

// awaitEvent reads ch until an event matches or timeout passes. A closed
// channel fails the test.
func awaitEvent(t *testing.T, ch <-chan broker.Event, timeout time.Duration, match func(broker.Event) bool) bool {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("subscription channel closed while waiting for an event")
			}
			if match(e) {
				return true
			}
		case <-timer.C:
			return false
		}
	}
}

// awaitClosed drains ch until it is closed.
func awaitClosed(t *testing.T, ch <-chan broker.Event) {
	t.Helper()
	timer := time.NewTimer(waitLong)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatalf("subscription channel not closed within %v", waitLong)
		}
	}
}

// checkMessage compares every stored field of got with want, times and
// durations to the millisecond. State and Result are checked by callers.
func checkMessage(t *testing.T, where string, got, want *tidetype.TaskInfo) {
	t.Helper()
	if got.ID != want.ID || got.Queue != want.Queue || got.Type != want.Type {
		t.Errorf("%s: ID/Queue/Type = %q/%q/%q, want %q/%q/%q", where, got.ID, got.Queue, got.Type, want.ID, want.Queue, want.Type)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		t.Errorf("%s: Payload = %q, want %q", where, got.Payload, want.Payload)
	}
	if len(got.Headers) != len(want.Headers) {
		t.Errorf("%s: Headers = %v, want %v", where, got.Headers, want.Headers)
	}
	for k, v := range want.Headers {
		if g, ok := got.Headers[k]; !ok || g != v {
			t.Errorf("%s: Headers[%q] = %q (present %v), want %q", where, k, g, ok, v)
		}
	}
	if got.MaxRetry != want.MaxRetry || got.Retried != want.Retried || got.LastErr != want.LastErr {
		t.Errorf("%s: MaxRetry/Retried/LastErr = %d/%d/%q, want %d/%d/%q", where,
			got.MaxRetry, got.Retried, got.LastErr, want.MaxRetry, want.Retried, want.LastErr)
	}
	if got.UniqueKey != want.UniqueKey {
		t.Errorf("%s: UniqueKey = %q, want %q", where, got.UniqueKey, want.UniqueKey)
	}
	times := []struct {
		name      string
		got, want time.Time
	}{
		{"ProcessAt", got.NextProcessAt, want.NextProcessAt},
		{"EnqueuedAt", got.EnqueuedAt, want.EnqueuedAt},
		{"LastFailedAt", got.LastFailedAt, want.LastFailedAt},
		{"CompletedAt", got.CompletedAt, want.CompletedAt},
		{"Deadline", got.Deadline, want.Deadline},
	}
	for _, c := range times {
		if !sameTime(c.got, c.want) {
			t.Errorf("%s: %s = %v, want %v", where, c.name, c.got, c.want)
		}
	}
	durations := []struct {
		name      string
		got, want time.Duration
	}{
		{"Timeout", got.Timeout, want.Timeout},
		{"Retention", got.Retention, want.Retention},
		{"UniqueTTL", got.UniqueTTL, want.UniqueTTL},
	}
	for _, c := range durations {
		if d := c.got - c.want; d <= -time.Millisecond || d >= time.Millisecond {
			t.Errorf("%s: %s = %v, want %v", where, c.name, c.got, c.want)
		}
	}
}

// sameTime reports whether a and b are the same to the millisecond (both
// zero counts as the same).
func sameTime(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() && b.IsZero()
	}
	d := a.Sub(b)
	return d > -time.Millisecond && d < time.Millisecond
}

func msTrunc(t time.Time) time.Time { return time.UnixMilli(t.UnixMilli()) }

func cloneMsg(m *tidetype.TaskInfo) *tidetype.TaskInfo {
	c := *m
	c.Payload = bytes.Clone(m.Payload)
	if m.Headers != nil {
		c.Headers = make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			c.Headers[k] = v
		}
	}
	return &c
}
