package redisbroker_test

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// On Redis Cluster grouped tasks keep the IDs their callers chose: on a
// queue of one partition they are found, replaced into another group and
// conflict across groups; a repartition to clusterParts moves them with
// their groups (each script still runs on one slot: a pointer in the ID's
// partition leads to the task) and they are found, run and deleted by
// their IDs there, as are new ones; Replace moves one into a group of
// another partition.
func TestClusterGroupFreeIDs(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	rdb := c.Client(t)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q = "clfree"
	free := func(id, g string) *tidetype.TaskInfo {
		m := groupMsg(q, id, "")
		m.Group = g
		return m
	}
	mustEnqueue(t, b, broker.EnqueueOptions{}, free("order-cancel:42", "shop-7"), free("order-cancel:43", "shop-7"), groupMsg(q, "tagged", "shop-8"))
	errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{free("order-cancel:42", "shop-8")}, broker.EnqueueOptions{})
	if err != nil || !errors.Is(errs[0], broker.ErrTaskIDConflict) {
		t.Fatalf("the same ID in another group: %v, %v; want ErrTaskIDConflict", errs, err)
	}
	mustEnqueue(t, b, broker.EnqueueOptions{Replace: true}, free("order-cancel:42", "shop-8"))
	if err := b.Repartition(ctx, q, clusterParts, nil); err != nil {
		t.Fatalf("Repartition holding free grouped IDs: %v", err)
	}
	want := map[string]string{"order-cancel:42": "shop-8", "order-cancel:43": "shop-7", "tagged{shop-8}": "shop-8"}
	for id, g := range want {
		if got, err := b.GetTask(ctx, q, id); err != nil || got.Group != g {
			t.Fatalf("GetTask(%s) after the repartition: %+v, %v", id, got, err)
		}
	}
	// Replace into a group of another partition (and slot) moves it.
	away := "shop-10"
	for k := 1; broker.Partition(away, clusterParts) == broker.Partition("shop-7", clusterParts) ||
		broker.Partition(away, clusterParts) == broker.Partition("order-cancel:43", clusterParts); k++ {
		away = "shop-10-" + strconv.Itoa(k)
	}
	if broker.Partition("shop-7", clusterParts) == broker.Partition("order-cancel:43", clusterParts) {
		t.Fatal("order-cancel:43 is in shop-7's partition: no move to test")
	}
	mustEnqueue(t, b, broker.EnqueueOptions{Replace: true}, free("order-cancel:43", away))
	want["order-cancel:43"] = away
	if got, err := b.GetTask(ctx, q, "order-cancel:43"); err != nil || got.Group != away {
		t.Fatalf("GetTask(order-cancel:43) after its move: %+v, %v", got, err)
	}
	mustEnqueue(t, b, broker.EnqueueOptions{}, free("order-cancel:44", "shop-9"), free("order-cancel:45", "shop-9"))
	if err := b.Delete(ctx, q, "order-cancel:45"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	want["order-cancel:44"] = "shop-9"
	got := map[string]string{}
	for range len(want) {
		ds, err := b.Dequeue(ctx, []string{q}, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Dequeue: %d, %v", len(ds), err)
		}
		got[ds[0].Task.ID] = ds[0].Task.Group
		if errs, err := b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil || errs[0] != nil {
			t.Fatalf("Settle: %v %v", err, errs)
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}
