package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/tidetype"
)

// Replace during a repartition replaces a waiting task that is not moved
// yet, as it does any other time: the task moves first, and in an ordered
// group it keeps its place.
func TestRepartitionReplaceWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, group := range []string{"", "g"} {
		t.Run(fmt.Sprintf("group=%q", group), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			q := "replmove" + group
			if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Ordered: group != ""}); err != nil {
				t.Fatal(err)
			}
			const n = 250
			var want []string
			for i := range n {
				m := groupMsg(q, fmt.Sprintf("t%03d", i), group)
				mustEnqueue(t, e.b, broker.EnqueueOptions{}, m)
				want = append(want, m.ID)
			}
			last := groupMsg(q, fmt.Sprintf("t%03d", n-1), group)
			last.Payload = []byte("replaced")
			steps := 0
			err := e.b.Repartition(ctx, q, 3, func(moved, left int) {
				if steps++; steps != 1 {
					return
				}
				if left == 0 {
					t.Errorf("the move took one step: nothing left to replace")
				}
				errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{last}, broker.EnqueueOptions{Replace: true})
				if err == nil {
					err = errs[0]
				}
				if err != nil {
					t.Errorf("Replace of a waiting task not moved yet: %v", err)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.b.GetTask(ctx, q, last.ID)
			if err != nil || string(got.Payload) != "replaced" {
				t.Fatalf("after the repartition the replaced task holds %q (%v), want %q", got.Payload, err, "replaced")
			}
			ids := runOneByOne(t, e.b, q)
			if group == "" {
				slices.Sort(ids)
			}
			if !slices.Equal(ids, want) {
				t.Fatalf("after the repartition the tasks ran %s", orderDiff(ids, want))
			}
		})
	}
}

// A Replace of a task that runs in the old partition of a repartition is
// refused, as it is any other time.
func TestRepartitionReplaceActive(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "replactive"
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, "a", ""), groupMsg(q, "b", ""))
	ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %d, %v", len(ds), err)
	}
	done := make(chan error, 1)
	moved := make(chan struct{})
	var once sync.Once
	go func() {
		done <- e.b.Repartition(ctx, q, 2, func(m, left int) {
			if left == 1 {
				once.Do(func() { close(moved) })
			}
		})
	}()
	<-moved
	errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{groupMsg(q, ds[0].Task.ID, "")}, broker.EnqueueOptions{Replace: true})
	if err == nil {
		err = errs[0]
	}
	if !errors.Is(err, broker.ErrTaskIDConflict) {
		t.Fatalf("Replace of a running task during a repartition: %v, want ErrTaskIDConflict", err)
	}
	if _, err := e.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Two runs of the same repartition at once (an operator resuming one that
// still runs) move every task once: a run that finds a task taken by the
// other leaves it to that run rather than dropping its placeholder.
func TestRepartitionConcurrentRuns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, n = "twice", 3000
	var ms []*tidetype.TaskInfo
	for i := range n {
		ms = append(ms, groupMsg(q, fmt.Sprint("c", i), ""))
	}
	for i := 0; i < n; i += 500 {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, ms[i:i+500]...)
	}
	var wg sync.WaitGroup
	for range 3 {
		other := redisbroker.New(e.rdb, redisbroker.WithPrefix(e.prefix))
		t.Cleanup(func() { _ = other.Close() })
		wg.Go(func() {
			if err := other.Repartition(ctx, q, 4, nil); err != nil {
				t.Errorf("Repartition: %v", err)
			}
		})
	}
	wg.Wait()
	info, err := e.b.QueueInfo(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if info.Pending != n {
		t.Fatalf("after concurrent runs of one repartition %d of %d tasks are pending", info.Pending, n)
	}
}

// A repartition whose run stopped after recording the new layout but before
// marking the old partitions is resumed by the next run, which marks them.
func TestRepartitionResumesBeforeMark(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, n = "resumemark", 300
	var ms []*tidetype.TaskInfo
	for i := range n {
		ms = append(ms, groupMsg(q, fmt.Sprint("m", i), ""))
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, ms...)
	stop, cancel := context.WithCancel(ctx)
	err := e.b.Repartition(stop, q, 2, func(int, int) { cancel() })
	if err == nil {
		t.Fatal("the interrupted repartition finished")
	}
	// As if the run had died before it marked the old partition.
	if err := e.rdb.Set(ctx, e.prefix+":{"+q+":0}:meta", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	other := redisbroker.New(e.rdb, redisbroker.WithPrefix(e.prefix))
	t.Cleanup(func() { _ = other.Close() })
	if err := other.Repartition(ctx, q, 2, nil); err != nil {
		t.Fatalf("resuming the repartition: %v", err)
	}
	info, err := other.QueueInfo(ctx, q)
	if err != nil || info.Pending != n {
		t.Fatalf("after the resumed repartition %d of %d tasks are pending (%v)", info.Pending, n, err)
	}
}
