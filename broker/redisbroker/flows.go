package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// A flow (workflow or batch) keeps its bookkeeping in three keys that share
// the hash tag {f:<id>}, apart from its tasks (which live in their queues'
// partitions): one script (flow.lua) changes them atomically, on Redis
// Cluster too. The flows indexes (<prefix>:flows:w and :b, sorted sets by
// creation time) are what ListFlows pages through; they are kept apart and
// swept of flows that expired a few entries per creation.

// flowKeys returns the hash, the failed-IDs list and the step-names list of
// flow id.
func (b *Broker) flowKeys(id string) []string {
	base := b.prefix + ":{f:" + id + "}"
	return []string{base, base + ":failed", base + ":names"}
}

func (b *Broker) flowIndex(k tidetype.FlowKind) string { return b.prefix + ":flows:" + kindChar(k) }

// newFlows is the sorted set of flows whose creation began (score: when, ms)
// and was not confirmed (ConfirmFlow): what RepairFlows reads.
func (b *Broker) newFlows() string { return b.prefix + ":flows:new" }

// flowChunk bounds the steps of one append call, so that no script runs long
// enough to stall Redis for the others.
const flowChunk = 500

func kindChar(k tidetype.FlowKind) string {
	if k == tidetype.KindBatch {
		return "b"
	}
	return "w"
}

// specOf is a step's spec as flow.lua stores it.
func specOf(s *broker.FlowStep) string {
	return s.Task.Queue + "\n" + s.Task.ID + "\n" + strings.Join(s.After, ",") + "\n" + strings.Join(s.Dependents, ",")
}

// flowCall runs one flow.lua call.
func (b *Broker) flowCall(ctx context.Context, id, what string, args ...any) (*redis.Cmd, error) {
	c := &call{script: b.s.flow, keys: b.flowKeys(id), args: args}
	b.run(ctx, []*call{c})
	if c.err != nil && !errors.Is(c.err, redis.Nil) {
		return nil, callErr(what+" "+id, c.err)
	}
	return c.cmd, nil
}

// CreateFlow implements broker.Flows: a create call, the steps in chunks,
// then the call that starts the flow; each is safe to repeat, so a creation
// cut short is finished by the next CreateFlow with the same flow.
func (b *Broker) CreateFlow(ctx context.Context, f *broker.Flow) ([]broker.ReadyStep, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	cbID := ""
	for i := range f.Steps {
		if f.Callback != "" && f.Steps[i].Name == f.Callback {
			cbID = f.Steps[i].Task.ID
		}
	}
	// Listed before anything is stored, so that a creator that dies at any
	// point leaves a flow that RepairFlows finds. ZADD NX keeps the first
	// time.
	if err := b.rdb.ZAddNX(ctx, b.newFlows(), redis.Z{Score: float64(b.Now().UnixMilli()), Member: f.ID}).Err(); err != nil {
		return nil, callErr("list new flow "+f.ID, classify(err))
	}
	cmd, err := b.flowCall(ctx, f.ID, "create flow", "c", kindChar(f.Kind), f.Digest, f.CreatedAt.UnixMilli(),
		max(f.Retention.Milliseconds(), 1), f.Callback, len(f.Steps), cbID)
	if err != nil {
		return nil, err
	}
	switch cmd.Val() {
	case "exists":
		return nil, fmt.Errorf("%w: %q", broker.ErrFlowExists, f.ID)
	case "new":
		b.sweepFlowIndex(ctx, f.Kind)
	}
	// Indexed whether this call or an earlier one created the flow: a
	// create re-sent after its reply was lost answers "ok", and the index
	// must not miss it. ZADD NX keeps the first creation time.
	if err := b.rdb.ZAddNX(ctx, b.flowIndex(f.Kind), redis.Z{Score: float64(f.CreatedAt.UnixMilli()), Member: f.ID}).Err(); err != nil {
		return nil, callErr("index flow "+f.ID, classify(err))
	}
	var calls []*call
	for start := 0; start < len(f.Steps); start += flowChunk {
		args := []any{"a", f.Digest}
		for i := start; i < min(start+flowChunk, len(f.Steps)); i++ {
			s := &f.Steps[i]
			rof := ""
			if s.RunOnFailure {
				rof = "1"
			}
			args = append(args, s.Name, rof, len(s.After), specOf(s), codec.Encode(s.Task, 0))
		}
		calls = append(calls, &call{script: b.s.flow, keys: b.flowKeys(f.ID), args: args})
	}
	b.run(ctx, calls)
	for _, c := range calls {
		if c.err != nil {
			return nil, callErr("store flow steps "+f.ID, c.err)
		}
		if c.cmd.Val() == "exists" {
			return nil, fmt.Errorf("%w: %q", broker.ErrFlowExists, f.ID)
		}
	}
	cmd, err = b.flowCall(ctx, f.ID, "start flow", "g", f.Digest)
	if err != nil {
		return nil, err
	}
	if cmd.Val() == "exists" {
		return nil, fmt.Errorf("%w: %q", broker.ErrFlowExists, f.ID)
	}
	return readySteps(cmd)
}

