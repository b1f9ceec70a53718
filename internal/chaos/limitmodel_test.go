package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

// The limit model: random work over three queues with random flow-control
// limits (Concurrency, Rate, GroupConcurrency, GroupRate; one queue
// Ordered), changed at runtime, while handlers defer with RetryAfter and
// ThrottleGroup, an operator replaces, cancels and deletes tasks, a queue is
// repartitioned, one server process is SIGKILLed and another cut off from
// Redis for longer than its lease. Every handler logs its start and end on
// Redis's clock; the checker (limitmodel_check_test.go) then replays the
// log against the limits in force. The membroker run shares everything but
// the processes, the proxy and Repartition.
//
// Run longer or with another seed:
//
//	go test -race -run LimitModel ./internal/chaos -args -limitmodel.seed=7 -limitmodel.scale=10
var (
	limitModelSeed  = flag.Uint64("limitmodel.seed", envUint("TIDE_LIMITMODEL_SEED", 1), "seed of the limit model (TestLimitModel*)")
	limitModelScale = flag.Int("limitmodel.scale", int(envUint("TIDE_LIMITMODEL_SCALE", 1)), "length of the limit model's run: tasks, operator actions and faults scale with it")
)

// One unit of scale of the limit model.
const (
	lmActive     = 8 * time.Second // tasks are enqueued and the operator acts
	lmBurstEvery = 650 * time.Millisecond
	lmOpEvery    = 200 * time.Millisecond
	lmRecent     = 30 // the operator's targets: the last tasks enqueued
	lmGroups     = 4  // groups per queue
	lmMaxRetry   = 10 // planned failures (<= 2) and recoveries stay below
	lmDrainLimit = 60 * time.Second
	// lmStall is how long the drain may go without a task fewer left
	// (waitQuiet): longer than any hold the model makes (throttles and
	// RetryAfter under 3 s, rate periods of 2-3 s, a lease of a killed
	// server recovered in seconds).
	lmStall = 20 * time.Second
	// lmLong is the shortest long task: one that runs past the 0.9 lease
	// after which a server cut off from Redis stops its handlers.
	lmLong = 2000
)

// Where in a unit of scale the faults and the repartition come.
const (
	lmKillAt        = 35 // percent of lmActive
	lmRepartitionAt = 45
	lmCutAt         = 60
	lmCutFor        = limitLease + 1500*time.Millisecond
)

// limitEnv is what differs between the Redis run and the membroker run.
type limitEnv struct {
	name    string
	client  *tide.Client    // the producer's and operator's
	insp    *tide.Inspector // the operator's and observer's
	rec     recorder
	servers int // servers up at once, each with limitConcurrency
	// repartition is set when the broker has partitions.
	repartition bool
	// start starts the servers and returns when each has logged "U".
	start func()
	// fault applies fault kind ("kill", "cut") of unit u and returns what
	// it did; it logs "K <server>" after a SIGKILL, "C start|end <server>"
	// around a cut, "G begin|end <server>" around a graceful restart.
	fault func(kind string, u int, r *rand.Rand) string
	// stop shuts the servers down and returns what went wrong.
	stop func() []error
}

// lmTask is a task ID the model enqueued, with its latest version.
type lmTask struct {
	queue, group, id string
	ver              int
}

// limitRun is one run of the limit model.
type limitRun struct {
	t   *testing.T
	env *limitEnv
	ctx context.Context

	enqMu  sync.Mutex // enqueues one at a time: their log order is their order
	mu     sync.Mutex
	tasks  []*lmTask // in enqueue order
	byID   map[string]*lmTask
	n      int                 // tasks made
	ops    map[string]int      // actions by "kind result"
	limits map[string][]string // the limits set, by queue
}

