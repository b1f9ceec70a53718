package encrypt

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"maps"

	"github.com/tidequeue/tide/broker"
)

// The tasks a flow keeps for its steps until they are
// released are sealed as Enqueue seals them (bound to their queue and task ID: a step's
// ID is fixed when the flow is created), and come back opened, ready for
// the Enqueue that stores them. A kept task whose payload does not open
// here (its key is not in this process) comes back sealed, marked with
// broker.SealedHeader: Enqueue stores it as it is, so the step's task keeps
// its payload (Dequeue archives it, its end; the payload stays readable
// with the key); it never runs with an empty payload. The digest a flow is
// kept with (broker.Flow.Digest, which the caller computes over the
// plaintext to recognise the same workflow enqueued again) is stored keyed
// with a key derived from the first key, so that the stored digest does
// not let anyone confirm a guessed payload. After a rotation of the first
// key, enqueuing again a workflow created before it reports
// broker.ErrFlowExists.

// CreateFlow implements broker.Flows.
func (w *wrapper) CreateFlow(ctx context.Context, f *broker.Flow) ([]broker.ReadyStep, error) {
	c := *f
	c.Digest = w.kr.flowDigest(f.Digest)
	c.Steps = make([]broker.FlowStep, len(f.Steps))
	for i, s := range f.Steps {
		c.Steps[i] = s
		if s.Task != nil && (len(s.Task.Payload) > 0 || len(s.Task.Result) > 0) {
			t := *s.Task
			w.sealTask(&t, t.Queue, t.ID, bindID, s.Task)
			c.Steps[i].Task = &t
		}
	}
	ready, err := w.b.CreateFlow(ctx, &c)
	w.openReady(ready)
	return ready, err
}

// openReady opens the kept tasks of ready steps; one whose payload does
// not open stays sealed and is marked so (broker.SealedHeader).
func (w *wrapper) openReady(ready []broker.ReadyStep) {
	for _, r := range ready {
		t := r.Task
		if t == nil {
			continue
		}
		at := where{field: fieldPayload, queue: t.Queue, id: t.ID, uniqueKey: t.UniqueKey}
		p, err := w.kr.open(at, t.Payload)
		if err != nil {
			t.Headers = maps.Clone(t.Headers)
			if t.Headers == nil {
				t.Headers = map[string]string{}
			}
			t.Headers[broker.SealedHeader] = "1"
			t.Result = nil
			continue
		}
		t.Payload, t.Result = p, nil
	}
}

// flowDigest keys a flow's digest (see the comment at the top).
func (kr *keyring) flowDigest(d string) string {
	if d == "" {
		return ""
	}
	m := hmac.New(sha256.New, kr.digest)
	m.Write([]byte(d))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:18])
}

// EndStep implements broker.Flows.
func (w *wrapper) EndStep(ctx context.Context, flow, step, taskID string, succeeded bool, reason string) ([]broker.ReadyStep, error) {
	ready, err := w.b.EndStep(ctx, flow, step, taskID, succeeded, reason)
	w.openReady(ready)
	return ready, err
}

// ReadySteps implements broker.Flows.
func (w *wrapper) ReadySteps(ctx context.Context, flow string) ([]broker.ReadyStep, error) {
	ready, err := w.b.ReadySteps(ctx, flow)
	w.openReady(ready)
	return ready, err
}
