package redisbroker_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/tidetype"
)

// While a repartition waits for a running task in its last old partition,
// after it has retired the others, SetQueueLimits succeeds and gives the
// limits to every partition of the new span; the admin calls that look at
// every partition (QueueInfo, DeleteTasks) succeed too. A retired old
// partition is no sign that the layout changed.
func TestSetQueueLimitsWhileOldPartitionsRetire(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "limretire"
	// Two partitions (epoch 1), then three (epoch 2): old partition 0 is
	// empty and retires at once; old partition 1 holds a running task.
	if err := e.b.Repartition(ctx, q, 2, nil); err != nil {
		t.Fatal(err)
	}
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprint("r", i); broker.Partition(c, 2) == 1 {
			id = c
		}
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, id, ""))
	ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %d, %v", len(ds), err)
	}
	lim := tidetype.QueueLimits{Concurrency: 4, Rate: tidetype.Rate{Limit: 10, Per: time.Second}}
	var once sync.Once
	checked := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.b.Repartition(ctx, q, 3, func(moved, left int) {
			if left != 1 {
				return
			}
			once.Do(func() {
				defer close(checked)
				if tag, err := e.rdb.HGet(ctx, e.prefix+":partitions", q).Result(); err != nil || tag != "3@2<2@1" {
					t.Errorf("layout %q (%v), want the repartition from 2@1 to 3@2 running", tag, err)
					return
				}
				if meta, _ := e.rdb.Get(ctx, e.prefix+":{"+q+":0@1}:meta").Result(); meta != "retired" {
					t.Errorf("old partition 0 records %q, want it retired", meta)
					return
				}
				if err := e.b.SetQueueLimits(ctx, q, lim); err != nil {
					t.Errorf("SetQueueLimits while old partitions retire: %v", err)
					return
				}
				rec, err := e.rdb.HGet(ctx, e.prefix+":limits", q).Result()
				if err != nil {
					t.Errorf("limits record: %v", err)
					return
				}
				v, _, _ := strings.Cut(rec, ":")
				for i := range 3 {
					k := e.prefix + ":{" + q + ":" + strconv.Itoa(i) + "@2}:lim"
					if got, err := e.rdb.HGet(ctx, k, "v").Result(); err != nil || got != v {
						t.Errorf("partition %d of the new span holds limits version %q (%v), want %q", i, got, err, v)
					}
				}
				if _, err := e.b.QueueInfo(ctx, q); err != nil {
					t.Errorf("QueueInfo while old partitions retire: %v", err)
				}
				if _, err := e.b.DeleteTasks(ctx, q, tidetype.StateArchived, 100); err != nil {
					t.Errorf("DeleteTasks while old partitions retire: %v", err)
				}
			})
		})
	}()
	select {
	case <-checked:
	case err := <-done:
		t.Fatalf("the repartition ended (%v) before its last old partition was left with the running task", err)
	}
	if _, err := e.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, err := e.b.QueueLimits(ctx, q); err != nil || got != lim {
		t.Fatalf("QueueLimits after the repartition: %+v (%v), want %+v", got, err, lim)
	}
}

// A SetQueueLimits that read the layout while a repartition ran, and gives
// the partitions their settings only after the repartition ended, does not
// leave the grouped tasks held as they were during the repartition: the
// repartition's end gave the settings of the same limits without the hold,
// and SetQueueLimits sees that the layout changed and gives them again.
func TestSetQueueLimitsAcrossARepartitionsEnd(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "limend"
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Repartition(ctx, q, 2, nil); err != nil {
		t.Fatal(err)
	}
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprint("r", i); broker.Partition(c, 2) == 1 {
			id = c
		}
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, id, ""))
	ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %d, %v", len(ds), err)
	}
	var once sync.Once
	waiting := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.b.Repartition(ctx, q, 3, func(moved, left int) {
			if left == 1 {
				once.Do(func() { close(waiting) })
			}
		})
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the repartition ended (%v) before its last old partition was left with the running task", err)
	}
	// The limits are recorded while the repartition runs; before the
	// partitions get their settings, the repartition ends.
	var ended sync.Once
	redisbroker.SetLimitsRecorded(func(queue string) {
		if queue != q {
			return
		}
		ended.Do(func() {
			if _, err := e.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil {
				t.Errorf("Settle: %v", err)
			}
			if err := <-done; err != nil {
				t.Errorf("Repartition: %v", err)
			}
		})
	})
	defer redisbroker.SetLimitsRecorded(nil)
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Ordered: true, Concurrency: 5}); err != nil {
		t.Fatal(err)
	}
	redisbroker.SetLimitsRecorded(nil)
	if tag, err := e.rdb.HGet(ctx, e.prefix+":partitions", q).Result(); err != nil || tag != "3@2" {
		t.Fatalf("layout %q (%v), want the repartition to 3@2 done", tag, err)
	}
	for i := range 3 {
		k := e.prefix + ":{" + q + ":" + strconv.Itoa(i) + "@2}:lim"
		if n, err := e.rdb.HExists(ctx, k, "gh").Result(); err != nil || n {
			t.Errorf("partition %d of the new span still holds grouped tasks back after the repartition (%v)", i, err)
		}
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, "x", "g"))
	ds, err = e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue of a grouped task after the repartition: %d tasks, %v; want 1", len(ds), err)
	}
}

