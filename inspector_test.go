package tide_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestInspectorQueuesAndListing(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(3))
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	var pendingIDs []string
	for i := range 25 {
		info, err := e.c.Enqueue(ctx, tide.NewTask("p", []byte(fmt.Sprint(i))), tide.Queue("orders"))
		if err != nil {
			t.Fatal(err)
		}
		pendingIDs = append(pendingIDs, info.ID)
	}
	for i := range 7 {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("s", nil), tide.Queue("orders"), tide.ProcessIn(time.Duration(i+1)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("x", nil), tide.Queue("emails")); err != nil {
		t.Fatal(err)
	}
	qs, err := in.Queues(ctx)
	if err != nil || strings.Join(qs, ",") != "emails,orders" {
		t.Fatalf("Queues = %v, %v", qs, err)
	}
	qi, err := in.QueueInfo(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if qi.Pending != 25 || qi.Scheduled != 7 || qi.Size != 32 || qi.Paused || qi.Latency <= 0 {
		t.Fatalf("QueueInfo = %+v", qi)
	}
	// Page through every pending task across the partitions: each exactly once.
	seen := map[string]bool{}
	for page := 1; ; page++ {
		ts, err := in.ListTasks(ctx, "orders", tide.StatePending, page, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) == 0 {
			break
		}
		for _, ti := range ts {
			if seen[ti.ID] || ti.State != tide.StatePending {
				t.Fatalf("page %d: %+v (seen=%v)", page, ti, seen[ti.ID])
			}
			seen[ti.ID] = true
		}
	}
	if len(seen) != 25 {
		t.Fatalf("listed %d pending tasks, want 25", len(seen))
	}
	sched, err := in.ListTasks(ctx, "orders", tide.StateScheduled, 1, 100)
	if err != nil || len(sched) != 7 {
		t.Fatalf("scheduled: %d, %v", len(sched), err)
	}
	if _, err := in.ListTasks(ctx, "orders", tide.StatePending, 0, 10); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("page 0: %v", err)
	}
	if _, err := in.ListTasks(ctx, "orders", tide.StatePending, 1, tide.MaxPageSize+1); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("oversize page: %v", err)
	}

	// Single-task operations.
	if err := in.ArchiveTask(ctx, "orders", pendingIDs[0]); err != nil {
		t.Fatal(err)
	}
	if ti := e.info("orders", pendingIDs[0]); ti.State != tide.StateArchived {
		t.Fatalf("after ArchiveTask: %v", ti.State)
	}
	if err := in.ArchiveTask(ctx, "orders", pendingIDs[0]); err == nil || !strings.Contains(err.Error(), "archived") {
		t.Fatalf("archiving an archived task: %v", err)
	}
	if err := in.RunTask(ctx, "orders", pendingIDs[0]); err != nil {
		t.Fatal(err)
	}
	if ti := e.info("orders", pendingIDs[0]); ti.State != tide.StatePending {
		t.Fatalf("after RunTask: %v", ti.State)
	}
	if err := in.RunTask(ctx, "orders", "nope"); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Fatalf("RunTask(missing) = %v", err)
	}

	// Bulk operations, in chunks across partitions.
	n, err := in.RunAllTasks(ctx, "orders", tide.StateScheduled)
	if err != nil || n != 7 {
		t.Fatalf("RunAllTasks = %d, %v", n, err)
	}
	n, err = in.ArchiveAllTasks(ctx, "orders", tide.StatePending)
	if err != nil || n != 32 {
		t.Fatalf("ArchiveAllTasks = %d, %v", n, err)
	}
	n, err = in.DeleteAllTasks(ctx, "orders", tide.StateArchived)
	if err != nil || n != 32 {
		t.Fatalf("DeleteAllTasks = %d, %v", n, err)
	}
	qi, err = in.QueueInfo(ctx, "orders")
	if err != nil || qi.Size != 0 {
		t.Fatalf("after deleting all: %+v, %v", qi, err)
	}
	// The unique lock of a bulk-deleted task is released.
	if _, err := e.c.Enqueue(ctx, tide.NewTask("u", nil, tide.Unique(time.Hour)), tide.Queue("orders")); err != nil {
		t.Fatal(err)
	}
	if n, err := in.DeleteAllTasks(ctx, "orders", tide.StatePending); err != nil || n != 1 {
		t.Fatalf("delete pending: %d %v", n, err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("u", nil, tide.Unique(time.Hour)), tide.Queue("orders")); err != nil {
		t.Fatalf("unique lock kept after bulk delete: %v", err)
	}
}

