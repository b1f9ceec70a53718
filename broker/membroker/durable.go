package membroker

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

var _ broker.Durable = (*Broker)(nil)

// LoadSteps implements broker.Durable.
func (b *Broker) LoadSteps(ctx context.Context, lease broker.LeaseRef) ([]broker.StepRecord, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	_, t, err := b.leased(lease)
	if err != nil {
		return nil, err
	}
	return cloneSteps(t.dur), nil
}

// SaveStep implements broker.Durable.
func (b *Broker) SaveStep(ctx context.Context, lease broker.LeaseRef, r broker.StepRecord) (broker.StepRecord, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return broker.StepRecord{}, err
	}
	_, t, err := b.leased(lease)
	if err != nil {
		return broker.StepRecord{}, err
	}
	if old, ok := broker.FindStep(t.dur, r.Kind, r.Name); ok {
		return cloneStep(old), nil
	}
	r = cloneStep(r)
	r.Started, r.Finished = msTime(r.Started), msTime(r.Finished)
	if err := t.addStep(r); err != nil {
		return broker.StepRecord{}, err
	}
	return cloneStep(r), nil
}

// ResolveWait implements broker.Durable.
func (b *Broker) ResolveWait(ctx context.Context, lease broker.LeaseRef, name string, deadline time.Time) (broker.StepRecord, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return broker.StepRecord{}, false, err
	}
	_, t, err := b.leased(lease)
	if err != nil {
		return broker.StepRecord{}, false, err
	}
	if r, ok := broker.FindStep(t.dur, broker.StepSignal, name); ok {
		return cloneStep(r), true, nil
	}
	if r, ok := broker.FindStep(t.dur, broker.StepTimedOut, name); ok {
		return cloneStep(r), true, nil
	}
	now := msTime(b.clock.Now())
	w, ok := broker.FindStep(t.dur, broker.StepWait, name)
	if !ok {
		// The wait's first reach: its deadline is stored in the same call.
		w = broker.StepRecord{Kind: broker.StepWait, Name: name, Started: now, Finished: msTime(deadline)}
		if err := t.addStep(w); err != nil {
			return broker.StepRecord{}, false, err
		}
	}
	if now.Before(msTime(deadline)) {
		return cloneStep(w), false, nil
	}
	r := broker.StepRecord{Kind: broker.StepTimedOut, Name: name, Started: now, Finished: now}
	if err := t.addStep(r); err != nil {
		return broker.StepRecord{}, false, err
	}
	return r, true, nil
}

// Signal implements broker.Durable.
func (b *Broker) Signal(ctx context.Context, queue, id, name string, payload []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	q := b.queues[queue]
	if q == nil || q.tasks[id] == nil {
		return broker.ErrTaskNotFound
	}
	t := q.tasks[id]
	if t.msg.State == tidetype.StateArchived || t.msg.State == tidetype.StateCompleted {
		return broker.ErrTaskNotFound
	}
	if _, ok := broker.FindStep(t.dur, broker.StepSignal, name); ok {
		return broker.ErrSignalSent
	}
	if _, ok := broker.FindStep(t.dur, broker.StepTimedOut, name); ok {
		return broker.ErrSignalTimeout
	}
	now := msTime(b.clock.Now())
	if d, ok := broker.FindStep(t.dur, broker.StepWait, name); ok && !d.Finished.After(now) {
		// The wait's deadline came first: that is its outcome.
		t.dur = append(t.dur, broker.StepRecord{Kind: broker.StepTimedOut, Name: name, Started: now, Finished: now})
		return broker.ErrSignalTimeout
	}
	if err := t.addStep(broker.StepRecord{Kind: broker.StepSignal, Name: name, Finished: now, Data: bytes.Clone(payload)}); err != nil {
		return err
	}
	if t.msg.State == tidetype.StateWaiting && t.waitingFor() == broker.WaitSignalPrefix+name {
		q.detach(t)
		t.msg.NextProcessAt = now
		b.pushPending(queue, q, t, false)
		b.event(q, t, tidetype.EventRetrying, "tide: signal "+name)
	}
	return nil
}

// park settles t as parked (broker.SettlePark): waiting for wait until at,
// or pending at once when at has come or the signal it waits for is here.
func (b *Broker) park(qn string, q *queue, t *task, wait string, at, now time.Time) {
	t.dur = slices.DeleteFunc(t.dur, func(r broker.StepRecord) bool { return r.Kind == broker.StepParked })
	t.dur = append(t.dur, broker.StepRecord{Kind: broker.StepParked, Name: wait, Finished: at})
	_, signalled := broker.FindStep(t.dur, broker.StepSignal, strings.TrimPrefix(wait, broker.WaitSignalPrefix))
	if !at.After(now) || (strings.HasPrefix(wait, broker.WaitSignalPrefix) && signalled) {
		b.pushPending(qn, q, t, true)
		return
	}
	t.msg.NextProcessAt = at
	b.pushSched(qn, q, t, tidetype.StateWaiting)
}

// waitingFor returns what t last parked for ("" when it never parked).
func (t *task) waitingFor() string {
	for _, r := range t.dur {
		if r.Kind == broker.StepParked {
			return r.Name
		}
	}
	return ""
}

// wakeNow ends the wait of a parked task now (an operator's run): the
// deadline of what it waits for becomes now, so that its sleep replays as
// over and its signal wait as timed out.
func (t *task) wakeNow(now time.Time) {
	w := t.waitingFor()
	k, name := broker.StepSleep, strings.TrimPrefix(w, broker.WaitSleepPrefix)
	if n, ok := strings.CutPrefix(w, broker.WaitSignalPrefix); ok {
		k, name = broker.StepWait, n
	}
	for i, r := range t.dur {
		if r.Kind == k && r.Name == name && r.Finished.After(now) {
			t.dur[i].Finished = msTime(now)
		}
	}
}

// addStep appends r within the bounds.
func (t *task) addStep(r broker.StepRecord) error {
	if len(t.dur)+1 > broker.MaxStepRecords || broker.StepsSize(t.dur)+broker.StepsSize([]broker.StepRecord{r}) > broker.MaxStepBytes {
		return fmt.Errorf("%w (%d records or %d bytes per task)", broker.ErrStepLimit, broker.MaxStepRecords, broker.MaxStepBytes)
	}
	t.dur = append(t.dur, r)
	return nil
}

func cloneStep(r broker.StepRecord) broker.StepRecord {
	r.Data = bytes.Clone(r.Data)
	return r
}

func cloneSteps(rs []broker.StepRecord) []broker.StepRecord {
	out := make([]broker.StepRecord, len(rs))
	for i, r := range rs {
		out[i] = cloneStep(r)
	}
	return out
}
