package redisbroker

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// An enqueue of a grouped task with a free ID refused by a repartition's
// hold waits for the new layout; when its read of the layout straddles the
// repartition recording it (the registry read before, the partitions'
// meta keys after they were marked) the read fails for that moment, and
// the enqueue reads again rather than return the hold's refusal. Not
// parallel: it sets the package's hooks.
func TestHeldEnqueueReadsTheLayoutAgain(t *testing.T) {
	rdb := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	b := New(rdb, WithPrefix(prefix), WithPartitions(6))
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

	// marked reports whether every old partition has been told of the
	// repartition (markOld).
	marked := func() bool {
		for i := range 6 {
			m, err := rdb.Get(ctx, prefix+":{"+q+":"+strconv.Itoa(i)+"}:meta").Result()
			if err != nil || m != "6>3@1" {
				return false
			}
		}
		return true
	}
	recording := make(chan struct{})
	var straddled bool
	read := func(queue string) {
		if queue != q || straddled {
			return
		}
		straddled = true
		afterLayoutRead.Store(nil)
		// The registry was read (the old layout): let the repartition
		// record its layout and mark the old partitions before the
		// meta keys are read.
		close(recording)
		for deadline := time.Now().Add(10 * time.Second); !marked(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("the old partitions were not marked")
				return
			}
		}
	}
	claim := func(id string) error {
		if id == "order-cancel:42" {
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
		case <-recording:
		case err := <-done:
			t.Errorf("the held enqueue ended before it read the layout: %v", err)
		}
	}
	if err := b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Enqueue whose wait for the new layout read it as it was recorded: %v", err)
	}
	if !straddled {
		t.Fatal("the wait's read of the layout did not straddle its recording")
	}
	if got, err := b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}
}
