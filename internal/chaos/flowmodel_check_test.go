package chaos

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

// mAttempt is one run of a handler, from the model's log.
type mAttempt struct {
	token, task, flow string
	seq               int64  // its start
	late              string // for a start after its flow's cancel marker: "stopped <cause>" or "ran"
	end               string // ok, fail, skip or ctx ("" when it never logged an end: killed)
	cause             string // for ctx
	endSeq            int64
}

// incarnation is the server process (or in-process server) that ran a.
func (a *mAttempt) incarnation() string {
	i := strings.LastIndexByte(a.token, '.')
	return a.token[:i]
}

// ended reports whether the attempt's own record shows the task's end:
// success, a planned SkipRetry, or a cancellation that reached it.
func (a *mAttempt) ended() bool {
	return a.end == "ok" || a.end == "skip" || (a.end == "ctx" && a.cause == "canceled") || a.late == "stopped canceled"
}

// opRec is one operator action, from the model's log.
type opRec struct {
	id, kind, queue, target, state string
	seq                            int64 // its "O" line: it began
	end                            int64 // its "R" line: it returned (never when it has none)
	class                          string
	n                              int
}

// during reports whether the action was still under way after seq. A bulk
// action is not one step: it works through its queue in chunks until one
// finds nothing, so one that began before a flow was created may reach
// that flow's tasks.
func (o *opRec) during(seq int64) bool { return o.end > seq }

// took reports whether the action may have done something: it succeeded
// (a bulk action on at least one task) or its outcome is unknown.
func (o *opRec) took() bool {
	switch o.class {
	case "unavailable":
		return true
	case "ok":
		return o.n != 0
	}
	return false
}

// modelLog is the model's log, parsed.
type modelLog struct {
	attempts map[string][]*mAttempt // by task ID, in log order
	byToken  map[string]*mAttempt
	byTarget map[string][]*opRec // single actions by task ID, CancelWorkflow by flow ID
	bulk     map[string][]*opRec // bulk actions by queue
	marked   map[string]int64    // flow -> where its CancelWorkflow returned (the first)
	windows  [][2]int64          // faults that lose or delay replies
	killed   map[string]bool     // incarnations SIGKILLed
}

func parseModelLog(lines []modelLine) (*modelLog, error) {
	l := &modelLog{attempts: map[string][]*mAttempt{}, byToken: map[string]*mAttempt{}, byTarget: map[string][]*opRec{},
		bulk: map[string][]*opRec{}, marked: map[string]int64{}, killed: map[string]bool{}}
	ops := map[string]*opRec{}
	open := map[string]int64{}
	for _, ln := range lines {
		f := strings.Fields(ln.text)
		bad := func() error { return fmt.Errorf("model log line %d: %q", ln.seq, ln.text) }
		if len(f) == 0 {
			return nil, bad()
		}
		switch f[0] {
		case "N", "U", "W": // a flow enqueued; a server process started; a Wait answered (checkWaits)
		case "S":
			if len(f) != 4 {
				return nil, bad()
			}
			a := &mAttempt{task: f[1], token: f[2], flow: f[3], seq: ln.seq}
			if a.flow != "-" {
				// Not a plain task that holds a step's ID.
				l.attempts[a.task] = append(l.attempts[a.task], a)
			}
			l.byToken[a.token] = a
		case "L", "E":
			if len(f) < 4 || l.byToken[f[2]] == nil {
				return nil, bad()
			}
			a := l.byToken[f[2]]
			if f[0] == "L" {
				a.late = strings.Join(f[3:], " ")
				continue
			}
			a.end, a.endSeq = f[3], ln.seq
			if len(f) > 4 {
				a.cause = f[4]
			}
		case "O":
			if len(f) != 6 {
				return nil, bad()
			}
			o := &opRec{id: f[1], kind: f[2], queue: f[3], target: f[4], state: f[5], seq: ln.seq, end: never, class: "?"}
			ops[o.id] = o
			switch o.kind {
			case "archiveall", "deleteall", "runall":
				l.bulk[o.queue] = append(l.bulk[o.queue], o)
			case "pause", "unpause":
			default:
				l.byTarget[o.target] = append(l.byTarget[o.target], o)
			}
		case "R":
			if len(f) != 4 || ops[f[1]] == nil {
				return nil, bad()
			}
			ops[f[1]].class = f[2]
			ops[f[1]].n, _ = strconv.Atoi(f[3])
			ops[f[1]].end = ln.seq
		case "X":
			if len(f) != 3 {
				return nil, bad()
			}
			if _, ok := l.marked[f[1]]; !ok {
				l.marked[f[1]] = ln.seq
			}
		case "F":
			if len(f) != 3 {
				return nil, bad()
			}
			if f[2] == "start" {
				open[f[1]] = ln.seq
			} else {
				l.windows = append(l.windows, [2]int64{open[f[1]], ln.seq})
				delete(open, f[1])
			}
		case "K":
			if len(f) != 2 {
				return nil, bad()
			}
			l.killed[f[1]] = true
		default:
			return nil, bad()
		}
	}
	for _, from := range open {
		l.windows = append(l.windows, [2]int64{from, 1 << 62})
	}
	return l, nil
}

