package tide_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
)

// gate is a broker whose calls can be held, as a paused process holds them
// (a long GC pause, a stopped VM, a network stall): while held, every call
// waits; on release each goes out as if the process had just resumed (with a
// fresh context, since the process never saw its deadline pass).
type gate struct {
	broker.Broker

	mu      sync.Mutex
	closed  chan struct{} // open while held
	settled []error       // answers to settlements that were held
}

func newGate(b broker.Broker) *gate { return &gate{Broker: b} }

func (g *gate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// wait blocks while the gate is held and reports whether it did.
func (g *gate) wait() bool {
	g.mu.Lock()
	c := g.closed
	g.mu.Unlock()
	if c == nil {
		return false
	}
	<-c
	return true
}

func (g *gate) Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	if g.wait() {
		ctx = context.WithoutCancel(ctx)
	}
	return g.Broker.Dequeue(ctx, queues, n, lease)
}

func (g *gate) Extend(ctx context.Context, leases []broker.LeaseRef, d time.Duration) ([]error, error) {
	if g.wait() {
		ctx = context.WithoutCancel(ctx)
	}
	return g.Broker.Extend(ctx, leases, d)
}

func (g *gate) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	held := g.wait()
	if held {
		ctx = context.WithoutCancel(ctx)
	}
	errs, err := g.Broker.Settle(ctx, ss)
	if held {
		g.mu.Lock()
		g.settled = append(g.settled, errs...)
		if err != nil {
			g.settled = append(g.settled, err)
		}
		g.mu.Unlock()
	}
	return errs, err
}

func (g *gate) heldSettlements() []error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]error(nil), g.settled...)
}

func (g *gate) Maintain(ctx context.Context, req broker.MaintainRequest) (broker.MaintainResult, error) {
	if g.wait() {
		ctx = context.WithoutCancel(ctx)
	}
	return g.Broker.Maintain(ctx, req)
}

// The documented order-cancel pattern re-creates task IDs all the time
// (TaskID("order-cancel:42") after the old timer ran or was deleted). A
// worker paused longer than its lease still holds the old task's fencing
// token when it wakes up; its late "done" must not touch the new task with
// the same ID, which must run to completion.
func TestRecreatedTaskIDRefusesTheOldWorker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const id = "order-cancel:42"

	// Server A runs the first incarnation, then is paused.
	g := newGate(e.broker())
	aRunning := make(chan struct{})
	aRelease := make(chan struct{})
	a := tide.NewServer(g, tide.Config{LeaseDuration: time.Second, Logger: testLogger(t)})
	if err := a.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		close(aRunning)
		<-aRelease
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Shutdown)
	if _, err := e.c.Enqueue(ctx, tide.NewTask("cancel", []byte("v1")), tide.TaskID(id)); err != nil {
		t.Fatal(err)
	}
	<-aRunning
	g.hold()        // A is paused: its renewals and its settlement wait
	close(aRelease) // ... its handler finished; the "done" is held

	// A's lease expires and the task is recovered (here by a third party).
	testwait.For(t, 10*time.Second, "the paused worker's lease to be recovered", func() bool {
		r, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: "default", Owner: "recoverer", OwnerTTL: time.Second, RecoverBackoff: time.Hour})
		return err == nil && r.Recovered == 1
	})
	// The order is paid, then a new cancel timer is set: same ID, new task.
	if err := e.c.Delete(ctx, "default", id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("cancel", []byte("v2")), tide.TaskID(id)); err != nil {
		t.Fatal(err)
	}
	bRunning := make(chan string, 1)
	bRelease := make(chan struct{})
	var bDone atomic.Bool
	e.server(tide.Config{LeaseDuration: 5 * time.Second}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		bRunning <- string(task.Payload())
		<-bRelease
		bDone.Store(true)
		return nil
	}))
	if p := <-bRunning; p != "v2" {
		t.Fatalf("server B ran %q, want v2", p)
	}

	// A wakes up while B runs the new task: its stale "done" is refused.
	g.release()
	testwait.For(t, 10*time.Second, "the paused worker's settlement to be answered", func() bool {
		return len(g.heldSettlements()) > 0
	})
	if errs := g.heldSettlements(); len(errs) != 1 || !errors.Is(errs[0], tide.ErrLeaseLost) {
		t.Fatalf("the stale settlement was answered %v, want ErrLeaseLost", errs)
	}
	if ti := e.info("default", id); ti.State != tide.StateActive || string(ti.Payload) != "v2" {
		t.Fatalf("the new task after the stale settlement: %+v, want v2 still active", ti)
	}
	close(bRelease)
	e.waitGone("default", id)
	if !bDone.Load() {
		t.Fatal("the new task vanished before its handler finished")
	}
}
