package membroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// flow is a workflow or batch: the same bookkeeping as the Redis broker's
// flow.lua, under its own lock (flowsMu), apart from the queues.
type flow struct {
	kind      tidetype.FlowKind
	digest    string
	state     tidetype.FlowState
	created   time.Time
	ended     time.Time
	retention time.Duration
	ok, bad   int
	canceled  int
	callback  string // a batch's callback step: not counted
	cbID      string
	cbState   tidetype.StepState
	steps     map[string]*flowStep
	names     []string
	failed    []string
	// begun is when its creation began; confirmed, that its creator
	// released what CreateFlow returned (RepairFlows).
	begun     time.Time
	confirmed bool
}

type flowStep struct {
	name, queue, id   string
	after, dependents []string
	runOnFailure      bool
	state             byte // w waiting, r ready, e enqueued, S, F, C
	left              int
	task              *tidetype.TaskInfo // a step with dependencies, until released
	reason            string
	// live: cancelled while ready, its release unconfirmed: its task may
	// exist until EndStep says it ended (CancelFlow returns it).
	live bool
}

// flowLocked returns flow id, forgetting it when its retention has passed.
func (b *Broker) flowLocked(id string) *flow {
	f := b.flows[id]
	if f != nil && !f.ended.IsZero() && b.Now().Sub(f.ended) >= f.retention {
		delete(b.flows, id)
		return nil
	}
	return f
}

// onFlow runs fn on flow id under flowsMu; ErrFlowNotFound when there is
// no such flow (or its retention passed).
func (b *Broker) onFlow(ctx context.Context, id string, fn func(f *flow) error) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	b.flowsMu.Lock()
	defer b.flowsMu.Unlock()
	f := b.flowLocked(id)
	if f == nil {
		return fmt.Errorf("%w: %q", broker.ErrFlowNotFound, id)
	}
	return fn(f)
}

// CreateFlow implements broker.Flows.
func (b *Broker) CreateFlow(ctx context.Context, f *broker.Flow) ([]broker.ReadyStep, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	b.flowsMu.Lock()
	defer b.flowsMu.Unlock()
	for id := range b.flows {
		b.flowLocked(id) // forget the expired
	}
	if old := b.flows[f.ID]; old != nil {
		if old.digest != f.Digest {
			return nil, fmt.Errorf("%w: %q", broker.ErrFlowExists, f.ID)
		}
		return old.readyAll(), nil
	}
	nf := &flow{kind: f.Kind, digest: f.Digest, state: tidetype.FlowRunning, created: f.CreatedAt, retention: max(f.Retention, time.Millisecond),
		callback: f.Callback, steps: make(map[string]*flowStep, len(f.Steps))}
	for i := range f.Steps {
		s := &f.Steps[i]
		st := &flowStep{name: s.Name, queue: s.Task.Queue, id: s.Task.ID, after: slices.Clone(s.After), dependents: slices.Clone(s.Dependents),
			runOnFailure: s.RunOnFailure, state: 'w', left: len(s.After)}
		st.task = clone(s.Task)
		if len(s.After) == 0 {
			st.state = 'r'
		}
		if s.Name == f.Callback {
			nf.cbID = s.Task.ID
		}
		nf.steps[s.Name] = st
		nf.names = append(nf.names, s.Name)
	}
	nf.begun = b.Now()
	b.flows[f.ID] = nf
	return nf.readyAll(), nil
}

// ConfirmFlow implements broker.Flows.
func (b *Broker) ConfirmFlow(ctx context.Context, id string) error {
	err := b.onFlow(ctx, id, func(f *flow) error {
		f.confirmed = true
		return nil
	})
	if errors.Is(err, broker.ErrFlowNotFound) {
		err = nil
	}
	return err
}

