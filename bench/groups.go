package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide"
)

// The groups and fairness workloads measure tide's groups (tide.Group, see
// the "Groups" section of the top-level README):
//
//   - groups: what per-group limits cost. The same tasks, the same server and
//     the same no-op handler, drained from a plain queue and spread over many
//     groups with QueueLimits{GroupConcurrency: 1} (and, to tell the cost of
//     the groups from that of the limit, over the groups without limits);
//     and both ways under a queue Concurrency below the server's, where
//     every slot that frees must wake a server for the next task.
//   - fairness: what groups are for. A few tasks enqueued behind a large
//     backlog wait for the whole backlog in a FIFO queue; in a group of their
//     own they take turns with the backlog's group.
//
// asynq has nothing to compare with: its groups aggregate tasks into one
// (Group + GroupAggregator) and have no per-group concurrency limit or fair
// dequeue. BullMQ has groups only in its paid BullMQ Pro package, which the
// bench cannot use. So groups runs on tide alone, and fairness sets tide's
// groups against FIFO queues (tide without groups, and asynq).
const (
	groupsQueue     = "grouped"
	groupsLimit     = 1  // QueueLimits.GroupConcurrency of the groups workload
	groupsQueueConc = 20 // QueueLimits.Concurrency of its Concurrency rows (under the server's 50)
	groupsEnqueuers = 8  // goroutines calling EnqueueMany, one group a call
	fairQueue       = "fair"
	fairBig         = "big"
	fairSmall       = "small"
	noGroupsCell    = "(no groups)"
	noGroupsNote    = "asynq: not run: its groups aggregate tasks (Group + GroupAggregator), with no per-group concurrency limit; BullMQ's groups are in the paid BullMQ Pro package, not available here"
)

func groupsWorkload(sz sizes) workload {
	return workload{
		name:    "groups",
		systems: []string{sysTide},
		absent:  noGroupsCell,
		about:   "cost of per-group limits: drain the same tasks without groups and over many groups (no limits; GroupConcurrency 1; a queue Concurrency, both ways) (tide only)",
		figs: []figure{
			{key: "grpPlain", label: fmt.Sprintf("groups: drain %s pending, no groups, concurrency %d, no-op handler (median of %d)", kcount(sz.grpN), sz.concurrency, sz.grpRounds), unit: "tasks/s"},
			{key: "grpFree", label: fmt.Sprintf("groups: the same %s over %s groups, no group limits (median of %d)", kcount(sz.grpN), kcount(sz.grpGroups), sz.grpRounds), unit: "tasks/s"},
			{key: "grpProc", label: fmt.Sprintf("groups: the same %s over %s groups, QueueLimits{GroupConcurrency: %d} (median of %d)", kcount(sz.grpN), kcount(sz.grpGroups), groupsLimit, sz.grpRounds), unit: "tasks/s"},
			{key: "grpConcPlain", label: fmt.Sprintf("groups: the same %s, no groups, QueueLimits{Concurrency: %d} (median of %d)", kcount(sz.grpN), groupsQueueConc, sz.grpRounds), unit: "tasks/s"},
			{key: "grpConcGrouped", label: fmt.Sprintf("groups: the same %s over %s groups, QueueLimits{Concurrency: %d} (median of %d)", kcount(sz.grpN), kcount(sz.grpGroups), groupsQueueConc, sz.grpRounds), unit: "tasks/s"},
		},
		limit: time.Duration(sz.grpRounds*len(groupsModes)) * 2 * time.Minute,
		run:   runGroups,
	}
}

