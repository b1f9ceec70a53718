package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide"
)

// The chain, fanout and wait workloads measure tide's workflows
// (Client.EnqueueWorkflow), batches (Client.EnqueueBatch with OnBatchDone)
// and request/response calls (Client.EnqueueAndWait) against what they
// replace:
//
//   - chain: a workflow whose steps run one after another, against the same
//     number of plain tasks where each handler enqueues the next (the
//     hand-rolled chain), on tide and on asynq.
//   - fanout: one root step, many dependents and a join step, against the
//     same number of plain tasks stored with one EnqueueMany; and a batch
//     with a callback against the same plain tasks. asynq has no workflows
//     or batches, so fanout runs on tide alone.
//   - wait: EnqueueAndWait round trips, sequential and from several
//     goroutines, next to one Redis round trip measured by redis-benchmark
//     in the same run; asynq's closest equivalent is Enqueue and then
//     polling Inspector.GetTaskInfo until the task is completed.
//
// asynq's processor sleeps TaskCheckInterval (default 1s, ±50% jitter)
// whenever it finds every queue empty, which a chain or a lone waited-for
// task always does between tasks. So asynq runs these twice: with
// TaskCheckInterval asynqFastCheck (the figure in its column) and with its
// defaults, for a time box (a row of its own).
const (
	asynqFastCheck = time.Millisecond // asynq's TaskCheckInterval in chain and wait
	asynqPoll      = time.Millisecond // wait: asynq's GetTaskInfo poll interval
	waitWorkers    = 16               // wait: goroutines of the concurrent variant
	waitWarm       = 32               // wait: warm-up calls before measuring
	noFlowsCell    = "(no workflows)"
	noFlowsNote    = "asynq: has no workflows, batches or completion callbacks (its Group + GroupAggregator merges tasks into one); fanout runs on tide alone"
)

func chainWorkload(sz sizes) workload {
	return workload{
		name:  "chain",
		about: "a chain of steps: a tide workflow (each step After the previous) vs. plain tasks whose handler enqueues the next",
		figs: []figure{
			{key: "chainWf", label: fmt.Sprintf("chain: tide workflow of %s steps, each After the previous, EnqueueWorkflow → last step starts, per step", kcount(sz.chainN)), unit: "dur", only: sysTide, absent: noFlowsCell},
			{key: "chainPlain", label: fmt.Sprintf("chain: hand-rolled chain, %s plain tasks, each handler enqueues the next, per task (asynq: TaskCheckInterval %v)", kcount(sz.chainN), asynqFastCheck), unit: "dur", lower: true, ratio: true},
			{key: "chainDef", label: fmt.Sprintf("chain: hand-rolled chain, per task (tide: as above; asynq: its defaults, TaskCheckInterval 1s, stopped after %v)", sz.chainCap), unit: "dur", lower: true, ratio: true},
		},
		limit: sz.chainCap + 3*time.Minute,
		run:   runChain,
	}
}

func fanoutWorkload(sz sizes) workload {
	return workload{
		name:    "fanout",
		systems: []string{sysTide},
		absent:  noFlowsCell,
		about:   "a wide fan-out workflow and a batch with a callback vs. the same plain tasks (tide only)",
		figs: []figure{
			{key: "fanPlainAll", label: fmt.Sprintf("fanout: %s plain tasks, one EnqueueMany on a running server (concurrency %d), call → last start", kcount(sz.fanN), sz.concurrency), unit: "dur"},
			{key: "fanPlainRate", label: fmt.Sprintf("fanout: plain, %s ÷ (call → last start)", kcount(sz.fanN)), unit: "tasks/s"},
			{key: "fanWfAll", label: fmt.Sprintf("fanout: workflow root → %s dependents → join, EnqueueWorkflow → join starts", kcount(sz.fanN)), unit: "dur"},
			{key: "fanWfRate", label: fmt.Sprintf("fanout: workflow, %s ÷ (EnqueueWorkflow → join starts)", kcount(sz.fanN)), unit: "tasks/s"},
			{key: "fanWfStep", label: fmt.Sprintf("fanout: workflow, %s ÷ (root starts → last fan-out step starts)", kcount(sz.fanN)), unit: "tasks/s"},
			{key: "fanBatchAll", label: fmt.Sprintf("fanout: EnqueueBatch of %s with OnBatchDone, call → callback starts", kcount(sz.fanN)), unit: "dur"},
			{key: "fanBatchRate", label: fmt.Sprintf("fanout: batch, %s ÷ (EnqueueBatch → callback starts)", kcount(sz.fanN)), unit: "tasks/s"},
		},
		limit: 4 * time.Minute,
		run:   runFanout,
	}
}

