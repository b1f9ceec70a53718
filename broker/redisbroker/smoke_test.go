package redisbroker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

func TestSmoke(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	m := &broker.Message{ID: "a", Queue: "q", Type: "t", Payload: []byte("x"), State: broker.StatePending, MaxRetry: 3, ProcessAt: now, EnqueuedAt: now, Headers: map[string]string{"h": "v"}}
	errs, err := b.Enqueue(ctx, []*broker.Message{m})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	errs, err = b.Enqueue(ctx, []*broker.Message{m})
	if err != nil || errs[0] != broker.ErrTaskIDConflict {
		t.Fatal(err, errs)
	}
	ds, err := b.Dequeue(ctx, []string{"q"}, 10, time.Second)
	if err != nil || len(ds) != 1 {
		t.Fatal(err, len(ds))
	}
	t.Logf("%+v token=%d", ds[0].Message, ds[0].Token)
	ref := broker.LeaseRef{Queue: "q", ID: "a", Token: ds[0].Token}
	if errs, err := b.Extend(ctx, []broker.LeaseRef{ref}, time.Second); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	if err := b.SetResult(ctx, ref, []byte("res")); err != nil {
		t.Fatal(err)
	}
	errs, err = b.Settle(ctx, []broker.Settlement{{Lease: ref, Outcome: broker.OutcomeRetry, Message: ds[0].Message, Err: "boom", RetryAt: now.Add(50 * time.Millisecond), At: now}})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	got, err := b.GetTask(ctx, "q", "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after retry: %+v", got)
	time.Sleep(60 * time.Millisecond)
	res, err := b.Maintain(ctx, broker.MaintainRequest{Queue: "q", Owner: "me", OwnerTTL: time.Second, Now: time.Now()})
	t.Logf("maintain: %+v %v", res, err)
	ds, err = b.Dequeue(ctx, []string{"q"}, 10, time.Second)
	if err != nil || len(ds) != 1 || ds[0].Token != 2 {
		t.Fatal(err, len(ds))
	}
	errs, err = b.Settle(ctx, []broker.Settlement{{Lease: ref, Outcome: broker.OutcomeDone}})
	if err != nil || errs[0] != broker.ErrLeaseLost {
		t.Fatal(err, errs)
	}
	if err := b.Delete(ctx, "q", "a"); err != broker.ErrTaskActive {
		t.Fatal(err)
	}
	ref.Token = 2
	errs, err = b.Settle(ctx, []broker.Settlement{{Lease: ref, Outcome: broker.OutcomeDone, Message: ds[0].Message}})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	if _, err := b.GetTask(ctx, "q", "a"); err != broker.ErrTaskNotFound {
		t.Fatal(err)
	}
}

func TestPartitionMismatchIsRefused(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	a := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(4))
	b := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix))
	m := func(id string) []*broker.Message {
		return []*broker.Message{{ID: id, Queue: "q", Type: "t", State: broker.StatePending, ProcessAt: time.Now()}}
	}
	if _, err := a.Enqueue(ctx, m("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Enqueue(ctx, m("2")); err == nil || !strings.Contains(err.Error(), "4 partitions") {
		t.Fatalf("mismatched Enqueue = %v", err)
	}
	if _, err := b.Maintain(ctx, broker.MaintainRequest{Queue: "q", Owner: "x", OwnerTTL: time.Second, Now: time.Now()}); err == nil {
		t.Fatal("mismatched Maintain succeeded")
	}
}
