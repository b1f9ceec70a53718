package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// enqueueReplace enqueues m with EnqueueOptions.Replace and returns its
// error.
func enqueueReplace(t *testing.T, b broker.Broker, m *tidetype.TaskInfo) error {
	t.Helper()
	errs, err := b.Enqueue(t.Context(), []*tidetype.TaskInfo{m}, broker.EnqueueOptions{Replace: true})
	if err != nil {
		t.Fatalf("Enqueue with Replace: %v", err)
	}
	if len(errs) != 1 {
		t.Fatalf("Enqueue of 1 task returned %d errors", len(errs))
	}
	return errs[0]
}

// replacement returns a task with m's queue, ID and group and a new payload,
// header and MaxRetry.
func replacement(m *tidetype.TaskInfo) *tidetype.TaskInfo {
	r := newMsg(m.Queue, m.ID)
	r.Group = m.Group
	r.Payload = []byte("replaced " + m.ID)
	r.Headers = map[string]string{"v": "2"}
	r.MaxRetry = 9
	return r
}

// checkReplaced fails unless task id of queue holds r's payload, headers and
// MaxRetry and is in state st.
func checkReplaced(t *testing.T, b broker.Broker, r *tidetype.TaskInfo, st tidetype.TaskState) {
	t.Helper()
	got := get(t, b, r.Queue, r.ID)
	if string(got.Payload) != string(r.Payload) || got.Headers["v"] != "2" || got.MaxRetry != 9 || got.State != st || got.Group != r.Group {
		t.Fatalf("replaced task: Payload %q Headers %v MaxRetry %d State %v Group %q; want %q, v=2, 9, %v, %q",
			got.Payload, got.Headers, got.MaxRetry, got.State, got.Group, r.Payload, st, r.Group)
	}
}

// testReplace: with EnqueueOptions.Replace a task with an existing ID
// replaces a waiting one (pending, scheduled, retry), which keeps its place
// in its group, and a finished one (completed, archived); an active one is
// an ID conflict; without an existing one the task is stored; without
// Replace nothing changes.
func testReplace(t *testing.T, b broker.Broker) {
	for _, st := range []tidetype.TaskState{tidetype.StatePending, tidetype.StateScheduled, tidetype.StateRetry, tidetype.StateCompleted, tidetype.StateArchived} {
		t.Run(st.String(), func(t *testing.T) {
			q := "replace-" + st.String()
			putInState(t, b, q, "x", st)
			r := replacement(newMsg(q, "x"))
			if err := enqueueReplace(t, b, r); err != nil {
				t.Fatalf("Replace of a %v task: %v", st, err)
			}
			checkReplaced(t, b, r, tidetype.StatePending)
			d := dequeueOne(t, b, q, time.Minute)
			if d.Task.ID != "x" || string(d.Task.Payload) != string(r.Payload) {
				t.Fatalf("dequeued %q with payload %q, want the replacement", d.Task.ID, d.Task.Payload)
			}
			if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
				t.Fatalf("after the replacement started Dequeue started %v too", idsOf(ds))
			}
		})
	}
	t.Run("ToScheduled", func(t *testing.T) {
		const q = "replace-to-scheduled"
		enqueue(t, b, newMsg(q, "x"))
		r := replacement(newMsg(q, "x"))
		r.State, r.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
		if err := enqueueReplace(t, b, r); err != nil {
			t.Fatalf("Replace: %v", err)
		}
		checkReplaced(t, b, r, tidetype.StateScheduled)
		if got := get(t, b, q, "x"); !sameTime(got.NextProcessAt, r.NextProcessAt) {
			t.Fatalf("replaced task ProcessAt = %v, want %v", got.NextProcessAt, r.NextProcessAt)
		}
		if ds := dequeue(t, b, []string{q}, 10, time.Minute); len(ds) != 0 {
			t.Fatalf("a task replaced by a scheduled one was dequeued")
		}
	})
	t.Run("Active", func(t *testing.T) {
		const q = "replace-active"
		putInState(t, b, q, "x", tidetype.StateActive)
		if err := enqueueReplace(t, b, replacement(newMsg(q, "x"))); !errors.Is(err, broker.ErrTaskIDConflict) {
			t.Fatalf("Replace of an active task: %v, want ErrTaskIDConflict", err)
		}
		if got := get(t, b, q, "x"); got.State != tidetype.StateActive || string(got.Payload) != "payload of x" {
			t.Fatalf("after a refused Replace the task is %v with payload %q", got.State, got.Payload)
		}
	})
	t.Run("Absent", func(t *testing.T) {
		const q = "replace-absent"
		r := replacement(newMsg(q, "x"))
		if err := enqueueReplace(t, b, r); err != nil {
			t.Fatalf("Replace without a task to replace: %v", err)
		}
		checkReplaced(t, b, r, tidetype.StatePending)
	})
	t.Run("WithoutReplace", func(t *testing.T) {
		const q = "replace-not"
		enqueue(t, b, newMsg(q, "x"))
		if errs := enqueueErrs(t, b, replacement(newMsg(q, "x"))); !errors.Is(errs[0], broker.ErrTaskIDConflict) {
			t.Fatalf("Enqueue without Replace of an existing ID: %v, want ErrTaskIDConflict", errs[0])
		}
		if got := get(t, b, q, "x"); string(got.Payload) != "payload of x" {
			t.Fatalf("a refused Enqueue changed the payload to %q", got.Payload)
		}
	})
	t.Run("KeepsPlace", func(t *testing.T) {
		// A grouped task replaced while pending or scheduled keeps its
		// place in its group's enqueue order.
		const q = "replace-place"
		ms := gmsgs(q, "t", "G", 4)
		ms[0].State, ms[0].NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
		enqueue(t, b, ms...)
		for _, m := range []*tidetype.TaskInfo{ms[0], ms[2]} {
			r := replacement(m)
			if err := enqueueReplace(t, b, r); err != nil {
				t.Fatalf("Replace of %s: %v", m.ID, err)
			}
			checkReplaced(t, b, r, tidetype.StatePending)
		}
		for i, m := range ms {
			d := dequeueOne(t, b, q, time.Minute)
			if d.Task.ID != m.ID {
				t.Fatalf("start %d was %q, want %q: a replaced task keeps its place in its group", i, d.Task.ID, m.ID)
			}
			if replaced := i == 0 || i == 2; replaced != (string(d.Task.Payload) == "replaced "+m.ID) {
				t.Fatalf("task %s started with payload %q", m.ID, d.Task.Payload)
			}
		}
	})
}