// ---- chain ----

func runChain(ctx context.Context, e *env, kind string) (results, error) {
	noteLoad(e, "chain", kind)
	n := e.sz.chainN
	res := results{}
	if kind == sysTide {
		per, err := chainWorkflow(ctx, e, n)
		if err != nil {
			return nil, err
		}
		res["chainWf"] = val{v: ms(per)}
	}
	cfg := serverConfig{concurrency: e.sz.concurrency}
	if kind == sysAsynq {
		cfg.taskCheck = asynqFastCheck
	}
	per, _, err := handChain(ctx, e, kind, n, cfg, 0)
	if err != nil {
		return nil, err
	}
	res["chainPlain"] = val{v: ms(per)}
	res["chainDef"] = res["chainPlain"]
	if kind == sysAsynq {
		per, got, err := handChain(ctx, e, kind, n, serverConfig{concurrency: e.sz.concurrency}, e.sz.chainCap)
		if err != nil {
			return nil, err
		}
		res["chainDef"] = val{v: ms(per)}
		e.note("chain/asynq defaults: %d of %d tasks of the hand-rolled chain started within %v (%.0f ms per task)", got, n, e.sz.chainCap, ms(per))
	}
	return res, nil
}

func stepName(prefix string, i int) string { return fmt.Sprintf("%s%05d", prefix, i) }

// chainWorkflow runs a workflow of n steps, each After the previous, on a
// running tide server and returns the time from EnqueueWorkflow until the
// last step's handler started, per step. The end is the recorder's done
// channel (closed by the last step's handler): nothing polls meanwhile.
func chainWorkflow(ctx context.Context, e *env, n int) (time.Duration, error) {
	if err := e.flush(ctx); err != nil {
		return 0, err
	}
	s, err := newSystem(sysTide, e.addr)
	if err != nil {
		return 0, err
	}
	defer s.close()
	ts := s.(*tideSystem)
	rec := newRecorder(n)
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency}, rec.handle)
	if err != nil {
		return 0, err
	}
	defer srv.stop(time.Minute)
	if err := warmUp(ctx, s, rec, e.sz.warmups, defaultQueue); err != nil {
		return 0, err
	}
	time.Sleep(100 * time.Millisecond) // the server waits for work, as in handChain
	ref := time.Now()
	wf := tide.NewWorkflow("bench-chain")
	for i := range n {
		t := tide.NewTask(taskType, makePayload(kindTask, i, ref))
		if i == 0 {
			wf.Add(stepName("s", i), t)
		} else {
			wf.Add(stepName("s", i), t, tide.After(stepName("s", i-1)))
		}
	}
	t0 := time.Now()
	if _, err := ts.c.EnqueueWorkflow(ctx, wf); err != nil {
		return 0, fmt.Errorf("chain: EnqueueWorkflow: %w", err)
	}
	call := time.Since(t0)
	if err := rec.wait(ctx, 2*time.Minute); err != nil {
		return 0, fmt.Errorf("chain workflow: %w", err)
	}
	last := rec.lastStart().Sub(t0)
	for i := 1; i < n; i++ {
		if rec.starts[i].Load() <= rec.starts[i-1].Load() {
			return 0, fmt.Errorf("chain workflow: step %d started before step %d", i, i-1)
		}
	}
	end, err := flowEnd(ctx, ts, wf.ID(), n, t0)
	if err != nil {
		return 0, err
	}
	e.note("chain/tide workflow: %d steps; EnqueueWorkflow returned after %v; first step started %v, last %v after the call; the workflow's FinishedAt %v after it (Succeeded %d of %d)",
		n, call.Round(time.Microsecond), time.Unix(0, rec.starts[0].Load()).Sub(t0).Round(time.Microsecond), last.Round(time.Millisecond), end.Round(time.Millisecond), n, n)
	return last / time.Duration(n), nil
}

