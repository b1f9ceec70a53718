package redisbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// On Redis Cluster a queue of one partition takes grouped tasks with the
// IDs their callers chose (every key of the partition shares one hash tag,
// so each script still runs on one slot): they are found, replaced into
// another group and run by those IDs; a repartition to clusterParts is
// refused while one is there and spreads the tagged ones once they are
// gone.
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
	if got, err := b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-8" {
		t.Fatalf("GetTask after Replace into shop-8: %+v, %v", got, err)
	}
	if err := b.Repartition(ctx, q, clusterParts, nil); !errors.Is(err, broker.ErrLayout) {
		t.Fatalf("Repartition holding free grouped IDs: %v, want ErrLayout", err)
	}
	got := map[string]string{}
	for range 3 {
		ds, err := b.Dequeue(ctx, []string{q}, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Dequeue: %d, %v", len(ds), err)
		}
		got[ds[0].Task.ID] = ds[0].Task.Group
		if errs, err := b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil || errs[0] != nil {
			t.Fatalf("Settle: %v %v", err, errs)
		}
	}
	if got["order-cancel:42"] != "shop-8" || got["order-cancel:43"] != "shop-7" || got["tagged{shop-8}"] != "shop-8" {
		t.Fatalf("ran %v", got)
	}
	mustEnqueue(t, b, broker.EnqueueOptions{}, groupMsg(q, "tagged-2", "shop-9"))
	if err := b.Repartition(ctx, q, clusterParts, nil); err != nil {
		t.Fatalf("Repartition once the free IDs are gone: %v", err)
	}
	if got, err := b.GetTask(ctx, q, "tagged-2{shop-9}"); err != nil || got.Group != "shop-9" {
		t.Fatalf("GetTask after the repartition: %+v, %v", got, err)
	}
}