// acted reports whether an action of one of kinds may have reached the task
// id of step s in flow f before seq: a single action on id, a bulk action
// on its queue still under way after the flow was created, or
// CancelWorkflow of its flow (kind "cancelworkflow").
func (l *modelLog) acted(f *mFlow, s *mStep, before int64, kinds ...string) bool {
	has := func(k string) bool {
		for _, x := range kinds {
			if x == k {
				return true
			}
		}
		return false
	}
	for _, o := range l.byTarget[s.id] {
		if o.seq < before && has(o.kind) && o.took() {
			return true
		}
	}
	for _, o := range l.byTarget[f.id] {
		if o.seq < before && has(o.kind) && o.took() {
			return true
		}
	}
	for _, o := range l.bulk[s.queue] {
		if o.during(f.createdSeq) && o.seq < before && has(o.kind) && o.took() {
			return true
		}
	}
	return false
}

// canceled reports whether a CancelWorkflow of f may have taken effect.
func (l *modelLog) canceled(f *mFlow) bool {
	for _, o := range l.byTarget[f.id] {
		if o.kind == "cancelworkflow" && o.took() {
			return true
		}
	}
	return false
}

// inWindow reports whether seq falls in a fault that lost or delayed replies.
func (l *modelLog) inWindow(seq int64) bool {
	for _, w := range l.windows {
		if seq >= w[0] && seq <= w[1] {
			return true
		}
	}
	return false
}

// Reasons a step failed or was cancelled, as the brokers and the root
// package write them.
var (
	reasonNotRun     = regexp.MustCompile(`^tide: not run: step (\S+) did not succeed`)
	reasonWfCanceled = regexp.MustCompile(`workflow (was )?cancelled`)
)

// figures are what a run did, for the report.
type figures struct {
	workflows, batches, steps int
	stepState                 map[tide.StepState]int
	flowState                 map[tide.FlowState]int
	starts, successes         int
	dups, late, untouched     int
	callbacks, cbOnce         int
	cbNever, cbMore           int
	notifySteps, notified     int
	notifyDups                int
	waits                     map[string]int
	stepInfo                  map[*mStep]tide.StepInfo // for checkWaits
}

const never = int64(1) << 62

