package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

// The flow model: random workflows and batches with random outcomes, driven
// while an operator applies random actions through the public API and the
// servers restart (and, on Redis, die and lose replies); at the end every
// flow must have finished, with an outcome its tasks' log explains. It
// lives here, beside TestChaos, because it needs what TestChaos has: server
// processes to SIGKILL and restart (fleet) and the fault proxy between
// them and Redis; the membroker run shares everything but those.
//
// Run longer or with another seed:
//
//	go test -race -run FlowModel ./internal/chaos -args -flowmodel.seed=7 -flowmodel.scale=10
var (
	flowModelSeed  = flag.Uint64("flowmodel.seed", envUint("TIDE_FLOWMODEL_SEED", 1), "seed of the flow model (TestFlowModel*)")
	flowModelScale = flag.Int("flowmodel.scale", int(envUint("TIDE_FLOWMODEL_SCALE", 1)), "length of the flow model's run: flows, operator actions and faults scale with it")
)

func envUint(name string, def uint64) uint64 {
	if v, err := strconv.ParseUint(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

// One unit of scale of the model run.
const (
	modelActive       = 8 * time.Second // flows are enqueued and the operator acts
	modelWorkflows    = 100
	modelBatches      = 30
	modelOpEvery      = 25 * time.Millisecond
	modelRecent       = 25 // the operator's targets: steps of the last flows
	modelRecentCancel = 6  // CancelWorkflow's: the newest flows
	modelMaxRetry     = 8  // planned failures (<= 2) and a few recoveries stay below
	modelDrainLimit   = 60 * time.Second
)

// mStep is one step of a model flow (for a batch: a task, or its callback).
type mStep struct {
	name, queue, id string
	after           []string
	runOnFail       bool
	plan            plan
	delay           time.Duration // ProcessIn
	notify          bool          // NotifyURL to the model's receiver
	// held: its task ID is held by a plain task stored first (hold), so
	// the step fails when it is released; holder is what became of that
	// task ("completed", or why not).
	held   bool
	holder string
	wait   bool // a Client.Wait follows its task from its enqueue (waitStep)
}

// mFlow is a workflow or batch the model enqueued.
type mFlow struct {
	id         string
	batch      bool
	steps      []*mStep // for a batch, the tasks and then the callback
	byName     map[string]*mStep
	callback   *mStep
	retention  bool  // a batch whose completed tasks are kept
	createdSeq int64 // log position before it was enqueued
}

func randPlan(r *rand.Rand) plan {
	switch x := r.IntN(100); {
	case x < 50:
		return plan{kind: "ok"}
	case x < 62:
		return plan{kind: "skip"}
	case x < 80:
		return plan{kind: "retry", n: 1 + r.IntN(2)}
	default:
		return plan{kind: "slow", n: 100 + r.IntN(500)}
	}
}

// flowQueues picks the 2 or 3 queues of one flow.
func flowQueues(r *rand.Rand) []string {
	qs := slices.Clone(modelQueues)
	r.Shuffle(len(qs), func(i, j int) { qs[i], qs[j] = qs[j], qs[i] })
	return qs[:2+r.IntN(2)]
}

func genWorkflow(r *rand.Rand, id string) *mFlow {
	f := &mFlow{id: id, byName: map[string]*mStep{}}
	qs := flowQueues(r)
	n := 2 + r.IntN(7)
	for i := range n {
		s := &mStep{name: "s" + strconv.Itoa(i), queue: qs[r.IntN(len(qs))], plan: randPlan(r)}
		s.id = id + "/" + s.name
		for j := range i {
			if r.IntN(100) < 35 {
				s.after = append(s.after, "s"+strconv.Itoa(j))
			}
		}
		if len(s.after) > 0 && r.IntN(100) < 25 {
			s.runOnFail = true
		}
		if len(s.after) == 0 && r.IntN(100) < 20 {
			s.delay = time.Duration(100+r.IntN(1400)) * time.Millisecond
		}
		extras(r, s, len(s.after) == 0)
		f.steps = append(f.steps, s)
		f.byName[s.name] = s
	}
	return f
}

func genBatch(r *rand.Rand) *mFlow {
	f := &mFlow{batch: true, byName: map[string]*mStep{}, retention: r.IntN(2) == 0}
	qs := flowQueues(r)
	n := 2 + r.IntN(19)
	for i := range n {
		s := &mStep{name: strconv.Itoa(i), queue: qs[r.IntN(len(qs))], plan: randPlan(r)}
		if r.IntN(100) < 20 {
			s.delay = time.Duration(100+r.IntN(1400)) * time.Millisecond
		}
		extras(r, s, true)
		f.steps = append(f.steps, s)
	}
	cb := &mStep{name: "callback", queue: qs[r.IntN(len(qs))], plan: plan{kind: "ok"}, runOnFail: true}
	if r.IntN(4) == 0 {
		cb.plan = plan{kind: "slow", n: 100 + r.IntN(300)}
	}
	cb.notify = r.IntN(100) < modelNotifyPct
	for _, s := range f.steps {
		cb.after = append(cb.after, s.name)
	}
	f.steps = append(f.steps, cb)
	f.callback = cb
	return f
}

// modelEnv is what differs between the Redis run and the membroker run.
type modelEnv struct {
	name   string
	client *tide.Client    // the producer's and operator's (through the proxy on Redis)
	insp   *tide.Inspector // the operator's
	obs    *tide.Inspector // the observer's (straight to Redis)
	rec    recorder
	// faults applies faults until stop is closed and returns what it did,
	// by kind. It logs "F <kind> start|end" around faults that lose or
	// delay replies and "K <incarnation>" for every process SIGKILLed.
	faults func(stop <-chan struct{}, r *rand.Rand) map[string]int
	// calm ends every fault and makes sure every server runs.
	calm func()
	// stop shuts the servers down and returns what went wrong.
	stop func() []error
}

// modelRun is one run of the model.
type modelRun struct {
	t   *testing.T
	env *modelEnv
	ctx context.Context

	mu      sync.Mutex
	flows   []*mFlow
	lost    int            // batches whose EnqueueBatch gave no ID
	ops     map[string]int // operator actions by "kind result"
	opKinds map[string]int
	paused  map[string]int // queue -> actions left until it is unpaused
	opID    atomic.Int64

	sink    *notifySink    // receives the steps' NotifyURL notifications
	waits   []*mWait       // Client.Wait calls on steps' tasks
	waiting sync.WaitGroup // their goroutines
	waitCtx context.Context
	holds   int // tasks stored to hold a step's ID
}

// runFlowModel runs the model on env and checks it.
func runFlowModel(t *testing.T, env *modelEnv) {
	seed, scale := *flowModelSeed, max(*flowModelScale, 1)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("flow model (%s) failed with seed %d, scale %d: go test -race -run '%s' ./internal/chaos -args -flowmodel.seed=%d -flowmodel.scale=%d",
				env.name, seed, scale, t.Name(), seed, scale)
		}
	})
	m := &modelRun{t: t, env: env, ctx: context.Background(), ops: map[string]int{}, opKinds: map[string]int{}, paused: map[string]int{},
		sink: newNotifySink(t)}
	waitCtx, stopWaits := context.WithCancel(m.ctx)
	m.waitCtx = waitCtx
	begin := time.Now()
	active := modelActive * time.Duration(scale)
	nWf, nB := modelWorkflows*scale, modelBatches*scale

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var faults map[string]int
	wg.Go(func() { faults = env.faults(stop, rand.New(rand.NewPCG(seed, 3))) })
	wg.Go(func() { m.operate(stop, rand.New(rand.NewPCG(seed, 2))) })
	m.produce(rand.New(rand.NewPCG(seed, 1)), nWf, nB, active)
	close(stop)
	wg.Wait()
	activeEnd := time.Now()

	m.unpauseAll()
	env.calm()
	quiet := m.waitQuiet(modelDrainLimit + 10*time.Second*time.Duration(scale))
	quietAt := time.Now()
	m.endWaits(stopWaits)
	for _, err := range env.stop() {
		t.Error(err)
	}
	fig := m.check()
	end := time.Now()
	if keep := os.Getenv("TIDE_CHAOS_KEEP"); keep != "" && t.Failed() {
		m.keepLog(keep)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("flow model on %s: seed %d, scale %d", env.name, seed, scale)
	t.Logf("flows: %d workflows, %d batches (%d batches lost to an EnqueueBatch error); %d steps (succeeded %d, failed %d, cancelled %d); flows ended succeeded %d, failed %d, cancelled %d",
		fig.workflows, fig.batches, m.lost, fig.steps, fig.stepState[tide.StepSucceeded], fig.stepState[tide.StepFailed], fig.stepState[tide.StepCanceled],
		fig.flowState[tide.FlowSucceeded], fig.flowState[tide.FlowFailed], fig.flowState[tide.FlowCanceled])
	t.Logf("handlers: %d starts, %d successes; %d steps succeeded more than once (each explained by a SIGKILL or a fault window); %d starts after their workflow's CancelWorkflow returned (each saw its cancellation); %d flows no action touched, predicted exactly",
		fig.starts, fig.successes, fig.dups, fig.late, fig.untouched)
	t.Logf("batch callbacks: %d, ran once %d, never (batch or callback stopped by an action) %d, more than once (explained) %d",
		fig.callbacks, fig.cbOnce, fig.cbNever, fig.cbMore)
	t.Logf("operator actions: %d: %s", m.totalOps(), joinCounts(m.opKinds))
	t.Logf("operator results: %s", joinCounts(m.ops))
	t.Logf("notifications: %d steps with NotifyURL, %d POSTs delivered (%d for an end already notified: at least once), %d answered 503 and retried; holders: %d task IDs held before their step; Wait: %s",
		fig.notifySteps, fig.notified, fig.notifyDups, m.sink.refusedCount(), m.holds, joinCounts(fig.waits))
	t.Logf("faults: %s", joinCounts(faults))
	t.Logf("seconds: active %.1f, until quiet %.1f (quiet: %v), checks %.1f, total %.1f",
		activeEnd.Sub(begin).Seconds(), quietAt.Sub(activeEnd).Seconds(), quiet, end.Sub(quietAt).Seconds(), end.Sub(begin).Seconds())
}

