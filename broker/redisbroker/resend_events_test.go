package redisbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
)

// A state change whose reply is lost is sent again; the second run answers
// from the reply cache and records no second event: one enqueued, one
// started, one succeeded.
func TestResentCallsRecordOneEvent(t *testing.T) {
	t.Parallel()
	f := newFaulty(t, redisbroker.WithEvents(true))
	ctx := context.Background()
	resend := func(what string, call func()) {
		t.Helper()
		seen := f.proxy.Seen("EVALSHA")
		f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
		call()
		if f.proxy.Seen("EVALSHA") < seen+2 {
			t.Fatalf("%s was not sent again", what)
		}
	}
	var id string
	resend("enqueue", func() {
		info, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"))
		if err != nil {
			t.Fatal(err)
		}
		id = info.ID
	})
	var ds []*broker.Delivery
	resend("dequeue", func() {
		var err error
		ds, err = f.b.Dequeue(ctx, []string{"q"}, 1, time.Minute)
		if err != nil || len(ds) != 1 || ds[0].Task.ID != id {
			t.Fatalf("Dequeue: %v %v", ds, err)
		}
	})
	resend("settle", func() {
		errs, err := f.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task, At: time.Now()}})
		if err != nil || errs[0] != nil {
			t.Fatalf("Settle: %v %v", errs, err)
		}
	})
	// A marker after them: every event of the task is read before it.
	marker, err := f.c.Enqueue(ctx, tide.NewTask("marker", nil), tide.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	evs, err := tide.NewInspector(f.b).Events(rctx, tide.EventsFrom{Queues: []string{"q"}, After: tide.EventsOldest})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for ev := range evs {
		if ev.TaskID == marker.ID {
			break
		}
		if ev.TaskID == id {
			kinds = append(kinds, ev.Kind.String())
		}
	}
	if got := len(kinds); got != 3 || kinds[0] != "enqueued" || kinds[1] != "started" || kinds[2] != "succeeded" {
		t.Fatalf("events of the task: %v, want enqueued, started, succeeded once each", kinds)
	}
}
