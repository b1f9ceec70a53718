package encrypt

import (
	"context"
	"time"

	"github.com/tidequeue/tide/broker"
)

// stepWhere is where a durable record's data is sealed: bound to the
// task's queue and ID and to the record's kind and name, so that a record
// cannot be passed off as another's.
func stepWhere(queue, id string, k broker.StepKind, name string) where {
	return where{field: fieldStep, queue: queue, id: id + "\x00" + string(k) + name}
}

// openStep decrypts r's data in place; data that does not decrypt fails
// the call (a step replayed from data it cannot read must not run on).
func (w *wrapper) openStep(queue, id string, r *broker.StepRecord) error {
	if len(r.Data) == 0 {
		return nil
	}
	p, err := w.kr.open(stepWhere(queue, id, r.Kind, r.Name), r.Data)
	if err != nil {
		return err
	}
	r.Data = p
	return nil
}

// openSteps decrypts the durable records a delivery carries. When one
// does not decrypt it drops them all (StepsLoaded false): tide then loads
// them with LoadSteps, whose error tells the handler why.
func (w *wrapper) openSteps(d *broker.Delivery) {
	for i := range d.Steps {
		if err := w.openStep(d.Task.Queue, d.Task.ID, &d.Steps[i]); err != nil {
			d.Steps, d.StepsLoaded = nil, false
			return
		}
	}
}

// LoadSteps implements broker.Durable: the records come back decrypted.
func (w *wrapper) LoadSteps(ctx context.Context, lease broker.LeaseRef) ([]broker.StepRecord, error) {
	rs, err := w.b.LoadSteps(ctx, lease)
	if err != nil {
		return nil, err
	}
	for i := range rs {
		if err := w.openStep(lease.Queue, lease.ID, &rs[i]); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// SaveStep implements broker.Durable: the record's data is sealed.
func (w *wrapper) SaveStep(ctx context.Context, lease broker.LeaseRef, r broker.StepRecord) (broker.StepRecord, error) {
	if len(r.Data) > 0 {
		r.Data = w.kr.seal(stepWhere(lease.Queue, lease.ID, r.Kind, r.Name), bindID, r.Data)
	}
	got, err := w.b.SaveStep(ctx, lease, r)
	if err != nil {
		return got, err
	}
	return got, w.openStep(lease.Queue, lease.ID, &got)
}

// ResolveWait implements broker.Durable: a signal's payload comes back
// decrypted.
func (w *wrapper) ResolveWait(ctx context.Context, lease broker.LeaseRef, name string, deadline time.Time) (broker.StepRecord, bool, error) {
	r, ok, err := w.b.ResolveWait(ctx, lease, name, deadline)
	if err != nil || !ok {
		return r, ok, err
	}
	return r, ok, w.openStep(lease.Queue, lease.ID, &r)
}

// Signal implements broker.Durable: the payload is sealed.
func (w *wrapper) Signal(ctx context.Context, queue, id, name string, payload []byte) error {
	if len(payload) > 0 {
		payload = w.kr.seal(stepWhere(queue, id, broker.StepSignal, name), bindID, payload)
	}
	return w.b.Signal(ctx, queue, id, name, payload)
}
