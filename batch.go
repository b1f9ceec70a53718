package tide

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// BatchInfo describes a batch: how many tasks it has, how many succeeded
// and failed, and which failed. It is what a batch's callback sees
// (GetBatch).
type BatchInfo = tidetype.BatchInfo

// callbackStep is the step name of a batch's callback.
const callbackStep = "callback"

// batchDone is the Option OnBatchDone returns.
type batchDone struct{ t *Task }

func (b batchDone) apply(*enqueueOptions) error {
	return errors.New("OnBatchDone applies to EnqueueBatch only")
}

// OnBatchDone gives EnqueueBatch a callback: t runs once, when every task
// of the batch has finished (succeeded, or archived after failing), however
// many servers process them and whatever fails in between. In its handler,
// GetBatch reports the batch's outcome. t's own options apply over those
// given to EnqueueBatch (so it runs in the batch's queue unless it names
// another); its task ID is "<batch ID>/callback". Given to any other call it
// is an error.
func OnBatchDone(t *Task) Option { return batchDone{t} }

// EnqueueBatch enqueues tasks as one batch and returns its ID and size. opts
// apply to every task (under each task's own options) and may include
// OnBatchDone. A task without TaskID gets "<batch ID>/<index>". Each task
// is an ordinary task; when it ends (completed or archived) its end is
// recorded with the batch in the same atomic step, so the callback runs
// once every task has ended: exactly once, a 10,000-task batch included.
// A task that cannot be stored (its TaskID or uniqueness lock taken) counts
// as failed. Invalid tasks (or more than broker.MaxFlowSteps) give an error
// wrapping ErrInvalidTask and store nothing. A batch whose enqueue stops
// halfway (the process dies, the store goes away) still finishes: its
// tasks are kept with it until they are stored, and a server stores those
// that are left after a while (Server's flow repair, which also cancels a
// batch whose own bookkeeping was not all written); the error comes with
// the BatchInfo when the batch exists. It needs a broker.Flows (both
// shipped brokers are) and returns ErrNotSupported otherwise.
func (c *Client) EnqueueBatch(ctx context.Context, tasks []*Task, opts ...Option) (*BatchInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	fl := c.b
	if len(tasks) == 0 || len(tasks) > broker.MaxFlowSteps {
		return nil, fmt.Errorf("%w: a batch has 1 to %d tasks, not %d", ErrInvalidTask, broker.MaxFlowSteps, len(tasks))
	}
	var cb *Task
	rest := make([]Option, 0, len(opts))
	for _, o := range opts {
		if d, ok := o.(batchDone); ok {
			if d.t == nil || cb != nil {
				return nil, fmt.Errorf("%w: OnBatchDone given a nil task or twice", ErrInvalidTask)
			}
			cb = d.t
			continue
		}
		rest = append(rest, o)
	}
	id := "b" + broker.NewID()
	now := c.now()
	header := "b:" + id
	f := &broker.Flow{ID: id, Kind: tidetype.KindBatch, Retention: WorkflowRetention, CreatedAt: now, Steps: make([]broker.FlowStep, 0, len(tasks)+1)}
	var members []string
	cbID := ""
	if cb != nil {
		members = make([]string, len(tasks))
	}
	for i, t := range tasks {
		name := strconv.Itoa(i)
		info, err := stepTask(t, rest, now, id, name, header, false, true)
		if err != nil {
			return nil, fmt.Errorf("batch task %d: %w", i, err)
		}
		if err := c.checkPlacement(ctx, info); err != nil {
			return nil, fmt.Errorf("batch task %d: %w", i, err)
		}
		s := broker.FlowStep{Name: name, Task: info}
		if cb != nil {
			s.Dependents = []string{callbackStep}
			members[i] = name
		}
		f.Steps = append(f.Steps, s)
	}
	if cb != nil {
		info, err := stepTask(cb, rest, now, id, callbackStep, header, true, false)
		if err != nil {
			return nil, fmt.Errorf("OnBatchDone: %w", err)
		}
		info.Retention = max(info.Retention, WorkflowRetention)
		f.Steps = append(f.Steps, broker.FlowStep{Name: callbackStep, Task: info, After: members, RunOnFailure: true})
		f.Callback = callbackStep
		cbID = info.ID
	}
	f.Digest = digest(f)
	ready, err := fl.CreateFlow(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("tide: enqueue batch: %w", err)
	}
	info := &BatchInfo{ID: id, State: FlowRunning, Total: len(tasks), CallbackID: cbID, CreatedAt: now}
	if err := releaseReady(ctx, c.b, fl, id, ready, now); err != nil {
		return info, fmt.Errorf("tide: enqueue batch %s: %w", id, err)
	}
	_ = fl.ConfirmFlow(ctx, id) // as EnqueueWorkflow
	return info, nil
}

// batchOf derives a batch's view from its flow: the callback is not one of
// its tasks.
func batchOf(f *WorkflowInfo) *BatchInfo {
	b := &BatchInfo{ID: f.ID, State: f.State, Total: f.Total, Succeeded: f.Succeeded, Failed: f.Failed + f.Canceled,
		FailedIDs: f.FailedIDs, CallbackID: f.Callback, CreatedAt: f.CreatedAt, FinishedAt: f.FinishedAt}
	if f.Callback != "" {
		b.Total-- // the callback is a step, not one of the batch's tasks
	}
	return b
}

// GetBatch returns the batch of the callback a handler is running
// (OnBatchDone): its size, how many tasks succeeded and failed, and the IDs
// of those that failed. ok is false in any other handler. The batch is read
// before the handler starts; a callback whose batch cannot be read is
// retried.
func GetBatch(ctx context.Context) (*BatchInfo, bool) {
	m, ok := metaFrom(ctx)
	if !ok || m.batch == nil {
		return nil, false
	}
	b := *m.batch
	b.FailedIDs = slices.Clone(b.FailedIDs)
	return &b, true
}

// loadBatch reads the batch of a callback into its context before the
// handler runs.
func loadBatch(ctx context.Context) error {
	m, _ := metaFrom(ctx)
	if m == nil || m.step != callbackStep {
		return nil
	}
	kind, id, ok := flowRef(m.flow)
	fl := m.b
	if !ok || kind != tidetype.KindBatch {
		return nil
	}
	f, err := fl.GetFlow(ctx, id, false)
	if err != nil {
		return fmt.Errorf("tide: batch callback: reading batch %s: %w", id, err)
	}
	m.batch = batchOf(f)
	return nil
}

// GetBatch returns the batch with its counts and failed task IDs; it
// returns ErrWorkflowNotFound for an unknown ID (or one kept past
// WorkflowRetention).
func (in *Inspector) GetBatch(ctx context.Context, id string) (*BatchInfo, error) {
	fl := in.b
	if err := checkFlowName("batch ID", id); err != nil {
		return nil, err
	}
	f, err := fl.GetFlow(ctx, id, false)
	if err != nil {
		return nil, err
	}
	if f.Kind != tidetype.KindBatch {
		return nil, fmt.Errorf("%w: %s is a workflow, not a batch", ErrWorkflowNotFound, id)
	}
	return batchOf(f), nil
}

// Batches lists batches, newest first, from offset (at most limit, 1 to
// 1000), and how many there are.
func (in *Inspector) Batches(ctx context.Context, offset, limit int) ([]*BatchInfo, int, error) {
	fs, n, err := in.listFlows(ctx, tidetype.KindBatch, offset, limit)
	if err != nil {
		return nil, 0, err
	}
	out := make([]*BatchInfo, len(fs))
	for i, f := range fs {
		out[i] = batchOf(f)
	}
	return out, n, nil
}
