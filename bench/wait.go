package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/tidequeue/tide"
)

// The wait workload: EnqueueAndWait round trips against the floor and
// asynq's enqueue-and-poll (see flows.go for the shared notes).

func waitWorkload(sz sizes) workload {
	return workload{
		name:  "wait",
		about: "request/response: tide EnqueueAndWait vs. asynq Enqueue + GetTaskInfo polling, next to one Redis round trip",
		figs: []figure{
			{key: "waitFl1p50", label: fmt.Sprintf("wait: floor, redis-benchmark EVAL HSETNX+LPUSH round trip, 1 client, p50 (%s requests, in each column's run)", kcount(sz.waitFloorN)), unit: "dur"},
			{key: "waitFl1p99", label: "wait: floor, 1 client, p99", unit: "dur"},
			{key: "waitFl16p50", label: fmt.Sprintf("wait: floor, %d clients, p50 (%s requests)", waitWorkers, kcount(3*sz.waitFloorN)), unit: "dur"},
			{key: "waitFl16p99", label: fmt.Sprintf("wait: floor, %d clients, p99", waitWorkers), unit: "dur"},
			{key: "wait1p50", label: fmt.Sprintf("wait: %s sequential calls, no-op handler, p50 (tide EnqueueAndWait; asynq Enqueue, GetTaskInfo every %v, TaskCheckInterval %v)", kcount(sz.waitN), asynqPoll, asynqFastCheck), unit: "dur", lower: true, ratio: true},
			{key: "wait1p99", label: "wait: sequential, p99", unit: "dur", lower: true, ratio: true},
			{key: "wait16p50", label: fmt.Sprintf("wait: %s calls from %d goroutines, p50", kcount(sz.waitN), waitWorkers), unit: "dur", lower: true, ratio: true},
			{key: "wait16p99", label: fmt.Sprintf("wait: %d goroutines, p99", waitWorkers), unit: "dur", lower: true, ratio: true},
			{key: "waitDef50", label: fmt.Sprintf("wait: sequential, p50 (tide: as above; asynq: its defaults, TaskCheckInterval 1s, for %v)", sz.waitCap), unit: "dur", lower: true, ratio: true},
		},
		limit: sz.waitCap + 3*time.Minute,
		run:   runWait,
	}
}

func runWait(ctx context.Context, e *env, kind string) (results, error) {
	noteLoad(e, "wait", kind)
	res := results{}
	// The floor, in this system's run, before its server starts.
	for _, c := range []int{1, waitWorkers} {
		n := e.sz.waitFloorN
		if c > 1 {
			n *= 3
		}
		p50, p99, err := roundTripFloor(ctx, e, c, n)
		if err != nil {
			return nil, err
		}
		res[fmt.Sprintf("waitFl%dp50", c)] = val{v: p50}
		res[fmt.Sprintf("waitFl%dp99", c)] = val{v: p99}
	}
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	cfg := serverConfig{concurrency: e.sz.concurrency}
	if kind == sysAsynq {
		cfg.taskCheck = asynqFastCheck
	}
	seq, conc, _, err := waitRounds(ctx, e, kind, cfg, 0)
	if err != nil {
		return nil, err
	}
	res["wait1p50"], res["wait1p99"] = val{v: ms(pct(seq, 50))}, val{v: ms(pct(seq, 99))}
	res["wait16p50"], res["wait16p99"] = val{v: ms(pct(conc, 50))}, val{v: ms(pct(conc, 99))}
	res["waitDef50"] = res["wait1p50"]
	how := "EnqueueAndWait (no Retention), no-op handler"
	if kind == sysAsynq {
		how = fmt.Sprintf("EnqueueContext with Retention(1h), then Inspector.GetTaskInfo every %v until TaskStateCompleted; server TaskCheckInterval %v", asynqPoll, asynqFastCheck)
	}
	e.note("wait/%s: %s; %d sequential calls p50 %s p99 %s max %s; %d calls from %d goroutines p50 %s p99 %s max %s; after %d warm-up calls",
		kind, how, len(seq), fmtMs(pct(seq, 50)), fmtMs(pct(seq, 99)), fmtMs(seq[len(seq)-1]), len(conc), waitWorkers, fmtMs(pct(conc, 50)), fmtMs(pct(conc, 99)), fmtMs(conc[len(conc)-1]), waitWarm)
	if kind == sysAsynq {
		if err := e.flush(ctx); err != nil {
			return nil, err
		}
		def, _, elapsed, err := waitRounds(ctx, e, kind, serverConfig{concurrency: e.sz.concurrency}, e.sz.waitCap)
		if err != nil {
			return nil, err
		}
		res["waitDef50"] = val{v: ms(pct(def, 50))}
		e.note("wait/asynq defaults (TaskCheckInterval 1s; GetTaskInfo every %v): %d sequential calls in %v, p50 %s, max %s",
			asynqPoll, len(def), elapsed.Round(time.Millisecond), fmtMs(pct(def, 50)), fmtMs(def[len(def)-1]))
	}
	return res, nil
}