// check reads the final state and the model's log and checks every flow.
func (m *modelRun) check() figures {
	t := m.t
	fig := figures{stepState: map[tide.StepState]int{}, flowState: map[tide.FlowState]int{}, stepInfo: map[*mStep]tide.StepInfo{}}
	ctx, cancel := context.WithTimeout(m.ctx, 5*time.Minute)
	defer cancel()
	lines, err := m.env.rec.lines(ctx)
	if err != nil {
		t.Errorf("reading the model's log: %v", err)
		return fig
	}
	l, err := parseModelLog(lines)
	if err != nil {
		t.Error(err)
		return fig
	}
	for _, as := range l.attempts {
		fig.starts += len(as)
		for _, a := range as {
			if a.end == "ok" {
				fig.successes++
			}
		}
	}
	m.mu.Lock()
	flows := append([]*mFlow(nil), m.flows...)
	m.mu.Unlock()
	errs := 0
	fail := func(f *mFlow, format string, args ...any) {
		errs++
		if errs <= 60 {
			t.Errorf("flow %s: %s", f.id, fmt.Sprintf(format, args...))
		}
	}
	for _, f := range flows {
		if f.batch {
			fig.batches++
		} else {
			fig.workflows++
		}
		fig.steps += len(f.steps)
		m.checkFlow(ctx, l, f, &fig, func(format string, args ...any) { fail(f, format, args...) })
	}
	if errs > 60 {
		t.Errorf("... and %d more", errs-60)
	}
	m.checkWaits(l, &fig, fig.stepInfo)
	return fig
}

