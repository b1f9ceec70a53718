package membroker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// gmsg returns a pending task of group g with ID "<id>{<g>}".
func (e *env) gmsg(id, g string) *tidetype.TaskInfo {
	m := e.msg(id + "{" + g + "}")
	m.Group = g
	return m
}

func (e *env) limits(l tidetype.QueueLimits) {
	e.t.Helper()
	if err := e.b.SetQueueLimits(e.t.Context(), "q", l); err != nil {
		e.t.Fatalf("SetQueueLimits: %v", err)
	}
}

// TestGroupRateExactWithFakeClock: a group's rate window is exact to the
// millisecond, and a refused Dequeue announces when the group may start.
func TestGroupRateExactWithFakeClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch, err := e.b.Subscribe(t.Context(), []string{"q"})
	if err != nil {
		t.Fatal(err)
	}
	e.limits(tidetype.QueueLimits{GroupRate: tidetype.Rate{Limit: 2, Per: time.Second}})
	for i := range 4 {
		e.mustEnqueue(e.gmsg(fmt.Sprint("a", i), "A"))
	}
	start := e.clk.Now()
	if ds := e.dequeue(10, time.Minute); len(ds) != 2 {
		t.Fatalf("Dequeue under GroupRate 2/s started %d", len(ds))
	}
	announced := false
	for len(ch) > 0 {
		if ev := <-ch; ev.Kind == broker.EventPending && ev.At.Equal(start.Add(time.Second)) {
			announced = true
		}
	}
	if !announced {
		t.Fatal("no EventPending announcing when the group may start again")
	}
	e.clk.Add(999 * time.Millisecond)
	if ds := e.dequeue(10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue 999ms after 2 starts under GroupRate 2/s started %d", len(ds))
	}
	e.clk.Add(time.Millisecond)
	if ds := e.dequeue(10, time.Minute); len(ds) != 2 {
		t.Fatalf("Dequeue a window after the first starts started %d, want 2", len(ds))
	}
}

// TestThrottleWithFakeClock: a throttled group starts nothing before the
// throttle ends; Groups reports it until then.
func TestThrottleWithFakeClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustEnqueue(e.gmsg("a1", "A"))
	until := e.clk.Now().Add(time.Minute)
	if err := e.settle(e.one(time.Hour), broker.SettleDefer, func(s *broker.Settlement) {
		s.RetryAt, s.Throttle = until, true
	}); err != nil {
		t.Fatal(err)
	}
	e.mustEnqueue(e.gmsg("a2", "A"))
	e.clk.Add(time.Minute - time.Millisecond)
	if ds := e.dequeue(10, time.Minute); len(ds) != 0 {
		t.Fatalf("throttled group started %s", ds[0].Task.ID)
	}
	gs, err := e.b.Groups(t.Context(), "q", 10)
	if err != nil || len(gs) != 1 || !gs[0].ThrottledUntil.Equal(until) || gs[0].Waiting != 1 {
		t.Fatalf("Groups = %+v, %v; want A throttled until %v with 1 waiting", gs, err, until)
	}
	e.clk.Add(time.Millisecond)
	if d := e.one(time.Minute); d.Task.ID != "a2{A}" {
		t.Fatalf("after the throttle started %s, want a2{A} (a1 waits for Maintain)", d.Task.ID)
	}
	if gs, _ := e.b.Groups(t.Context(), "q", 10); len(gs) != 1 || !gs[0].ThrottledUntil.IsZero() || gs[0].Running != 1 {
		t.Fatalf("Groups after the throttle = %+v", gs)
	}
}

// TestGroupWakesOnRelease: a settlement that gives a full group room back
// announces pending work although other tasks were pending all along.
func TestGroupWakesOnRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.limits(tidetype.QueueLimits{GroupConcurrency: 1})
	e.mustEnqueue(e.gmsg("a1", "A"), e.gmsg("a2", "A"))
	d := e.one(time.Minute)
	if ds := e.dequeue(10, time.Minute); len(ds) != 0 {
		t.Fatalf("Dequeue at the group's limit started %d", len(ds))
	}
	ch, err := e.b.Subscribe(t.Context(), []string{"q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.settle(d, broker.SettleDone, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		if ev.Kind != broker.EventPending {
			t.Fatalf("event %+v, want pending", ev)
		}
	default:
		t.Fatal("no event when the group got room back")
	}
}

// TestGroupsForgotten: a group with nothing left disappears from Groups;
// Maintain then drops what it kept of it, and the queue can be deleted.
func TestGroupsForgotten(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.limits(tidetype.QueueLimits{Ordered: true, GroupRate: tidetype.Rate{Limit: 5, Per: time.Second}})
	e.mustEnqueue(e.gmsg("a1", "A"))
	if err := e.settle(e.one(time.Minute), broker.SettleDone, nil); err != nil {
		t.Fatal(err)
	}
	if gs, err := e.b.Groups(t.Context(), "q", 10); err != nil || len(gs) != 0 {
		t.Fatalf("Groups = %+v, %v; want none", gs, err)
	}
	e.clk.Add(time.Second)
	e.maintain()
	if err := e.b.DeleteQueue(t.Context(), "q"); err != nil {
		t.Fatalf("DeleteQueue: %v", err)
	}
}