func fairnessWorkload(sz sizes) workload {
	return workload{
		name:  "fairness",
		about: "wait of a few tasks enqueued behind a large backlog: FIFO queue, and (tide) in a group of their own",
		figs: []figure{
			{key: "fairF50", label: fmt.Sprintf("fairness, FIFO (no groups): %d tasks enqueued after %s, wait (start − enqueue) p50, concurrency %d", sz.fairSmallN, kcount(sz.fairBigN), sz.fairConcurrency), unit: "dur", lower: true, ratio: true},
			{key: "fairF99", label: "fairness, FIFO: wait of the few, p99", unit: "dur", lower: true, ratio: true},
			{key: "fairFMax", label: "fairness, FIFO: wait of the few, max", unit: "dur", lower: true, ratio: true},
			{key: "fairFBefore", label: "fairness, FIFO: backlog tasks started before the last of the few", unit: "count"},
			{key: "fairG50", label: fmt.Sprintf("fairness, tide groups: the %d in group %q after %s in group %q, wait p50 (asynq: FIFO above)", sz.fairSmallN, fairSmall, kcount(sz.fairBigN), fairBig), unit: "dur", lower: true, ratio: true},
			{key: "fairG99", label: "fairness, tide groups: wait of the few, p99 (asynq: FIFO)", unit: "dur", lower: true, ratio: true},
			{key: "fairGMax", label: "fairness, tide groups: wait of the few, max (asynq: FIFO)", unit: "dur", lower: true, ratio: true},
			{key: "fairGBefore", label: fmt.Sprintf("fairness, tide groups: %q tasks started before the last of %q (asynq: FIFO)", fairBig, fairSmall), unit: "count"},
		},
		limit: 8 * time.Minute,
		run:   runFairness,
	}
}

// ---- groups ----

// groupsMode is one way of storing the groups workload's tasks.
type groupsMode struct {
	key    string // figure key
	what   string // for notes and errors
	groups bool   // spread over grpGroups groups
	limit  bool   // with QueueLimits{GroupConcurrency: groupsLimit}
	conc   bool   // with QueueLimits{Concurrency: groupsQueueConc}
}

var groupsModes = []groupsMode{
	{key: "grpPlain", what: "no groups"},
	{key: "grpFree", what: "groups, no limits", groups: true},
	{key: "grpProc", what: fmt.Sprintf("groups, GroupConcurrency %d", groupsLimit), groups: true, limit: true},
	{key: "grpConcPlain", what: fmt.Sprintf("no groups, Concurrency %d", groupsQueueConc), conc: true},
	{key: "grpConcGrouped", what: fmt.Sprintf("groups, Concurrency %d", groupsQueueConc), groups: true, conc: true},
}

// groupsRatios are the pairs of modes (indices in groupsModes) whose
// ratio by round the note lists: what groups cost with each limit.
var groupsRatios = [][2]int{{2, 0}, {4, 3}}

