package brokertest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// followTests check that every way a followed task ends (broker/followup.go)
// stores its follow-up once, in the same step, and that nothing else does.
var followTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker)
}{
	{"FollowupEveryEnd", testFollowupEveryEnd},
	{"FollowupNotAnEnd", testFollowupNotAnEnd},
	{"FollowupInternal", testFollowupInternal},
	{"FollowupAdmin", testFollowupAdmin},
	{"FollowupKept", testFollowupKept},
	{"CancelStepTask", testCancelStepTask},
}

// stepMsg returns a pending task of queue that is step s of workflow wf,
// with a NotifyURL when url is not empty.
func stepMsg(queue, id, wf, s, url string) *tidetype.TaskInfo {
	m := newMsg(queue, id)
	m.Headers = map[string]string{"traceparent": "00-x"}
	if wf != "" {
		m.Headers[broker.FlowHeader], m.Headers[broker.StepHeader] = "w:"+wf, s
	}
	if url != "" {
		m.Headers[broker.NotifyHeader] = url
	}
	return m
}

// followups dequeues everything pending in queue (settling each done) and
// returns the follow-ups among it, parsed; it fails on anything else that
// is not in others.
func followups(t *testing.T, b broker.Broker, queue string, others ...string) []broker.Ending {
	t.Helper()
	var out []broker.Ending
	for {
		ds := dequeue(t, b, []string{queue}, 100, time.Minute)
		if len(ds) == 0 {
			return out
		}
		for _, d := range ds {
			switch d.Task.Type {
			case broker.FlowType, broker.NotifyType:
				if !d.Internal {
					t.Fatalf("follow-up %s delivered without the internal mark", d.Task.ID)
				}
				if !strings.HasPrefix(d.Task.ID, broker.ReservedIDPrefix) {
					t.Fatalf("follow-up ID %q lacks the reserved prefix", d.Task.ID)
				}
				e, err := broker.ParseEnding(queue, d.Task.Payload)
				if err != nil {
					t.Fatalf("follow-up %s: %v", d.Task.ID, err)
				}
				if want, _ := broker.FollowupType(map[string]string{broker.FlowHeader: e.Flow, broker.NotifyHeader: e.Notify}); want != d.Task.Type {
					t.Fatalf("follow-up of type %s for %+v, want %s", d.Task.Type, e, want)
				}
				out = append(out, e)
			default:
				found := false
				for _, o := range others {
					found = found || o == d.Task.ID
				}
				if !found {
					t.Fatalf("dequeued %s, which is not a follow-up", d.Task.ID)
				}
			}
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
		}
	}
}

// oneFollowup checks that queue holds exactly one follow-up, of task id,
// with outcome and an error holding errPart, and returns it.
func oneFollowup(t *testing.T, b broker.Broker, queue, id string, outcome broker.Outcome, errPart string, others ...string) broker.Ending {
	t.Helper()
	fs := followups(t, b, queue, others...)
	if len(fs) != 1 {
		t.Fatalf("%d follow-ups in %s, want 1: %+v", len(fs), queue, fs)
	}
	e := fs[0]
	if e.TaskID != id || e.Outcome != outcome || e.Queue != queue || !strings.Contains(e.Err, errPart) || e.Type != taskType || e.At.IsZero() {
		t.Fatalf("follow-up %+v; want of %s, outcome %c, error with %q", e, id, outcome, errPart)
	}
	return e
}

