package redisbroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// A repartition moves a parked durable task with its records: after it,
// the task still waits, its steps are there, and its signal wakes it.
func TestRepartitionMovesDurableRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	const q = "durmove"
	var ids []string
	for i := range 20 {
		m := &tidetype.TaskInfo{ID: fmt.Sprintf("d%02d", i), Queue: q, Type: "t", MaxRetry: 1, State: tidetype.StatePending}
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, m)
		ids = append(ids, m.ID)
	}
	for range ids {
		ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatal(ds, err)
		}
		d := ds[0]
		if _, err := e.b.SaveStep(ctx, d.Lease(), broker.StepRecord{Kind: broker.StepResult, Name: "reserve", Data: []byte("int\n1")}); err != nil {
			t.Fatal(err)
		}
		park := broker.Settlement{Lease: d.Lease(), Kind: broker.SettlePark, RetryAt: time.Now().Add(time.Hour), WaitFor: "signal:paid"}
		if errs, err := e.b.Settle(ctx, []broker.Settlement{park}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
	}
	if err := e.b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		got, err := e.b.GetTask(ctx, q, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != tidetype.StateWaiting || got.WaitingFor != "signal:paid" || len(got.Steps) != 1 || got.Steps[0].Name != "reserve" {
			t.Fatalf("after the repartition %s: state %v, waiting for %q, steps %+v", id, got.State, got.WaitingFor, got.Steps)
		}
	}
	if err := e.b.Signal(ctx, q, ids[0], "paid", []byte("1")); err != nil {
		t.Fatalf("Signal after the repartition: %v", err)
	}
	var d *broker.Delivery
	for p := range 3 {
		if _, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: p, Owner: "o", OwnerTTL: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("the signalled task after the repartition: %v, %v", ds, err)
	}
	d = ds[0]
	rs, err := e.b.LoadSteps(ctx, d.Lease())
	if err != nil || len(rs) < 2 {
		t.Fatalf("LoadSteps after the repartition = %+v, %v", rs, err)
	}
}