// runGroups drains grpN pending tasks grpRounds times in each groupsMode,
// the order of the modes rotating from round to round, and reports the
// median rate of each.
func runGroups(ctx context.Context, e *env, kind string) (results, error) {
	if kind != sysTide {
		return nil, fmt.Errorf("groups: tide only (%s)", noGroupsNote)
	}
	got := make([][]float64, len(groupsModes))
	costs := make([][]redisCost, len(groupsModes))
	for round := range e.sz.grpRounds {
		for j := range groupsModes {
			m := (round + j) % len(groupsModes)
			r, c, err := drainGroups(ctx, e, groupsModes[m])
			if err != nil {
				return nil, err
			}
			got[m] = append(got[m], r)
			costs[m] = append(costs[m], c)
		}
	}
	res := results{}
	var parts []string
	for m, mode := range groupsModes {
		res[mode.key] = val{v: median(got[m])}
		parts = append(parts, fmt.Sprintf("%s %s", mode.what, rates(got[m])))
	}
	var pairs []string
	for _, pr := range groupsRatios {
		num, den := pr[0], pr[1]
		ratios := make([]string, len(got[den]))
		for i := range got[den] {
			ratios[i] = fmt.Sprintf("%.2f", got[num][i]/got[den][i])
		}
		pairs = append(pairs, fmt.Sprintf("%s ÷ %s by round: %s", groupsModes[num].what, groupsModes[den].what, strings.Join(ratios, " ")))
		// CPU-bound on a busy machine, throughput follows the CPU a task
		// costs (redis-server and the bench process together), which
		// swings far less than throughput from round to round.
		var cpu []string
		for i := range costs[den] {
			n, d := costs[num][i], costs[den][i]
			if n.redisCPU+n.benchCPU > 0 && d.benchCPU > 0 {
				cpu = append(cpu, fmt.Sprintf("%.2f", (d.redisCPU+d.benchCPU)/(n.redisCPU+n.benchCPU)))
			}
		}
		if len(cpu) > 0 {
			pairs = append(pairs, fmt.Sprintf("CPU per task, %s ÷ %s, by round: %s", groupsModes[den].what, groupsModes[num].what, strings.Join(cpu, " ")))
		}
	}
	e.note("groups/%s: %s tasks (%s groups), concurrency %d, each drain on a flushed Redis, order rotating; %s; %s",
		kind, kcount(e.sz.grpN), kcount(e.sz.grpGroups), e.sz.concurrency, strings.Join(parts, "; "), strings.Join(pairs, "; "))
	var cs []string
	for m, mode := range groupsModes {
		var parts []string
		for _, c := range costs[m] {
			parts = append(parts, c.String())
		}
		cs = append(cs, fmt.Sprintf("%s: %s", mode.what, strings.Join(parts, "; ")))
	}
	e.note("groups/%s, Redis per task by round (INFO commandstats from Start to drained: script calls, µs of script time, commands run inside scripts, PUBLISH, i.e. server wake-ups sent; and CPU time per task of redis-server, INFO cpu, and of the bench process, which runs the client and the server, /proc/self/stat): %s", kind, strings.Join(cs, " | "))
	e.note("groups: %s", noGroupsNote)
	return res, nil
}

// redisCost is what Redis spent per task on a drain, from INFO
// commandstats (reset just before the server starts), and the CPU time
// per task of redis-server and of the bench process (client and server)
// meanwhile (zero when unknown).
type redisCost struct {
	scripts, usec, inner, publish float64
	redisCPU, benchCPU            float64 // µs
}

func (c redisCost) String() string {
	return fmt.Sprintf("%.3f calls %.1f µs %.2f cmds %.3f pub, CPU %.1f µs Redis %.1f µs bench", c.scripts, c.usec, c.inner, c.publish, c.redisCPU, c.benchCPU)
}

// selfCPU is the bench process's CPU time so far (all its threads), in
// seconds, from /proc/self/stat; 0 where there is no /proc.
func selfCPU() float64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return float64(u+st) / clockTicks
}

// topLevel are commands the bench and the server send themselves, not
// run inside scripts.
var topLevel = map[string]bool{"evalsha": true, "eval": true, "info": true, "hlen": true, "scan": true,
	"ping": true, "hello": true, "subscribe": true, "psubscribe": true, "unsubscribe": true, "client|setinfo": true,
	"client|setname": true, "config|resetstat": true, "script|load": true, "select": true}

// readCost reads INFO commandstats and returns the cost per task of n tasks.
// With the environment variable TIDE_BENCH_CMDSTATS set it also prints to
// stderr, under label, each command's calls per task and µs per call, and
// how much of the scripts' time per task went outside the commands they
// ran (the Lua around them and each redis.call's own conversions).
func readCost(ctx context.Context, e *env, n int, label string) (redisCost, error) {
	info, err := e.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return redisCost{}, err
	}
	var c redisCost
	var detail []string
	var innerUsec float64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		var calls, usec float64
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = x
			case "usec":
				usec = x
			}
		}
		if !topLevel[name] {
			innerUsec += usec
		}
		if os.Getenv("TIDE_BENCH_CMDSTATS") != "" && calls > 0 {
			detail = append(detail, fmt.Sprintf("%s %.3f/task %.2fµs/call", name, calls/float64(n), usec/calls))
		}
		switch {
		case name == "evalsha" || name == "eval":
			c.scripts += calls
			c.usec += usec
		case name == "publish":
			c.publish += calls
			c.inner += calls
		case !topLevel[name]:
			c.inner += calls
		}
	}
	if len(detail) > 0 {
		sort.Strings(detail)
		f := float64(n)
		fmt.Fprintf(os.Stderr, "commandstats per task, %s: scripts %.1f µs, of it inside commands %.1f µs, outside %.1f µs; %s\n",
			label, c.usec/f, innerUsec/f, (c.usec-innerUsec)/f, strings.Join(detail, "; "))
	}
	f := float64(n)
	return redisCost{scripts: c.scripts / f, usec: c.usec / f, inner: c.inner / f, publish: c.publish / f}, nil
}

