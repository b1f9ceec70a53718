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

func testMixedBatch(t *testing.T, b broker.Broker) {
	key := "mixed-key"
	holder := newMsg("q", uniqueID(t, b, "q", "holder", key))
	holder.UniqueKey, holder.UniqueTTL = key, time.Hour
	enqueue(t, b, newMsg("q", "existing"), holder)

	dupUnique := newMsg("q", uniqueID(t, b, "q", "dup-unique", key))
	dupUnique.UniqueKey, dupUnique.UniqueTTL = key, time.Hour
	batch := []*tidetype.TaskInfo{
		newMsg("q", "a"),
		newMsg("q", "existing"),
		newMsg("q", "b"),
		dupUnique,
		newMsg("q", "a"), // conflicts with the first element of this batch
		newMsg("other", "a"),
	}
	errs := enqueueErrs(t, b, batch...)
	want := []error{nil, broker.ErrTaskIDConflict, nil, broker.ErrDuplicateTask, broker.ErrTaskIDConflict, nil}
	for i := range want {
		if want[i] == nil && errs[i] != nil || want[i] != nil && !errors.Is(errs[i], want[i]) {
			t.Errorf("element %d (%s/%s): error %v, want %v", i, batch[i].Queue, batch[i].ID, errs[i], want[i])
		}
	}
	for _, ref := range [][2]string{{"q", "a"}, {"q", "b"}, {"other", "a"}, {"q", "existing"}} {
		get(t, b, ref[0], ref[1])
	}
	if _, err := b.GetTask(t.Context(), "q", dupUnique.ID); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Errorf("refused unique task: GetTask error %v, want ErrTaskNotFound", err)
	}
	if n := len(dequeue(t, b, []string{"q"}, 10, time.Minute)); n != 4 {
		t.Errorf("queue q has %d pending tasks, want 4 (existing, holder, a, b)", n)
	}
}

func testUnique(t *testing.T, b broker.Broker) {
	// Each case uses its own queue (the lock is per queue). A case leaves the
	// first task in some state; the lock is then held or released.
	cases := []struct {
		name      string
		retention time.Duration
		dequeue   bool // the first task is dequeued before finish runs
		finish    func(t *testing.T, q string, d *broker.Delivery, id string)
		released  bool
	}{
		{name: "HeldWhilePending", finish: func(*testing.T, string, *broker.Delivery, string) {}},
		{name: "HeldWhileActive", dequeue: true, finish: func(*testing.T, string, *broker.Delivery, string) {}},
		{name: "HeldThroughRetry", dequeue: true, finish: func(t *testing.T, q string, d *broker.Delivery, id string) {
			settleOK(t, b, retryOf(d, time.Now().Add(time.Hour), "boom"))
		}},
		{name: "HeldThroughRequeue", dequeue: true, finish: func(t *testing.T, q string, d *broker.Delivery, id string) {
			settleOK(t, b, outcomeOf(d, broker.SettleRequeue))
		}},
		{name: "ReleasedOnDone", dequeue: true, released: true, finish: func(t *testing.T, q string, d *broker.Delivery, id string) {
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
		}},
		{name: "ReleasedOnDoneWithRetention", retention: time.Hour, dequeue: true, released: true, finish: func(t *testing.T, q string, d *broker.Delivery, id string) {
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
			if st := get(t, b, q, id).State; st != tidetype.StateCompleted {
				t.Fatalf("task is %v, want completed", st)
			}
		}},
		{name: "ReleasedOnArchive", dequeue: true, released: true, finish: func(t *testing.T, q string, d *broker.Delivery, id string) {
			s := outcomeOf(d, broker.SettleArchive)
			s.Err = "bad"
			settleOK(t, b, s)
		}},
		{name: "ReleasedOnDelete", released: true, finish: func(t *testing.T, q string, d *broker.Delivery, id string) {
			if err := b.Delete(t.Context(), q, id); err != nil {
				t.Fatalf("Delete: %v", err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			q := "unique-" + c.name
			key := "key-" + c.name
			first := newMsg(q, uniqueID(t, b, q, "first", key))
			first.UniqueKey, first.UniqueTTL = key, time.Hour
			first.Retention = c.retention
			enqueue(t, b, first)

			second := newMsg(q, uniqueID(t, b, q, "second", key))
			second.UniqueKey, second.UniqueTTL = key, time.Hour
			if errs := enqueueErrs(t, b, second); !errors.Is(errs[0], broker.ErrDuplicateTask) {
				t.Fatalf("second task with the lock held: error %v, want ErrDuplicateTask", errs[0])
			}
			// The lock is per queue.
			elsewhere := cloneMsg(second)
			elsewhere.Queue = q + "-other"
			elsewhere.ID = uniqueID(t, b, elsewhere.Queue, "elsewhere", key)
			enqueue(t, b, elsewhere)

			var d *broker.Delivery
			if c.dequeue {
				d = dequeueOne(t, b, q, time.Minute)
			}
			c.finish(t, q, d, first.ID)

			errs := enqueueErrs(t, b, second)
			if c.released && errs[0] != nil {
				t.Fatalf("after the first task finished: error %v, want the lock released", errs[0])
			}
			if !c.released && !errors.Is(errs[0], broker.ErrDuplicateTask) {
				t.Fatalf("while the first task is unfinished: error %v, want ErrDuplicateTask", errs[0])
			}
		})
	}
}

func testUniqueExpires(t *testing.T, b broker.Broker) {
	const ttl = 300 * time.Millisecond
	key := "expiring"
	first := newMsg("q", uniqueID(t, b, "q", "first", key))
	first.UniqueKey, first.UniqueTTL = key, ttl
	start := time.Now()
	enqueue(t, b, first)

	second := newMsg("q", uniqueID(t, b, "q", "second", key))
	second.UniqueKey, second.UniqueTTL = key, ttl
	errs := enqueueErrs(t, b, second)
	if errs[0] == nil && time.Since(start) < ttl {
		t.Fatalf("second task accepted while the lock (ttl %v) was held", ttl)
	}
	if errs[0] != nil && !errors.Is(errs[0], broker.ErrDuplicateTask) {
		t.Fatalf("second task: error %v, want ErrDuplicateTask", errs[0])
	}
	if errs[0] == nil {
		return // the machine was too slow to tell; the lock has expired anyway
	}
	eventually(t, waitLong, "the unique lock to expire", func() bool {
		errs := enqueueErrs(t, b, second)
		if errs[0] != nil && !errors.Is(errs[0], broker.ErrDuplicateTask) {
			t.Fatalf("second task: error %v, want ErrDuplicateTask or nil", errs[0])
		}
		return errs[0] == nil
	})
	if time.Since(start) < ttl {
		t.Fatalf("lock released after %v, before its ttl %v", time.Since(start), ttl)
	}
	// The first task is still there, pending.
	if st := get(t, b, "q", first.ID).State; st != tidetype.StatePending {
		t.Fatalf("first task is %v, want pending", st)
	}
}
