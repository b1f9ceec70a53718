package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
)

// What the flow model drives besides flows, operator actions and faults:
// NotifyURL notifications to a local receiver that now and then answers
// 503, Client.Wait on steps' tasks, step and batch task IDs held by a plain
// task stored first (EnqueueAndWait with TaskID, kept completed), and
// workflows enqueued again with their ID, with the same steps or others.

// Shares of steps with each extra, in percent.
const (
	modelNotifyPct = 20
	modelHeldPct   = 4
	modelWaitPct   = 30
	// modelWaitAfterQuiet bounds how long a Wait may take to answer once
	// the run went quiet: every task has ended by then.
	modelWaitAfterQuiet = 20 * time.Second
)

// extras draws a step's notification, held ID and Wait; noDeps says its
// task is stored with its flow (no dependencies).
func extras(r *rand.Rand, s *mStep, noDeps bool) {
	s.notify = r.IntN(100) < modelNotifyPct
	s.held = r.IntN(100) < modelHeldPct
	s.wait = noDeps && !s.held && r.IntN(100) < modelWaitPct
}

// reasonHeld is how a step whose task ID another task holds fails.
const reasonHeld = "is held by a task that is not this step's"

// notifySink receives NotifyURL notifications: it answers every tenth POST
// 503 (the notification is retried) and keeps the others.
type notifySink struct {
	srv     *httptest.Server
	n       atomic.Int64
	mu      sync.Mutex
	got     map[string][]string // task ID -> states delivered, in order
	refused int
}

