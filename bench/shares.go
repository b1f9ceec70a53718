package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// The shares workload measures how fast a queue's Concurrency follows its
// backlog across partitions (issue 23, item 12): a queue of sharesParts
// partitions under Concurrency sharesLimit, served by three servers, gets a
// backlog in one partition only. Fixed per-partition shares would run
// sharesLimit/sharesParts of it at once for ever; the slots move to the busy
// partition instead. The figures are the time from the servers' Start (and
// from the first handler's start) to sharesLimit handlers running at once.
// asynq has no partitions.
const (
	sharesQueue   = "shares"
	sharesParts   = 6
	sharesLimit   = 10
	sharesTasks   = 100
	sharesServers = 3
	sharesRounds  = 5
)

func sharesWorkload(sizes) workload {
	return workload{
		name:    "shares",
		systems: []string{sysTide},
		absent:  "(no partitions)",
		about:   "a queue's Concurrency following its backlog: one busy partition of six reaches the whole limit (tide only)",
		figs: []figure{
			{key: "shrReach", label: fmt.Sprintf("shares: %d partitions, Concurrency %d, %d servers, backlog in one partition: servers' Start to %d running at once (median of %d)", sharesParts, sharesLimit, sharesServers, sharesLimit, sharesRounds), unit: "dur", lower: true},
			{key: "shrReachMax", label: "shares: Start to the whole limit, slowest round", unit: "dur", lower: true},
			{key: "shrFirst", label: "shares: first handler start to the whole limit (median)", unit: "dur", lower: true},
			{key: "shrPeak", label: fmt.Sprintf("shares: most handlers running at once (Concurrency %d)", sharesLimit), unit: "count"},
		},
		limit: 3 * time.Minute,
		run:   runShares,
	}
}

func runShares(ctx context.Context, e *env, kind string) (results, error) {
	if kind != sysTide {
		return nil, fmt.Errorf("shares: tide only")
	}
	var reach, fromFirst []float64
	var peak int64
	for round := range sharesRounds {
		d, f, p, err := sharesOnce(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("shares, round %d: %w", round+1, err)
		}
		reach, fromFirst = append(reach, ms(d)), append(fromFirst, ms(f))
		peak = max(peak, p)
	}
	var parts []string
	for _, r := range reach {
		parts = append(parts, fmt.Sprintf("%.1fms", r))
	}
	e.note("shares/%s: %d tasks in partition 0 of %d, Concurrency %d, %d servers of concurrency 10 each, handlers held until the limit is reached; Start to the whole limit by round: %s",
		kind, sharesTasks, sharesParts, sharesLimit, sharesServers, strings.Join(parts, " "))
	return results{"shrReach": val{v: median(reach)}, "shrReachMax": val{v: slices.Max(reach)}, "shrFirst": val{v: median(fromFirst)}, "shrPeak": val{v: float64(peak)}}, nil
}

// sharesOnce runs one round on a flushed Redis and returns the time from the
// servers' Start and from the first handler's start to the whole limit
// running, and the most that ran at once.
func sharesOnce(ctx context.Context, e *env) (fromStart, fromFirst time.Duration, most int64, err error) {
	if err := e.flush(ctx); err != nil {
		return 0, 0, 0, err
	}
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	newBroker := func() *redisbroker.Broker {
		rdb := newRDB(e.addr)
		b := redisbroker.New(rdb, redisbroker.WithPartitions(sharesParts))
		closers = append(closers, func() { _ = b.Close(); _ = rdb.Close() })
		return b
	}
	b := newBroker()
	if err := tide.NewInspector(b).SetQueueLimits(ctx, sharesQueue, tide.QueueLimits{Concurrency: sharesLimit}); err != nil {
		return 0, 0, 0, err
	}
	c := tide.NewClient(b)
	n := 0
	for i := 0; n < sharesTasks; i++ {
		id := fmt.Sprint("s", i)
		if broker.Partition(id, sharesParts) != 0 {
			continue
		}
		if _, err := c.Enqueue(ctx, tide.NewTask(taskType, nil), tide.Queue(sharesQueue), tide.TaskID(id)); err != nil {
			return 0, 0, 0, err
		}
		n++
	}
	var mu sync.Mutex
	var first, full time.Time
	var cur, peak atomic.Int64
	release := make(chan struct{})
	reached := make(chan struct{})
	h := tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		now := time.Now()
		v := cur.Add(1)
		for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
		}
		mu.Lock()
		if first.IsZero() {
			first = now
		}
		if v == sharesLimit && full.IsZero() {
			full = now
			close(reached)
		}
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
		}
		cur.Add(-1)
		return nil
	})
	start := time.Now()
	for range sharesServers {
		srv := tide.NewServer(newBroker(), tide.Config{Concurrency: 10, Queues: map[string]int{sharesQueue: 1}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err := srv.Start(h); err != nil {
			return 0, 0, 0, err
		}
		closers = append(closers, func() { _ = stopWithin("shares server", time.Minute, srv.Shutdown) })
	}
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		close(release)
		return 0, 0, 0, fmt.Errorf("the limit %d was not reached in 30s (at most %d at once)", sharesLimit, peak.Load())
	case <-ctx.Done():
		close(release)
		return 0, 0, 0, ctx.Err()
	}
	close(release)
	mu.Lock()
	defer mu.Unlock()
	return full.Sub(start), full.Sub(first), peak.Load(), nil
}