// keepLog writes the model's log into a new file in dir, for a post-mortem.
func (m *modelRun) keepLog(dir string) {
	lines, err := m.env.rec.lines(m.ctx)
	if err != nil {
		m.t.Logf("model log not kept: %v", err)
		return
	}
	f, err := os.CreateTemp(dir, "flowmodel-*.log")
	if err != nil {
		m.t.Logf("model log not kept: %v", err)
		return
	}
	defer f.Close()
	for _, l := range lines {
		fmt.Fprintf(f, "%d %s\n", l.seq, l.text)
	}
	m.t.Logf("model log kept in %s", f.Name())
}

func (m *modelRun) totalOps() int {
	n := 0
	for _, v := range m.opKinds {
		n += v
	}
	return n
}

func joinCounts(c map[string]int) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s %d", k, c[k])
	}
	return sb.String()
}

// log appends a line to the model's log; the run fails if it cannot.
func (m *modelRun) log(line string) int64 {
	c, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	seq, _, err := m.env.rec.add(c, line, "")
	if err != nil {
		m.t.Errorf("model log: %v", err)
	}
	return seq
}

// produce enqueues nWf workflows and nB batches spread over d.
func (m *modelRun) produce(r *rand.Rand, nWf, nB int, d time.Duration) {
	kinds := make([]bool, 0, nWf+nB) // true: batch
	for range nWf {
		kinds = append(kinds, false)
	}
	for range nB {
		kinds = append(kinds, true)
	}
	r.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	tick := time.NewTicker(d / time.Duration(len(kinds)))
	defer tick.Stop()
	for i, batch := range kinds {
		<-tick.C
		if batch {
			m.enqueueBatch(genBatch(r), i)
		} else {
			m.enqueueWorkflow(genWorkflow(r, fmt.Sprintf("wf-%d", i)))
		}
	}
}

