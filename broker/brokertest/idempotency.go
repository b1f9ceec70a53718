package brokertest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// testIdempotencyKey: a second Enqueue with a key already used in the queue
// stores nothing and answers with the first task's ID, whether the first
// task still waits or finished and is gone; the key is per queue; in one
// batch the second use of a key already sees the first.
func testIdempotencyKey(t *testing.T, b broker.Broker) {
	withKey := func(queue, id, key string) *tidetype.TaskInfo {
		m := newMsg(queue, id)
		m.IdempotencyKey = key
		return m
	}
	first := withKey("q", "", "req-1")
	enqueue(t, b, first)
	if first.ID == "" {
		t.Fatal("Enqueue left the broker-chosen ID empty")
	}

	again := withKey("q", "", "req-1")
	again.Payload = []byte("a different body")
	enqueue(t, b, again)
	if again.ID != first.ID {
		t.Fatalf("repeated key: ID %q, want the first task's %q", again.ID, first.ID)
	}
	if got := get(t, b, "q", first.ID); string(got.Payload) != "payload of " {
		t.Fatalf("the first task's payload became %q", got.Payload)
	}

	other := withKey("other", "", "req-1")
	enqueue(t, b, other)
	if got := get(t, b, "other", other.ID); got.ID == "" {
		t.Fatal("the key in another queue stored nothing")
	}

	// One batch: the second element sees the first.
	x, y := withKey("q", "", "req-2"), withKey("q", "", "req-2")
	enqueue(t, b, x, y)
	if x.ID == "" || y.ID != x.ID {
		t.Fatalf("one batch, one key: IDs %q and %q, want one ID", x.ID, y.ID)
	}

	// The caller's ID as the key: a repeat is not a conflict.
	own := withKey("q", "order-1", "order-1")
	enqueue(t, b, own)
	rep := withKey("q", "order-1", "order-1")
	if errs := enqueueErrs(t, b, rep); errs[0] != nil {
		t.Fatalf("repeated TaskID with the ID as its key: %v, want nil", errs[0])
	}

	ds := dequeue(t, b, []string{"q"}, 10, time.Minute)
	if len(ds) != 3 {
		t.Fatalf("queue q holds %d tasks, want 3 (req-1, req-2, order-1)", len(ds))
	}
	// Finished and deleted: the key still answers with the old ID.
	for _, d := range ds {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	late := withKey("q", "", "req-1")
	enqueue(t, b, late)
	if late.ID != first.ID {
		t.Fatalf("key of a finished task: ID %q, want %q", late.ID, first.ID)
	}
	if _, err := b.GetTask(t.Context(), "q", first.ID); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("the finished task came back: GetTask error %v", err)
	}
	if n := len(dequeue(t, b, []string{"q"}, 10, time.Minute)); n != 0 {
		t.Fatalf("a repeated key stored %d new tasks", n)
	}

	long := withKey("q", "", strings.Repeat("k", 256))
	if errs, err := b.Enqueue(t.Context(), []*tidetype.TaskInfo{long}, broker.EnqueueOptions{}); err == nil && (len(errs) != 1 || !errors.Is(errs[0], broker.ErrInvalidTask)) {
		t.Fatalf("a 256-byte key: errors %v, want ErrInvalidTask", errs)
	} else if err != nil && !errors.Is(err, broker.ErrInvalidTask) {
		t.Fatalf("a 256-byte key: %v, want ErrInvalidTask", err)
	}
}