// runLimitModel runs the limit model on env and checks it.
func runLimitModel(t *testing.T, env *limitEnv) {
	seed, scale := *limitModelSeed, max(*limitModelScale, 1)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("limit model (%s) failed with seed %d, scale %d: go test -race -run '%s' ./internal/chaos -args -limitmodel.seed=%d -limitmodel.scale=%d",
				env.name, seed, scale, t.Name(), seed, scale)
		}
	})
	m := &limitRun{t: t, env: env, ctx: context.Background(), byID: map[string]*lmTask{}, ops: map[string]int{}, limits: map[string][]string{}}
	begin := time.Now()
	lr := rand.New(rand.NewPCG(seed, 11))
	for _, q := range limitQueues {
		m.setLimits(q, randLimits(lr, q == limitOrdered))
	}
	env.start()
	active := lmActive * time.Duration(scale)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	faults := map[string]int{}
	wg.Go(func() {
		r := rand.New(rand.NewPCG(seed, 3))
		start := time.Now()
		for u := range scale {
			for _, ev := range []struct {
				pct  int
				kind string
			}{{lmKillAt, "kill"}, {lmRepartitionAt, "repartition"}, {lmCutAt, "cut"}} {
				timer := time.NewTimer(time.Until(start.Add(time.Duration(u)*lmActive + lmActive*time.Duration(ev.pct)/100)))
				select {
				case <-stop:
					timer.Stop()
					return
				case <-timer.C:
				}
				if ev.kind == "repartition" {
					if env.repartition {
						wg.Go(func() { m.repartition(limitQueues[r.IntN(2)*2], 3-u%2) })
					}
					continue
				}
				if ev.kind == "cut" {
					m.longBurst(r)
				}
				if what := env.fault(ev.kind, u, r); what != "" {
					faults[what]++
				}
			}
		}
	})
	wg.Go(func() { m.operate(stop, rand.New(rand.NewPCG(seed, 2)), lr) })
	m.produce(rand.New(rand.NewPCG(seed, 1)), active)
	close(stop)
	wg.Wait()
	activeEnd := time.Now()

	quiet := m.waitQuiet(2 * lmDrainLimit * time.Duration(scale))
	if !quiet {
		t.Errorf("the queues did not drain: no task fewer left for %v, or %v in all", lmStall, 2*lmDrainLimit*time.Duration(scale))
		m.logStuck()
	}
	quietAt := time.Now()
	for _, err := range env.stop() {
		t.Error(err)
	}
	lines, err := env.rec.lines(m.ctx)
	if err != nil {
		t.Fatalf("model log: %v", err)
	}
	fig := checkLimitModel(t, lines)
	if keep := os.Getenv("TIDE_CHAOS_KEEP"); keep != "" && t.Failed() {
		keepLines(t, keep, "limitmodel-*.log", lines)
	}
	end := time.Now()

	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("limit model on %s: seed %d, scale %d", env.name, seed, scale)
	t.Logf("tasks: %d made; %s", m.n, fig.summary())
	t.Logf("operator: %s", joinCounts(m.ops))
	for _, q := range limitQueues {
		t.Logf("limits of %s: %s", q, strings.Join(m.limits[q], " → "))
	}
	t.Logf("faults: %s", joinCounts(faults))
	t.Logf("seconds: active %.1f, until quiet %.1f, checks %.1f, total %.1f",
		activeEnd.Sub(begin).Seconds(), quietAt.Sub(activeEnd).Seconds(), end.Sub(quietAt).Seconds(), end.Sub(begin).Seconds())
}

// randLimits draws a queue's limits.
func randLimits(r *rand.Rand, ordered bool) tide.QueueLimits {
	l := tide.QueueLimits{Ordered: ordered}
	if r.IntN(5) != 0 {
		l.Concurrency = 1 + r.IntN(6)
	}
	if r.IntN(2) == 0 {
		// Periods of 2 or 3 s: the checker's windows are lmRateLag
		// shorter.
		l.Rate = tide.Rate{Limit: 6 + r.IntN(10), Per: time.Duration(2+r.IntN(2)) * time.Second}
	}
	if !ordered && r.IntN(3) != 0 {
		l.GroupConcurrency = 1 + r.IntN(3)
	}
	if r.IntN(2) == 0 {
		l.GroupRate = tide.Rate{Limit: 3 + r.IntN(5), Per: time.Duration(2+r.IntN(2)) * time.Second}
	}
	return l
}

