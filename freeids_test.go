package tide_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// A grouped task keeps the ID its caller chose ("order-cancel:42" in group
// "shop-7", no tag) on a queue of one partition, through every entry point:
// Enqueue, EnqueueMany, EnqueuePrepared, Replace into another group, the
// Inspector's single and bulk actions, Cancel, Delete, Wait, the handler's
// GetTaskID and the task events. The ID is the queue's: the same ID in
// another group is ErrTaskIDConflict.
func TestGroupFreeIDsEveryEntryPoint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	const q = "shops"
	if err := in.SetQueueEvents(ctx, q, true); err != nil {
		t.Fatal(err)
	}
	later := tide.ProcessIn(time.Hour)
	task := func(id, g string, opts ...tide.Option) *tide.Task {
		return tide.NewTask("order:cancel", []byte(id), append([]tide.Option{tide.Queue(q), tide.Group(g), tide.TaskID(id)}, opts...)...)
	}
	info, err := e.c.Enqueue(ctx, task("order-cancel:42", "shop-7", later))
	if err != nil || info.ID != "order-cancel:42" || info.Group != "shop-7" {
		t.Fatalf("Enqueue: %+v, %v; want ID order-cancel:42 in shop-7", info, err)
	}
	infos, err := e.c.EnqueueMany(ctx, []*tide.Task{task("order-cancel:43", "shop-7", later), task("order-cancel:44", "shop-8", later)})
	if err != nil || infos[0].ID != "order-cancel:43" || infos[1].ID != "order-cancel:44" {
		t.Fatalf("EnqueueMany: %v; infos %+v", err, infos)
	}
	prep, err := tide.Prepare(task("order-cancel:45", "shop-9", later))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := e.c.EnqueuePrepared(ctx, prep); err != nil || info.ID != "order-cancel:45" {
		t.Fatalf("EnqueuePrepared: %+v, %v", info, err)
	}
	if _, err := e.c.Enqueue(ctx, task("order-cancel:42", "shop-8")); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("the same ID in another group: %v, want ErrTaskIDConflict", err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("order:cancel", nil, tide.Queue(q), tide.TaskID("order-cancel:42"))); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("the same ID without a group: %v, want ErrTaskIDConflict", err)
	}
	// Replace moves the task to another group.
	if info, err := e.c.Enqueue(ctx, task("order-cancel:42", "shop-8", later, tide.Replace(), tide.Retention(time.Hour))); err != nil || info.Group != "shop-8" {
		t.Fatalf("Replace into shop-8: %+v, %v", info, err)
	}
	if got := e.info(q, "order-cancel:42"); got.Group != "shop-8" || got.State != tide.StateScheduled {
		t.Fatalf("after Replace: group %q state %v", got.Group, got.State)
	}
	if err := e.c.Delete(ctx, q, "order-cancel:43"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := e.c.Cancel(ctx, q, "order-cancel:44"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	for _, id := range []string{"order-cancel:43", "order-cancel:44"} {
		if _, err := in.GetTaskInfo(ctx, q, id); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("GetTaskInfo(%s) after Delete/Cancel: %v", id, err)
		}
	}
	if err := in.ArchiveTask(ctx, q, "order-cancel:45"); err != nil {
		t.Fatalf("ArchiveTask: %v", err)
	}
	if n, err := in.ArchiveAllTasks(ctx, q, tide.StateScheduled); err != nil || n != 1 {
		t.Fatalf("ArchiveAllTasks(scheduled) = %d, %v; want 1", n, err)
	}
	archived, err := in.ListTasks(ctx, q, tide.StateArchived, 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ti := range archived {
		ids = append(ids, ti.ID+"/"+ti.Group)
	}
	if slices.Sort(ids); !slices.Equal(ids, []string{"order-cancel:42/shop-8", "order-cancel:45/shop-9"}) {
		t.Fatalf("archived tasks %v", ids)
	}
	// The event reader.
	evctx, stop := context.WithCancel(ctx)
	defer stop()
	events, err := in.Events(evctx, tide.EventsFrom{Queues: []string{q}, After: tide.EventsOldest})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := in.RunAllTasks(ctx, q, tide.StateArchived); err != nil || n != 2 {
		t.Fatalf("RunAllTasks(archived) = %d, %v; want 2", n, err)
	}
	// A waiter (order-cancel:42 is kept when done: Wait finds it also
	// after it ended), then a server runs them.
	waited := make(chan *tide.TaskInfo, 1)
	go func() {
		ti, err := e.c.Wait(ctx, q, "order-cancel:42")
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		waited <- ti
	}()
	var mu sync.Mutex
	var ran []string
	e.server(tide.Config{Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		mu.Lock()
		ran = append(ran, id)
		mu.Unlock()
		return nil
	}))
	select {
	case ti := <-waited:
		if ti == nil || ti.ID != "order-cancel:42" || ti.State != tide.StateCompleted {
			t.Fatalf("Wait returned %+v", ti)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	testwait.For(t, 10*time.Second, "both tasks to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == 2
	})
	mu.Lock()
	slices.Sort(ran)
	if !slices.Equal(ran, []string{"order-cancel:42", "order-cancel:45"}) {
		t.Fatalf("handlers saw GetTaskID %v", ran)
	}
	mu.Unlock()
	seen := map[string]bool{}
	for !seen["order-cancel:42 succeeded"] || !seen["order-cancel:45 succeeded"] {
		select {
		case ev := <-events:
			if ev.Kind == tide.EventSucceeded || ev.Kind == tide.EventEnqueued {
				seen[ev.TaskID+" "+ev.Kind.String()] = true
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("events seen %v", seen)
		}
	}
	for _, want := range []string{"order-cancel:42 succeeded", "order-cancel:45 succeeded", "order-cancel:43 enqueued"} {
		if !seen[want] {
			t.Fatalf("events %v lack %q", seen, want)
		}
	}
}

// A running grouped task with a free ID is cancelled by that ID.
func TestGroupFreeIDCancelProcessing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	started := make(chan struct{})
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}))
	if _, err := e.c.Enqueue(ctx, tide.NewTask("slow", nil), tide.Group("acct-1"), tide.TaskID("report:7")); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := tide.NewInspector(e.b).CancelProcessing(ctx, "default", "report:7"); err != nil {
		t.Fatalf("CancelProcessing: %v", err)
	}
	if got := e.waitState("default", "report:7", tide.StateArchived); got.Group != "acct-1" {
		t.Fatalf("cancelled task's group %q", got.Group)
	}
}

