package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tidequeue/tide"
)

// The blocked workload measures how soon a task starts that may run while
// many groups may not: an Ordered queue where blockedGroups groups each
// have their first task waiting to be retried (it holds the group's place)
// and a second task waiting behind it. One task at a time is enqueued in a
// group of its own; its time to start is handler start − the instant just
// before its Enqueue. The dequeue must find it without walking past the
// blocked groups (issue 23's "runnable group stuck behind blocked ones").
// asynq has no ordered groups, so it runs on tide alone.
const (
	blockedQueue = "blocked"
	kindHolder   = 3 // first task of a blocked group: asks to run again in an hour
	kindBehind   = 4 // second task of a blocked group: must not start
	blockedGoal  = 10 * time.Millisecond
)

func blockedWorkload(sz sizes) workload {
	return workload{
		name:    "blocked",
		systems: []string{sysTide},
		absent:  noGroupsCell,
		about:   "time to start of a task that may run behind many ordered groups that may not (tide only)",
		figs: []figure{
			{key: "blk50", label: fmt.Sprintf("blocked: start of the one runnable task behind %s blocked ordered groups, p50 (%d tasks, one at a time)", kcount(sz.blockedGroups), sz.blockedN), unit: "dur", lower: true},
			{key: "blk99", label: fmt.Sprintf("blocked: the same, p99 (goal ≤ %v)", blockedGoal), unit: "dur", lower: true},
			{key: "blkMax", label: "blocked: the same, max", unit: "dur", lower: true},
		},
		limit: 5 * time.Minute,
		run:   runBlocked,
	}
}

// runBlocked sets up blockedGroups blocked ordered groups on a flushed
// Redis, then enqueues blockedN tasks one at a time, each in a new group,
// and records how long each took to start (at most blockedCap).
func runBlocked(ctx context.Context, e *env, kind string) (results, error) {
	if kind != sysTide {
		return nil, fmt.Errorf("blocked: tide only (%s)", noGroupsNote)
	}
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	s, err := newSystem(sysTide, e.addr)
	if err != nil {
		return nil, err
	}
	defer s.close()
	ts := s.(*tideSystem)
	in := tide.NewInspector(ts.b)
	if err := in.SetQueueLimits(ctx, blockedQueue, tide.QueueLimits{Ordered: true}); err != nil {
		return nil, fmt.Errorf("blocked: SetQueueLimits: %w", err)
	}
	n, groups := e.sz.blockedN, e.sz.blockedGroups
	rec := newRecorder(n)
	behind := make(chan struct{}, 1)
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency, queues: []string{blockedQueue}}, func(ctx context.Context, p []byte) error {
		switch kind, _, _, _ := parsePayload(p); kind {
		case kindHolder:
			return tide.RetryAfter(time.Hour)
		case kindBehind:
			select {
			case behind <- struct{}{}:
			default:
			}
			return nil
		}
		return rec.handle(ctx, p)
	})
	if err != nil {
		return nil, err
	}
	defer srv.stop(time.Minute)
	// Each group's first task runs, asks to run again in an hour and so
	// holds its group's place; then each group gets a second task.
	for _, k := range []byte{kindHolder, kindBehind} {
		for i := 0; i < groups; i += e.sz.batch {
			batch := make([]*tide.Task, 0, e.sz.batch)
			for g := i; g < min(i+e.sz.batch, groups); g++ {
				batch = append(batch, tide.NewTask(taskType, makePayload(k, g, time.Now()), tide.Group(groupName(g))))
			}
			if _, err := ts.c.EnqueueMany(ctx, batch, tide.Queue(blockedQueue)); err != nil {
				return nil, fmt.Errorf("blocked: EnqueueMany at %d: %w", i, err)
			}
		}
		if k == kindBehind {
			break
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
			qi, err := in.QueueInfo(ctx, blockedQueue)
			if err != nil {
				return nil, fmt.Errorf("blocked: QueueInfo: %w", err)
			}
			if qi.Retry == groups {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("blocked: %d of %d first tasks wait in retry after 2 minutes", qi.Retry, groups)
			}
		}
	}
	var waits []time.Duration
	capped := false
	for i := range n {
		t0 := time.Now()
		if _, err := ts.c.Enqueue(ctx, tide.NewTask(taskType, makePayload(kindTask, i, t0)), tide.Queue(blockedQueue), tide.Group(fmt.Sprintf("free-%05d", i))); err != nil {
			return nil, fmt.Errorf("blocked: enqueue task %d: %w", i, err)
		}
		for rec.starts[i].Load() == 0 && time.Since(t0) < e.sz.blockedCap {
			time.Sleep(200 * time.Microsecond)
		}
		st := rec.starts[i].Load()
		if st == 0 {
			waits, capped = append(waits, e.sz.blockedCap), true
			break
		}
		waits = append(waits, time.Duration(st-t0.UnixNano()))
	}
	select {
	case <-behind:
		return nil, errors.New("blocked: a task behind its group's first one started while that one waited in retry")
	default:
	}
	slices.Sort(waits)
	res := results{
		"blk50":  val{v: ms(pct(waits, 50)), atLeast: capped},
		"blk99":  val{v: ms(pct(waits, 99)), atLeast: capped},
		"blkMax": val{v: ms(waits[len(waits)-1]), atLeast: capped},
	}
	verdict := "met"
	if capped || pct(waits, 99) > blockedGoal {
		verdict = "NOT met"
	}
	how := fmt.Sprintf("%d tasks enqueued one at a time, each in a group of its own", len(waits))
	if capped {
		how = fmt.Sprintf("tasks enqueued one at a time, each in a group of its own: gave up at task %d of %d, not started after %v", len(waits), n, e.sz.blockedCap)
	}
	e.note("blocked/%s: %s ordered groups each with its first task in retry (RetryAfter 1h) and a second one behind it; %s; goal p99 ≤ %v: %s",
		kind, kcount(groups), how, blockedGoal, verdict)
	return res, nil
}