// sweepFlowIndex looks at the next few entries of the index after the
// process's cursor and drops those whose flow expired, so the index stays
// about as large as the flows kept, whatever their order of expiry.
func (b *Broker) sweepFlowIndex(ctx context.Context, kind tidetype.FlowKind) {
	b.flowSweepMu.Lock()
	from := b.flowSweep[kind]
	b.flowSweepMu.Unlock()
	zs, err := b.rdb.ZRangeByScoreWithScores(ctx, b.flowIndex(kind), &redis.ZRangeBy{Min: "(" + strconv.FormatFloat(from, 'f', -1, 64), Max: "+inf", Count: 10}).Result()
	if err != nil {
		return
	}
	next := 0.0 // back to the start once the end is reached
	if len(zs) == 10 {
		next = zs[len(zs)-1].Score
	}
	b.flowSweepMu.Lock()
	if b.flowSweep == nil {
		b.flowSweep = map[tidetype.FlowKind]float64{}
	}
	b.flowSweep[kind] = next
	b.flowSweepMu.Unlock()
	pipe := b.rdb.Pipeline()
	exists := make([]*redis.IntCmd, len(zs))
	for i, z := range zs {
		exists[i] = pipe.Exists(ctx, b.flowKeys(z.Member.(string))[0])
	}
	_, _ = pipe.Exec(ctx)
	for i, e := range exists {
		if e.Err() == nil && e.Val() == 0 {
			b.rdb.ZRem(ctx, b.flowIndex(kind), zs[i].Member)
		}
	}
}

// readySteps parses flow.lua's list of ready steps.
func readySteps(cmd *redis.Cmd) ([]broker.ReadyStep, error) {
	vals, err := cmd.StringSlice()
	if err != nil || len(vals)%3 != 0 {
		return nil, fmt.Errorf("tide: redisbroker: flow: unexpected reply %v (%v)", cmd.Val(), err)
	}
	out := make([]broker.ReadyStep, 0, len(vals)/3)
	for i := 0; i < len(vals); i += 3 {
		r := broker.ReadyStep{Name: vals[i]}
		if vals[i+2] != "" {
			q, id, _ := parseSpec(vals[i+1])
			t, _, err := codec.Decode(q, id, []byte(vals[i+2]))
			if err != nil {
				return nil, fmt.Errorf("tide: redisbroker: flow step %s: stored task unreadable: %w", vals[i], err)
			}
			r.Task = t
		}
		out = append(out, r)
	}
	return out, nil
}

// parseSpec splits a step's spec into its queue, task ID and dependencies.
func parseSpec(s string) (queue, id string, after []string) {
	parts := strings.SplitN(s, "\n", 4)
	for len(parts) < 4 {
		parts = append(parts, "")
	}
	if parts[2] != "" {
		after = strings.Split(parts[2], ",")
	}
	return parts[0], parts[1], after
}

// EndStep implements broker.Flows.
func (b *Broker) EndStep(ctx context.Context, flow, step, taskID string, succeeded bool, reason string) ([]broker.ReadyStep, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	ok := "0"
	if succeeded {
		ok = "1"
	}
	cmd, err := b.flowCall(ctx, flow, "end step "+step+" of", "e", step, taskID, ok, reason, b.Now().UnixMilli())
	if err != nil {
		return nil, err
	}
	if s, isStr := cmd.Val().(string); isStr && s == "x" {
		return nil, fmt.Errorf("%w: %q has no step %q with task %q", broker.ErrFlowNotFound, flow, step, taskID)
	}
	return readySteps(cmd)
}