// RepairFlows implements broker.Flows. A creation here is one step (it
// cannot stop halfway), so a flow to repair has its steps, not all
// released.
func (b *Broker) RepairFlows(ctx context.Context, olderThan time.Duration, limit int) ([]string, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	b.flowsMu.Lock()
	defer b.flowsMu.Unlock()
	cut := b.Now().Add(-olderThan)
	var out []string
	for id, f := range b.flows {
		if len(out) < limit && !f.confirmed && !f.begun.After(cut) && b.flowLocked(id) != nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// ReadySteps implements broker.Flows.
func (b *Broker) ReadySteps(ctx context.Context, id string) ([]broker.ReadyStep, error) {
	var out []broker.ReadyStep
	err := b.onFlow(ctx, id, func(f *flow) error {
		out = f.readyAll()
		return nil
	})
	return out, err
}

func (s *flowStep) ready() broker.ReadyStep {
	r := broker.ReadyStep{Name: s.name}
	if s.task != nil {
		r.Task = clone(s.task)
	}
	return r
}

// readyAll lists every ready step not released yet.
func (f *flow) readyAll() []broker.ReadyStep {
	var out []broker.ReadyStep
	if f.state == tidetype.FlowCanceled {
		return nil
	}
	for _, n := range f.names {
		if s := f.steps[n]; s.state == 'r' {
			out = append(out, s.ready())
		}
	}
	return out
}

// collect lists the ready steps that n's end made startable: its ready
// dependents, and through cancelled dependents theirs.
func (f *flow) collect(n string) []broker.ReadyStep {
	if f.state == tidetype.FlowCanceled {
		return nil
	}
	var out []broker.ReadyStep
	seen := map[string]bool{}
	stack := []string{n}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, d := range f.steps[x].dependents {
			if seen[d] {
				continue
			}
			seen[d] = true
			switch s := f.steps[d]; s.state {
			case 'r':
				out = append(out, s.ready())
			case 'C':
				stack = append(stack, d)
			}
		}
	}
	return out
}

// tally sets a step's final state and counts it (a batch's callback is not
// counted); it reports whether it counted.
func (f *flow) tally(s *flowStep, st byte, reason string) bool {
	s.state, s.task = st, nil
	if reason != "" {
		s.reason = reason
	}
	if s.name == f.callback {
		f.cbState = stepState(st)
		return false
	}
	switch st {
	case 'S':
		f.ok++
	case 'F':
		f.bad++
	default:
		f.canceled++
	}
	return true
}

// end records the flow's end once every step has finished.
func (f *flow) end(now time.Time) {
	n := len(f.names)
	if f.cbState != 0 {
		n--
	}
	if f.ok+f.bad+f.canceled < n || !f.ended.IsZero() {
		return
	}
	if f.state == tidetype.FlowRunning {
		f.state = tidetype.FlowSucceeded
		if f.bad+f.canceled > 0 || f.cbState == tidetype.StepFailed || f.cbState == tidetype.StepCanceled {
			f.state = tidetype.FlowFailed
		}
	}
	f.ended = now
}

// EndStep implements broker.Flows.
func (b *Broker) EndStep(ctx context.Context, id, step, taskID string, succeeded bool, reason string) ([]broker.ReadyStep, error) {
	var ready []broker.ReadyStep
	err := b.onFlow(ctx, id, func(f *flow) error {
		s := f.steps[step]
		if s == nil || s.id != taskID {
			return fmt.Errorf("%w: %q has no step %q with task %q", broker.ErrFlowNotFound, id, step, taskID)
		}
		live := s.live
		s.live = false
		switch {
		case s.state == 'r' || s.state == 'e':
			f.endStep(s, succeeded, reason, b.Now())
		case s.state == 'C' && live && succeeded:
			// Cancelled while ready, its release unconfirmed, and its
			// task (the release had stored it) succeeded before the
			// cancel reached it: the step keeps its task's outcome, as
			// an enqueued step does.
			if s.name != f.callback {
				f.canceled--
			}
			s.reason = ""
			f.tally(s, 'S', "")
		}
		ready = f.collect(step)
		return nil
	})
	return ready, err
}

// endStep records s's end and releases or cancels its dependents, and
// theirs when cancelled.
func (f *flow) endStep(s *flowStep, succeeded bool, reason string, now time.Time) {
	switch {
	case succeeded:
		f.tally(s, 'S', "")
	case f.state == tidetype.FlowCanceled:
		f.tally(s, 'C', reason)
	default:
		if f.tally(s, 'F', reason) {
			f.failed = append(f.failed, s.id)
		}
	}
	type work struct {
		name string
		ok   bool
	}
	todo := []work{{s.name, succeeded}}
	for len(todo) > 0 {
		w := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		for _, dn := range f.steps[w.name].dependents {
			d := f.steps[dn]
			if d.state != 'w' {
				continue
			}
			if !w.ok && !d.runOnFailure {
				f.tally(d, 'C', "tide: not run: step "+w.name+" did not succeed")
				todo = append(todo, work{dn, false})
			} else if d.left--; d.left <= 0 {
				d.state = 'r'
			}
		}
	}
	f.end(now)
}

// ReleaseSteps implements broker.Flows. A flow that is gone releases
// nothing.
func (b *Broker) ReleaseSteps(ctx context.Context, id string, steps []string) ([]string, error) {
	var canceled []string
	err := b.onFlow(ctx, id, func(f *flow) error {
		for _, n := range steps {
			s := f.steps[n]
			switch {
			case s == nil:
			case s.state == 'r':
				s.state, s.task = 'e', nil
			case s.state == 'C':
				canceled = append(canceled, n)
			}
		}
		return nil
	})
	if errors.Is(err, broker.ErrFlowNotFound) {
		err = nil
	}
	return canceled, err
}

// CancelFlow implements broker.Flows. It returns the steps whose tasks may
// live (enqueued ones, and ready ones whose release was not confirmed) on
// every call while the flow stays cancelled, as flow.lua does.
func (b *Broker) CancelFlow(ctx context.Context, id string) ([]tidetype.StepInfo, error) {
	var out []tidetype.StepInfo
	err := b.onFlow(ctx, id, func(f *flow) error {
		switch f.state {
		case tidetype.FlowSucceeded, tidetype.FlowFailed:
			return nil
		case tidetype.FlowRunning:
			f.state = tidetype.FlowCanceled
			for _, n := range f.names {
				switch s := f.steps[n]; s.state {
				case 'r':
					s.live = true
					f.tally(s, 'C', "tide: workflow cancelled")
				case 'w':
					f.tally(s, 'C', "tide: workflow cancelled")
				}
			}
		}
		for _, n := range f.names {
			if s := f.steps[n]; s.state == 'e' || s.live {
				out = append(out, s.info())
			}
		}
		f.end(b.Now())
		return nil
	})
	return out, err
}

func stepState(c byte) tidetype.StepState {
	switch c {
	case 'w':
		return tidetype.StepWaiting
	case 'r', 'e':
		return tidetype.StepEnqueued
	case 'S':
		return tidetype.StepSucceeded
	case 'F':
		return tidetype.StepFailed
	case 'C':
		return tidetype.StepCanceled
	}
	return 0
}

func (s *flowStep) info() tidetype.StepInfo {
	return tidetype.StepInfo{Name: s.name, Queue: s.queue, TaskID: s.id, After: slices.Clone(s.after), RunOnFailure: s.runOnFailure,
		State: stepState(s.state), Err: s.reason}
}

func (f *flow) info(id string, steps bool) *tidetype.WorkflowInfo {
	out := &tidetype.WorkflowInfo{ID: id, Kind: f.kind, State: f.state, Total: len(f.names), Succeeded: f.ok, Failed: f.bad, Canceled: f.canceled,
		CreatedAt: f.created, FinishedAt: f.ended, FailedIDs: slices.Clone(f.failed), Callback: f.cbID}
	if steps {
		out.Steps = make([]tidetype.StepInfo, len(f.names))
		for i, n := range f.names {
			out.Steps[i] = f.steps[n].info()
		}
	}
	return out
}

// GetFlow implements broker.Flows.
func (b *Broker) GetFlow(ctx context.Context, id string, steps bool) (*tidetype.WorkflowInfo, error) {
	var out *tidetype.WorkflowInfo
	err := b.onFlow(ctx, id, func(f *flow) error {
		out = f.info(id, steps)
		return nil
	})
	return out, err
}

// GetStep implements broker.Flows.
func (b *Broker) GetStep(ctx context.Context, id, step string) (*tidetype.StepInfo, error) {
	var out *tidetype.StepInfo
	err := b.onFlow(ctx, id, func(f *flow) error {
		s := f.steps[step]
		if s == nil {
			return fmt.Errorf("%w: %q has no step %q", broker.ErrFlowNotFound, id, step)
		}
		info := s.info()
		out = &info
		return nil
	})
	return out, err
}

// ListFlows implements broker.Flows.
func (b *Broker) ListFlows(ctx context.Context, kind tidetype.FlowKind, offset, limit int) ([]*tidetype.WorkflowInfo, int, error) {
	if err := b.check(ctx); err != nil {
		return nil, 0, err
	}
	b.flowsMu.Lock()
	defer b.flowsMu.Unlock()
	var ids []string
	for id := range b.flows {
		if f := b.flowLocked(id); f != nil && f.kind == kind {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(x, y string) int {
		if c := b.flows[y].created.Compare(b.flows[x].created); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	})
	total := len(ids)
	if offset >= total {
		return nil, total, nil
	}
	var out []*tidetype.WorkflowInfo
	for _, id := range ids[offset:min(offset+limit, total)] {
		out = append(out, b.flows[id].info(id, false))
	}
	return out, total, nil
}
