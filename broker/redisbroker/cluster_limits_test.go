package redisbroker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestClusterQueueLimits: three servers run a queue whose six partitions
// spread over the three masters, under a concurrency limit of 6 (a share of
// 1 in each partition, so every master holds part of the limit). Handlers
// running at once never exceed it and every task completes.
func TestClusterQueueLimits(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	rdb := c.Client(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	newBroker := clusterBrokers(t, rdb, prefix)
	const limit, n = clusterParts, 300
	var cur, peak, done atomic.Int64
	h := tide.HandlerFunc(func(context.Context, *tide.Task) error {
		c := cur.Add(1)
		for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
		}
		time.Sleep(2 * time.Millisecond)
		cur.Add(-1)
		done.Add(1)
		return nil
	})
	for range 3 {
		srv := tide.NewServer(newBroker(), tide.Config{
			Concurrency: 10, Queues: map[string]int{spreadQueue: 1}, Logger: quietLogger(),
			QueueLimits: map[string]tide.QueueLimits{spreadQueue: {Concurrency: limit}},
		})
		if err := srv.Start(h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
	}
	cl := tide.NewClient(newBroker())
	batch := make([]*tide.Task, n)
	for i := range batch {
		batch[i] = tide.NewTask("limited", fmt.Appendf(nil, "%d", i))
	}
	if _, err := cl.EnqueueMany(ctx, batch, tide.Queue(spreadQueue)); err != nil {
		t.Fatalf("EnqueueMany: %v", err)
	}
	testwait.Until(t, 60*time.Second, func() error { return processed(done.Load(), n) })
	if p := peak.Load(); p > limit {
		t.Fatalf("%d handlers ran at once under Concurrency %d", p, limit)
	}
	t.Logf("peak %d handlers at once under Concurrency %d over 3 masters", peak.Load(), limit)
}

// TestClusterGroupLimits: three servers run grouped tasks of a queue whose
// partitions spread over three masters, with GroupConcurrency 2. Each
// group's tasks live in its own partition (its hash tag), so the groups
// land on different masters; no group ever runs more than 2 tasks at once
// and every task completes, also with several groups on each master.
func TestClusterGroupLimits(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	rdb := c.Client(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	newBroker := clusterBrokers(t, rdb, prefix)
	const groups, per, limit = 8, 30, 2
	var cur, peak [groups]atomic.Int64
	var done atomic.Int64
	h := tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		g, _ := tide.GetGroup(ctx)
		var i int
		if _, err := fmt.Sscanf(g, "tenant-%d", &i); err != nil {
			return err
		}
		c := cur[i].Add(1)
		for p := peak[i].Load(); c > p && !peak[i].CompareAndSwap(p, c); p = peak[i].Load() {
		}
		time.Sleep(2 * time.Millisecond)
		cur[i].Add(-1)
		done.Add(1)
		return nil
	})
	for range 3 {
		srv := tide.NewServer(newBroker(), tide.Config{
			Concurrency: 10, Queues: map[string]int{spreadQueue: 1}, Logger: quietLogger(),
			QueueLimits: map[string]tide.QueueLimits{spreadQueue: {GroupConcurrency: limit}},
		})
		if err := srv.Start(h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
	}
	cl := tide.NewClient(newBroker())
	for g := range groups {
		batch := make([]*tide.Task, per)
		for i := range batch {
			batch[i] = tide.NewTask("grouped", fmt.Appendf(nil, "%d", i))
		}
		if _, err := cl.EnqueueMany(ctx, batch, tide.Queue(spreadQueue), tide.Group(fmt.Sprint("tenant-", g))); err != nil {
			t.Fatalf("EnqueueMany: %v", err)
		}
	}
	testwait.Until(t, 60*time.Second, func() error { return processed(done.Load(), groups*per) })
	for i := range groups {
		if p := peak[i].Load(); p > limit {
			t.Fatalf("group tenant-%d ran %d tasks at once under GroupConcurrency %d", i, p, limit)
		}
	}
}

// TestClusterLimitsFollowBacklog: a queue's six partitions spread over three
// masters, so no script sees two of them, under limits below the partition
// count (Concurrency 4, Rate 5 per 300ms). Three servers work through
// waves of tasks that each sit in one partition, on one master: the wave
// runs up to the whole Concurrency at once (the slots move to its partition
// from the others' masters), never more, no window holds more than the
// Rate's starts, and every task completes.
func TestClusterLimitsFollowBacklog(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	rdb := c.Client(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	newBroker := clusterBrokers(t, rdb, prefix)
	const limit, rate, per, waves, perWave = 4, 5, 300 * time.Millisecond, 3, 12
	var cur, peak, done atomic.Int64
	var mu sync.Mutex
	var starts []time.Time
	h := tide.HandlerFunc(func(context.Context, *tide.Task) error {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		n := cur.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(200 * time.Millisecond)
		cur.Add(-1)
		done.Add(1)
		return nil
	})
	for range 3 {
		srv := tide.NewServer(newBroker(), tide.Config{
			Concurrency: 10, Queues: map[string]int{spreadQueue: 1}, Logger: quietLogger(),
			QueueLimits: map[string]tide.QueueLimits{spreadQueue: {Concurrency: limit, Rate: tide.Rate{Limit: rate, Per: per}}},
		})
		if err := srv.Start(h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
	}
	cl := tide.NewClient(newBroker())
	for w := range waves {
		var ids []string
		for i := 0; len(ids) < perWave; i++ {
			if id := fmt.Sprintf("w%d-%d", w, i); broker.Partition(id, clusterParts) == 2*w {
				ids = append(ids, id)
			}
		}
		for _, id := range ids {
			if _, err := cl.Enqueue(ctx, tide.NewTask("limited", nil), tide.Queue(spreadQueue), tide.TaskID(id)); err != nil {
				t.Fatalf("Enqueue: %v", err)
			}
		}
		want := int64((w + 1) * perWave)
		testwait.Until(t, 60*time.Second, func() error {
			if err := processed(done.Load(), want); err != nil {
				return fmt.Errorf("wave %d: %w", w, err)
			}
			return nil
		})
	}
	if p := peak.Load(); p != limit {
		t.Fatalf("at most %d handlers ran at once under Concurrency %d, want exactly the limit", p, limit)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	const jitter = 100 * time.Millisecond
	for i := 0; i+rate < len(starts); i++ {
		if span := starts[i+rate].Sub(starts[i]); span < per-jitter {
			t.Fatalf("%d starts within %v under Rate %d/%v", rate+1, span, rate, per)
		}
	}
}

// processed reports how far short of want done tasks are, or nil.
func processed(done, want int64) error {
	if done < want {
		return fmt.Errorf("only %d of %d tasks processed", done, want)
	}
	return nil
}
