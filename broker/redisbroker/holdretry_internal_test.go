package redisbroker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// An enqueue of a grouped task with a free ID refused by a repartition's
// hold waits for the new layout; a read of the layout that fails for a
// moment meanwhile (the straddle of the repartition's recording that
// loadLayout did not read again before, a connection lost) is read again
// rather than ending the wait with the hold's refusal. Not parallel: it
// sets the package's hooks.
func TestHeldEnqueueReadsTheLayoutAgain(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	b := New(rdb, WithPrefix(redistest.Prefix(t)), WithPartitions(6))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q = "heldread"
	msg := func(id, g string) *tidetype.TaskInfo {
		now := time.Now()
		return &tidetype.TaskInfo{ID: id, Queue: q, Type: "t", Payload: []byte(id), State: tidetype.StatePending, MaxRetry: 3, NextProcessAt: now, EnqueuedAt: now, Group: g}
	}
	if errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{msg("first", "shop-7")}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatalf("Enqueue: %v %v", errs, err)
	}
	failed := make(chan struct{})
	read := func(queue string) error {
		if queue != q {
			return nil
		}
		afterLayoutRead.Store(nil)
		close(failed)
		return fmt.Errorf("%w: the connection was lost for a moment", broker.ErrUnavailable)
	}
	armed := false
	claim := func(id string) error {
		if id == "order-cancel:42" && !armed {
			armed = true
			// The store that follows meets the hold; the wait for the
			// new layout reads it next.
			afterLayoutRead.Store(&read)
		}
		return nil
	}
	afterClaim.Store(&claim)
	t.Cleanup(func() { afterClaim.Store(nil); afterLayoutRead.Store(nil); afterHold = nil })
	done := make(chan error, 1)
	afterHold = func(queue string) {
		if queue != q {
			return
		}
		go func() {
			errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{msg("order-cancel:42", "shop-7")}, broker.EnqueueOptions{})
			if err == nil {
				err = errs[0]
			}
			done <- err
		}()
		select {
		case <-failed:
		case err := <-done:
			t.Errorf("the held enqueue ended before it read the layout: %v", err)
			done <- err
		}
	}
	if err := b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Enqueue whose wait for the new layout read it in vain once: %v", err)
	}
	if got, err := b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}
}