// On a queue of six partitions a grouped task keeps the ID its caller
// chose too ("order-cancel:42" in group "shop-7", which live in different
// partitions): it is found, cancelled, deleted and waited for by that ID,
// runs with it, and the ID is the queue's: the same ID in another group,
// or without a group, is ErrTaskIDConflict while the task is there, and
// free again once it is gone.
func TestGroupFreeIDsOnPartitions(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	const q = "shops6"
	later := tide.ProcessIn(time.Hour)
	task := func(id, g string, opts ...tide.Option) *tide.Task {
		return tide.NewTask("order:cancel", []byte(id), append([]tide.Option{tide.Queue(q), tide.Group(g), tide.TaskID(id)}, opts...)...)
	}
	for _, id := range []string{"order-cancel:42", "order-cancel:43", "order-cancel:44"} {
		if info, err := e.c.Enqueue(ctx, task(id, "shop-7", later)); err != nil || info.ID != id || info.Group != "shop-7" {
			t.Fatalf("Enqueue(%s): %+v, %v", id, info, err)
		}
	}
	for _, id := range []string{"order-cancel:42", "order-cancel:43", "order-cancel:44"} {
		ti, err := in.GetTaskInfo(ctx, q, id)
		if err != nil || ti.ID != id || ti.Group != "shop-7" || ti.State != tide.StateScheduled {
			t.Fatalf("GetTaskInfo(%s): %+v, %v", id, ti, err)
		}
	}
	if _, err := e.c.Enqueue(ctx, task("order-cancel:42", "shop-8")); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("the same ID in another group: %v, want ErrTaskIDConflict", err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("order:cancel", nil, tide.Queue(q), tide.TaskID("order-cancel:42"))); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("the same ID without a group: %v, want ErrTaskIDConflict", err)
	}
	if err := e.c.Cancel(ctx, q, "order-cancel:42"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if err := e.c.Delete(ctx, q, "order-cancel:43"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	for _, id := range []string{"order-cancel:42", "order-cancel:43"} {
		if _, err := in.GetTaskInfo(ctx, q, id); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("GetTaskInfo(%s) after Cancel/Delete: %v, want ErrTaskNotFound", id, err)
		}
	}
	// Gone, the ID is free: in another group, and without one.
	if _, err := e.c.Enqueue(ctx, task("order-cancel:42", "shop-8", later)); err != nil {
		t.Fatalf("the cancelled task's ID in another group: %v", err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("order:cancel", nil, tide.Queue(q), tide.TaskID("order-cancel:43"), later)); err != nil {
		t.Fatalf("the deleted task's ID without a group: %v", err)
	}
	if ti, err := in.GetTaskInfo(ctx, q, "order-cancel:42"); err != nil || ti.Group != "shop-8" {
		t.Fatalf("GetTaskInfo(order-cancel:42) re-created in shop-8: %+v, %v", ti, err)
	}
	// Run by a server: its lease, settlement and Wait find it.
	waited := make(chan *tide.TaskInfo, 1)
	go func() {
		ti, err := e.c.Wait(ctx, q, "order-cancel:44")
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		waited <- ti
	}()
	ran := make(chan string, 10)
	e.server(tide.Config{Queues: map[string]int{q: 1}, LeaseDuration: 2 * time.Second}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		g, _ := tide.GetGroup(ctx)
		ran <- id + "/" + g
		time.Sleep(1500 * time.Millisecond) // past a lease renewal
		return nil
	}))
	if err := in.RunTask(ctx, q, "order-cancel:44"); err != nil {
		t.Fatalf("RunTask: %v", err)
	}
	select {
	case got := <-ran:
		if got != "order-cancel:44/shop-7" {
			t.Fatalf("ran %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("order-cancel:44 did not run")
	}
	select {
	case ti := <-waited:
		if ti == nil || ti.ID != "order-cancel:44" {
			t.Fatalf("Wait returned %+v", ti)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	if _, err := e.c.Enqueue(ctx, task("order-cancel:44", "shop-9", later)); err != nil {
		t.Fatalf("the ID of a task that ran, in another group: %v", err)
	}
}

// A periodic task in a group runs on a queue of one partition with its
// tick's ID ("cron:<entry>:<tick>", no group tag) and its group.
func TestSchedulerGroupedEntry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	type run struct{ id, group string }
	runs := make(chan run, 10)
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		g, _ := tide.GetGroup(ctx)
		runs <- run{id, g}
		return nil
	}))
	s := tide.NewScheduler(e.broker(), &tide.SchedulerOpts{Logger: testLogger(t)})
	if _, err := s.RegisterEntry(tide.CronEntry{Spec: "@every 1s", Task: tide.NewTask("report", nil), ID: "tenant-report", Options: []tide.Option{tide.Group("tenant-1")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	select {
	case r := <-runs:
		if !strings.HasPrefix(r.id, "cron:tenant-report:") || strings.Contains(r.id, "{") || r.group != "tenant-1" {
			t.Fatalf("tick ran as %q in group %q", r.id, r.group)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no tick ran")
	}
}
