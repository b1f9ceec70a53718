package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The rolling workload runs rollProcs servers as separate OS processes (the
// bench binary re-executed with envRole=rolling), feeds them a stream of
// delayed tasks due at known times, and restarts the processes one by one
// with a clean shutdown (SIGTERM, wait for exit, start again) while tasks
// fall due. Each handler start is recorded in Redis by the process that ran
// it; lateness = start − due, for tasks due before the first SIGTERM
// (baseline) and during the restarts.
const (
	envRole          = "TIDE_BENCH_ROLE" // "rolling"; unset: the crash worker
	envID            = "TIDE_BENCH_ID"
	rollProcs        = 3
	rollStartsKey    = "tide-bench:rolling:starts"
	rollReadyPrefix  = "tide-bench:rolling:ready:"
	rollConcurrency  = 10
	rollStopLimit    = 60 * time.Second
	rollReadyTimeout = 30 * time.Second
)

// rollingChild is one server process of the rolling workload. It records
// every handler start (RPUSH idx:unixns:id), marks itself ready once started,
// and on SIGTERM shuts down cleanly and exits 0.
func rollingChild(kind string) int {
	addr, id := os.Getenv(envRedis), os.Getenv(envID)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, os.Interrupt)
	s, err := newSystem(kind, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer s.close()
	mark := redis.NewClient(&redis.Options{Addr: addr})
	defer mark.Close()
	srv, err := s.startServer(serverConfig{concurrency: rollConcurrency}, func(ctx context.Context, p []byte) error {
		now := time.Now().UnixNano()
		k, idx, _, ok := parsePayload(p)
		if !ok || k != kindTask {
			return nil
		}
		return mark.RPush(context.Background(), rollStartsKey, fmt.Sprintf("%d:%d:%s", idx, now, id)).Err()
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := mark.Set(context.Background(), rollReadyPrefix+id, os.Getpid(), 0).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "child: mark ready:", err)
	}
	select {
	case <-term:
	case <-time.After(childMaxRun):
		fmt.Fprintln(os.Stderr, "child: never told to stop")
	}
	if err := srv.stop(rollStopLimit); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// rollProc is one running server process.
type rollProc struct {
	id     string
	cmd    *exec.Cmd
	out    bytes.Buffer
	exited chan error
}

func startRollProc(ctx context.Context, e *env, kind, id string) (*rollProc, error) {
	if err := e.admin.Del(ctx, rollReadyPrefix+id).Err(); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &rollProc{id: id, exited: make(chan error, 1)}
	p.cmd = exec.Command(exe)
	p.cmd.Env = append(os.Environ(), envChild+"="+kind, envRole+"=rolling", envRedis+"="+e.addr, envID+"="+id)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = childAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server process %s: %w", id, err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	want := strconv.Itoa(p.cmd.Process.Pid)
	deadline := time.Now().Add(rollReadyTimeout)
	for {
		v, err := e.admin.Get(ctx, rollReadyPrefix+id).Result()
		if err == nil && v == want {
			return p, nil
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			return nil, fmt.Errorf("server process %s exited before it was ready: %v\n%s", id, err, p.out.String())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.kill()
			return nil, fmt.Errorf("server process %s not ready within %v\n%s", id, rollReadyTimeout, p.out.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// term stops the process cleanly (SIGTERM) and waits for it to exit.
func (p *rollProc) term() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			return fmt.Errorf("server process %s: %v\n%s", p.id, err, p.out.String())
		}
		return nil
	case <-time.After(rollStopLimit + 10*time.Second):
		p.kill()
		return fmt.Errorf("server process %s did not exit within %v of SIGTERM", p.id, rollStopLimit+10*time.Second)
	}
}

func (p *rollProc) kill() {
	_ = p.cmd.Process.Kill()
	err := <-p.exited
	p.exited <- err
}

func runRolling(ctx context.Context, e *env, kind string) (results, error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, err
	}
	defer s.close()

	procs := make([]*rollProc, rollProcs)
	defer func() {
		for _, p := range procs {
			if p != nil {
				select {
				case err := <-p.exited:
					p.exited <- err
				default:
					_ = p.term()
				}
			}
		}
	}()
	for i := range procs {
		if procs[i], err = startRollProc(ctx, e, kind, strconv.Itoa(i)); err != nil {
			return nil, err
		}
	}

	// Tasks due every rollEvery from t0 on, over baseline + restart budget +
	// tail, on whole milliseconds.
	total := e.sz.rollBaseline + e.sz.rollBudget + e.sz.rollTail
	n := int(total / e.sz.rollEvery)
	t0 := time.Now().Add(e.sz.rollLead).Truncate(time.Millisecond)
	dues := make([]time.Time, n)
	for i := range dues {
		dues[i] = t0.Add(time.Duration(i) * e.sz.rollEvery)
	}
	if err := enqueueDue(ctx, s, dues); err != nil {
		return nil, err
	}
	if late := time.Since(t0); late > 0 {
		return nil, fmt.Errorf("enqueueing %d tasks took longer than the %v lead (%v past the first due time)", n, e.sz.rollLead, late)
	}

	// Baseline, then restart the processes one by one.
	time.Sleep(time.Until(t0.Add(e.sz.rollBaseline)))
	restartFrom := time.Now()
	var steps []string
	for i, p := range procs {
		t := time.Now()
		if err := p.term(); err != nil {
			return nil, err
		}
		stopped := time.Since(t)
		procs[i] = nil
		np, err := startRollProc(ctx, e, kind, p.id)
		if err != nil {
			return nil, err
		}
		procs[i] = np
		steps = append(steps, fmt.Sprintf("#%s stop %v + start %v", p.id, stopped.Round(time.Millisecond), (time.Since(t)-stopped).Round(time.Millisecond)))
		time.Sleep(e.sz.rollGap)
	}
	restartTo := time.Now()

	// Wait for every task to start.
	deadline := dues[n-1].Add(e.sz.rollWait)
	starts := map[int]time.Time{}
	by := map[string]int{}
	dups := 0
	var seen int64
	for {
		raw, err := e.admin.LRange(ctx, rollStartsKey, seen, -1).Result()
		if err != nil {
			return nil, err
		}
		seen += int64(len(raw))
		for _, r := range raw {
			parts := strings.SplitN(r, ":", 3)
			if len(parts) != 3 {
				return nil, fmt.Errorf("bad start record %q", r)
			}
			idx, err1 := strconv.Atoi(parts[0])
			ns, err2 := strconv.ParseInt(parts[1], 10, 64)
			if err1 != nil || err2 != nil || idx < 0 || idx >= n {
				return nil, fmt.Errorf("bad start record %q", r)
			}
			if _, dup := starts[idx]; dup {
				dups++
				continue
			}
			starts[idx] = time.Unix(0, ns)
			by[parts[2]]++
		}
		if len(starts) == n {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("only %d of %d tasks started by %v after the last due time", len(starts), n, e.sz.rollWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if dups > 0 {
		return nil, fmt.Errorf("%d duplicate handler starts among %d tasks", dups, n)
	}

	var base, during, after []time.Duration
	early := 0
	for i, due := range dues {
		d := starts[i].Sub(due)
		if d < 0 {
			early++
		}
		switch {
		case due.Before(restartFrom):
			base = append(base, d)
		case !due.After(restartTo):
			during = append(during, d)
		default:
			after = append(after, d)
		}
	}
	if len(base) == 0 || len(during) == 0 {
		return nil, fmt.Errorf("no task fell due in the baseline (%d) or during the restarts (%d)", len(base), len(during))
	}
	slices.Sort(base)
	slices.Sort(during)
	slices.Sort(after)
	e.note("rolling/%s: %d server processes (concurrency %d each), %d tasks due every %v; restarts (SIGTERM → exit → start → ready, %v apart) from %v to %v after the first due time: %s; %d tasks due before (baseline), %d during, %d after (p99 after: %s); starts per process id: %v; %d early starts",
		kind, rollProcs, rollConcurrency, n, e.sz.rollEvery, e.sz.rollGap, restartFrom.Sub(t0).Round(time.Millisecond), restartTo.Sub(t0).Round(time.Millisecond),
		strings.Join(steps, ", "), len(base), len(during), len(after), fmtDurOrNone(after, 99), by, early)
	return results{
		"roll50":     {v: ms(pct(base, 50))},
		"roll99":     {v: ms(pct(base, 99))},
		"rollMax":    {v: ms(base[len(base)-1])},
		"rollR50":    {v: ms(pct(during, 50))},
		"rollR99":    {v: ms(pct(during, 99))},
		"rollRMax":   {v: ms(during[len(during)-1])},
		"rollEarly":  {v: float64(early)},
		"rollRCount": {v: float64(len(during))},
	}, nil
}

// enqueueDue stores one task per due time (payload index i, reference time
// dues[i]) from enqWorkers goroutines.
func enqueueDue(ctx context.Context, s system, dues []time.Time) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(dues) {
					return
				}
				if err := s.enqueue(ctx, defaultQueue, makePayload(kindTask, i, dues[i]), dues[i]); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("enqueue task %d: %w", i, err)
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func fmtDurOrNone(sorted []time.Duration, p float64) string {
	if len(sorted) == 0 {
		return "none"
	}
	return pct(sorted, p).Round(100 * time.Microsecond).String()
}