// retryUnavailable calls fn until it returns something other than an
// ErrUnavailable (a fault's doing), at most 10 times.
func retryUnavailable(fn func() error) error {
	var err error
	for range 10 {
		if err = fn(); !errors.Is(err, tide.ErrUnavailable) {
			return err
		}
	}
	return err
}

// buildWorkflow builds f's workflow; changed gives its first step another
// payload (the same ID with other steps).
func (m *modelRun) buildWorkflow(f *mFlow, changed bool) *tide.Workflow {
	wf := tide.NewWorkflow(f.id)
	for i, s := range f.steps {
		opts := []tide.Option{tide.Queue(s.queue), tide.MaxRetry(modelMaxRetry)}
		if s.delay > 0 {
			opts = append(opts, tide.ProcessIn(s.delay))
		}
		if s.notify {
			opts = append(opts, tide.NotifyURL(m.sink.url()))
		}
		var so []tide.StepOption
		if len(s.after) > 0 {
			so = append(so, tide.After(s.after...))
		}
		if s.runOnFail {
			so = append(so, tide.OnDependencyFailure(tide.RunDependents))
		}
		payload := s.plan.String()
		if changed && i == 0 {
			payload = map[bool]string{true: "ok", false: "skip"}[payload != "ok"]
		}
		wf.Add(s.name, tide.NewTask("fm:step", []byte(payload), opts...), so...)
	}
	return wf
}