func (m *modelRun) checkFlow(ctx context.Context, l *modelLog, f *mFlow, fig *figures, fail func(string, ...any)) {
	info, err := m.env.obs.GetWorkflow(ctx, f.id)
	if err != nil {
		fail("GetWorkflow: %v", err)
		return
	}
	fig.flowState[info.State]++
	si := map[string]tide.StepInfo{}
	for _, s := range info.Steps {
		si[s.Name] = s
	}
	tasks := map[string]*tide.TaskInfo{}
	others := map[string]*tide.TaskInfo{} // tasks that hold a step's ID
	for _, s := range f.steps {
		ti, err := m.env.obs.GetTaskInfo(ctx, s.queue, s.id)
		switch {
		case err == nil:
			if own, other := stepTaskOf(f, ti); own != nil {
				tasks[s.name] = own
			} else {
				others[s.name] = other
			}
		case !errors.Is(err, tide.ErrTaskNotFound):
			fail("GetTaskInfo %s: %v", s.id, err)
			return
		}
	}
	describe := func() string {
		var sb strings.Builder
		for _, s := range f.steps {
			st := "gone"
			if ti := tasks[s.name]; ti != nil {
				st = ti.State.String()
			}
			fmt.Fprintf(&sb, "\n  %s (%s, after %v, runOnFail %v, plan %s): step %s %q, task %s, attempts %s, actions %s",
				s.name, s.id, s.after, s.runOnFail, s.plan, si[s.name].State, si[s.name].Err, st, attemptsOf(l, s.id), opsOf(l, f, s))
		}
		return sb.String()
	}
	if info.State == tide.FlowRunning || info.FinishedAt.IsZero() {
		fail("still %s (FinishedAt %v) after the run went quiet:%s", info.State, info.FinishedAt, describe())
		return
	}
	if info.State == tide.FlowCanceled && !l.canceled(f) {
		fail("cancelled, but no CancelWorkflow reached it:%s", describe())
	}

	// Counts: of the steps' states, the callback left out.
	count := map[tide.StepState]int{}
	var failedIDs []string
	for _, s := range f.steps {
		st := si[s.name].State
		fig.stepState[st]++
		if s == f.callback {
			continue
		}
		count[st]++
		if st == tide.StepFailed {
			failedIDs = append(failedIDs, s.id)
		}
	}
	if info.Succeeded != count[tide.StepSucceeded] || info.Failed != count[tide.StepFailed] || info.Canceled != count[tide.StepCanceled] {
		fail("counts succeeded %d, failed %d, cancelled %d; its steps say %d, %d, %d", info.Succeeded, info.Failed, info.Canceled,
			count[tide.StepSucceeded], count[tide.StepFailed], count[tide.StepCanceled])
	}
	if !sameSet(failedIDs, info.FailedIDs) {
		fail("FailedIDs %v; its failed steps are %v", info.FailedIDs, failedIDs)
	}
	allGood := count[tide.StepFailed]+count[tide.StepCanceled] == 0
	if f.callback != nil {
		cb := si[f.callback.name].State
		allGood = allGood && cb != tide.StepFailed && cb != tide.StepCanceled
	}
	if info.State == tide.FlowSucceeded && !allGood || info.State == tide.FlowFailed && allGood {
		fail("state %s with its steps %v:%s", info.State, count, describe())
	}

	for _, s := range f.steps {
		step := si[s.name]
		fig.stepInfo[s] = step
		as := l.attempts[s.id]
		if s.held {
			m.checkHeld(l, f, s, step, others[s.name], fail)
		}
		var oks []*mAttempt
		for _, a := range as {
			if a.end == "ok" {
				oks = append(oks, a)
			}
		}
		ti := tasks[s.name]

		// The step's outcome and its task's final state agree.
		switch step.State {
		case tide.StepSucceeded:
			if len(oks) == 0 {
				fail("step %s succeeded, but its handler never did:%s", s.name, describe())
			}
			switch {
			case ti != nil && ti.State != tide.StateCompleted:
				fail("step %s succeeded, but its task is %s:%s", s.name, ti.State, describe())
			case ti == nil && !(f.batch && !f.retention && s != f.callback) &&
				!l.acted(f, s, never, "delete", "cancel") && !l.bulkOn(f, s, "deleteall", "completed"):
				// Kept WorkflowRetention: only an operator's delete may
				// remove it.
				why := "nothing deleted it"
				if l.acted(f, s, never, "cancelworkflow") {
					why = "only CancelWorkflow could have deleted it (Cancel of the completed task)"
				}
				if zero := l.zeroBulk(f, s, "deleteall"); zero != "" {
					why += "; bulk deletes on its queue that reported no task: " + zero
				}
				fail("step %s succeeded, but its task, kept for WorkflowRetention, is gone: %s:%s", s.name, why, describe())
			}
		case tide.StepFailed, tide.StepCanceled:
			if ti != nil && ti.State != tide.StateArchived {
				fail("step %s %s, but its task is %s:%s", s.name, step.State, ti.State, describe())
			}
			if ti == nil && step.State == tide.StepFailed && !strings.Contains(step.Err, reasonHeld) &&
				!l.acted(f, s, never, "delete", "cancel") && !l.bulkOn(f, s, "deleteall", "archived") {
				fail("step %s failed, but its task is gone and nothing deleted it:%s", s.name, describe())
			}
			for _, a := range oks {
				if !l.killed[a.incarnation()] && !l.inWindow(a.endSeq) {
					fail("step %s %s, but its handler succeeded (%s) on a server that was not killed, out of any fault:%s", s.name, step.State, a.token, describe())
				}
			}
			if why := m.explain(l, f, s, step, si); why != "" {
				fail("step %s %s (%q): %s:%s", s.name, step.State, step.Err, why, describe())
			}
		default:
			fail("step %s left %s after its flow ended %s:%s", s.name, step.State, info.State, describe())
		}
		if step.State == tide.StepSucceeded && !s.plan.succeeds() {
			fail("step %s succeeded, but its plan is %s", s.name, s.plan)
		}
		m.checkNotified(l, f, s, step, ti, fig, fail)

		// Each start: after its dependencies ended; not after its flow's
		// CancelWorkflow returned, unless the cancellation reached it.
		for _, a := range as {
			for _, dn := range s.after {
				d := f.byName[dn]
				if s.runOnFail {
					if !m.endedBefore(l, f, d, si, a.seq, 0) {
						fail("step %s started (%s) before its dependency %s ended:%s", s.name, a.token, dn, describe())
					}
					continue
				}
				okBefore := false
				for _, da := range l.attempts[d.id] {
					if da.end == "ok" && da.endSeq < a.seq {
						okBefore = true
					}
				}
				if !okBefore || si[dn].State != tide.StepSucceeded {
					fail("step %s started (%s) though its dependency %s had not succeeded (%s):%s", s.name, a.token, dn, si[dn].State, describe())
				}
			}
			if x, ok := l.marked[f.id]; ok && a.seq > x {
				fig.late++
				switch {
				case strings.HasPrefix(a.late, "stopped"):
				case a.late == "" && l.killed[a.incarnation()]:
				default:
					fail("step %s started (%s) after its workflow's CancelWorkflow returned, and was not cancelled (%q):%s", s.name, a.token, a.late, describe())
				}
			}
		}

		// A success followed by another start: the first success's
		// settlement was lost, which only a SIGKILL or a fault explains.
		for i, a := range as {
			if a.end != "ok" || i == len(as)-1 {
				continue
			}
			fig.dups++
			if !l.killed[a.incarnation()] && !l.inWindow(a.endSeq) {
				fail("step %s ran again (%s) after its handler succeeded (%s) on a server neither killed nor in a fault:%s",
					s.name, as[i+1].token, a.token, describe())
			}
		}
	}

	// A batch's callback: once, unless an action stopped it.
	if cb := f.callback; cb != nil {
		fig.callbacks++
		n := 0
		for _, a := range l.attempts[cb.id] {
			if a.end == "ok" {
				n++
			}
		}
		switch {
		case n == 0:
			fig.cbNever++
		case n == 1:
			fig.cbOnce++
		default:
			fig.cbMore++
		}
		stopped := l.acted(f, cb, never, "archive", "delete", "cancel", "cancelprocessing", "cancelworkflow", "archiveall", "deleteall")
		if !stopped && (n == 0 || si[cb.name].State != tide.StepSucceeded) {
			fail("batch callback ran %d times, step %s, though no action reached it or its batch:%s", n, si[cb.name].State, describe())
		}
	}

	// A flow no action reached ends as its plans say.
	touched := false
	for _, s := range f.steps {
		if l.acted(f, s, never, "archive", "delete", "cancel", "cancelprocessing", "cancelworkflow", "archiveall", "deleteall") ||
			strings.Contains(si[s.name].Err, "lease expired") || (s.held && s.holder != "completed") {
			touched = true
		}
	}
	if !touched {
		fig.untouched++
		want := predict(f)
		for _, s := range f.steps {
			if si[s.name].State != want[s.name] {
				fail("no action reached it, yet step %s is %s, not %s:%s", s.name, si[s.name].State, want[s.name], describe())
			}
		}
	}
}

