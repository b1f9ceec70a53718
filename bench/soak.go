package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/tidequeue/tide"
)

// The soak workload processes tasks at full speed for soakDur while sampling
// Redis used_memory: the claim under test is that memory stays flat while a
// system keeps running (completed tasks go away, reply caches and other
// bookkeeping expire), archived tasks aside.
const (
	soakRetention = time.Millisecond
	soakWindow    = 2000 // at most this many tasks enqueued and not yet handled
	soakFailEvery = 500  // task idx%soakFailEvery: 0 is archived (skip retry), 1 fails once then succeeds
	soakWorkers   = 8
)

// soakEnqueue stores one task with the soak's retention (completed tasks are
// kept this long, then deleted).
func soakEnqueue(ctx context.Context, s system, payload []byte) error {
	switch s := s.(type) {
	case *tideSystem:
		_, err := s.c.Enqueue(ctx, tide.NewTask(taskType, payload), tide.Retention(soakRetention))
		return err
	case *asynqSystem:
		// asynq keeps retention in whole seconds: 1ms becomes 0, and the
		// task is deleted on completion, as without Retention.
		_, err := s.c.EnqueueContext(ctx, asynq.NewTask(taskType, payload), asynq.Retention(soakRetention))
		return err
	}
	return fmt.Errorf("soak: unknown system %s", s.name())
}

// skipRetry wraps err so that the system archives the task at once.
func skipRetry(s system, err error) error {
	switch s.(type) {
	case *tideSystem:
		return fmt.Errorf("%w: %w", err, tide.SkipRetry)
	case *asynqSystem:
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}

type memSample struct {
	at  time.Duration
	mem int64
}

func runSoak(ctx context.Context, e *env, kind string) (results, error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, err
	}
	defer s.close()

	var handled, archived, failedOnce, calls atomic.Int64
	var retried sync.Map // idx → struct{}: failed once already
	slots := make(chan struct{}, soakWindow)
	errBoom := errors.New("soak: planned failure")
	release := func() { // never blocks a handler (a duplicate delivery finds no slot)
		select {
		case <-slots:
		default:
		}
	}
	h := func(_ context.Context, p []byte) error {
		calls.Add(1)
		kindB, idx, _, ok := parsePayload(p)
		if !ok || kindB != kindTask {
			return nil
		}
		switch idx % soakFailEvery {
		case 0:
			archived.Add(1)
			release()
			return skipRetry(s, errBoom)
		case 1:
			if _, again := retried.LoadOrStore(idx, struct{}{}); !again {
				failedOnce.Add(1)
				release() // it waits for its retry outside the window
				return errBoom
			}
			handled.Add(1)
			return nil
		}
		handled.Add(1)
		release()
		return nil
	}
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency}, h)
	if err != nil {
		return nil, err
	}
	defer srv.stop(time.Minute)

	// Producers: enqueue as fast as the server drains, at most soakWindow
	// ahead of it, so that the backlog (which would be memory growth of its
	// own) stays bounded.
	pctx, stopProducers := context.WithCancel(ctx)
	var next atomic.Int64
	var wg sync.WaitGroup
	perr := make(chan error, soakWorkers)
	for range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case slots <- struct{}{}:
				case <-pctx.Done():
					return
				}
				i := int(next.Add(1)) - 1
				if err := soakEnqueue(pctx, s, makePayload(kindTask, i, time.Now())); err != nil {
					if pctx.Err() == nil {
						perr <- fmt.Errorf("enqueue task %d: %w", i, err)
						stopProducers()
					}
					return
				}
			}
		}()
	}

	start := time.Now()
	var samples []memSample
	sample := func() error {
		m, err := usedMemory(ctx, e.admin)
		if err != nil {
			return err
		}
		samples = append(samples, memSample{time.Since(start), m})
		return nil
	}
	if err := sample(); err != nil {
		stopProducers()
		wg.Wait()
		return nil, err
	}
	tick := time.NewTicker(e.sz.soakEvery)
	end := time.NewTimer(e.sz.soakDur)
	var runErr error