// noteLoad notes the machine's load average (Linux: /proc/loadavg) as a
// workload starts: these figures are sensitive to other work on the machine.
func noteLoad(e *env, workload, kind string) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) >= 3 {
		e.note("%s/%s: load average at start %s %s %s (1, 5, 15 min; %d CPUs)", workload, kind, f[0], f[1], f[2], runtime.NumCPU())
	}
}

func fmtMs(d time.Duration) string { return format("dur", ms(d)) }

// waitRounds starts a server with cfg and a no-op handler, warms it up,
// and measures waitN sequential calls and waitN calls from waitWorkers
// goroutines (each sorted). With limit > 0 it makes only the sequential
// calls, as many as fit in limit, and returns the time they took.
func waitRounds(ctx context.Context, e *env, kind string, cfg serverConfig, limit time.Duration) (seq, conc []time.Duration, elapsed time.Duration, err error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, nil, 0, err
	}
	defer s.close()
	var handled atomic.Int64
	srv, err := s.startServer(cfg, func(context.Context, []byte) error {
		handled.Add(1)
		return nil
	})
	if err != nil {
		return nil, nil, 0, err
	}
	defer srv.stop(time.Minute)
	call, err := waiter(s)
	if err != nil {
		return nil, nil, 0, err
	}
	var calls atomic.Int64
	one := func(ctx context.Context) (time.Duration, error) {
		i := int(calls.Add(1))
		t0 := time.Now()
		if err := call(ctx, makePayload(kindTask, i, t0)); err != nil {
			return 0, fmt.Errorf("call %d: %w", i, err)
		}
		return time.Since(t0), nil
	}
	warm := waitWarm
	if limit > 0 {
		warm = 2
	}
	for range warm {
		if _, err := one(ctx); err != nil {
			return nil, nil, 0, fmt.Errorf("wait/%s: warm-up: %w", kind, err)
		}
	}
	if limit == 0 {
		// Open the connections the concurrent calls use.
		if _, err := waitConcurrent(ctx, waitWorkers, 2*waitWorkers, one); err != nil {
			return nil, nil, 0, fmt.Errorf("wait/%s: warm-up: %w", kind, err)
		}
	}
	n := e.sz.waitN
	start := time.Now()
	for i := 0; i < n && (limit == 0 || time.Since(start) < limit); i++ {
		d, err := one(ctx)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("wait/%s: sequential: %w", kind, err)
		}
		seq = append(seq, d)
	}
	elapsed = time.Since(start)
	slices.Sort(seq)
	if limit == 0 {
		if conc, err = waitConcurrent(ctx, waitWorkers, n, one); err != nil {
			return nil, nil, 0, fmt.Errorf("wait/%s: %d goroutines: %w", kind, waitWorkers, err)
		}
	}
	if got, want := handled.Load(), calls.Load(); got != want {
		return nil, nil, 0, fmt.Errorf("wait/%s: the handler ran %d times for %d calls", kind, got, want)
	}
	return seq, conc, elapsed, nil
}