// testFollowupEveryEnd: a settlement done (deleted or kept) or archived,
// lease recovery with no retries left or of a cancelled task, and Delete or
// Cancel of a waiting step: each stores one follow-up with the outcome.
func testFollowupEveryEnd(t *testing.T, b broker.Broker) {
	t.Run("Done", func(t *testing.T) {
		enqueue(t, b, stepMsg("fu-done", "a", "wf", "charge", "https://hooks.example.com/x?k=1"))
		settleOK(t, b, outcomeOf(dequeueOne(t, b, "fu-done", time.Minute), broker.SettleDone))
		e := oneFollowup(t, b, "fu-done", "a", broker.OutcomeCompleted, "")
		if e.Flow != "w:wf" || e.Step != "charge" || e.Notify != "https://hooks.example.com/x?k=1" || e.Err != "" {
			t.Fatalf("follow-up %+v", e)
		}
	})
	t.Run("DoneKept", func(t *testing.T) {
		m := stepMsg("fu-kept", "a", "", "", "https://hooks.example.com/")
		m.Retention = time.Hour
		enqueue(t, b, m)
		d := dequeueOne(t, b, "fu-kept", time.Minute)
		s := outcomeOf(d, broker.SettleDone)
		s.Task = d.Task
		settleOK(t, b, s)
		if e := oneFollowup(t, b, "fu-kept", "a", broker.OutcomeCompleted, ""); e.Flow != "" || e.Notify == "" {
			t.Fatalf("follow-up %+v", e)
		}
	})
	t.Run("Archived", func(t *testing.T) {
		enqueue(t, b, stepMsg("fu-arch", "a", "wf", "s", ""))
		s := outcomeOf(dequeueOne(t, b, "fu-arch", time.Minute), broker.SettleArchive)
		s.Err = "card declined"
		settleOK(t, b, s)
		oneFollowup(t, b, "fu-arch", "a", broker.OutcomeArchived, "card declined")
	})
	t.Run("RetryOfCancelled", func(t *testing.T) {
		enqueue(t, b, stepMsg("fu-canc", "a", "wf", "s", ""))
		d := dequeueOne(t, b, "fu-canc", time.Minute)
		if err := b.Cancel(t.Context(), "fu-canc", "a"); err != nil {
			t.Fatal(err)
		}
		settleOK(t, b, retryOf(d, time.Now(), "boom"))
		oneFollowup(t, b, "fu-canc", "a", broker.OutcomeArchived, "cancelled")
	})
	t.Run("LeaseExpiredNoRetries", func(t *testing.T) {
		m := stepMsg("fu-exp", "a", "wf", "s", "")
		m.MaxRetry = 0
		enqueue(t, b, m)
		dequeueOne(t, b, "fu-exp", 50*time.Millisecond)
		awaitRecovered(t, b, "fu-exp", 1)
		if got := get(t, b, "fu-exp", "a"); got.State != tidetype.StateArchived {
			t.Fatalf("a step whose lease expired with no retries left is %s, want archived by the broker itself", got.State)
		}
		oneFollowup(t, b, "fu-exp", "a", broker.OutcomeArchived, "lease expired")
	})
	t.Run("LeaseExpiredCancelled", func(t *testing.T) {
		enqueue(t, b, stepMsg("fu-expc", "a", "", "", "https://hooks.example.com/"))
		dequeueOne(t, b, "fu-expc", 50*time.Millisecond)
		if err := b.Cancel(t.Context(), "fu-expc", "a"); err != nil {
			t.Fatal(err)
		}
		awaitRecovered(t, b, "fu-expc", 1)
		oneFollowup(t, b, "fu-expc", "a", broker.OutcomeArchived, "cancelled")
	})
	for _, op := range []string{"Delete", "Cancel"} {
		t.Run(op+"WaitingStep", func(t *testing.T) {
			q := "fu-" + strings.ToLower(op)
			m := stepMsg(q, "a", "wf", "s", "")
			m.State, m.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
			enqueue(t, b, m)
			var err error
			if op == "Delete" {
				err = b.Delete(t.Context(), q, "a")
			} else {
				err = b.Cancel(t.Context(), q, "a")
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := get(t, b, q, "a"); got.State != tidetype.StateArchived {
				t.Fatalf("after %s a waiting step is %s, want archived", op, got.State)
			}
			want := "deleted by an operator"
			if op == "Cancel" {
				want = "cancelled"
			}
			oneFollowup(t, b, q, "a", broker.OutcomeArchived, want)
			// Deleting it now that it ended is no second end.
			if err := b.Delete(t.Context(), q, "a"); err != nil {
				t.Fatal(err)
			}
			if fs := followups(t, b, q); len(fs) != 0 {
				t.Fatalf("deleting an archived step stored follow-ups %+v", fs)
			}
		})
	}
	t.Run("DeleteWaitingNotification", func(t *testing.T) {
		enqueue(t, b, stepMsg("fu-delnote", "a", "", "", "https://hooks.example.com/"))
		if err := b.Delete(t.Context(), "fu-delnote", "a"); err != nil {
			t.Fatal(err)
		}
		if fs := followups(t, b, "fu-delnote"); len(fs) != 0 {
			t.Fatalf("a deleted task that never ran notified: %+v", fs)
		}
	})
}

// testFollowupNotAnEnd: a retry, a requeue and a deferral are not ends, and
// a task nobody follows gets no follow-up.
func testFollowupNotAnEnd(t *testing.T, b broker.Broker) {
	enqueue(t, b, stepMsg("fu-not", "a", "wf", "s", "https://hooks.example.com/"), newMsg("fu-not", "plain"))
	for _, d := range dequeue(t, b, []string{"fu-not"}, 2, time.Minute) {
		if d.Task.ID == "plain" {
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
			continue
		}
		settleOK(t, b, retryOf(d, time.Now().Add(-time.Millisecond), "boom"))
	}
	d := redeliver(t, b, "fu-not", time.Minute)
	settleOK(t, b, outcomeOf(d, broker.SettleRequeue))
	d = dequeueOne(t, b, "fu-not", time.Minute)
	s := outcomeOf(d, broker.SettleDefer)
	s.RetryAt = time.Now().Add(time.Hour)
	settleOK(t, b, s)
	if fs := followups(t, b, "fu-not"); len(fs) != 0 {
		t.Fatalf("retry, requeue, defer or a plain task stored follow-ups: %+v", fs)
	}
}

// testFollowupInternal: a follow-up is internal however it is handed out
// again (retried, archived and run again), and no enqueue takes its place.
func testFollowupInternal(t *testing.T, b broker.Broker) {
	enqueue(t, b, stepMsg("fu-int", "a", "", "", "https://hooks.example.com/"))
	d := dequeueOne(t, b, "fu-int", time.Minute)
	if d.Internal {
		t.Fatal("an enqueued task was delivered as internal")
	}
	settleOK(t, b, outcomeOf(d, broker.SettleDone))
	f := dequeueOne(t, b, "fu-int", time.Minute)
	if !f.Internal || f.Task.Type != broker.NotifyType {
		t.Fatalf("follow-up delivered as %+v (internal %v)", f.Task, f.Internal)
	}
	forged := newMsg("fu-int", f.Task.ID)
	if errs := enqueueErrsOpts(t, b, broker.EnqueueOptions{Replace: true}, forged); !errors.Is(errs[0], broker.ErrTaskIDConflict) {
		t.Fatalf("Replace over an active follow-up: %v, want ErrTaskIDConflict", errs[0])
	}
	settleOK(t, b, retryOf(f, time.Now().Add(-time.Millisecond), "receiver down"))
	if errs := enqueueErrsOpts(t, b, broker.EnqueueOptions{Replace: true}, forged); !errors.Is(errs[0], broker.ErrTaskIDConflict) {
		t.Fatalf("Replace over a follow-up waiting in retry: %v, want ErrTaskIDConflict", errs[0])
	}
	f2 := redeliver(t, b, "fu-int", time.Minute)
	if f2.Task.ID != f.Task.ID || !f2.Internal {
		t.Fatalf("retried follow-up delivered as %s (internal %v)", f2.Task.ID, f2.Internal)
	}
	settleOK(t, b, outcomeOf(f2, broker.SettleArchive))
	if err := b.RunTask(t.Context(), "fu-int", f.Task.ID); !errors.Is(err, broker.ErrNotSupported) {
		if err != nil {
			t.Fatalf("RunTask of the archived follow-up: %v", err)
		}
		if f3 := dequeueOne(t, b, "fu-int", time.Minute); f3.Task.ID != f.Task.ID || !f3.Internal {
			t.Fatalf("follow-up run again delivered as %s (internal %v)", f3.Task.ID, f3.Internal)
		}
	}
}

// testFollowupAdmin: an operator's archive (single and bulk) is a task's
// end, a bulk delete archives waiting steps instead of deleting them, and
// an archived step does not run again (ErrFlowStep), single or bulk.
func testFollowupAdmin(t *testing.T, b broker.Broker) {
	a := b
	ctx := t.Context()
	_, err := a.Queues(ctx)
	needs(t, "Admin", err)
	t.Run("Archive", func(t *testing.T) {
		enqueue(t, b, stepMsg("fa-one", "a", "wf", "s", ""))
		if err := a.ArchiveTask(ctx, "fa-one", "a"); err != nil {
			t.Fatal(err)
		}
		oneFollowup(t, b, "fa-one", "a", broker.OutcomeArchived, "archived by an operator")
		if err := a.RunTask(ctx, "fa-one", "a"); !errors.Is(err, broker.ErrFlowStep) {
			t.Fatalf("RunTask of an archived step: %v, want ErrFlowStep", err)
		}
	})
	t.Run("Bulk", func(t *testing.T) {
		for _, st := range []tidetype.TaskState{tidetype.StatePending, tidetype.StateScheduled} {
			for _, op := range []string{"archive", "delete"} {
				q := "fa-" + op + "-" + st.String()
				var ids []string
				for _, id := range []string{"s1", "s2", "s3"} {
					m := stepMsg(q, id, "wf", id, "")
					if st == tidetype.StateScheduled {
						m.State, m.NextProcessAt = st, time.Now().Add(time.Hour)
					}
					enqueue(t, b, m)
					ids = append(ids, id)
				}
				plain := newMsg(q, "plain")
				if st == tidetype.StateScheduled {
					plain.State, plain.NextProcessAt = st, time.Now().Add(time.Hour)
				}
				enqueue(t, b, plain)
				var n int
				var err error
				if op == "archive" {
					n, err = a.ArchiveTasks(ctx, q, st, 100)
				} else {
					n, err = a.DeleteTasks(ctx, q, st, 100)
				}
				if err != nil || n != 4 {
					t.Fatalf("%s %s: %d, %v; want 4", op, st, n, err)
				}
				for _, id := range ids {
					if got := get(t, b, q, id); got.State != tidetype.StateArchived {
						t.Fatalf("%s %s: step %s is %s, want archived", op, st, id, got.State)
					}
				}
				fs := followups(t, b, q)
				if len(fs) != 3 {
					t.Fatalf("%s %s: %d follow-ups, want one per step: %+v", op, st, len(fs), fs)
				}
				// Running the archived tasks again: the steps stay.
				n, err = a.RunTasks(ctx, q, tidetype.StateArchived, 100)
				want := 0
				if op == "archive" {
					want = 1 // the plain task
				}
				if err != nil || n != want {
					t.Fatalf("%s %s: RunTasks of the archive: %d, %v; want %d (steps do not run again)", op, st, n, err, want)
				}
				for _, id := range ids {
					if got := get(t, b, q, id); got.State != tidetype.StateArchived {
						t.Fatalf("step %s ran again: %s", id, got.State)
					}
				}
			}
		}
	})
}

// testFollowupKept: a workflow follow-up is tide's own bookkeeping: Delete,
// Cancel, ArchiveTask and CancelProcessing refuse it (ErrInternalTask) and
// bulk deletes and archives pass over it; a notification's follow-up may be
// deleted (that stops it).
func testFollowupKept(t *testing.T, b broker.Broker) {
	ctx := t.Context()
	enqueue(t, b, stepMsg("fk", "a", "wf", "s", ""), stepMsg("fk", "n", "", "", "https://hooks.example.com/"))
	for _, d := range dequeue(t, b, []string{"fk"}, 2, time.Minute) {
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
	enqueue(t, b, newMsg("fk", "plain"))
	a := b
	_, err := a.Queues(ctx)
	isAdmin := !errors.Is(err, broker.ErrNotSupported)
	if isAdmin {
		if n, err := a.DeleteTasks(ctx, "fk", tidetype.StatePending, 100); err != nil || n != 2 {
			t.Fatalf("DeleteTasks(pending): %d, %v; want 2 (the plain task and the notification)", n, err)
		}
	} else {
		if err := b.Delete(ctx, "fk", "plain"); err != nil {
			t.Fatal(err)
		}
	}
	ds := dequeue(t, b, []string{"fk"}, 10, time.Minute)
	var flowFu *broker.Delivery
	for _, d := range ds {
		switch d.Task.Type {
		case broker.FlowType:
			flowFu = d
		case broker.NotifyType:
			if isAdmin {
				t.Fatalf("the notification's follow-up survived a bulk delete")
			}
		default:
			t.Fatalf("dequeued %s", d.Task.ID)
		}
	}
	if flowFu == nil {
		t.Fatal("the workflow follow-up is gone")
	}
	id := flowFu.Task.ID
	if err := b.Cancel(ctx, "fk", id); !errors.Is(err, broker.ErrInternalTask) {
		t.Fatalf("Cancel of an active workflow follow-up: %v, want ErrInternalTask", err)
	}
	settleOK(t, b, retryOf(flowFu, time.Now().Add(time.Hour), "store down"))
	if err := b.Delete(ctx, "fk", id); !errors.Is(err, broker.ErrInternalTask) {
		t.Fatalf("Delete of a workflow follow-up: %v, want ErrInternalTask", err)
	}
	if err := b.Cancel(ctx, "fk", id); !errors.Is(err, broker.ErrInternalTask) {
		t.Fatalf("Cancel of a waiting workflow follow-up: %v, want ErrInternalTask", err)
	}
	if isAdmin {
		if err := a.ArchiveTask(ctx, "fk", id); !errors.Is(err, broker.ErrInternalTask) {
			t.Fatalf("ArchiveTask of a workflow follow-up: %v, want ErrInternalTask", err)
		}
		for _, st := range []tidetype.TaskState{tidetype.StateRetry} {
			if n, err := a.ArchiveTasks(ctx, "fk", st, 100); err != nil || n != 0 {
				t.Fatalf("ArchiveTasks(%s): %d, %v; want 0", st, n, err)
			}
			if n, err := a.DeleteTasks(ctx, "fk", st, 100); err != nil || n != 0 {
				t.Fatalf("DeleteTasks(%s): %d, %v; want 0", st, n, err)
			}
		}
	}
	if got := get(t, b, "fk", id); got.State != tidetype.StateRetry {
		t.Fatalf("the workflow follow-up is %s, want still waiting in retry", got.State)
	}
}

// testCancelStepTask: cancelling the task of a cancelled flow's step ends
// the step once, whatever the task did: a waiting one is archived with its
// follow-up, a running one is cancelled, a finished one keeps its outcome
// and result, one that ended and is gone is reported by its follow-up
// (ErrTaskNotFound only when nothing will report it), and each answers the
// same when run again.
func testCancelStepTask(t *testing.T, b broker.Broker) {
	ctx := t.Context()
	needs(t, "Flows", b.CancelStepTask(ctx, "cst-probe", "none"))
	twice := func(t *testing.T, q, id string, want error) {
		t.Helper()
		for i := range 2 {
			if err := b.CancelStepTask(ctx, q, id); !errors.Is(err, want) {
				t.Fatalf("CancelStepTask of %s (run %d): %v, want %v", id, i+1, err, want)
			}
		}
	}
	t.Run("Waiting", func(t *testing.T) {
		m := stepMsg("cst-wait", "a", "wf", "s", "")
		m.State, m.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
		enqueue(t, b, m)
		twice(t, "cst-wait", "a", nil)
		if got := get(t, b, "cst-wait", "a"); got.State != tidetype.StateArchived {
			t.Fatalf("a waiting step is %s, want archived", got.State)
		}
		oneFollowup(t, b, "cst-wait", "a", broker.OutcomeArchived, "cancelled")
	})
	t.Run("Running", func(t *testing.T) {
		enqueue(t, b, stepMsg("cst-run", "a", "wf", "s", ""))
		d := dequeueOne(t, b, "cst-run", time.Minute)
		twice(t, "cst-run", "a", nil)
		settleOK(t, b, retryOf(d, time.Now(), "boom"))
		oneFollowup(t, b, "cst-run", "a", broker.OutcomeArchived, "cancelled")
	})
	t.Run("Completed", func(t *testing.T) {
		m := stepMsg("cst-done", "a", "wf", "s", "")
		m.Retention = time.Hour
		enqueue(t, b, m)
		d := dequeueOne(t, b, "cst-done", time.Minute)
		if err := b.SetResult(ctx, leaseOf(d), []byte("receipt")); err != nil {
			t.Fatal(err)
		}
		s := outcomeOf(d, broker.SettleDone)
		s.Task = d.Task
		settleOK(t, b, s)
		twice(t, "cst-done", "a", nil)
		if got := get(t, b, "cst-done", "a"); got.State != tidetype.StateCompleted || string(got.Result) != "receipt" {
			t.Fatalf("a completed step after CancelStepTask: %s, result %q; want kept", got.State, got.Result)
		}
		oneFollowup(t, b, "cst-done", "a", broker.OutcomeCompleted, "")
	})
	t.Run("Archived", func(t *testing.T) {
		enqueue(t, b, stepMsg("cst-arch", "a", "wf", "s", ""))
		s := outcomeOf(dequeueOne(t, b, "cst-arch", time.Minute), broker.SettleArchive)
		s.Err = "card declined"
		settleOK(t, b, s)
		twice(t, "cst-arch", "a", nil)
		if got := get(t, b, "cst-arch", "a"); got.State != tidetype.StateArchived || !strings.Contains(got.LastErr, "card declined") {
			t.Fatalf("an archived step after CancelStepTask: %s, %q; want kept as it was", got.State, got.LastErr)
		}
		oneFollowup(t, b, "cst-arch", "a", broker.OutcomeArchived, "card declined")
	})
	t.Run("EndedAndGone", func(t *testing.T) {
		enqueue(t, b, stepMsg("cst-gone", "a", "wf", "s", ""))
		settleOK(t, b, outcomeOf(dequeueOne(t, b, "cst-gone", time.Minute), broker.SettleDone))
		// Deleted as done; its follow-up still waits: it reports the end.
		twice(t, "cst-gone", "a", nil)
		oneFollowup(t, b, "cst-gone", "a", broker.OutcomeCompleted, "")
		// Follow-up done too: nothing will report it any more.
		twice(t, "cst-gone", "a", broker.ErrTaskNotFound)
	})
	t.Run("NeverThere", func(t *testing.T) {
		twice(t, "cst-none", "a", broker.ErrTaskNotFound)
	})
}