func newNotifySink(t *testing.T) *notifySink {
	s := &notifySink{got: map[string][]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *notifySink) url() string { return s.srv.URL + "/fm" }

func (s *notifySink) serve(w http.ResponseWriter, r *http.Request) {
	var body struct {
		TaskID string `json:"task_id"`
		State  string `json:"state"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.TaskID == "" || r.Header.Get("Tide-Task-ID") != body.TaskID {
		// Archives the notification: the check then misses it.
		http.Error(w, "bad notification", http.StatusBadRequest)
		return
	}
	if s.n.Add(1)%10 == 0 {
		s.mu.Lock()
		s.refused++
		s.mu.Unlock()
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	s.mu.Lock()
	s.got[body.TaskID] = append(s.got[body.TaskID], body.State)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *notifySink) delivered(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got[id]...)
}

func (s *notifySink) refusedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// hold stores a plain task with ID id in queue and waits until it is
// completed (EnqueueAndWait; it is kept an hour), so that the step with
// that ID finds it taken. It returns "completed", or what else came of it
// (an operator may archive or delete it meanwhile).
func (m *modelRun) hold(queue, id string) string {
	c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	task := tide.NewTask("fm:step", []byte("ok"), tide.Queue(queue), tide.TaskID(id), tide.Retention(time.Hour))
	var info *tide.TaskInfo
	first := true
	err := retryUnavailable(func() error {
		var err error
		if first {
			first = false
			info, err = m.env.client.EnqueueAndWait(c, task)
			if !errors.Is(err, tide.ErrUnavailable) {
				return err
			}
		}
		// The enqueue's reply may be lost with the task stored: wait
		// for it, or enqueue it again when it is not there.
		if info, err = m.env.client.Wait(c, queue, id); errors.Is(err, tide.ErrTaskNotFound) {
			info, err = m.env.client.EnqueueAndWait(c, task)
		}
		return err
	})
	m.mu.Lock()
	m.holds++
	m.mu.Unlock()
	switch {
	case err != nil:
		return "error: " + classify(err)
	case info.State != tide.StateCompleted:
		return info.State.String()
	}
	return "completed"
}

// mWait is one Client.Wait on a step's task.
type mWait struct {
	f      *mFlow
	s      *mStep
	result string // completed, archived, notfound, or "error: ..."
	seq    int64  // its "W" line, logged when it answered
}

// waitStep waits for s's task (stored with its flow) in a goroutine.
func (m *modelRun) waitStep(f *mFlow, s *mStep) {
	w := &mWait{f: f, s: s}
	m.mu.Lock()
	m.waits = append(m.waits, w)
	m.mu.Unlock()
	m.waiting.Go(func() {
		var info *tide.TaskInfo
		var err error
		for {
			info, err = m.env.client.Wait(m.waitCtx, s.queue, s.id)
			if !errors.Is(err, tide.ErrUnavailable) || m.waitCtx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		var res string
		switch {
		case errors.Is(err, tide.ErrTaskNotFound):
			res = "notfound"
		case err != nil:
			res = "error: " + err.Error()
		default:
			res = info.State.String()
		}
		// "W <task ID> <result>": the answer came after this line's
		// predecessors, the task's end among them.
		seq := int64(0)
		if m.waitCtx.Err() == nil {
			seq = m.log(fmt.Sprintf("W %s %s", s.id, strings.ReplaceAll(res, " ", "_")))
		}
		m.mu.Lock()
		w.result, w.seq = res, seq
		m.mu.Unlock()
	})
}

// endWaits gives the Wait calls modelWaitAfterQuiet more to answer, then
// stops those that did not.
func (m *modelRun) endWaits(stop context.CancelFunc) {
	done := make(chan struct{})
	go func() { m.waiting.Wait(); close(done) }()
	timer := time.NewTimer(modelWaitAfterQuiet)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		stop()
		<-done
	}
	stop()
}

// reenqueue enqueues a recent workflow again with its ID: with the same
// steps it is the same workflow (nothing runs again), with another payload
// it is refused with ErrWorkflowExists.
func (m *modelRun) reenqueue(r *rand.Rand, begin func(queue, target, state string) string, finish func(id string, err error, n int)) {
	var f *mFlow
	for range 5 {
		if g := m.recentFlow(r, modelRecent); g != nil && !g.batch {
			f = g
			break
		}
	}
	if f == nil {
		return
	}
	changed := r.IntN(3) == 0
	id := begin("-", f.id, map[bool]string{true: "changed", false: "same"}[changed])
	c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	wf := m.buildWorkflow(f, changed)
	err := retryUnavailable(func() error {
		_, err := m.env.client.EnqueueWorkflow(c, wf)
		return err
	})
	switch class := classify(err); {
	case class == "unavailable":
	case changed && class != "exists":
		m.t.Errorf("workflow %s enqueued again with another step: %v, want ErrWorkflowExists", f.id, err)
	case !changed && class != "ok":
		m.t.Errorf("workflow %s enqueued again with the same steps: %v, want nil", f.id, err)
	}
	finish(id, err, -1)
}

// stepTaskOf returns ti when it is the task of step s of f (its flow
// header names f), and nil with the other task otherwise (a task that
// held the step's ID).
func stepTaskOf(f *mFlow, ti *tide.TaskInfo) (own, other *tide.TaskInfo) {
	if ti == nil {
		return nil, nil
	}
	want := "w:" + f.id
	if f.batch {
		want = "b:" + f.id
	}
	if ti.Headers[broker.FlowHeader] != want {
		return nil, ti
	}
	return ti, nil
}

// checkHeld checks a step whose ID was held: it failed for it, unless the
// holder was gone (never completed, or an action may have removed it).
func (m *modelRun) checkHeld(l *modelLog, f *mFlow, s *mStep, step tide.StepInfo, other *tide.TaskInfo, fail func(string, ...any)) {
	if strings.Contains(step.Err, reasonHeld) {
		if other == nil && !l.acted(f, s, never, "delete", "cancel", "deleteall") {
			fail("step %s failed for its held ID, but the task that held it is gone and nothing deleted it", s.name)
		}
		return
	}
	if step.State == tide.StepCanceled {
		return // cancelled before its release (its workflow, a dependency): the ID was never tried
	}
	if s.holder == "completed" && !l.acted(f, s, never, "delete", "cancel", "deleteall", "archive", "archiveall", "cancelworkflow") {
		fail("step %s's ID was held by a completed task nothing touched, yet it is %s (%q), not failed for it", s.name, step.State, step.Err)
	}
}

// checkNotified checks the notifications of step s: one end each, the
// same state in every delivery of it, and one at least when its task ended.
func (m *modelRun) checkNotified(l *modelLog, f *mFlow, s *mStep, step tide.StepInfo, own *tide.TaskInfo, fig *figures, fail func(string, ...any)) {
	got := m.sink.delivered(s.id)
	if !s.notify {
		if len(got) > 0 && !s.held {
			fail("step %s has no NotifyURL, yet %d notifications came for it", s.name, len(got))
		}
		return
	}
	if s.held && strings.Contains(step.Err, reasonHeld) {
		return // the holder had no NotifyURL; the step never had a task
	}
	fig.notifySteps++
	fig.notified += len(got)
	if len(got) > 1 {
		fig.notifyDups += len(got) - 1
	}
	for i := 1; i < len(got); i++ {
		if got[i] != got[0] {
			fail("step %s notified %v: two ends of one task", s.name, got)
			return
		}
	}
	// The task's own end, when it is kept; otherwise the step's says it,
	// unless the task never existed (a step cancelled or failed before
	// its release).
	want := ""
	switch {
	case own != nil && (own.State == tide.StateCompleted || own.State == tide.StateArchived):
		want = own.State.String()
	case step.State == tide.StepSucceeded:
		want = "completed"
	case len(l.attempts[s.id]) > 0:
		want = "archived"
	}
	switch {
	case want != "" && len(got) == 0:
		fail("step %s %s with its task %s, but no notification came", s.name, step.State, taskState(own))
	case len(got) > 0 && want == "" && got[0] != "archived":
		fail("step %s %s, notified %v", s.name, step.State, got)
	case len(got) > 0 && want != "" && got[0] != want:
		fail("step %s %s, but notified %v", s.name, step.State, got)
	}
}

func taskState(ti *tide.TaskInfo) string {
	if ti == nil {
		return "gone"
	}
	return ti.State.String()
}

// checkWaits checks every Wait against its step's final state.
func (m *modelRun) checkWaits(l *modelLog, fig *figures, steps map[*mStep]tide.StepInfo) {
	// The steps' states by flow and name, as endedBefore reads them.
	states := map[*mFlow]map[string]tide.StepInfo{}
	for _, w := range m.waits {
		if states[w.f] == nil {
			states[w.f] = map[string]tide.StepInfo{}
			for _, s := range w.f.steps {
				states[w.f][s.name] = steps[s]
			}
		}
	}
	m.mu.Lock()
	waits := append([]*mWait(nil), m.waits...)
	m.mu.Unlock()
	fig.waits = map[string]int{}
	for _, w := range waits {
		m.mu.Lock()
		res := w.result
		m.mu.Unlock()
		key := res
		if strings.HasPrefix(key, "error") {
			key = "error"
		}
		fig.waits[key]++
		step, ok := steps[w.s]
		if !ok {
			continue // its flow failed its own checks
		}
		bad := ""
		switch res {
		case "completed":
			okBefore := false
			for _, a := range l.attempts[w.s.id] {
				okBefore = okBefore || (a.end == "ok" && a.endSeq < w.seq)
			}
			switch {
			case step.State != tide.StepSucceeded:
				bad = "its step is " + step.State.String()
			case !okBefore:
				bad = "it answered before the task's handler succeeded"
			}
		case "archived":
			switch {
			case step.State != tide.StepFailed && step.State != tide.StepCanceled:
				bad = "its step is " + step.State.String()
			case !m.endedBefore(l, w.f, w.s, states[w.f], w.seq, 0):
				bad = "it answered before anything ended the task"
			}
		case "notfound":
			// A batch task without Retention is deleted when it succeeds:
			// Wait finds nothing when it looks after that.
			trimmed := w.f.batch && !w.f.retention && step.State == tide.StepSucceeded
			if !trimmed && !l.acted(w.f, w.s, never, "delete", "cancel", "deleteall", "cancelworkflow") {
				bad = "nothing deleted or cancelled it"
			}
		default:
			bad = "it never answered, though every task ended"
		}
		if bad != "" {
			m.t.Errorf("flow %s: Wait on step %s (task %s) answered %q: %s", w.f.id, w.s.name, w.s.id, res, bad)
		}
	}
}