// ReleaseSteps implements broker.Flows.
func (b *Broker) ReleaseSteps(ctx context.Context, flow string, steps []string) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	var canceled []string
	for start := 0; start < len(steps); start += flowChunk {
		args := []any{"l"}
		for _, s := range steps[start:min(start+flowChunk, len(steps))] {
			args = append(args, s)
		}
		cmd, err := b.flowCall(ctx, flow, "release steps of", args...)
		if err != nil {
			return nil, err
		}
		c, err := cmd.StringSlice()
		if err != nil {
			return nil, fmt.Errorf("tide: redisbroker: release steps: unexpected reply %v", cmd.Val())
		}
		canceled = append(canceled, c...)
	}
	return canceled, nil
}

// ConfirmFlow implements broker.Flows.
func (b *Broker) ConfirmFlow(ctx context.Context, flow string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := b.rdb.ZRem(ctx, b.newFlows(), flow).Err(); err != nil {
		return callErr("confirm flow "+flow, classify(err))
	}
	return nil
}

// RepairFlows implements broker.Flows.
func (b *Broker) RepairFlows(ctx context.Context, olderThan time.Duration, limit int) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	until := strconv.FormatInt(b.Now().Add(-olderThan).UnixMilli(), 10)
	ids, err := b.rdb.ZRangeByScore(ctx, b.newFlows(), &redis.ZRangeBy{Min: "-inf", Max: until, Count: int64(limit)}).Result()
	if err != nil {
		return nil, callErr("list flows to repair", classify(err))
	}
	return ids, nil
}

// ReadySteps implements broker.Flows.
func (b *Broker) ReadySteps(ctx context.Context, flow string) ([]broker.ReadyStep, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	cmd, err := b.flowCall(ctx, flow, "ready steps of", "r", b.Now().UnixMilli())
	if err != nil {
		return nil, err
	}
	if s, isStr := cmd.Val().(string); isStr && s == "x" {
		return nil, fmt.Errorf("%w: %q", broker.ErrFlowNotFound, flow)
	}
	return readySteps(cmd)
}

// CancelFlow implements broker.Flows.
func (b *Broker) CancelFlow(ctx context.Context, flow string) ([]tidetype.StepInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	cmd, err := b.flowCall(ctx, flow, "cancel flow", "x", b.Now().UnixMilli())
	if err != nil {
		return nil, err
	}
	if s, isStr := cmd.Val().(string); isStr && s == "x" {
		return nil, fmt.Errorf("%w: %q", broker.ErrFlowNotFound, flow)
	}
	vals, err := cmd.StringSlice()
	if err != nil || len(vals)%2 != 0 {
		return nil, fmt.Errorf("tide: redisbroker: cancel flow: unexpected reply %v", cmd.Val())
	}
	out := make([]tidetype.StepInfo, 0, len(vals)/2)
	for i := 0; i < len(vals); i += 2 {
		q, id, after := parseSpec(vals[i+1])
		out = append(out, tidetype.StepInfo{Name: vals[i], Queue: q, TaskID: id, After: after, State: tidetype.StepEnqueued})
	}
	return out, nil
}

// flowMeta are the hash fields of a flow's summary.
var flowMeta = []string{"_k", "_s", "_n", "_ok", "_bad", "_x", "_c", "_e", "_cbi"}

// parseFlowMeta reads flowMeta's values; ok is false when the flow is not
// stored (or the fields are not ours).
func parseFlowMeta(id string, v []any) (*tidetype.WorkflowInfo, bool) {
	str := func(i int) string { s, _ := v[i].(string); return s }
	num := func(i int) int { n, _ := strconv.Atoi(str(i)); return n }
	if len(v) != len(flowMeta) || str(0) == "" {
		return nil, false
	}
	f := &tidetype.WorkflowInfo{ID: id, Kind: tidetype.KindWorkflow, Total: num(2), Succeeded: num(3), Failed: num(4), Canceled: num(5), Callback: str(8)}
	if str(0) == "b" {
		f.Kind = tidetype.KindBatch
	}
	switch str(1) {
	case "P", "R":
		f.State = tidetype.FlowRunning
	case "S":
		f.State = tidetype.FlowSucceeded
	case "F":
		f.State = tidetype.FlowFailed
	case "X":
		f.State = tidetype.FlowCanceled
	default:
		return nil, false
	}
	if ms, err := strconv.ParseInt(str(6), 10, 64); err == nil {
		f.CreatedAt = time.UnixMilli(ms)
	}
	if ms, err := strconv.ParseInt(str(7), 10, 64); err == nil && ms > 0 {
		f.FinishedAt = time.UnixMilli(ms)
	}
	return f, true
}

