package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// The durable workload: what tide's durable handlers (Step, Sleep,
// WaitSignal, Client.Signal) cost. asynq has no durable handlers.

const noDurableCell = "(no durable handlers)"

func durableWorkload(sz sizes) workload {
	n, park := sz.procN/2, 100000
	if sz.procN < 20000 {
		park = 10000
	}
	return workload{
		name:  "durable",
		about: "durable handlers: a Step's cost beside a plain task, sleep wake-up lateness, memory of parked tasks, Signal → resume",
		figs: []figure{
			{key: "durPlain", label: fmt.Sprintf("durable: drain %s plain tasks, no-op handler, concurrency %d", kcount(n), sz.concurrency), unit: "tasks/s", only: sysTide, absent: noDurableCell},
			{key: "durStep", label: fmt.Sprintf("durable: drain %s tasks whose handler runs one Step", kcount(n)), unit: "tasks/s", only: sysTide, absent: noDurableCell},
			{key: "durStepCost", label: "durable: one Step's added cost per task (1/rate with a Step − 1/rate plain, at that concurrency)", unit: "dur", only: sysTide, absent: noDurableCell},
			{key: "durSleep50", label: "durable: Sleep(1s) wake-up, handler resumes − deadline, p50 (500 tasks)", unit: "dur", only: sysTide, absent: noDurableCell},
			{key: "durSleep99", label: "durable: Sleep wake-up lateness, p99", unit: "dur", only: sysTide, absent: noDurableCell},
			{key: "durSleepEarly", label: "durable: Sleep resumed before its deadline", unit: "count", only: sysTide, absent: noDurableCell},
			{key: "durParkBytes", label: fmt.Sprintf("durable: used_memory per parked task, %s tasks in WaitSignal (1h)", kcount(park)), unit: "bytes", only: sysTide, absent: noDurableCell},
			{key: "durSig50", label: "durable: Client.Signal call → handler resumes past WaitSignal, p50 (300 signals, one at a time)", unit: "dur", only: sysTide, absent: noDurableCell},
			{key: "durSig99", label: "durable: Signal → resume, p99", unit: "dur", only: sysTide, absent: noDurableCell},
		},
		limit: 10 * time.Minute,
		run: func(ctx context.Context, e *env, kind string) (results, error) {
			return runDurable(ctx, e, kind, n, park)
		},
		systems: []string{sysTide},
		absent:  noDurableCell,
	}
}

// durServer starts a tide server on a fresh broker with h and returns its
// client and a stop function.
func durServer(e *env, h tide.HandlerFunc) (*tide.Client, *redisbroker.Broker, func(), error) {
	rdb := newRDB(e.addr)
	b := redisbroker.New(rdb)
	s := tide.NewServer(b, tide.Config{Concurrency: e.sz.concurrency, Logger: discardLogger()})
	if err := s.Start(h); err != nil {
		_ = rdb.Close()
		return nil, nil, nil, err
	}
	return tide.NewClient(b), b, func() { s.Shutdown(); _ = b.Close(); _ = rdb.Close() }, nil
}