// encodeLimits writes limits as one log field: c=3,r=10/1000,gc=2,gr=3/2000,o=1
// (rates as limit/milliseconds; a field left out is no limit).
func encodeLimits(l tide.QueueLimits) string {
	var f []string
	if l.Concurrency > 0 {
		f = append(f, fmt.Sprintf("c=%d", l.Concurrency))
	}
	if l.Rate.Limit > 0 {
		f = append(f, fmt.Sprintf("r=%d/%d", l.Rate.Limit, l.Rate.Per.Milliseconds()))
	}
	if l.GroupConcurrency > 0 {
		f = append(f, fmt.Sprintf("gc=%d", l.GroupConcurrency))
	}
	if l.GroupRate.Limit > 0 {
		f = append(f, fmt.Sprintf("gr=%d/%d", l.GroupRate.Limit, l.GroupRate.Per.Milliseconds()))
	}
	if l.Ordered {
		f = append(f, "o=1")
	}
	if len(f) == 0 {
		return "none"
	}
	return strings.Join(f, ",")
}

func decodeLimits(s string) (tide.QueueLimits, error) {
	var l tide.QueueLimits
	if s == "none" {
		return l, nil
	}
	rate := func(v string) (tide.Rate, error) {
		n, per, ok := strings.Cut(v, "/")
		a, err1 := strconv.Atoi(n)
		b, err2 := strconv.Atoi(per)
		if !ok || err1 != nil || err2 != nil {
			return tide.Rate{}, fmt.Errorf("bad rate %q", v)
		}
		return tide.Rate{Limit: a, Per: time.Duration(b) * time.Millisecond}, nil
	}
	for _, f := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "c":
			l.Concurrency, err = strconv.Atoi(v)
		case "r":
			l.Rate, err = rate(v)
		case "gc":
			l.GroupConcurrency, err = strconv.Atoi(v)
		case "gr":
			l.GroupRate, err = rate(v)
		case "o":
			l.Ordered = true
		default:
			err = fmt.Errorf("bad limits %q", s)
		}
		if err != nil {
			return l, err
		}
	}
	return l, nil
}

// randTaskPlan draws what a task does, and its delay (none in the ordered
// queue).
func randTaskPlan(r *rand.Rand, queue string, grouped bool) (lmPlan, time.Duration) {
	var p lmPlan
	switch x := r.IntN(100); {
	case x < 61:
		p = lmPlan{kind: "ok", ms: 20 + r.IntN(230)}
	case x < 66:
		p = lmPlan{kind: "ok", ms: lmLong + r.IntN(1000)} // outlives a cut-off's lease
	case x < 76:
		p = lmPlan{kind: "fail", n: 1 + r.IntN(2), ms: 20 + r.IntN(80)}
	case x < 81:
		p = lmPlan{kind: "skip"}
	case x < 91 || !grouped:
		p = lmPlan{kind: "ra", ms: 300 + r.IntN(500)}
	default:
		p = lmPlan{kind: "thr", ms: 2000 + r.IntN(1000)}
	}
	var delay time.Duration
	if queue != limitOrdered && r.IntN(100) < 15 {
		delay = time.Duration(100+r.IntN(1400)) * time.Millisecond
	}
	return p, delay
}

// log appends a line to the model's log; the run fails if it cannot.
func (m *limitRun) log(line string) {
	c, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	if _, _, err := m.env.rec.add(c, line, ""); err != nil {
		m.t.Errorf("model log: %v", err)
	}
}

// produce enqueues bursts of tasks over d: each burst 5 to 20 tasks of one
// queue, spread over its groups (and some without a group), half of them
// mostly of one group.
func (m *limitRun) produce(r *rand.Rand, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		q := limitQueues[r.IntN(len(limitQueues))]
		hot := -1 // half the bursts are mostly one tenant's
		if r.IntN(2) == 0 {
			hot = r.IntN(lmGroups)
		}
		for range 5 + r.IntN(16) {
			group := ""
			switch {
			case hot >= 0 && r.IntN(100) < 70:
				group = fmt.Sprintf("%s%d", q[3:], hot)
			case r.IntN(100) >= map[string]int{"lm-a": 30, "lm-b": 10, "lm-o": 10}[q]:
				group = fmt.Sprintf("%s%d", q[3:], r.IntN(lmGroups))
			}
			m.mu.Lock()
			m.n++
			id := fmt.Sprintf("%s-%d", q, m.n)
			m.mu.Unlock()
			if group != "" {
				id += "{" + group + "}"
			}
			p, delay := randTaskPlan(r, q, group != "")
			m.enqueue(&lmTask{queue: q, group: group, id: id}, p, delay, false)
		}
		time.Sleep(time.Duration(r.Int64N(int64(2 * lmBurstEvery))))
	}
}