func TestInspectorCancelProcessingAndServers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	started := make(chan struct{})
	causes := make(chan error, 1)
	e.server(tide.Config{ServerID: "worker-1"}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}))
	info, err := e.c.Enqueue(ctx, tide.NewTask("long", nil))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	var ss []tide.ServerInfo
	testwait.For(t, 15*time.Second, "the server to report its active task", func() bool {
		ss, err = in.Servers(ctx)
		return err == nil && len(ss) == 1 && len(ss[0].Active) == 1
	})
	if ss[0].ID != "worker-1" || ss[0].Active[0].ID != info.ID || ss[0].Concurrency != 10 {
		t.Fatalf("servers = %+v", ss[0])
	}
	if err := in.CancelProcessing(ctx, "default", "missing"); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Fatalf("cancel missing: %v", err)
	}
	// The inspector talks to Redis through its own broker: the cancel crosses
	// connections the way it crosses processes.
	if err := tide.NewInspector(e.broker()).CancelProcessing(ctx, "default", info.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-causes:
		if !errors.Is(c, tide.ErrTaskCanceled) {
			t.Fatalf("cause = %v", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler not cancelled")
	}
	ti := e.waitState("default", info.ID, tide.StateArchived)
	if !strings.Contains(ti.LastErr, "cancelled") {
		t.Fatalf("archived with %q", ti.LastErr)
	}
	if err := in.CancelProcessing(ctx, "default", info.ID); !errors.Is(err, tide.ErrTaskState) || !strings.Contains(err.Error(), "not active") {
		t.Fatalf("cancel archived: %v", err)
	}
	qi, err := in.QueueInfo(ctx, "default")
	if err != nil || qi.Processed != 1 || qi.Failed != 1 {
		t.Fatalf("counters: %+v, %v", qi, err)
	}
	hist, err := in.History(ctx, "default", 7)
	if err != nil || len(hist) != 7 || hist[0].Processed != 1 || hist[1].Processed != 0 {
		t.Fatalf("history: %+v, %v", hist, err)
	}
}

// What an operator sees of a running task (where and since when it runs,
// when its lease ends), of a queue's last minutes, of the periodic entries'
// last ticks and of the Redis behind it all.
func TestInspectorOperatorViews(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	running := make(chan struct{})
	release := make(chan struct{})
	e.server(tide.Config{ServerID: "worker-9", LeaseDuration: 6 * time.Second}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if task.Type() == "slow" {
			close(running)
			<-release
			return nil
		}
		if string(task.Payload()) == "fail" {
			return errors.New("upstream said no")
		}
		return nil
	}))
	if _, err := e.c.Enqueue(ctx, tide.NewTask("slow", nil)); err != nil {
		t.Fatal(err)
	}
	<-running
	var active []*tide.TaskInfo
	testwait.For(t, 15*time.Second, "the running task with its server", func() bool {
		var err error
		active, err = in.ListTasks(ctx, "default", tide.StateActive, 1, 10)
		return err == nil && len(active) == 1 && active[0].Server == "worker-9"
	})
	if a := active[0]; a.StartedAt.IsZero() || a.LeaseExpiresAt.Before(time.Now()) {
		t.Fatalf("running task: started %v, lease until %v", a.StartedAt, a.LeaseExpiresAt)
	}
	// GetTaskInfo tells the same of one task, without a listing.
	one, err := in.GetTaskInfo(ctx, "default", active[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if one.Server != "worker-9" || !one.StartedAt.Equal(active[0].StartedAt) || one.LeaseExpiresAt.Before(time.Now()) {
		t.Fatalf("GetTaskInfo of the running task: server %q, started %v, lease until %v; want worker-9, %v, a future expiry",
			one.Server, one.StartedAt, one.LeaseExpiresAt, active[0].StartedAt)
	}
	close(release)

	info, err := e.c.Enqueue(ctx, tide.NewTask("job", []byte("fail")), tide.MaxRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	ti := e.waitState("default", info.ID, tide.StateArchived)
	if len(ti.Attempts) != 1 || ti.Attempts[0].Server != "worker-9" || ti.Attempts[0].Err != "upstream said no" || ti.Attempts[0].Started.IsZero() {
		t.Fatalf("attempt history: %+v", ti.Attempts)
	}
	found, _, err := in.SearchTasks(ctx, "default", tide.StateArchived, tide.TaskFilter{Err: "said no"}, 0, 10)
	if err != nil || len(found) != 1 || found[0].ID != info.ID {
		t.Fatalf("search by error: %+v, %v", found, err)
	}
	pts, err := in.Series(ctx, "default", time.Now().Add(-10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	processed, failed := 0, 0
	for _, p := range pts {
		processed, failed = processed+p.Processed, failed+p.Failed
	}
	if processed != 2 || failed != 1 {
		t.Fatalf("series: processed %d, failed %d; want 2 and 1", processed, failed)
	}
	si, err := in.StoreInfo(ctx)
	if err != nil || si.Kind != "redis" || si.Version == "" || si.UsedMemory <= 0 || si.EvictionPolicy == "" {
		t.Fatalf("store info: %+v, %v", si, err)
	}

	s := tide.NewScheduler(e.b, &tide.SchedulerOpts{Logger: testLogger(t)})
	if _, err := s.Register("@every 1s", tide.NewTask("tick", nil)); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	var runs []tide.CronRun
	testwait.For(t, 20*time.Second, "three ticks run", func() bool {
		es, err := in.SchedulerEntries(ctx)
		if err != nil || len(es) != 1 {
			return false
		}
		runs, err = in.CronHistory(ctx, es[0], 5)
		if err != nil || len(runs) < 3 {
			return false
		}
		for _, r := range runs[:3] {
			if r.Task == nil || r.Task.State != tide.StateCompleted {
				return false
			}
		}
		return true
	})
	if !runs[0].Tick.After(runs[1].Tick) {
		t.Fatalf("history not newest first: %v then %v", runs[0].Tick, runs[1].Tick)
	}
}