func runDurable(ctx context.Context, e *env, kind string, n, park int) (results, error) {
	noteLoad(e, "durable", kind)
	if kind != sysTide {
		return nil, errors.New("durable: tide only")
	}
	res := results{}
	// Drain n tasks, plain and with one Step.
	var rates [2]float64
	for i, withStep := range []bool{false, true} {
		if err := e.flush(ctx); err != nil {
			return nil, err
		}
		var done atomic.Int64
		finished := make(chan struct{})
		c, _, stop, err := durServer(e, func(ctx context.Context, _ *tide.Task) error {
			if withStep {
				if _, err := tide.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil }); err != nil {
					return err
				}
			}
			if done.Add(1) == int64(n) {
				close(finished)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		tasks := make([]*tide.Task, n)
		for j := range tasks {
			tasks[j] = tide.NewTask("dur", nil)
		}
		t0 := time.Now()
		for j := 0; j < n; j += 1000 {
			if _, err := c.EnqueueMany(ctx, tasks[j:min(j+1000, n)]); err != nil {
				stop()
				return nil, err
			}
		}
		select {
		case <-finished:
		case <-time.After(3 * time.Minute):
			stop()
			return nil, fmt.Errorf("durable drain: %d of %d done", done.Load(), n)
		}
		rates[i] = rate(n, time.Since(t0))
		stop()
	}
	res["durPlain"], res["durStep"] = val{v: rates[0]}, val{v: rates[1]}
	res["durStepCost"] = val{v: ms(time.Duration((1/rates[1] - 1/rates[0]) * float64(time.Second)))}

	// Sleep lateness: 500 tasks sleep 1s from their first run.
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	const sleepers = 500
	var mu sync.Mutex
	var late []time.Duration
	early := 0
	all := make(chan struct{})
	var b *redisbroker.Broker
	c, b, stop, err := durServer(e, func(ctx context.Context, t *tide.Task) error {
		if err := tide.Sleep(ctx, "nap", time.Second); err != nil {
			return err
		}
		now := b.Now()
		info, err := tide.NewInspector(b).GetTaskInfo(ctx, "default", mustID(ctx))
		if err != nil {
			return err
		}
		var deadline time.Time
		for _, s := range info.Steps {
			if s.Name == "sleep:nap" {
				deadline = s.FinishedAt
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if now.Before(deadline) {
			early++
		}
		late = append(late, now.Sub(deadline))
		if len(late) == sleepers {
			close(all)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range sleepers {
		if _, err := c.Enqueue(ctx, tide.NewTask("sleep", nil), tide.TaskID("sl"+strconv.Itoa(i))); err != nil {
			stop()
			return nil, err
		}
		time.Sleep(2 * time.Millisecond) // spread the deadlines over a second
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		stop()
		return nil, errors.New("durable sleep: not every sleeper woke")
	}
	stop()
	slices.Sort(late)
	res["durSleep50"], res["durSleep99"] = val{v: ms(pct(late, 50))}, val{v: ms(pct(late, 99))}
	res["durSleepEarly"] = val{v: float64(early)}
	e.note("durable/sleep: %d tasks, Sleep(1s) measured on the broker's clock in the handler against the stored deadline (ms precision); max %s", sleepers, fmtMs(late[len(late)-1]))

	// Memory of parked tasks, then Signal → resume on some of them.
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	before, err := usedMemory(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	var parked atomic.Int64
	resumed := make(chan time.Time, 1)
	c, b, stop, err = durServer(e, func(ctx context.Context, t *tide.Task) error {
		_, err := tide.WaitSignal[int](ctx, "paid", time.Hour)
		if errors.Is(err, tide.ErrSuspended) {
			parked.Add(1)
			return err
		}
		if err == nil {
			resumed <- time.Now()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	tasks := make([]*tide.Task, park)
	for j := range tasks {
		tasks[j] = tide.NewTask("order:flow", nil)
	}
	var ids []string
	for j := 0; j < park; j += 1000 {
		infos, err := c.EnqueueMany(ctx, tasks[j:min(j+1000, park)])
		if err != nil {
			return nil, err
		}
		for _, in := range infos {
			ids = append(ids, in.ID)
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	for parked.Load() < int64(park) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("durable park: %d of %d parked", parked.Load(), park)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the last settlements land
	after, err := usedMemory(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	res["durParkBytes"] = val{v: float64(after-before) / float64(park)}
	var sig []time.Duration
	for _, id := range ids[:300] {
		t0 := time.Now()
		if err := c.Signal(ctx, "default", id, "paid", 1); err != nil {
			return nil, err
		}
		select {
		case at := <-resumed:
			sig = append(sig, at.Sub(t0))
		case <-time.After(10 * time.Second):
			return nil, errors.New("durable signal: the handler did not resume")
		}
	}
	slices.Sort(sig)
	res["durSig50"], res["durSig99"] = val{v: ms(pct(sig, 50))}, val{v: ms(pct(sig, 99))}
	e.note("durable/signal: %d signals one at a time to tasks parked among %d; max %s", len(sig), park, fmtMs(sig[len(sig)-1]))
	return res, nil
}

func mustID(ctx context.Context) string { id, _ := tide.GetTaskID(ctx); return id }

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