// drainGroups stores grpN tasks in groupsQueue of a flushed Redis as mode
// says, starts a server and returns tasks/s from Start until every task is
// acknowledged (gone from Redis), and what Redis spent per task meanwhile.
func drainGroups(ctx context.Context, e *env, mode groupsMode) (float64, redisCost, error) {
	if err := e.flush(ctx); err != nil {
		return 0, redisCost{}, err
	}
	s, err := newSystem(sysTide, e.addr)
	if err != nil {
		return 0, redisCost{}, err
	}
	defer s.close()
	ts := s.(*tideSystem)
	n, what := e.sz.grpN, "groups, "+mode.what
	ps := payloads(n, kindTask, time.Now())
	in := tide.NewInspector(ts.b)
	var lim tide.QueueLimits
	if mode.limit {
		lim.GroupConcurrency = groupsLimit
	}
	if mode.conc {
		lim.Concurrency = groupsQueueConc
	}
	if lim != (tide.QueueLimits{}) {
		if err := in.SetQueueLimits(ctx, groupsQueue, lim); err != nil {
			return 0, redisCost{}, fmt.Errorf("%s: SetQueueLimits: %w", what, err)
		}
	}
	if mode.groups {
		if err := enqueueGroups(ctx, ts, ps, e.sz.grpGroups); err != nil {
			return 0, redisCost{}, fmt.Errorf("%s: %w", what, err)
		}
		// The tasks are grouped: Inspector.Groups sees as many groups as
		// it may list, each with tasks waiting.
		want := min(e.sz.grpGroups, 1000)
		gs, err := in.Groups(ctx, groupsQueue, want)
		if err != nil {
			return 0, redisCost{}, fmt.Errorf("%s: Inspector.Groups: %w", what, err)
		}
		if len(gs) != want || gs[len(gs)-1].Waiting == 0 {
			return 0, redisCost{}, fmt.Errorf("%s: Inspector.Groups listed %d groups, want %d with tasks waiting", what, len(gs), want)
		}
	} else if _, err := enqueueBatches(ctx, s, e.sz.batch, groupsQueue, ps, time.Time{}); err != nil {
		return 0, redisCost{}, fmt.Errorf("%s: %w", what, err)
	}
	if err := expectStored(ctx, e, s, n, what+": before start"); err != nil {
		return 0, redisCost{}, err
	}
	if err := e.admin.ConfigResetStat(ctx).Err(); err != nil {
		return 0, redisCost{}, err
	}
	rcpu0, err := redisCPU(ctx, e.admin)
	if err != nil {
		return 0, redisCost{}, err
	}
	bcpu0 := selfCPU()
	rec := newRecorder(n)
	start := time.Now()
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency, queues: []string{groupsQueue}}, rec.handle)
	if err != nil {
		return 0, redisCost{}, err
	}
	defer srv.stop(time.Minute)
	if err := rec.wait(ctx, 3*time.Minute); err != nil {
		return 0, redisCost{}, fmt.Errorf("%s: %w", what, err)
	}
	drained, err := waitDrained(ctx, e, s, n, start, what)
	if err != nil {
		return 0, redisCost{}, err
	}
	bcpu := selfCPU() - bcpu0
	rcpu, err := redisCPU(ctx, e.admin)
	if err != nil {
		return 0, redisCost{}, err
	}
	cost, err := readCost(ctx, e, n, what)
	if err != nil {
		return 0, redisCost{}, err
	}
	cost.redisCPU = (rcpu - rcpu0) * 1e6 / float64(n)
	if bcpu0 > 0 {
		cost.benchCPU = bcpu * 1e6 / float64(n)
	}
	return rate(n, drained), cost, nil
}