// A GroupConcurrency set while a repartition moves groups whose tasks run
// (a queue that had no group limit, so no running counts were kept): while
// the move runs no group whose task runs starts another (the repartition
// holds grouped starts; without that hold a second task of such a group
// starts here), and neither the move nor the running tasks' settlements
// in the old partitions leave a count behind in the new ones: after the
// repartition every group starts one task at a time, none held by a stale
// count, none over the limit, until all have run. Half of the running
// tasks settle before the limit is set and half after.
func TestGroupLimitSetWhileARepartitionMovesGroups(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, groups, per = "glimmove", 8, 3
	var ms []*tidetype.TaskInfo
	for i := range per {
		for g := range groups {
			ms = append(ms, groupMsg(q, fmt.Sprintf("t%d", i), fmt.Sprintf("g%d", g)))
		}
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, ms...)
	// No group limit: the rotation hands out one task of each group.
	running, err := e.b.Dequeue(ctx, []string{q}, groups, time.Minute)
	if err != nil || len(running) != groups {
		t.Fatalf("Dequeue: %d tasks, %v; want %d", len(running), err, groups)
	}
	seen := map[string]bool{}
	for _, d := range running {
		if seen[d.Task.Group] {
			t.Fatalf("two tasks of group %s started without a limit before the rotation went round", d.Task.Group)
		}
		seen[d.Task.Group] = true
	}
	settle := func(ds []*broker.Delivery) {
		t.Helper()
		for _, d := range ds {
			errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task}})
			if err != nil || errs[0] != nil {
				t.Errorf("Settle %s: %v %v", d.Task.ID, err, errs)
			}
		}
	}
	settle(running[:groups/2])
	var once sync.Once
	set := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.b.Repartition(ctx, q, 4, func(moved, left int) {
			if moved == 0 {
				return
			}
			once.Do(func() {
				defer close(set)
				if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{GroupConcurrency: 1}); err != nil {
					t.Errorf("SetQueueLimits while the repartition moves groups: %v", err)
				}
			})
		})
	}()
	select {
	case <-set:
	case err := <-done:
		t.Fatalf("the repartition ended (%v) before it moved a task while the others ran", err)
	}
	// Meanwhile the groups whose tasks still run start nothing more.
	extra, err := e.b.Dequeue(ctx, []string{q}, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range extra {
		for _, r := range running[groups/2:] {
			if r.Task.Group == d.Task.Group {
				t.Errorf("%s of group %s started while %s of its group ran, under GroupConcurrency 1", d.Task.ID, d.Task.Group, r.Task.ID)
			}
		}
	}
	settle(extra)
	settle(running[groups/2:])
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return
	}
	// What is left (per-1 tasks a group) runs one task of a group at a time.
	ran := map[string]int{}
	for round := 0; ; round++ {
		ds, err := e.b.Dequeue(ctx, []string{q}, 100, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break
		}
		at := map[string]bool{}
		for _, d := range ds {
			if at[d.Task.Group] {
				t.Fatalf("round %d: two tasks of group %s run at once under GroupConcurrency 1", round, d.Task.Group)
			}
			at[d.Task.Group] = true
			ran[d.Task.Group]++
		}
		settle(ds)
		if round > 2*per {
			t.Fatalf("still handing out tasks after %d rounds", round)
		}
	}
	for _, d := range extra {
		ran[d.Task.Group]++
	}
	for g := range groups {
		if n := ran[fmt.Sprintf("g%d", g)]; n != per-1 {
			t.Errorf("group g%d ran %d of its %d tasks left after the repartition (a stale running count holds it)", g, n, per-1)
		}
	}
}
