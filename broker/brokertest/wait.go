package brokertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// waitTests cover broker.Waiter and broker.ProgressReporter (each skipped by
// a broker that does not implement the interface), and Replace of a flow's
// step.
var waitTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker)
}{
	{"WaitOutcomes", testWaitOutcomes},
	{"WaitWatched", testWaitWatched},
	{"Progress", testProgress},
	{"ReplaceStep", testReplaceStep},
}

// waitAsync runs Wait in a goroutine and returns its result channel.
func waitAsync(t *testing.T, w broker.Waiter, queue, id string) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		info, err := w.Wait(t.Context(), queue, id)
		ch <- waitResult{info, err}
	}()
	return ch
}

type waitResult struct {
	info *tidetype.TaskInfo
	err  error
}

// awaitWait returns what a Wait call returned, failing after waitLong.
func awaitWait(t *testing.T, ch <-chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitLong):
		t.Fatal("Wait did not return after the task ended")
		return waitResult{}
	}
}

// testWaitOutcomes: a waiter learns that its task succeeded (kept or not),
// was archived, or was deleted; an unknown task and an ended context are
// reported at once.
func testWaitOutcomes(t *testing.T, b broker.Broker) {
	w := b
	probe, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := w.Wait(probe, "probe", "probe")
	needs(t, "Waiter", err)
	settleWith := func(t *testing.T, q string, m *tidetype.TaskInfo, kind broker.SettleKind) waitResult {
		t.Helper()
		enqueue(t, b, m)
		ch := waitAsync(t, w, q, m.ID)
		d := dequeueOne(t, b, q, time.Minute)
		time.Sleep(20 * time.Millisecond) // the waiter registers meanwhile (either order must work)
		s := outcomeOf(d, kind)
		s.Err = "boom"
		settleOK(t, b, s)
		return awaitWait(t, ch)
	}
	t.Run("DoneDeleted", func(t *testing.T) {
		// The task is deleted as it ends, so a waiter that registers only
		// after the settle (a starved machine can delay its goroutine past
		// the pause) rightly finds no task. Each try waits longer; a broker
		// that never tells a registered waiter fails every try.
		var r waitResult
		for try, pause := 0, 20*time.Millisecond; try < 5; try, pause = try+1, pause*3 {
			id := fmt.Sprintf("a%d", try)
			m := newMsg("wait-done", id)
			enqueue(t, b, m)
			ch := waitAsync(t, w, "wait-done", id)
			d := dequeueOne(t, b, "wait-done", time.Minute)
			time.Sleep(pause)
			settleOK(t, b, outcomeOf(d, broker.SettleDone))
			if r = awaitWait(t, ch); !errors.Is(r.err, broker.ErrTaskNotFound) {
				if r.err == nil && r.info != nil {
					if r.info.ID != id {
						t.Fatalf("Wait for %s answered for %s", id, r.info.ID)
					}
					r.info.ID = "a"
				}
				break
			}
		}
		if r.err != nil || r.info.State != tidetype.StateCompleted || r.info.ID != "a" || r.info.CompletedAt.IsZero() {
			t.Fatalf("Wait = %+v, %v; want the completed task", r.info, r.err)
		}
	})
	t.Run("DoneKept", func(t *testing.T) {
		m := newMsg("wait-kept", "a")
		m.Retention = time.Hour
		r := settleWith(t, "wait-kept", m, broker.SettleDone)
		if r.err != nil || r.info.State != tidetype.StateCompleted || r.info.Type != taskType {
			t.Fatalf("Wait = %+v, %v; want the whole completed task", r.info, r.err)
		}
	})
	t.Run("Archived", func(t *testing.T) {
		r := settleWith(t, "wait-arch", newMsg("wait-arch", "a"), broker.SettleArchive)
		if r.err != nil || r.info.State != tidetype.StateArchived || r.info.LastErr != "boom" {
			t.Fatalf("Wait = %+v, %v; want the archived task", r.info, r.err)
		}
	})
	t.Run("Deleted", func(t *testing.T) {
		m := newMsg("wait-del", "a")
		m.State, m.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
		enqueue(t, b, m)
		ch := waitAsync(t, w, "wait-del", "a")
		time.Sleep(20 * time.Millisecond)
		if err := b.Delete(t.Context(), "wait-del", "a"); err != nil {
			t.Fatal(err)
		}
		if r := awaitWait(t, ch); !errors.Is(r.err, broker.ErrTaskNotFound) {
			t.Fatalf("Wait for a deleted task: %+v, %v; want ErrTaskNotFound", r.info, r.err)
		}
	})
	t.Run("Unknown", func(t *testing.T) {
		if _, err := w.Wait(t.Context(), "wait-none", "nope"); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("Wait for no task: %v, want ErrTaskNotFound", err)
		}
	})
	t.Run("Context", func(t *testing.T) {
		enqueue(t, b, newMsg("wait-ctx", "a"))
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if _, err := w.Wait(ctx, "wait-ctx", "a"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait past its context: %v, want DeadlineExceeded", err)
		}
	})
}

