package redisbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/tidetype"
)

// A signal whose reply came after the read timeout (a Redis stall) is sent
// again by go-redis: it is delivered once, and the sender hears what the
// first run did (delivered), not ErrSignalSent from the second run.
func TestResentSignalDeliveredOnce(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	info, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := f.b.Dequeue(ctx, []string{"q"}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	park := broker.Settlement{Lease: ds[0].Lease(), Kind: broker.SettlePark, RetryAt: time.Now().Add(time.Hour), WaitFor: "signal:paid"}
	if errs, err := f.b.Settle(ctx, []broker.Settlement{park}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	// Load signal.lua, so that the fault below hits the signal itself.
	if err := f.c.Signal(ctx, "q", "nobody", "x", nil); err == nil {
		t.Fatal("a signal to no task was accepted")
	}
	seen := f.proxy.Seen("EVALSHA")
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	if err := f.c.Signal(ctx, "q", info.ID, "paid", map[string]int{"amount": 7}); err != nil {
		t.Fatalf("a re-sent Signal: %v, want delivered", err)
	}
	if f.proxy.Seen("EVALSHA") < seen+2 {
		t.Fatal("the signal was not sent again")
	}
	got, err := f.b.GetTask(ctx, "q", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != tidetype.StatePending {
		t.Fatalf("after a re-sent signal the task is %v, want pending", got.State)
	}
	n := 0
	for _, s := range got.Steps {
		if s.Name == "signal:paid" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("signal stored %d times: %+v", n, got.Steps)
	}
	if l, _ := f.direct.LLen(ctx, f.prefix+":{q:0}:pending").Result(); l != 1 {
		t.Fatalf("pending list holds %d entries, want the woken task once", l)
	}
	// A second signal of the name, sent on its own, is refused.
	if err := f.c.Signal(ctx, "q", info.ID, "paid", nil); err == nil {
		t.Fatal("a second signal of the name was accepted")
	}
}

// A re-sent Dequeue hands out the durable records of the task it leased,
// as the first run would have: the handler replays its steps from them.
func TestResentDequeueBringsSteps(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	info, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := f.b.Dequeue(ctx, []string{"q"}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	step := broker.StepRecord{Kind: broker.StepResult, Name: "charge", Data: []byte("int\n7")}
	if _, err := f.b.SaveStep(ctx, ds[0].Lease(), step); err != nil {
		t.Fatal(err)
	}
	retry := broker.Settlement{Lease: ds[0].Lease(), Kind: broker.SettleRetry, RetryAt: time.Now().Add(-time.Second), Err: "again"}
	if errs, err := f.b.Settle(ctx, []broker.Settlement{retry}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	seen := f.proxy.Seen("EVALSHA")
	ds, err = f.b.Dequeue(ctx, []string{"q"}, 1, time.Minute)
	if err != nil || len(ds) != 1 || ds[0].Task.ID != info.ID {
		t.Fatalf("a re-sent Dequeue: %v, %v", ds, err)
	}
	if f.proxy.Seen("EVALSHA") < seen+2 {
		t.Fatal("the dequeue was not sent again")
	}
	d := ds[0]
	if !d.StepsLoaded || len(d.Steps) != 1 || d.Steps[0].Name != "charge" || string(d.Steps[0].Data) != "int\n7" {
		t.Fatalf("the re-sent Dequeue's delivery: StepsLoaded %v, Steps %+v; want the stored step", d.StepsLoaded, d.Steps)
	}
}