var stepStates = map[string]tidetype.StepState{
	"w": tidetype.StepWaiting, "r": tidetype.StepEnqueued, "e": tidetype.StepEnqueued,
	"S": tidetype.StepSucceeded, "F": tidetype.StepFailed, "C": tidetype.StepCanceled,
}

// GetFlow implements broker.Flows.
func (b *Broker) GetFlow(ctx context.Context, flow string, steps bool) (*tidetype.WorkflowInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	k := b.flowKeys(flow)
	pipe := b.rdb.Pipeline()
	meta := pipe.HMGet(ctx, k[0], flowMeta...)
	failed := pipe.LRange(ctx, k[1], 0, -1)
	var names *redis.StringSliceCmd
	var all *redis.MapStringStringCmd
	if steps {
		names = pipe.LRange(ctx, k[2], 0, -1)
		all = pipe.HGetAll(ctx, k[0])
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, callErr("get flow "+flow, classify(err))
	}
	f, ok := parseFlowMeta(flow, meta.Val())
	if !ok {
		return nil, fmt.Errorf("%w: %q", broker.ErrFlowNotFound, flow)
	}
	f.FailedIDs = failed.Val()
	if steps {
		h := all.Val()
		for _, n := range names.Val() {
			f.Steps = append(f.Steps, stepOf(n, h["s:"+n], h["d:"+n], h["e:"+n], h["p:"+n] == "1"))
		}
	}
	return f, nil
}

func stepOf(name, state, spec, reason string, rof bool) tidetype.StepInfo {
	q, id, after := parseSpec(spec)
	return tidetype.StepInfo{Name: name, Queue: q, TaskID: id, After: after, RunOnFailure: rof, State: stepStates[state], Err: reason}
}

// GetStep implements broker.Flows.
func (b *Broker) GetStep(ctx context.Context, flow, step string) (*tidetype.StepInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	v, err := b.rdb.HMGet(ctx, b.flowKeys(flow)[0], "s:"+step, "d:"+step, "e:"+step, "p:"+step).Result()
	if err != nil {
		return nil, callErr("get step of flow "+flow, classify(err))
	}
	str := func(i int) string { s, _ := v[i].(string); return s }
	if str(0) == "" {
		return nil, fmt.Errorf("%w: %q has no step %q", broker.ErrFlowNotFound, flow, step)
	}
	s := stepOf(step, str(0), str(1), str(2), str(3) == "1")
	return &s, nil
}

// ListFlows implements broker.Flows: a page of the kind's index, newest
// first; entries of flows that expired are dropped as they are met.
func (b *Broker) ListFlows(ctx context.Context, kind tidetype.FlowKind, offset, limit int) ([]*tidetype.WorkflowInfo, int, error) {
	if err := b.check(); err != nil {
		return nil, 0, err
	}
	idx := b.flowIndex(kind)
	pipe := b.rdb.Pipeline()
	card := pipe.ZCard(ctx, idx)
	page := pipe.ZRevRange(ctx, idx, int64(offset), int64(offset+limit-1))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, callErr("list flows", classify(err))
	}
	ids, total := page.Val(), int(card.Val())
	pipe = b.rdb.Pipeline()
	metas := make([]*redis.SliceCmd, len(ids))
	for i, id := range ids {
		metas[i] = pipe.HMGet(ctx, b.flowKeys(id)[0], flowMeta...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, callErr("list flows", classify(err))
	}
	out := make([]*tidetype.WorkflowInfo, 0, len(ids))
	for i, id := range ids {
		f, ok := parseFlowMeta(id, metas[i].Val())
		if !ok {
			b.rdb.ZRem(ctx, idx, id)
			total--
			continue
		}
		out = append(out, f)
	}
	return out, total, nil
}