// enqueueGroups stores ps in groupsQueue, task i in group i mod groups, with
// one EnqueueMany call per group from groupsEnqueuers goroutines.
func enqueueGroups(ctx context.Context, ts *tideSystem, ps [][]byte, groups int) error {
	byGroup := make([][]*tide.Task, groups)
	for i, p := range ps {
		byGroup[i%groups] = append(byGroup[i%groups], tide.NewTask(taskType, p))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	errc := make(chan error, groupsEnqueuers)
	for range groupsEnqueuers {
		go func() {
			for {
				g := int(next.Add(1)) - 1
				if g >= groups {
					errc <- nil
					return
				}
				if _, err := ts.c.EnqueueMany(ctx, byGroup[g], tide.Queue(groupsQueue), tide.Group(groupName(g))); err != nil {
					cancel()
					errc <- fmt.Errorf("EnqueueMany, group %s: %w", groupName(g), err)
					return
				}
			}
		}()
	}
	var first error
	for range groupsEnqueuers {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func groupName(g int) string { return fmt.Sprintf("tenant-%05d", g) }

// waitDrained waits until Redis holds none of the system's tasks and returns
// the time since start.
func waitDrained(ctx context.Context, e *env, s system, n int, start time.Time, what string) (time.Duration, error) {
	for deadline := time.Now().Add(time.Minute); ; {
		left, err := s.stored(ctx)
		if err != nil {
			return 0, err
		}
		if left == 0 {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s: every handler ran but Redis still holds %d of %d tasks a minute later; some keys: %s", what, left, n, describeKeys(ctx, e.admin, 12))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---- fairness ----

// runFairness measures, on tide, the few tasks' wait in a FIFO queue and in
// a group of their own; on asynq, in a FIFO queue (its only kind), whose
// figures also fill asynq's cells of the group rows.
func runFairness(ctx context.Context, e *env, kind string) (results, error) {
	res := results{}
	fifo, err := fairOnce(ctx, e, kind, false)
	if err != nil {
		return nil, err
	}
	fifo.put(res, "fairF")
	if kind != sysTide {
		fifo.put(res, "fairG")
		return res, nil
	}
	grouped, err := fairOnce(ctx, e, kind, true)
	if err != nil {
		return nil, err
	}
	grouped.put(res, "fairG")
	return res, nil
}

// fairResult is one fairness measurement: the few tasks' waits (sorted) and
// how many backlog tasks started before the last of them.
type fairResult struct {
	waits  []time.Duration
	before int
}

func (f fairResult) put(res results, prefix string) {
	res[prefix+"50"] = val{v: ms(pct(f.waits, 50))}
	res[prefix+"99"] = val{v: ms(pct(f.waits, 99))}
	res[prefix+"Max"] = val{v: ms(f.waits[len(f.waits)-1])}
	res[prefix+"Before"] = val{v: float64(f.before)}
}

// fairOnce stores fairBigN tasks and then, one Enqueue at a time, fairSmallN
// more in fairQueue of a flushed Redis — in groups fairBig and fairSmall
// when grouped, else in one FIFO queue — then starts a server with
// fairConcurrency and waits until every task has started. A few task's
// wait is its handler start − the instant just before its Enqueue.
func fairOnce(ctx context.Context, e *env, kind string, grouped bool) (fairResult, error) {
	if err := e.flush(ctx); err != nil {
		return fairResult{}, err
	}
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return fairResult{}, err
	}
	defer s.close()
	nBig, nSmall := e.sz.fairBigN, e.sz.fairSmallN
	what, how := "fairness, FIFO", ""
	big := payloads(nBig, kindTask, time.Now())
	if grouped {
		what, how = "fairness, groups", fmt.Sprintf("EnqueueMany ×%d with Group(%q)", e.sz.batch, fairBig)
		ts := s.(*tideSystem)
		for i := 0; i < nBig; i += e.sz.batch {
			batch := make([]*tide.Task, 0, e.sz.batch)
			for _, p := range big[i:min(i+e.sz.batch, nBig)] {
				batch = append(batch, tide.NewTask(taskType, p))
			}
			if _, err := ts.c.EnqueueMany(ctx, batch, tide.Queue(fairQueue), tide.Group(fairBig)); err != nil {
				return fairResult{}, fmt.Errorf("%s: batch at %d: %w", what, i, err)
			}
		}
		for i := range nSmall {
			t0 := time.Now()
			if _, err := ts.c.Enqueue(ctx, tide.NewTask(taskType, makePayload(kindTask, nBig+i, t0)), tide.Queue(fairQueue), tide.Group(fairSmall)); err != nil {
				return fairResult{}, fmt.Errorf("%s: enqueue small task %d: %w", what, i, err)
			}
		}
		gs, err := tide.NewInspector(ts.b).Groups(ctx, fairQueue, 10)
		if err != nil {
			return fairResult{}, fmt.Errorf("%s: Inspector.Groups: %w", what, err)
		}
		waiting := map[string]int{}
		for _, g := range gs {
			waiting[g.Group] = g.Waiting
		}
		if waiting[fairBig] != nBig || waiting[fairSmall] != nSmall {
			return fairResult{}, fmt.Errorf("%s: Inspector.Groups says %d waiting in %q and %d in %q, want %d and %d", what, waiting[fairBig], fairBig, waiting[fairSmall], fairSmall, nBig, nSmall)
		}
	} else {
		how, err = enqueueBulk(ctx, e, s, fairQueue, big, time.Time{})
		if err != nil {
			return fairResult{}, fmt.Errorf("%s: %w", what, err)
		}
		for i := range nSmall {
			t0 := time.Now()
			if err := s.enqueue(ctx, fairQueue, makePayload(kindTask, nBig+i, t0), time.Time{}); err != nil {
				return fairResult{}, fmt.Errorf("%s: enqueue small task %d: %w", what, i, err)
			}
		}
	}
	if err := expectStored(ctx, e, s, nBig+nSmall, what+": before start"); err != nil {
		return fairResult{}, err
	}
	rec := newRecorder(nBig + nSmall)
	start := time.Now()
	srv, err := s.startServer(serverConfig{concurrency: e.sz.fairConcurrency, queues: []string{fairQueue}}, rec.handle)
	if err != nil {
		return fairResult{}, err
	}
	defer srv.stop(time.Minute)
	if err := rec.wait(ctx, 5*time.Minute); err != nil {
		return fairResult{}, fmt.Errorf("%s: %w", what, err)
	}
	all := time.Since(start)
	var f fairResult
	var lastSmall int64
	for i := nBig; i < nBig+nSmall; i++ {
		st := rec.starts[i].Load()
		f.waits = append(f.waits, time.Duration(st-rec.refs[i].Load()))
		lastSmall = max(lastSmall, st)
	}
	slices.Sort(f.waits)
	for i := range nBig {
		if rec.starts[i].Load() < lastSmall {
			f.before++
		}
	}
	e.note("%s/%s: %d tasks (%s) then %d one by one; from Start: last of the %d started %v, all %d started %v; %d of the %d started before the last of the %d",
		what, kind, nBig, how, nSmall, nSmall, time.Unix(0, lastSmall).Sub(start).Round(time.Millisecond), nBig+nSmall, all.Round(time.Millisecond), f.before, nBig, nSmall)
	return f, nil
}

// ---- helpers ----

// median returns the median of xs (the mean of the middle two when even).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// rates formats tasks/s figures for a note.
func rates(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = format("tasks/s", x)
	}
	return strings.Join(parts, " ")
}