// waitConcurrent makes n calls from workers goroutines and returns their
// durations, sorted.
func waitConcurrent(ctx context.Context, workers, n int, one func(context.Context) (time.Duration, error)) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]time.Duration, n)
	var next atomic.Int64
	errc := make(chan error, workers)
	for range workers {
		go func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					errc <- nil
					return
				}
				d, err := one(ctx)
				if err != nil {
					cancel()
					errc <- err
					return
				}
				out[i] = d
			}
		}()
	}
	var first error
	for range workers {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	slices.Sort(out)
	return out, first
}

// waiter returns the system's request/response call: enqueue a task with
// payload p and return once it has completed.
func waiter(s system) (func(ctx context.Context, p []byte) error, error) {
	switch s := s.(type) {
	case *tideSystem:
		return func(ctx context.Context, p []byte) error {
			info, err := s.c.EnqueueAndWait(ctx, tide.NewTask(taskType, p))
			if err != nil {
				return err
			}
			if info.State != tide.StateCompleted {
				return fmt.Errorf("EnqueueAndWait returned the task %s", info.State)
			}
			return nil
		}, nil
	case *asynqSystem:
		in := asynq.NewInspectorFromRedisClient(s.rdb)
		return func(ctx context.Context, p []byte) error {
			info, err := s.c.EnqueueContext(ctx, asynq.NewTask(taskType, p), asynq.Retention(time.Hour))
			if err != nil {
				return err
			}
			for deadline := time.Now().Add(time.Minute); ; {
				ti, err := in.GetTaskInfo(info.Queue, info.ID)
				if err != nil {
					return fmt.Errorf("GetTaskInfo: %w", err)
				}
				switch ti.State {
				case asynq.TaskStateCompleted:
					return nil
				case asynq.TaskStateArchived:
					return fmt.Errorf("task archived: %s", ti.LastErr)
				}
				if time.Now().After(deadline) {
					return errors.New("task not completed within a minute")
				}
				if err := sleepCtx(ctx, asynqPoll); err != nil {
					return err
				}
			}
		}, nil
	}
	return nil, fmt.Errorf("no request/response call for %s", s.name())
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// roundTripFloor runs redis-benchmark with the floor's enqueue-like script
// (see floor.go), c clients with one request in flight each, n requests, and
// returns its p50 and p99 latency in milliseconds. The keys it wrote are
// deleted.
func roundTripFloor(ctx context.Context, e *env, c, n int) (p50, p99 float64, err error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, 0, fmt.Errorf("redis-benchmark not found on PATH (it ships with redis-server): %w", err)
	}
	host, port, err := net.SplitHostPort(e.addr)
	if err != nil {
		return 0, 0, err
	}
	cmd := exec.CommandContext(ctx, bin, "-h", host, "-p", port,
		"-c", strconv.Itoa(c), "-P", "1", "-n", strconv.Itoa(n), "-r", strconv.Itoa(floorRange), "--csv",
		"EVAL", floorScript, "2", floorPrefix+"h:__rand_int__", floorPrefix+"l:__rand_int__", "__rand_int__", strings.Repeat("x", payloadSize))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return 0, 0, fmt.Errorf("redis-benchmark -c %d: %v\n%s%s", c, err, out.String(), errOut.String())
	}
	if p50, err = benchCSVField(out.Bytes(), "p50_latency_ms"); err == nil {
		p99, err = benchCSVField(out.Bytes(), "p99_latency_ms")
	}
	if err != nil {
		return 0, 0, fmt.Errorf("redis-benchmark -c %d: %v\n%s", c, err, out.String())
	}
	if err := deleteMatching(ctx, e, floorPrefix+"*"); err != nil {
		return 0, 0, fmt.Errorf("clean up floor keys: %w", err)
	}
	return p50, p99, nil
}