func (m *modelRun) enqueueWorkflow(f *mFlow) {
	wf := m.buildWorkflow(f, false)
	f.createdSeq = m.log("N " + f.id)
	for _, s := range f.steps {
		if s.held {
			s.holder = m.hold(s.queue, s.id)
		}
	}
	err := retryUnavailable(func() error {
		c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
		defer cancel()
		_, err := m.env.client.EnqueueWorkflow(c, wf) // the same ID and steps resume the first call
		return err
	})
	if err != nil {
		m.t.Errorf("EnqueueWorkflow %s: %v", f.id, err)
		return
	}
	m.mu.Lock()
	m.flows = append(m.flows, f)
	m.mu.Unlock()
	for _, s := range f.steps {
		if s.wait {
			m.waitStep(f, s)
		}
	}
}

func (m *modelRun) enqueueBatch(f *mFlow, i int) {
	members := f.steps[:len(f.steps)-1]
	tasks := make([]*tide.Task, len(members))
	f.createdSeq = m.log(fmt.Sprintf("N batch-%d", i))
	for j, s := range members {
		opts := []tide.Option{tide.Queue(s.queue)}
		if s.delay > 0 {
			opts = append(opts, tide.ProcessIn(s.delay))
		}
		if s.notify {
			opts = append(opts, tide.NotifyURL(m.sink.url()))
		}
		if s.held {
			// A member's TaskID held by a plain task: it counts as failed.
			s.id = fmt.Sprintf("fm-held-%d-%d", i, j)
			s.holder = m.hold(s.queue, s.id)
			opts = append(opts, tide.TaskID(s.id))
		}
		tasks[j] = tide.NewTask("fm:step", []byte(s.plan.String()), opts...)
	}
	cbOpts := []tide.Option{tide.Queue(f.callback.queue)}
	if f.callback.notify {
		cbOpts = append(cbOpts, tide.NotifyURL(m.sink.url()))
	}
	opts := []tide.Option{tide.MaxRetry(modelMaxRetry), tide.OnBatchDone(tide.NewTask("fm:callback", []byte(f.callback.plan.String()), cbOpts...))}
	if f.retention {
		opts = append(opts, tide.Retention(time.Hour))
	}
	c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	info, err := m.env.client.EnqueueBatch(c, tasks, opts...)
	cancel()
	switch {
	case info == nil && errors.Is(err, tide.ErrUnavailable):
		// Nothing tells which batch it was: the final listing of batches
		// still checks that every stored batch ended.
		m.mu.Lock()
		m.lost++
		m.mu.Unlock()
		return
	case info == nil:
		m.t.Errorf("EnqueueBatch: %v", err)
		return
	case err != nil:
		m.t.Logf("EnqueueBatch %s: %v (the batch is checked like the others)", info.ID, err)
	}
	f.id = info.ID
	for _, s := range f.steps {
		if !s.held {
			s.id = f.id + "/" + s.name
		}
		f.byName[s.name] = s
	}
	if info.CallbackID != f.callback.id {
		m.t.Errorf("batch %s: callback ID %q, want %q", f.id, info.CallbackID, f.callback.id)
	}
	m.mu.Lock()
	m.flows = append(m.flows, f)
	m.mu.Unlock()
	for _, s := range f.steps {
		if s.wait {
			m.waitStep(f, s)
		}
	}
}

// The operator's actions, with their weights.
var opWeights = []struct {
	kind string
	w    int
}{
	{"archive", 10}, {"delete", 10}, {"run", 8}, {"cancelprocessing", 8}, {"cancel", 8},
	{"cancelworkflow", 6}, {"archiveall", 1}, {"deleteall", 1}, {"runall", 3}, {"pause", 3}, {"reenqueue", 3},
}