// longBurst enqueues a long task for each queue and group, so that the
// server about to be cut off is likely to run one: its handler must stop
// before its lease can have ended, while the others take its slots.
func (m *limitRun) longBurst(r *rand.Rand) {
	for _, q := range limitQueues {
		for g := range lmGroups {
			m.mu.Lock()
			m.n++
			id := fmt.Sprintf("%s-%d{%s%d}", q, m.n, q[3:], g)
			m.mu.Unlock()
			// Longer than the cut: a handler that went on past its lease
			// would still run when another server takes its slot.
			p := lmPlan{kind: "ok", ms: int(lmCutFor.Milliseconds()) + r.IntN(1500)}
			m.enqueue(&lmTask{queue: q, group: fmt.Sprintf("%s%d", q[3:], g), id: id}, p, 0, false)
		}
	}
}

// enqueue enqueues version ver+1 of task k (or replaces it) and logs it:
//
//	N <queue> <group|-> <id> <version> <plan> <delay ms> new|replace
//	Q <id> <version> ok|conflict
func (m *limitRun) enqueue(k *lmTask, p lmPlan, delay time.Duration, replace bool) {
	m.enqMu.Lock()
	defer m.enqMu.Unlock()
	m.mu.Lock()
	if old := m.byID[k.id]; old != nil {
		k = old
	}
	ver := k.ver + 1
	m.mu.Unlock()
	g, mode := k.group, "new"
	if g == "" {
		g = "-"
	}
	opts := []tide.Option{tide.Queue(k.queue), tide.TaskID(k.id), tide.MaxRetry(lmMaxRetry)}
	if k.group != "" {
		opts = append(opts, tide.Group(k.group))
	}
	if delay > 0 {
		opts = append(opts, tide.ProcessIn(delay))
	}
	if replace {
		opts = append(opts, tide.Replace())
		mode = "replace"
	}
	m.log(fmt.Sprintf("N %s %s %s %d %s %d %s", k.queue, g, k.id, ver, p, delay.Milliseconds(), mode))
	c, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	_, err := m.env.client.Enqueue(c, tide.NewTask("lm:task", []byte(p.String()+"|"+strconv.Itoa(ver))), opts...)
	cancel()
	res := "ok"
	switch {
	case errors.Is(err, tide.ErrTaskIDConflict):
		res = "conflict"
	case err != nil:
		m.t.Errorf("Enqueue %s: %v", k.id, err)
		res = "error"
	}
	m.log(fmt.Sprintf("Q %s %d %s", k.id, ver, res))
	m.mu.Lock()
	defer m.mu.Unlock()
	if res == "ok" {
		k.ver = ver
		if m.byID[k.id] == nil {
			m.byID[k.id] = k
			m.tasks = append(m.tasks, k)
		}
	}
	if replace {
		m.ops["replace "+res]++
	}
}

// recent picks one of the last lmRecent tasks enqueued.
func (m *limitRun) recent(r *rand.Rand) *lmTask {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.tasks) == 0 {
		return nil
	}
	ts := m.tasks[max(0, len(m.tasks)-lmRecent):]
	return ts[r.IntN(len(ts))]
}

// operate applies random operator actions until stop is closed: Replace,
// Cancel, Delete and new limits (drawn from lr).
func (m *limitRun) operate(stop <-chan struct{}, r, lr *rand.Rand) {
	tick := time.NewTicker(lmOpEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		switch x := r.IntN(12); {
		case x < 4:
			if k := m.recent(r); k != nil {
				p, delay := randTaskPlan(r, k.queue, k.group != "")
				m.enqueue(k, p, delay, true)
			}
		case x < 6:
			m.remove("cancel", r)
		case x < 8:
			m.remove("delete", r)
		case x < 10:
			q := limitQueues[r.IntN(len(limitQueues))]
			m.setLimits(q, randLimits(lr, q == limitOrdered))
		}
	}
}