// testWaitWatched: a task enqueued with Watch that ends (and is deleted)
// before anyone waits is still reported to a later Wait.
func testWaitWatched(t *testing.T, b broker.Broker) {
	w := b
	probe, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := w.Wait(probe, "probe", "probe")
	needs(t, "Waiter", err)
	if _, err := b.Enqueue(t.Context(), []*tidetype.TaskInfo{newMsg("watched", "a")}, broker.EnqueueOptions{Watch: true}); err != nil {
		t.Fatal(err)
	}
	d := dequeueOne(t, b, "watched", time.Minute)
	settleOK(t, b, outcomeOf(d, broker.SettleDone))
	info, err := w.Wait(t.Context(), "watched", "a")
	if err != nil || info.State != tidetype.StateCompleted {
		t.Fatalf("Wait after the watched task ended: %+v, %v; want completed", info, err)
	}

	// A task kept completed or archived whose record was trimmed before
	// the Wait: the outcome alone answers.
	for _, kind := range []broker.SettleKind{broker.SettleDone, broker.SettleArchive} {
		q := "watched-trim-" + kind.String()
		m := newMsg(q, "a")
		m.Retention = time.Millisecond
		if _, err := b.Enqueue(t.Context(), []*tidetype.TaskInfo{m}, broker.EnqueueOptions{Watch: true}); err != nil {
			t.Fatal(err)
		}
		d := dequeueOne(t, b, q, time.Minute)
		s := outcomeOf(d, kind)
		s.Err = "boom"
		settleOK(t, b, s)
		if kind == broker.SettleArchive {
			if err := b.Delete(t.Context(), q, "a"); err != nil {
				t.Fatal(err)
			}
		} else {
			eventually(t, waitLong, "the completed task to be trimmed", func() bool {
				maintain(t, b, q)
				_, err := b.GetTask(t.Context(), q, "a")
				return errors.Is(err, broker.ErrTaskNotFound)
			})
		}
		info, err := w.Wait(t.Context(), q, "a")
		want := tidetype.StateCompleted
		if kind == broker.SettleArchive {
			want = tidetype.StateArchived
		}
		if err != nil || info.State != want {
			t.Fatalf("Wait after the watched task ended %s and its record went: %+v, %v; want %s", kind, info, err, want)
		}
	}

	// The outcome of an earlier task with the ID does not answer for a
	// new task with it, deleted before it ran.
	enqueue(t, b, newMsg("watched", "a"))
	if err := b.Delete(t.Context(), "watched", "a"); err != nil {
		t.Fatal(err)
	}
	if info, err := w.Wait(t.Context(), "watched", "a"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("Wait for a re-created task deleted before it ran: %+v, %v; want ErrTaskNotFound", info, err)
	}
}

// testProgress: a leased task's progress is kept with it and read back by
// GetTask; a stale lease is refused.
func testProgress(t *testing.T, b broker.Broker) {
	pr := b
	needs(t, "ProgressReporter", pr.SetProgress(t.Context(), broker.LeaseRef{Queue: "probe", ID: "probe", Token: 1}, tidetype.Progress{}))
	m := newMsg("progress", "a")
	m.Retention = time.Hour
	enqueue(t, b, m)
	d := dequeueOne(t, b, "progress", time.Minute)
	at := time.Now()
	if err := pr.SetProgress(t.Context(), leaseOf(d), tidetype.Progress{Percent: 40, Note: "4 of 10", At: at}); err != nil {
		t.Fatal(err)
	}
	got := get(t, b, "progress", "a").Progress
	if got.Percent != 40 || got.Note != "4 of 10" || !sameTime(got.At, at) {
		t.Fatalf("progress = %+v", got)
	}
	stale := leaseOf(d)
	stale.Token++
	if err := pr.SetProgress(t.Context(), stale, tidetype.Progress{Percent: 50}); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("SetProgress with a stale token: %v, want ErrLeaseLost", err)
	}
	if err := pr.SetProgress(t.Context(), leaseOf(d), tidetype.Progress{Percent: 101}); !errors.Is(err, broker.ErrInvalidTask) {
		t.Fatalf("SetProgress(101%%): %v, want ErrInvalidTask", err)
	}
	settleOK(t, b, outcomeOf(d, broker.SettleDone))
	if got := get(t, b, "progress", "a").Progress; got.Percent != 40 {
		t.Fatalf("progress of the completed task = %+v, want the last one reported", got)
	}
}

// testReplaceStep: Replace never takes the place of a workflow step's or
// batch task's task, waiting or finished: its end would not reach its flow.
func testReplaceStep(t *testing.T, b broker.Broker) {
	step := newMsg("rstep", "wf/a")
	step.Headers = map[string]string{broker.FlowHeader: "w:wf"}
	enqueue(t, b, step)
	forged := newMsg("rstep", "wf/a")
	if errs := enqueueErrsOpts(t, b, broker.EnqueueOptions{Replace: true}, forged); !errors.Is(errs[0], broker.ErrTaskIDConflict) {
		t.Fatalf("Replace over a waiting step: %v, want ErrTaskIDConflict", errs[0])
	}
	if got := get(t, b, "rstep", "wf/a"); got.Headers[broker.FlowHeader] != "w:wf" {
		t.Fatalf("the step was replaced: %+v", got)
	}
}