loop:
	for {
		select {
		case <-tick.C:
			if err := sample(); err != nil {
				runErr = err
				break loop
			}
		case <-end.C:
			break loop
		case err := <-perr:
			runErr = err
			break loop
		case <-ctx.Done():
			runErr = ctx.Err()
			break loop
		}
	}
	tick.Stop()
	elapsed := time.Since(start)
	done := handled.Load()
	if runErr == nil {
		runErr = sample()
	}
	stopProducers()
	wg.Wait()
	if runErr != nil {
		return nil, runErr
	}
	if len(samples) < 3 {
		return nil, fmt.Errorf("soak: only %d memory samples; run longer (-soak)", len(samples))
	}
	if done == 0 {
		return nil, errors.New("soak: no task was processed")
	}

	// The first tenth (at least one sample interval) is warm-up: queues,
	// scripts, connections and the first reply caches appear.
	warm := max(e.sz.soakDur/10, e.sz.soakEvery)
	var steady []memSample
	for _, x := range samples {
		if x.at >= warm {
			steady = append(steady, x)
		}
	}
	if len(steady) < 2 {
		steady = samples
	}
	first, last := steady[0], steady[len(steady)-1]
	peak := first.mem
	for _, x := range steady {
		peak = max(peak, x.mem)
	}
	slope := slopePerMin(steady)
	var second []memSample // the second half, for a trend once settled
	for _, x := range steady {
		if x.at >= first.at+(last.at-first.at)/2 {
			second = append(second, x)
		}
	}
	stored, _ := s.stored(ctx)
	families := keyFamilies(ctx, e, 6)
	var mbs []string
	for _, x := range samples {
		mbs = append(mbs, fmt.Sprintf("%.2f", float64(x.mem)/1e6))
	}
	e.note("soak/%s: %v at full speed, Retention(%v), %d-task window; %d tasks done (%.0f/s), %d archived (1 in %d, skip retry), %d failed once for a retry (1 in %d), %d handler calls; %d task records in Redis at the end",
		kind, elapsed.Round(time.Second), soakRetention, soakWindow, done, rate(int(done), elapsed), archived.Load(), soakFailEvery, failedOnce.Load(), soakFailEvery, calls.Load(), stored)
	e.note("soak/%s: used_memory from %v (after %v warm-up) to the end: start %.2f MB, peak %.2f MB, end %.2f MB, slope %+.1f KB/min (second half %+.1f KB/min); samples every %v (MB): %s",
		kind, first.at.Round(time.Second), warm, float64(first.mem)/1e6, float64(peak)/1e6, float64(last.mem)/1e6,
		slope/1e3, slopePerMin(second)/1e3, e.sz.soakEvery, strings.Join(mbs, " "))
	var slices5 []string // min–max of each fifth of the run: a sawtooth shows as steady troughs
	for f := range 5 {
		lo, hi := int64(math.MaxInt64), int64(0)
		for _, x := range samples {
			if x.at >= elapsed*time.Duration(f)/5 && x.at < elapsed*time.Duration(f+1)/5 {
				lo, hi = min(lo, x.mem), max(hi, x.mem)
			}
		}
		if hi > 0 {
			slices5 = append(slices5, fmt.Sprintf("%.1f–%.1f", float64(lo)/1e6, float64(hi)/1e6))
		}
	}
	e.note("soak/%s: used_memory min–max in each fifth of the run (MB): %s", kind, strings.Join(slices5, ", "))
	e.note("soak/%s: largest key families at the end (MEMORY USAGE): %s", kind, families)
	return results{
		"soakRate":   {v: rate(int(done), elapsed)},
		"soakStart":  {v: float64(first.mem) / 1e6},
		"soakPeak":   {v: float64(peak) / 1e6},
		"soakEnd":    {v: float64(last.mem) / 1e6},
		"soakSlope":  {v: slope / 1e3},
		"soakSlope2": {v: slopePerMin(second) / 1e3},
	}, nil
}

// slopePerMin is the least-squares slope of memory over time, bytes/minute.
func slopePerMin(xs []memSample) float64 {
	if len(xs) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for _, x := range xs {
		t := x.at.Minutes()
		y := float64(x.mem)
		sx, sy, sxx, sxy = sx+t, sy+y, sxx+t*t, sxy+t*y
	}
	n := float64(len(xs))
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// keyFamilies sums MEMORY USAGE over the keys, grouped by name with digit
// runs replaced by #, and lists the largest groups.
func keyFamilies(ctx context.Context, e *env, top int) string {
	type fam struct {
		name  string
		keys  int
		bytes int64
	}
	by := map[string]*fam{}
	iter := e.admin.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		name := digitRuns.ReplaceAllString(uuids.ReplaceAllString(k, "<id>"), "#")
		name = replyCaches.ReplaceAllString(name, "$1:<process>.<n>")
		f := by[name]
		if f == nil {
			f = &fam{name: name}
			by[name] = f
		}
		f.keys++
		n, _ := e.admin.MemoryUsage(ctx, k).Result()
		f.bytes += n
	}
	var all []*fam
	for _, f := range by {
		all = append(all, f)
	}
	slices.SortFunc(all, func(a, b *fam) int { return cmp.Compare(b.bytes, a.bytes) })
	var parts []string
	for i, f := range all {
		if i == top {
			break
		}
		parts = append(parts, fmt.Sprintf("%s ×%d %.2f MB", f.name, f.keys, float64(f.bytes)/1e6))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

var (
	digitRuns = regexp.MustCompile(`[0-9]+`)
	// replyCaches matches the end of a tide reply cache's name once digits
	// are replaced: rq:<slice>:<process tag>.<fifty>.
	replyCaches = regexp.MustCompile(`(:rq:#):[^:]*$`)
	uuids       = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)
)