// flowEnd polls the workflow every 5 ms, now that its last step has
// started, until it has ended; it checks that every step succeeded and
// returns its FinishedAt − t0.
func flowEnd(ctx context.Context, ts *tideSystem, id string, n int, t0 time.Time) (time.Duration, error) {
	in := tide.NewInspector(ts.b)
	for deadline := time.Now().Add(30 * time.Second); ; {
		info, err := in.GetWorkflow(ctx, id)
		if err != nil {
			return 0, fmt.Errorf("GetWorkflow %s: %w", id, err)
		}
		if info.State != tide.FlowRunning {
			if info.State != tide.FlowSucceeded || info.Succeeded != n || info.Total != n {
				return 0, fmt.Errorf("workflow %s ended %v with %d of %d steps succeeded (total %d)", id, info.State, info.Succeeded, n, info.Total)
			}
			return info.FinishedAt.Sub(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("workflow %s still running 30 s after its last step started (%d of %d succeeded)", id, info.Succeeded, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// handChain runs the hand-rolled chain: task 0 is enqueued, and the
// handler of task i enqueues task i+1, up to n tasks or for limit (0: no
// limit). It returns the time from the first Enqueue until the last
// handler started, per task started, and how many started.
func handChain(ctx context.Context, e *env, kind string, n int, cfg serverConfig, limit time.Duration) (time.Duration, int, error) {
	if err := e.flush(ctx); err != nil {
		return 0, 0, err
	}
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return 0, 0, err
	}
	defer s.close()
	rec := newRecorder(n)
	var stop atomic.Bool
	errc := make(chan error, 1)
	srv, err := s.startServer(cfg, func(ctx context.Context, p []byte) error {
		_ = rec.handle(ctx, p)
		k, idx, _, ok := parsePayload(p)
		if !ok || k != kindTask || idx+1 >= n || stop.Load() {
			return nil
		}
		if err := s.enqueue(ctx, defaultQueue, makePayload(kindTask, idx+1, time.Now()), time.Time{}); err != nil {
			select {
			case errc <- fmt.Errorf("handler of task %d: enqueue the next: %w", idx, err):
			default:
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	defer srv.stop(time.Minute)
	if err := warmUp(ctx, s, rec, e.sz.warmups, defaultQueue); err != nil {
		return 0, 0, err
	}
	time.Sleep(100 * time.Millisecond) // both servers wait for work, as a workflow's would
	what := fmt.Sprintf("hand-rolled chain/%s", kind)
	t0 := time.Now()
	if err := s.enqueue(ctx, defaultQueue, makePayload(kindTask, 0, t0), time.Time{}); err != nil {
		return 0, 0, fmt.Errorf("%s: enqueue task 0: %w", what, err)
	}
	wait := 2 * time.Minute
	if limit > 0 {
		wait = limit
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-rec.done:
	case err := <-errc:
		return 0, 0, fmt.Errorf("%s: %w", what, err)
	case <-ctx.Done():
		return 0, 0, fmt.Errorf("%s: %d of %d tasks started before the time box ended: %w", what, rec.got.Load(), n, ctx.Err())
	case <-t.C:
		if limit == 0 {
			return 0, 0, fmt.Errorf("%s: only %d of %d tasks started within %v", what, rec.got.Load(), n, wait)
		}
	}
	stop.Store(true)
	got := int(rec.got.Load())
	if err := rec.check(); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", what, err)
	}
	if got == 0 {
		return 0, 0, fmt.Errorf("%s: no task started within %v", what, wait)
	}
	return rec.lastStart().Sub(t0) / time.Duration(got), got, nil
}

// ---- fanout ----

func runFanout(ctx context.Context, e *env, kind string) (results, error) {
	noteLoad(e, "fanout", kind)
	if kind != sysTide {
		return nil, fmt.Errorf("fanout: tide only (%s)", noFlowsNote)
	}
	n := e.sz.fanN
	res := results{}
	ref := time.Now() // payloads' reference time (unused by these figures)

	// Plain: n tasks in one EnqueueMany on a running server.
	err := withTideServer(ctx, e, n, func(ts *tideSystem, rec *recorder) error {
		tasks := make([]*tide.Task, n)
		for i := range tasks {
			tasks[i] = tide.NewTask(taskType, makePayload(kindTask, i, ref))
		}
		t0 := time.Now()
		infos, err := ts.c.EnqueueMany(ctx, tasks)
		if err != nil {
			return fmt.Errorf("EnqueueMany: %w", err)
		}
		call := time.Since(t0)
		for i, in := range infos {
			if in == nil {
				return fmt.Errorf("EnqueueMany: task %d not stored", i)
			}
		}
		if err := rec.wait(ctx, 2*time.Minute); err != nil {
			return err
		}
		all := rec.lastStart().Sub(t0)
		res["fanPlainAll"] = val{v: ms(all)}
		res["fanPlainRate"] = val{v: rate(n, all)}
		e.note("fanout/plain: %d tasks, EnqueueMany returned after %v, first start %v, last start %v after the call",
			n, call.Round(time.Millisecond), firstStart(rec, 0, n).Sub(t0).Round(time.Millisecond), all.Round(time.Millisecond))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fanout, plain: %w", err)
	}

	// Workflow: step 0 the root, 1..n its dependents, n+1 the join.
	err = withTideServer(ctx, e, n+2, func(ts *tideSystem, rec *recorder) error {
		wf := tide.NewWorkflow("bench-fanout")
		wf.Add("root", tide.NewTask(taskType, makePayload(kindTask, 0, ref)))
		fans := make([]string, n)
		for i := range n {
			fans[i] = stepName("f", i)
			wf.Add(fans[i], tide.NewTask(taskType, makePayload(kindTask, i+1, ref)), tide.After("root"))
		}
		wf.Add("join", tide.NewTask(taskType, makePayload(kindTask, n+1, ref)), tide.After(fans...))
		t0 := time.Now()
		if _, err := ts.c.EnqueueWorkflow(ctx, wf); err != nil {
			return fmt.Errorf("EnqueueWorkflow: %w", err)
		}
		call := time.Since(t0)
		if err := rec.wait(ctx, 2*time.Minute); err != nil {
			return err
		}
		root := time.Unix(0, rec.starts[0].Load())
		join := time.Unix(0, rec.starts[n+1].Load())
		first, last := firstStart(rec, 1, n+1), lastStartOf(rec, 1, n+1)
		if first.Before(root) || !join.After(last) {
			return fmt.Errorf("steps out of order: root started %v, fan-out steps %v to %v, join %v after the call",
				root.Sub(t0), first.Sub(t0), last.Sub(t0), join.Sub(t0))
		}
		end, err := flowEnd(ctx, ts, wf.ID(), n+2, t0)
		if err != nil {
			return err
		}
		res["fanWfAll"] = val{v: ms(join.Sub(t0))}
		res["fanWfRate"] = val{v: rate(n, join.Sub(t0))}
		res["fanWfStep"] = val{v: rate(n, last.Sub(root))}
		e.note("fanout/workflow: %d steps (root, %d, join); EnqueueWorkflow returned after %v; after the call: root started %v, fan-out steps %v to %v, join %v, the workflow's FinishedAt %v (all %d succeeded)",
			n+2, n, call.Round(time.Millisecond), root.Sub(t0).Round(time.Millisecond), first.Sub(t0).Round(time.Millisecond), last.Sub(t0).Round(time.Millisecond), join.Sub(t0).Round(time.Millisecond), end.Round(time.Millisecond), n+2)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fanout, workflow: %w", err)
	}

	// Batch: tasks 0..n-1, the callback n.
	err = withTideServer(ctx, e, n+1, func(ts *tideSystem, rec *recorder) error {
		tasks := make([]*tide.Task, n)
		for i := range tasks {
			tasks[i] = tide.NewTask(taskType, makePayload(kindTask, i, ref))
		}
		cb := tide.NewTask(taskType, makePayload(kindTask, n, ref))
		t0 := time.Now()
		b, err := ts.c.EnqueueBatch(ctx, tasks, tide.OnBatchDone(cb))
		if err != nil {
			return fmt.Errorf("EnqueueBatch: %w", err)
		}
		call := time.Since(t0)
		if err := rec.wait(ctx, 2*time.Minute); err != nil {
			return err
		}
		cbAt := time.Unix(0, rec.starts[n].Load())
		last := lastStartOf(rec, 0, n)
		if !cbAt.After(last) {
			return fmt.Errorf("callback started %v after the call, before the last task (%v)", cbAt.Sub(t0), last.Sub(t0))
		}
		in := tide.NewInspector(ts.b)
		var bi *tide.BatchInfo
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if bi, err = in.GetBatch(ctx, b.ID); err != nil {
				return fmt.Errorf("GetBatch: %w", err)
			}
			if bi.State != tide.FlowRunning {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("batch %s still running 30 s after its callback started", b.ID)
			}
		}
		if bi.State != tide.FlowSucceeded || bi.Succeeded != n || bi.Failed != 0 || bi.Total != n {
			return fmt.Errorf("batch %s ended %v: %d succeeded, %d failed of %d", b.ID, bi.State, bi.Succeeded, bi.Failed, bi.Total)
		}
		all := cbAt.Sub(t0)
		res["fanBatchAll"] = val{v: ms(all)}
		res["fanBatchRate"] = val{v: rate(n, all)}
		e.note("fanout/batch: %d tasks and a callback; EnqueueBatch returned after %v; after the call: tasks started %v to %v, callback %v, the batch's FinishedAt %v (%d succeeded)",
			n, call.Round(time.Millisecond), firstStart(rec, 0, n).Sub(t0).Round(time.Millisecond), last.Sub(t0).Round(time.Millisecond), all.Round(time.Millisecond), bi.FinishedAt.Sub(t0).Round(time.Millisecond), bi.Succeeded)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fanout, batch: %w", err)
	}
	e.note("fanout: %s", noFlowsNote)
	return res, nil
}

// withTideServer runs f on a flushed Redis with a fresh tide system and a
// started, warmed-up server (the workload's concurrency) whose handler
// records n tasks.
func withTideServer(ctx context.Context, e *env, n int, f func(ts *tideSystem, rec *recorder) error) error {
	if err := e.flush(ctx); err != nil {
		return err
	}
	s, rec, done, err := startRecorded(ctx, e, sysTide, n)
	if err != nil {
		return err
	}
	defer done()
	return f(s.(*tideSystem), rec)
}

func firstStart(rec *recorder, from, to int) time.Time {
	first := int64(0)
	for i := from; i < to; i++ {
		if st := rec.starts[i].Load(); first == 0 || st < first {
			first = st
		}
	}
	return time.Unix(0, first)
}

func lastStartOf(rec *recorder, from, to int) time.Time {
	last := int64(0)
	for i := from; i < to; i++ {
		last = max(last, rec.starts[i].Load())
	}
	return time.Unix(0, last)
}