// action logs an operator action around fn:
//
//	O <kind> <queue> <target> <args>
//	R <kind> <queue> <target> <result>
func (m *limitRun) action(kind, queue, target, args string, fn func(context.Context) error) error {
	m.log(fmt.Sprintf("O %s %s %s %s", kind, queue, target, args))
	c, cancel := context.WithTimeout(m.ctx, 60*time.Second)
	err := fn(c)
	cancel()
	res := "ok"
	switch {
	case err == nil:
	case errors.Is(err, tide.ErrTaskNotFound):
		res = "notfound"
	case errors.Is(err, tide.ErrTaskActive):
		res = "active"
	default:
		res = "error"
	}
	m.log(fmt.Sprintf("R %s %s %s %s", kind, queue, target, res))
	m.mu.Lock()
	m.ops[kind+" "+res]++
	m.mu.Unlock()
	return err
}

func (m *limitRun) remove(kind string, r *rand.Rand) {
	k := m.recent(r)
	if k == nil {
		return
	}
	m.enqMu.Lock() // no Replace of it meanwhile
	defer m.enqMu.Unlock()
	err := m.action(kind, k.queue, k.id, "-", func(c context.Context) error {
		if kind == "cancel" {
			return m.env.client.Cancel(c, k.queue, k.id)
		}
		return m.env.insp.DeleteTask(c, k.queue, k.id)
	})
	if err != nil && !errors.Is(err, tide.ErrTaskNotFound) && !errors.Is(err, tide.ErrTaskActive) {
		m.t.Errorf("%s %s: %v", kind, k.id, err)
	}
}

func (m *limitRun) setLimits(q string, l tide.QueueLimits) {
	m.mu.Lock()
	m.limits[q] = append(m.limits[q], encodeLimits(l))
	m.mu.Unlock()
	if err := m.action("limits", q, "-", encodeLimits(l), func(c context.Context) error {
		return m.env.insp.SetQueueLimits(c, q, l)
	}); err != nil {
		m.t.Errorf("SetQueueLimits %s: %v", q, err)
	}
}

func (m *limitRun) repartition(q string, n int) {
	if err := m.action("repartition", q, "-", strconv.Itoa(n), func(c context.Context) error {
		return m.env.insp.Repartition(c, q, n, nil)
	}); err != nil {
		m.t.Errorf("Repartition %s to %d: %v", q, n, err)
	}
}

// waitQuiet waits until no model queue holds a task that is not finished.
// It gives up when the tasks left have not gone down for lmStall, or after
// limit in all: a queue whose last limits allow few starts (seed 127: a
// GroupRate of 3 per 3 s over one group of some 60 tasks, many of which
// throttle it) drains for longer than a fixed budget, and slowness within
// the limits is no loss (checkIdle finds a runnable task left waiting with
// a slot free). It reports whether the queues drained.
func (m *limitRun) waitQuiet(limit time.Duration) bool {
	end := time.Now().Add(limit)
	stall := time.Now().Add(lmStall)
	least := -1
	for now := time.Now(); now.Before(end) && now.Before(stall); now = time.Now() {
		left := 0
		for _, q := range limitQueues {
			c, cancel := context.WithTimeout(m.ctx, 10*time.Second)
			qi, err := m.env.insp.QueueInfo(c, q)
			cancel()
			if err != nil {
				left = -1
				break
			}
			left += qi.Pending + qi.Active + qi.Scheduled + qi.Retry
		}
		if left == 0 {
			return true
		}
		if left > 0 && (least < 0 || left < least) {
			least, stall = left, now.Add(lmStall)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// logStuck logs what the queues hold, for a run that did not drain.
func (m *limitRun) logStuck() {
	for _, q := range limitQueues {
		c, cancel := context.WithTimeout(m.ctx, 10*time.Second)
		qi, err := m.env.insp.QueueInfo(c, q)
		if err != nil {
			m.t.Logf("%s: %v", q, err)
			cancel()
			continue
		}
		lim, _ := m.env.insp.QueueLimits(c, q)
		gs, _ := m.env.insp.Groups(c, q, 100)
		cancel()
		m.t.Logf("%s (limits %s): pending %d, active %d, scheduled %d, retry %d", q, encodeLimits(lim), qi.Pending, qi.Active, qi.Scheduled, qi.Retry)
		for _, g := range gs {
			m.t.Logf("  group %q: waiting %d, running %d, throttled until %v", g.Group, g.Waiting, g.Running, g.ThrottledUntil)
		}
	}
}