// bulkOn reports whether a bulk action of kind on state st reached the
// queue of step s after its flow was created.
func (l *modelLog) bulkOn(f *mFlow, s *mStep, kind, st string) bool {
	for _, o := range l.bulk[s.queue] {
		if o.kind == kind && o.state == st && o.during(f.createdSeq) && o.took() {
			return true
		}
	}
	return false
}

// zeroBulk lists the bulk actions of kind on step s's queue, after its
// flow was created, that reported handling no task: one that did (its
// reply lost and its count wrong) would explain a task gone.
func (l *modelLog) zeroBulk(f *mFlow, s *mStep, kind string) string {
	var out []string
	for _, o := range l.bulk[s.queue] {
		if o.kind == kind && o.during(f.createdSeq) && !o.took() {
			out = append(out, fmt.Sprintf("%s(%s)@%d=%s/%d", o.kind, o.state, o.seq, o.class, o.n))
		}
	}
	return strings.Join(out, " ")
}

// explain returns "" when the log explains why step s failed or was
// cancelled, and what is missing otherwise.
func (m *modelRun) explain(l *modelLog, f *mFlow, s *mStep, step tide.StepInfo, si map[string]tide.StepInfo) string {
	why := step.Err
	flowCanceled := l.canceled(f)
	if step.State == tide.StepCanceled && !flowCanceled && !reasonNotRun.MatchString(why) {
		return "cancelled, but neither its workflow was cancelled nor a dependency failed"
	}
	switch {
	case strings.Contains(why, "task cancelled"):
		if !l.acted(f, s, never, "cancel", "cancelprocessing", "cancelworkflow") {
			return "no Cancel, CancelProcessing or CancelWorkflow reached it"
		}
	case strings.Contains(why, "archived by an operator"):
		if !l.acted(f, s, never, "archive", "archiveall") {
			return "no archive action reached it"
		}
	case strings.Contains(why, "deleted by an operator"):
		if !l.acted(f, s, never, "delete", "deleteall") {
			return "no delete action reached it"
		}
	case reasonWfCanceled.MatchString(why):
		if !flowCanceled {
			return "its workflow was not cancelled"
		}
	case reasonNotRun.MatchString(why):
		dn := reasonNotRun.FindStringSubmatch(why)[1]
		if !contains(s.after, dn) || si[dn].State == tide.StepSucceeded {
			return "the step it names is not a dependency that failed"
		}
	case strings.Contains(why, reasonHeld):
		if !s.held {
			return "its ID was held, but the model held no task with it"
		}
	case strings.Contains(why, skipMsg):
		if s.plan.kind != "skip" {
			return "a planned skip, but its plan is " + s.plan.String()
		}
	case strings.Contains(why, "lease expired"):
		if len(l.killed) == 0 {
			return "its lease expired with no retries left, but no server was killed"
		}
	default:
		return "no known reason"
	}
	return ""
}

