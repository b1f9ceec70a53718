package redisbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

func TestSmoke(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	m := &tidetype.TaskInfo{ID: "a", Queue: "q", Type: "t", Payload: []byte("x"), State: tidetype.StatePending, MaxRetry: 3, NextProcessAt: now, EnqueuedAt: now, Headers: map[string]string{"h": "v"}}
	errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	errs, err = b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{})
	if err != nil || errs[0] != broker.ErrTaskIDConflict {
		t.Fatal(err, errs)
	}
	ds, err := b.Dequeue(ctx, []string{"q"}, 10, time.Second)
	if err != nil || len(ds) != 1 {
		t.Fatal(err, len(ds))
	}
	t.Logf("%+v token=%d", ds[0].Task, ds[0].Token)
	ref := broker.LeaseRef{Queue: "q", ID: "a", Token: ds[0].Token}
	if errs, err := b.Extend(ctx, []broker.LeaseRef{ref}, time.Second); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	if err := b.SetResult(ctx, ref, []byte("res")); err != nil {
		t.Fatal(err)
	}
	errs, err = b.Settle(ctx, []broker.Settlement{{Lease: ref, Kind: broker.SettleRetry, Task: ds[0].Task, Err: "boom", RetryAt: now.Add(50 * time.Millisecond), At: now}})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	got, err := b.GetTask(ctx, "q", "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after retry: %+v", got)
	time.Sleep(60 * time.Millisecond)
	res, err := b.Maintain(ctx, broker.MaintainRequest{Queue: "q", Owner: "me", OwnerTTL: time.Second})
	t.Logf("maintain: %+v %v", res, err)
	ds, err = b.Dequeue(ctx, []string{"q"}, 10, time.Second)
	if err != nil || len(ds) != 1 || ds[0].Token <= ref.Token {
		t.Fatal(err, len(ds))
	}
	errs, err = b.Settle(ctx, []broker.Settlement{{Lease: ref, Kind: broker.SettleDone}})
	if err != nil || errs[0] != broker.ErrLeaseLost {
		t.Fatal(err, errs)
	}
	if err := b.Delete(ctx, "q", "a"); err != broker.ErrTaskActive {
		t.Fatal(err)
	}
	ref.Token = ds[0].Token
	errs, err = b.Settle(ctx, []broker.Settlement{{Lease: ref, Kind: broker.SettleDone, Task: ds[0].Task}})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	if _, err := b.GetTask(ctx, "q", "a"); err != broker.ErrTaskNotFound {
		t.Fatal(err)
	}
}
