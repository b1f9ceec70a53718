package redisbroker

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
)

var _ broker.Durable = (*Broker)(nil)

// LoadSteps implements broker.Durable (step.lua 'load').
func (b *Broker) LoadSteps(ctx context.Context, lease broker.LeaseRef) ([]broker.StepRecord, error) {
	_, d, err := b.stepCall(ctx, "load steps", lease, "load", "", "", "")
	if err != nil {
		return nil, err
	}
	return broker.DecodeSteps(d), nil
}

// SaveStep implements broker.Durable (step.lua 'save').
func (b *Broker) SaveStep(ctx context.Context, lease broker.LeaseRef, r broker.StepRecord) (broker.StepRecord, error) {
	_, d, err := b.stepCall(ctx, "save step", lease, "save", string(r.Kind), r.Name, string(broker.EncodeSteps(nil, r)))
	if err != nil {
		return broker.StepRecord{}, err
	}
	rs := broker.DecodeSteps(d)
	if len(rs) != 1 {
		return broker.StepRecord{}, callErr("save step", fmt.Errorf("unexpected reply of %d bytes", len(d)))
	}
	return rs[0], nil
}

// ResolveWait implements broker.Durable (step.lua 'resolve').
func (b *Broker) ResolveWait(ctx context.Context, lease broker.LeaseRef, name string, deadline time.Time) (broker.StepRecord, bool, error) {
	code, d, err := b.stepCall(ctx, "resolve wait", lease, "resolve", "", name, max(deadline.UnixMilli(), 0))
	if err != nil {
		return broker.StepRecord{}, false, err
	}
	rs := broker.DecodeSteps(d)
	if len(rs) != 1 {
		return broker.StepRecord{}, false, callErr("resolve wait", fmt.Errorf("unexpected reply of %d bytes", len(d)))
	}
	return rs[0], code == 0, nil
}

// stepCall runs step.lua where the leased task may be and returns its
// code (0, or 2: a wait goes on) and data.
func (b *Broker) stepCall(ctx context.Context, op string, lease broker.LeaseRef, mode, kind, name string, value any) (int64, []byte, error) {
	if err := b.check(); err != nil {
		return 0, nil, err
	}
	l, err := b.layoutOf(ctx, lease.Queue)
	if err != nil {
		return 0, nil, err
	}
	for _, p := range b.lookup(lease.Queue, l, leaseKey(lease)) {
		c := &call{script: b.s.step, keys: p.keys("t", "result", "meta"),
			args: []any{p.layout, lease.ID, lease.Token, mode, kind, name, value, broker.MaxStepRecords, broker.MaxStepBytes}, queue: lease.Queue}
		b.run(ctx, []*call{c})
		if c.err != nil {
			return 0, nil, callErr(op, c.err)
		}
		vals, err := c.cmd.Slice()
		if err != nil || len(vals) != 2 {
			return 0, nil, callErr(op, fmt.Errorf("unexpected reply: %v", c.cmd.Val()))
		}
		code, _ := vals[0].(int64)
		data, _ := vals[1].(string)
		switch code {
		case 0, 2:
			return code, []byte(data), nil
		case 1:
			return 0, nil, broker.ErrLeaseLost
		case 4:
			return 0, nil, fmt.Errorf("%w (%d records or %d bytes per task)", broker.ErrStepLimit, broker.MaxStepRecords, broker.MaxStepBytes)
		}
	}
	return 0, nil, broker.ErrLeaseLost
}

// Signal implements broker.Durable (signal.lua), in the task's partition
// and, while a repartition runs, in its old one when it is not in the new.
func (b *Broker) Signal(ctx context.Context, queue, id, name string, payload []byte) error {
	if err := b.check(); err != nil {
		return err
	}
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		return err
	}
	r := string(broker.EncodeSteps(nil, broker.StepRecord{Kind: broker.StepSignal, Name: name, Finished: b.Now(), Data: payload}))
	where, err := b.resolve(ctx, queue, l, id)
	if err != nil {
		return err
	}
	for _, f := range where {
		p := f.p
		rid, cache, exp, _ := b.request(p)
		keys := append(append(p.keys("t", "result", "retry", "pending", "meta"), cache), p.groupKeys()...)
		c := &call{script: b.s.signal, keys: append(keys, p.k(eventsKey)),
			args:  []any{p.layout, rid, exp, id, name, r, p.channel, p.idx, broker.MaxStepRecords, broker.MaxStepBytes, b.eventsArg(p)},
			queue: queue}
		b.run(ctx, []*call{c})
		if c.err != nil {
			return callErr("signal", c.err)
		}
		code, err := c.cmd.Text()
		if err != nil {
			return callErr("signal", fmt.Errorf("unexpected reply: %w", err))
		}
		switch code {
		case "0", "1":
			return nil
		case "2":
			return broker.ErrTaskNotFound
		case "3":
			continue
		case "4":
			return broker.ErrSignalSent
		case "5":
			return broker.ErrSignalTimeout
		case "6":
			return fmt.Errorf("%w (%d records or %d bytes per task)", broker.ErrStepLimit, broker.MaxStepRecords, broker.MaxStepBytes)
		default:
			return callErr("signal", fmt.Errorf("unknown code %q", code))
		}
	}
	return broker.ErrTaskNotFound
}
