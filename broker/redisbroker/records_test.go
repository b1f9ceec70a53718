package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

func pendingTask(id string) *tidetype.TaskInfo {
	now := time.Now()
	return &tidetype.TaskInfo{ID: id, Queue: "q", Type: "t", Payload: []byte("p"), State: tidetype.StatePending, MaxRetry: 3, NextProcessAt: now, EnqueuedAt: now}
}

// An active task whose record cannot be read when its lease expires is
// archived with the reason (its bytes kept as the result), like any other bad
// record, instead of vanishing from every list.
func TestUndecodableActiveRecordIsArchived(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rdb, prefix, b := e.rdb, e.prefix, e.b
	ctx := context.Background()
	if errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("bad")}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	if ds, err := b.Dequeue(ctx, []string{"q"}, 1, 100*time.Millisecond); err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	garbage := "\x02\x02not a record"
	if err := rdb.HSet(ctx, prefix+":{q:0}:t", "bad", garbage).Err(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the expired lease to be recovered", func() bool {
		r, err := b.Maintain(ctx, broker.MaintainRequest{Queue: "q", Owner: "m", OwnerTTL: time.Second})
		return err == nil && r.Recovered == 1
	})
	got, err := b.GetTask(ctx, "q", "bad")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != tidetype.StateArchived || !strings.Contains(got.LastErr, "undecodable") || string(got.Result) != garbage {
		t.Fatalf("recovered bad record: %+v", got)
	}
	ts, err := b.ListTasks(ctx, "q", tidetype.StateArchived, 0, 10)
	if err != nil || len(ts) != 1 || ts[0].ID != "bad" {
		t.Fatalf("archived list: %v, %v", ts, err)
	}
}

// With a maxmemory-policy that may evict keys Redis can silently drop tasks:
// the broker says so loudly, or refuses to work when asked to.
func TestEvictionPolicyIsChecked(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru")
	ctx := context.Background()
	var logs testlog.Buffer
	warned := redisbroker.New(redistest.Client(t, srv.Addr), redisbroker.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if _, err := warned.Partitions(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); !strings.Contains(out, "maxmemory-policy") || !strings.Contains(out, "allkeys-lru") || !strings.Contains(out, "level=ERROR") {
		t.Fatalf("no loud warning about the eviction policy:\n%s", out)
	}
	strict := redisbroker.New(redistest.Client(t, srv.Addr), redisbroker.WithRequireNoEviction())
	if _, err := strict.Partitions(ctx, "q"); !errors.Is(err, redisbroker.ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("strict broker on an evicting Redis: %v", err)
	}
	if errs, err := strict.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("x")}, broker.EnqueueOptions{}); err == nil && errs[0] == nil {
		t.Fatal("strict broker stored a task on an evicting Redis")
	}
	fine := redistest.Start(t)
	if _, err := redisbroker.New(redistest.Client(t, fine.Addr), redisbroker.WithRequireNoEviction()).Partitions(ctx, "q"); err != nil {
		t.Fatalf("strict broker on a noeviction Redis: %v", err)
	}
}

// Every script checks the partition's recorded layout: a process that still
// routes with a layout that changed under it is refused (nothing leased,
// stored or settled), learns the new layout and then works.
func TestStaleLayoutIsRefusedByTheScripts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rdb, prefix, b := e.rdb, e.prefix, e.b
	ctx := context.Background()
	if errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("a")}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	// The queue now records 2 partitions (as after a repartition); b still
	// believes 1.
	if err := rdb.HSet(ctx, prefix+":partitions", "q", "2").Err(); err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		rdb.Set(ctx, fmt.Sprintf("%s:{q:%d}:meta", prefix, p), "2", 0)
	}
	_, err := b.Dequeue(ctx, []string{"q"}, 10, time.Minute)
	if !errors.Is(err, broker.ErrLayout) || !errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("Dequeue with a stale layout: %v, want ErrLayout", err)
	}
	if n, err := b.Partitions(ctx, "q"); err != nil || n != 2 {
		t.Fatalf("after the refusal: %d partitions, %v; want the recorded 2", n, err)
	}
}

// An Enqueue routed with a layout that a repartition changed since (by
// another process) is refused by the scripts, which store nothing; the
// broker then learns the new layout and sends the refused tasks again, so
// the caller sees its tasks stored, not ErrUnavailable.
func TestEnqueueAcrossARepartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	b := e.b
	if errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("a")}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	other := redisbroker.New(e.rdb, redisbroker.WithPrefix(e.prefix))
	t.Cleanup(func() { _ = other.Close() })
	if err := other.Repartition(ctx, "q", 3, nil); err != nil {
		t.Fatalf("Repartition: %v", err)
	}
	for _, id := range []string{"b", ""} {
		task := pendingTask(id)
		errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{task}, broker.EnqueueOptions{})
		if err != nil || errs[0] != nil {
			t.Fatalf("Enqueue of %q after another process repartitioned the queue: %v %v", id, errs, err)
		}
		if _, err := other.GetTask(ctx, "q", task.ID); err != nil {
			t.Fatalf("GetTask(%s): %v", task.ID, err)
		}
	}
}