// classify sorts an action's error: the expected ones, those of a fault
// (the outcome is unknown), and the rest, which fail the run.
func classify(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, tide.ErrTaskNotFound):
		return "notfound"
	case errors.Is(err, tide.ErrTaskActive):
		return "active"
	case errors.Is(err, tide.ErrFlowStep):
		return "flowstep"
	case errors.Is(err, tide.ErrInternalTask):
		return "internal"
	case errors.Is(err, tide.ErrTaskState):
		return "state"
	case errors.Is(err, tide.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, tide.ErrWorkflowExists):
		return "exists"
	}
	return "unexpected"
}

// operate applies random operator actions until stop is closed.
func (m *modelRun) operate(stop <-chan struct{}, r *rand.Rand) {
	total := 0
	for _, o := range opWeights {
		total += o.w
	}
	tick := time.NewTicker(modelOpEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		m.unpauseDue()
		x := r.IntN(total)
		kind := ""
		for _, o := range opWeights {
			if x < o.w {
				kind = o.kind
				break
			}
			x -= o.w
		}
		m.act(kind, r)
	}
}

// target picks a task for a single action of kind: often one that is
// live now (listed in a state the action applies to; workflow follow-ups
// included), otherwise a step of a recent flow, whatever its state.
func (m *modelRun) target(kind string, r *rand.Rand) (queue, id string, ok bool) {
	if r.IntN(100) < 45 {
		states := map[string][]tide.TaskState{
			"archive":          {tide.StatePending, tide.StateScheduled, tide.StateRetry},
			"delete":           {tide.StatePending, tide.StateScheduled, tide.StateRetry, tide.StateArchived},
			"run":              {tide.StateScheduled, tide.StateRetry, tide.StateArchived},
			"cancelprocessing": {tide.StateActive},
			"cancel":           {tide.StatePending, tide.StateScheduled, tide.StateRetry, tide.StateActive},
		}[kind]
		q := modelQueues[r.IntN(len(modelQueues))]
		c, cancel := context.WithTimeout(m.ctx, 10*time.Second)
		ts, err := m.env.insp.ListTasks(c, q, states[r.IntN(len(states))], 1, 20)
		cancel()
		if err == nil && len(ts) > 0 {
			return q, ts[r.IntN(len(ts))].ID, true
		}
	}
	f := m.recentFlow(r, modelRecent)
	if f == nil {
		return "", "", false
	}
	s := f.steps[r.IntN(len(f.steps))]
	return s.queue, s.id, true
}

// recentFlow picks one of the last n flows enqueued.
func (m *modelRun) recentFlow(r *rand.Rand, n int) *mFlow {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.flows) == 0 {
		return nil
	}
	recent := m.flows[max(0, len(m.flows)-n):]
	return recent[r.IntN(len(recent))]
}

func (m *modelRun) act(kind string, r *rand.Rand) {
	c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	in, cl := m.env.insp, m.env.client
	begin := func(queue, target, state string) string {
		id := strconv.FormatInt(m.opID.Add(1), 10)
		m.log(fmt.Sprintf("O %s %s %s %s %s", id, kind, queue, target, state))
		return id
	}
	finish := func(id string, err error, n int) {
		class := classify(err)
		m.log(fmt.Sprintf("R %s %s %d", id, class, n))
		m.mu.Lock()
		m.opKinds[kind]++
		m.ops[kind+" "+class]++
		m.mu.Unlock()
		if class == "unexpected" {
			m.t.Errorf("operator action %s (#%s): unexpected error: %v", kind, id, err)
		}
	}
	switch kind {
	case "archive", "delete", "run", "cancelprocessing", "cancel":
		q, task, ok := m.target(kind, r)
		if !ok {
			return
		}
		id := begin(q, task, "-")
		var err error
		switch kind {
		case "archive":
			err = in.ArchiveTask(c, q, task)
		case "delete":
			err = in.DeleteTask(c, q, task)
		case "run":
			err = in.RunTask(c, q, task)
		case "cancelprocessing":
			err = in.CancelProcessing(c, q, task)
		case "cancel":
			err = cl.Cancel(c, q, task)
		}
		finish(id, err, -1)
	case "archiveall", "deleteall", "runall":
		q := modelQueues[r.IntN(len(modelQueues))]
		states := map[string][]tide.TaskState{
			"archiveall": {tide.StatePending, tide.StateScheduled, tide.StateRetry},
			"deleteall":  {tide.StatePending, tide.StateScheduled, tide.StateRetry, tide.StateArchived, tide.StateCompleted},
			"runall":     {tide.StateScheduled, tide.StateRetry, tide.StateArchived},
		}[kind]
		st := states[r.IntN(len(states))]
		id := begin(q, "-", st.String())
		var n int
		var err error
		switch kind {
		case "archiveall":
			n, err = in.ArchiveAllTasks(c, q, st)
		case "deleteall":
			n, err = in.DeleteAllTasks(c, q, st)
		case "runall":
			n, err = in.RunAllTasks(c, q, st)
		}
		finish(id, err, n)
	case "cancelworkflow":
		// One of the newest flows: its steps are still running and ending.
		f := m.recentFlow(r, modelRecentCancel)
		if f == nil {
			return
		}
		id := begin("-", f.id, "-")
		// A re-run answers like the first: a caller whose call failed calls
		// again.
		err := retryUnavailable(func() error { return cl.CancelWorkflow(c, f.id) })
		if err == nil {
			mc, mcancel := context.WithTimeout(m.ctx, 10*time.Second)
			if _, err := m.env.rec.mark(mc, fmt.Sprintf("X %s %s", f.id, id), f.id); err != nil {
				m.t.Errorf("model log: %v", err)
			}
			mcancel()
		}
		finish(id, err, -1)
	case "reenqueue":
		m.reenqueue(r, begin, finish)
	case "pause":
		q := modelQueues[r.IntN(len(modelQueues))]
		m.mu.Lock()
		_, already := m.paused[q]
		m.mu.Unlock()
		if already {
			return
		}
		id := begin(q, "-", "-")
		err := retryUnavailable(func() error { return in.PauseQueue(c, q) })
		m.mu.Lock()
		m.paused[q] = 4 + r.IntN(20) // actions until it is unpaused
		m.mu.Unlock()
		finish(id, err, -1)
	}
}

