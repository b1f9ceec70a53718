package encrypt

import (
	"context"
	"errors"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Every broker Wrap returns is a broker.Flows, which fails when the wrapped
// broker is not. The tasks a flow keeps for its steps with dependencies are
// sealed as Enqueue seals them (bound to their queue and task ID: a step's
// ID is fixed when the flow is created), and come back opened, ready for
// the Enqueue that stores them.

var errNoFlows = errors.New("encrypt: the wrapped broker does not implement broker.Flows")

func (w *wrapper) flows() (broker.Flows, error) {
	f, ok := w.b.(broker.Flows)
	if !ok {
		return nil, errNoFlows
	}
	return f, nil
}

// CreateFlow implements broker.Flows.
func (w *wrapper) CreateFlow(ctx context.Context, f *broker.Flow) ([]broker.ReadyStep, error) {
	fl, err := w.flows()
	if err != nil {
		return nil, err
	}
	c := *f
	c.Steps = make([]broker.FlowStep, len(f.Steps))
	for i, s := range f.Steps {
		c.Steps[i] = s
		if s.Task != nil && len(s.After) > 0 && (len(s.Task.Payload) > 0 || len(s.Task.Result) > 0) {
			t := *s.Task
			w.sealTask(&t, t.Queue, t.ID, bindID, s.Task)
			c.Steps[i].Task = &t
		}
	}
	ready, err := fl.CreateFlow(ctx, &c)
	w.openReady(ready)
	return ready, err
}

func (w *wrapper) openReady(ready []broker.ReadyStep) {
	for _, r := range ready {
		if r.Task != nil {
			w.kr.openTask(r.Task)
		}
	}
}

// EndStep implements broker.Flows.
func (w *wrapper) EndStep(ctx context.Context, flow, step, taskID string, succeeded bool, reason string) ([]broker.ReadyStep, error) {
	fl, err := w.flows()
	if err != nil {
		return nil, err
	}
	ready, err := fl.EndStep(ctx, flow, step, taskID, succeeded, reason)
	w.openReady(ready)
	return ready, err
}

// ReleaseSteps implements broker.Flows.
func (w *wrapper) ReleaseSteps(ctx context.Context, flow string, steps []string) ([]string, error) {
	fl, err := w.flows()
	if err != nil {
		return nil, err
	}
	return fl.ReleaseSteps(ctx, flow, steps)
}

// CancelFlow implements broker.Flows.
func (w *wrapper) CancelFlow(ctx context.Context, flow string) ([]tidetype.StepInfo, error) {
	fl, err := w.flows()
	if err != nil {
		return nil, err
	}
	return fl.CancelFlow(ctx, flow)
}

// GetFlow implements broker.Flows.
func (w *wrapper) GetFlow(ctx context.Context, flow string, steps bool) (*tidetype.WorkflowInfo, error) {
	fl, err := w.flows()
	if err != nil {
		return nil, err
	}
	return fl.GetFlow(ctx, flow, steps)
}

// GetStep implements broker.Flows.
func (w *wrapper) GetStep(ctx context.Context, flow, step string) (*tidetype.StepInfo, error) {
	fl, err := w.flows()
	if err != nil {
		return nil, err
	}
	return fl.GetStep(ctx, flow, step)
}

// ListFlows implements broker.Flows.
func (w *wrapper) ListFlows(ctx context.Context, kind tidetype.FlowKind, offset, limit int) ([]*tidetype.WorkflowInfo, int, error) {
	fl, err := w.flows()
	if err != nil {
		return nil, 0, err
	}
	return fl.ListFlows(ctx, kind, offset, limit)
}