// endedBefore reports whether the log shows that step d of f could have
// ended before seq: its handler's own end, an action that ends it, or the
// end of the dependency that cancelled it.
func (m *modelRun) endedBefore(l *modelLog, f *mFlow, d *mStep, si map[string]tide.StepInfo, seq int64, depth int) bool {
	if depth > len(f.steps) {
		return false
	}
	for _, a := range l.attempts[d.id] {
		if a.ended() && a.endSeq < seq {
			return true
		}
	}
	if l.acted(f, d, seq, "archive", "delete", "cancel", "cancelprocessing", "cancelworkflow", "archiveall", "deleteall") {
		return true
	}
	why := si[d.name].Err
	if d.held && strings.Contains(why, reasonHeld) {
		return true // it failed when it was released, before anything after it
	}
	if strings.Contains(why, "lease expired") {
		for _, a := range l.attempts[d.id] {
			if a.seq < seq {
				return true
			}
		}
	}
	if mm := reasonNotRun.FindStringSubmatch(why); mm != nil && f.byName[mm[1]] != nil {
		return m.endedBefore(l, f, f.byName[mm[1]], si, seq, depth+1)
	}
	return false
}

// predict returns the final state of every step of a flow nothing
// disturbed: a step runs when its dependencies succeeded (or, running on
// failure, whatever they did) and ends as its plan says; otherwise it is
// cancelled. Steps only depend on steps before them.
func predict(f *mFlow) map[string]tide.StepState {
	out := map[string]tide.StepState{}
	for _, s := range f.steps {
		run := true
		for _, d := range s.after {
			if out[d] != tide.StepSucceeded && !s.runOnFail {
				run = false
			}
		}
		switch {
		case !run:
			out[s.name] = tide.StepCanceled
		case s.held:
			out[s.name] = tide.StepFailed
		case s.plan.succeeds():
			out[s.name] = tide.StepSucceeded
		default:
			out[s.name] = tide.StepFailed
		}
	}
	return out
}

func attemptsOf(l *modelLog, id string) string {
	var parts []string
	for _, a := range l.attempts[id] {
		p := fmt.Sprintf("%s@%d", a.token, a.seq)
		if a.late != "" {
			p += " late:" + a.late
		}
		if a.end != "" {
			p += fmt.Sprintf(" %s%s@%d", a.end, strings.TrimSpace(" "+a.cause), a.endSeq)
		}
		parts = append(parts, "["+p+"]")
	}
	return strings.Join(parts, " ")
}

func opsOf(l *modelLog, f *mFlow, s *mStep) string {
	var parts []string
	for _, o := range l.byTarget[s.id] {
		parts = append(parts, fmt.Sprintf("%s@%d=%s", o.kind, o.seq, o.class))
	}
	for _, o := range l.byTarget[f.id] {
		parts = append(parts, fmt.Sprintf("%s@%d=%s", o.kind, o.seq, o.class))
	}
	for _, o := range l.bulk[s.queue] {
		if o.during(f.createdSeq) && o.took() {
			parts = append(parts, fmt.Sprintf("%s(%s)@%d=%s/%d", o.kind, o.state, o.seq, o.class, o.n))
		}
	}
	return strings.Join(parts, " ")
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, x := range a {
		seen[x]++
	}
	for _, x := range b {
		if seen[x]--; seen[x] < 0 {
			return false
		}
	}
	return true
}