// unpauseDue unpauses the queues whose pause is over.
func (m *modelRun) unpauseDue() {
	m.mu.Lock()
	var due []string
	for q, n := range m.paused {
		if n <= 1 {
			due = append(due, q)
		} else {
			m.paused[q] = n - 1
		}
	}
	m.mu.Unlock()
	for _, q := range due {
		m.unpause(q)
	}
}

func (m *modelRun) unpause(q string) {
	c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	id := strconv.FormatInt(m.opID.Add(1), 10)
	m.log(fmt.Sprintf("O %s unpause %s - -", id, q))
	err := retryUnavailable(func() error { return m.env.insp.UnpauseQueue(c, q) })
	m.log(fmt.Sprintf("R %s %s -1", id, classify(err)))
	m.mu.Lock()
	m.opKinds["unpause"]++
	m.ops["unpause "+classify(err)]++
	if err == nil {
		delete(m.paused, q)
	}
	m.mu.Unlock()
	if err != nil {
		m.t.Errorf("UnpauseQueue %s: %v", q, err)
	}
}

// unpauseAll unpauses every model queue (paused or not: a pause whose
// reply was lost may have landed).
func (m *modelRun) unpauseAll() {
	for _, q := range modelQueues {
		m.unpause(q)
	}
}

// waitQuiet waits until no model queue holds a task that is not finished
// and every flow has ended (FinishedAt set: a cancelled flow ends when its
// last step does), at most limit. It reports whether that came.
func (m *modelRun) waitQuiet(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if m.quiet() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (m *modelRun) quiet() bool {
	c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	for _, q := range modelQueues {
		qi, err := m.env.obs.QueueInfo(c, q)
		if err != nil || qi.Pending+qi.Active+qi.Scheduled+qi.Retry > 0 {
			return false
		}
	}
	for _, list := range []func(context.Context, int, int) ([]*tide.WorkflowInfo, int, error){m.env.obs.Workflows, m.batches} {
		for off := 0; ; off += 1000 {
			fs, n, err := list(c, off, 1000)
			if err != nil {
				return false
			}
			for _, f := range fs {
				if f.State == tide.FlowRunning || f.FinishedAt.IsZero() {
					return false
				}
			}
			if off+1000 >= n {
				break
			}
		}
	}
	return true
}

// batches lists batches as workflows (their states are what matters).
func (m *modelRun) batches(ctx context.Context, off, limit int) ([]*tide.WorkflowInfo, int, error) {
	bs, n, err := m.env.obs.Batches(ctx, off, limit)
	out := make([]*tide.WorkflowInfo, len(bs))
	for i, b := range bs {
		out[i] = &tide.WorkflowInfo{ID: b.ID, State: b.State, FinishedAt: b.FinishedAt}
	}
	return out, n, err
}
