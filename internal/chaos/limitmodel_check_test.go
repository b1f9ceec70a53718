package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

// What the limit model's checker allows for, on the log's one clock.
const (
	// lmLag bounds the time from a broker's lease to the handler's start
	// record, and from its end record to the settlement: a run's recorded
	// [start, end] lies within the time its slot was taken, and a lease was
	// granted at most lmLag before its start record. A limit change is in
	// force from some moment between the start and the end of its
	// SetQueueLimits call.
	lmLag = 300 * time.Millisecond
	// lmRateLag is lmLag for the rate checks, which compare the start
	// records of different servers with each other: longer, as one busy
	// process (three race-instrumented ones share two cores) may record a
	// start late.
	lmRateLag = 500 * time.Millisecond
	// lmIdleBound is the longest a runnable task may wait while a slot is
	// free (see checkIdle).
	lmIdleBound = time.Second
	// lmThrottleSlack is how long after a ThrottleGroup run's end record
	// its throttle may still be unwritten (the settlement is sent after
	// the handler returns); and lmDeferSlack how much earlier than its end
	// record + d a deferred task may run again (the stamps are
	// microseconds, the broker's due times milliseconds).
	lmThrottleSlack = 2 * lmLag
	lmDeferSlack    = 2 * time.Millisecond
)

// lmRun is one handler run in the log.
type lmRun struct {
	queue, group, id string
	ver              int
	token, server    string
	from, to         time.Time
	how              string // ok, fail, skip, ra:MS, thr:MS, ctx:<cause>; killed: no end, its process was SIGKILLed
	// lost is set when the run's settlement may never have been written:
	// its process was SIGKILLed, cut off from Redis around its end, or
	// shut down just after it.
	lost bool
}

// lmVer is one Enqueue of a task ID (a new task or a Replace).
type lmVer struct {
	queue, group, id string
	ver              int
	plan             lmPlan
	delay            time.Duration
	replace          bool
	b, e             time.Time // the Enqueue call, on the log's clock
	ok               bool
	// pos is the version's place in its Ordered group (the order tasks
	// must start in); -1 when the log cannot tell it (a Replace that
	// raced with the end of the task it replaced).
	pos  int
	runs []*lmRun
}

// lmOp is one operator action.
type lmOp struct {
	kind, queue, target, args, result string
	b, e                              time.Time
}

// lmLimits is one SetQueueLimits, possibly in force from b until the next
// one's e.
type lmLimits struct {
	l    tide.QueueLimits
	b, e time.Time
	// grFrom is when the group starts GroupRate counts began to be kept:
	// the brokers keep a group's starts only while the queue has a
	// GroupRate, and drop those older than its Per, so a GroupRate set
	// anew or with a longer Per counts only the starts made after it was
	// (unlike Rate, which counts every start of its Per).
	grFrom time.Time
	// maybe marks a change whose SetQueueLimits returned an error: it may
	// be in force all the same (recorded before a later step failed, or
	// a reply lost after it ran), from b on, until the next change that
	// returned ok; the limits before it may be in force until then too.
	maybe bool
}

// lmWindow is a time span the idle check leaves out, with why.
type lmWindow struct {
	from, to time.Time
	why      string
}

// lmLog is the parsed log of a limit model run.
type lmLog struct {
	runs     []*lmRun
	vers     []*lmVer            // in log order
	byID     map[string][]*lmVer // ok versions of an ID, in order
	ops      []*lmOp
	opsByID  map[string][]*lmOp // cancel and delete, by target
	limits   map[string][]lmLimits
	up       map[string]time.Time // server incarnation -> up
	gone     map[string]time.Time // server incarnation -> SIGKILLed or stopped
	killed   map[string]bool
	cuts     []lmWindow // of a server name ("w3"): from..to
	cutOf    map[string][]lmWindow
	excluded []lmWindow // for every queue
	exclQ    map[string][]lmWindow
	last     time.Time // the log's last line
}

func parseLimitLog(lines []modelLine) (*lmLog, error) {
	l := &lmLog{byID: map[string][]*lmVer{}, opsByID: map[string][]*lmOp{}, limits: map[string][]lmLimits{},
		up: map[string]time.Time{}, gone: map[string]time.Time{}, killed: map[string]bool{},
		cutOf: map[string][]lmWindow{}, exclQ: map[string][]lmWindow{}}
	byToken := map[string]*lmRun{}
	pending := map[string]*lmVer{} // id|ver -> version being enqueued
	openOps := map[string]*lmOp{}  // kind|queue|target -> action running
	cutFrom := map[string]time.Time{}
	restartFrom := map[string]time.Time{}
	for _, ln := range lines {
		f := strings.Fields(ln.text)
		bad := func() error { return fmt.Errorf("limit model log line %d: %q", ln.seq, ln.text) }
		if len(f) == 0 {
			return nil, bad()
		}
		l.last = ln.at
		switch f[0] {
		case "S": // queue group id ver token
			if len(f) != 6 {
				return nil, bad()
			}
			ver, err := strconv.Atoi(f[4])
			if err != nil {
				return nil, bad()
			}
			r := &lmRun{queue: f[1], group: f[2], id: f[3], ver: ver, token: f[5], from: ln.at}
			if r.group == "-" {
				r.group = ""
			}
			r.server = r.token[:strings.LastIndexByte(r.token, '.')]
			byToken[r.token] = r
			l.runs = append(l.runs, r)
		case "E": // id ver token how
			r := byToken[f[len(f)-2]]
			if len(f) != 5 || r == nil || r.how != "" {
				return nil, bad()
			}
			r.to, r.how = ln.at, f[4]
		case "N": // queue group id ver plan delay mode
			if len(f) != 8 {
				return nil, bad()
			}
			v := &lmVer{queue: f[1], group: f[2], id: f[3], replace: f[7] == "replace", b: ln.at, pos: -1}
			if v.group == "-" {
				v.group = ""
			}
			var err1, err2, err3 error
			v.ver, err1 = strconv.Atoi(f[4])
			v.plan, err2 = parseLmPlan(f[5])
			ms, err3 := strconv.Atoi(f[6])
			if err1 != nil || err2 != nil || err3 != nil {
				return nil, bad()
			}
			v.delay = time.Duration(ms) * time.Millisecond
			pending[v.id+"|"+f[4]] = v
			l.vers = append(l.vers, v)
		case "Q": // id ver result
			v := pending[f[1]+"|"+f[2]]
			if len(f) != 4 || v == nil {
				return nil, bad()
			}
			delete(pending, f[1]+"|"+f[2])
			v.e, v.ok = ln.at, f[3] == "ok"
			if v.ok {
				l.byID[v.id] = append(l.byID[v.id], v)
			}
		case "O": // kind queue target args
			if len(f) != 5 {
				return nil, bad()
			}
			openOps[f[1]+"|"+f[2]+"|"+f[3]] = &lmOp{kind: f[1], queue: f[2], target: f[3], args: f[4], b: ln.at}
		case "R": // kind queue target result
			k := f[1] + "|" + f[2] + "|" + f[3]
			op := openOps[k]
			if len(f) != 5 || op == nil {
				return nil, bad()
			}
			delete(openOps, k)
			op.e, op.result = ln.at, f[4]
			l.ops = append(l.ops, op)
			switch op.kind {
			case "cancel", "delete":
				l.opsByID[op.target] = append(l.opsByID[op.target], op)
			case "limits":
				lim, err := decodeLimits(op.args)
				if err != nil {
					return nil, bad()
				}
				if op.result == "ok" || op.result == "error" {
					c := lmLimits{l: lim, b: op.b, e: op.e, grFrom: op.e.Add(lmLag), maybe: op.result != "ok"}
					if ls := l.limits[op.queue]; len(ls) > 0 {
						if p := ls[len(ls)-1]; p.l.GroupRate.Limit > 0 && lim.GroupRate.Limit > 0 && lim.GroupRate.Per <= p.l.GroupRate.Per {
							c.grFrom = p.grFrom
						}
					} else {
						c.grFrom = op.b
					}
					l.limits[op.queue] = append(l.limits[op.queue], c)
				}
				l.exclQ[op.queue] = append(l.exclQ[op.queue], lmWindow{op.b, op.e.Add(lmIdleBound / 2), "limits changed"})
			case "repartition":
				l.exclQ[op.queue] = append(l.exclQ[op.queue], lmWindow{op.b, op.e.Add(lmIdleBound), "repartition"})
			}
		case "U": // server incarnation up
			l.up[f[1]] = ln.at
		case "K": // SIGKILLed incarnation (logged once it is dead)
			l.gone[f[1]], l.killed[f[1]] = ln.at, true
			l.excluded = append(l.excluded, lmWindow{ln.at.Add(-lmIdleBound / 2), ln.at.Add(limitLease + 2*time.Second), "SIGKILL " + f[1]})
		case "C": // start|end server
			if f[1] == "start" {
				cutFrom[f[2]] = ln.at
				continue
			}
			w := lmWindow{cutFrom[f[2]], ln.at, "cut " + f[2]}
			l.cuts = append(l.cuts, w)
			l.cutOf[f[2]] = append(l.cutOf[f[2]], w)
			l.excluded = append(l.excluded, lmWindow{w.from.Add(-lmIdleBound / 2), w.to.Add(limitLease + 2*time.Second), w.why})
		case "G": // begin|end incarnation: a graceful restart
			if f[1] == "begin" {
				restartFrom[f[2]] = ln.at
				l.gone[f[2]] = ln.at
				continue
			}
			l.excluded = append(l.excluded, lmWindow{restartFrom[f[2]].Add(-lmIdleBound / 5), ln.at.Add(lmIdleBound / 2), "restart " + f[2]})
		default:
			return nil, bad()
		}
	}
	// The servers' first starts, and each restarted incarnation's start.
	first := time.Time{}
	for inc, at := range l.up {
		if first.IsZero() || at.After(first) {
			first = at
		}
		if !strings.HasSuffix(inc, ".1") {
			l.excluded = append(l.excluded, lmWindow{at.Add(-lmIdleBound), at.Add(lmIdleBound / 2), "start " + inc})
		}
	}
	if len(lines) > 0 {
		l.excluded = append(l.excluded, lmWindow{lines[0].at, first.Add(lmIdleBound / 2), "servers starting"})
	}
	for _, r := range l.runs {
		inc := r.server
		if r.how == "" {
			if !l.killed[inc] {
				return nil, fmt.Errorf("run %s of %s (v%d) has no end and its process was not killed", r.token, r.id, r.ver)
			}
			r.to, r.how = l.gone[inc], "killed"
		}
		if l.killed[inc] {
			r.lost = true
		}
		if gone, ok := l.gone[inc]; ok && r.to.After(gone.Add(-lmIdleBound)) {
			// Ended just before its server's graceful shutdown began: a
			// Shutdown that timed out may have requeued it before its
			// settlement was written.
			r.lost = true
		}
		name := inc[:strings.LastIndexByte(inc, '.')]
		for _, w := range l.cutOf[name] {
			if r.to.After(w.from.Add(-limitLease)) && r.from.Before(w.to.Add(limitLease)) {
				r.lost = true
			}
			// A run that was under way when its server was cut off for
			// longer than a lease logs its end only when the cut is over
			// (the log is on Redis), but its handler was stopped by the
			// lease watchdog before its lease could end: at the latest a
			// lease after the last renewal, which was sent before the cut.
			if w.to.Sub(w.from) > limitLease && r.from.Before(w.from) && r.to.After(w.from.Add(limitLease)) {
				r.to = w.from.Add(limitLease)
			}
		}
	}
	for _, v := range l.vers {
		if !v.ok {
			continue
		}
		for _, r := range l.runs {
			if r.id == v.id && r.ver == v.ver && r.queue == v.queue {
				v.runs = append(v.runs, r)
			}
		}
	}
	l.assignPositions()
	return l, nil
}

// runsOf returns the runs of every version of id.
func (l *lmLog) runsOf(id string) []*lmRun {
	var out []*lmRun
	for _, v := range l.byID[id] {
		out = append(out, v.runs...)
	}
	slices.SortFunc(out, func(a, b *lmRun) int { return a.from.Compare(b.from) })
	return out
}

// assignPositions gives each version of the Ordered queue's grouped tasks
// its place in its group's order: a new task comes last; a Replace of a
// task that never started keeps its place; one of a task that finished
// (its final run ended before the Replace was called, and nothing ran it
// again) or was removed comes last like a new one; any other Replace
// (the task was running, waiting to be retried, or ending meanwhile)
// leaves the place unknown (-1), and the order check skips it.
func (l *lmLog) assignPositions() {
	next := map[string]int{}
	for _, v := range l.vers {
		if !v.ok || v.queue != limitOrdered || v.group == "" {
			continue
		}
		vs := l.byID[v.id]
		i := slices.Index(vs, v)
		if !v.replace || i == 0 {
			v.pos = next[v.group]
			next[v.group]++
			continue
		}
		prev := vs[i-1]
		removed := false
		for _, op := range l.opsByID[v.id] {
			if op.result == "ok" && op.b.After(prev.e) && op.e.Before(v.b) {
				removed = true
			}
		}
		var before []*lmRun // runs of the ID that started before the Replace returned
		for _, r := range l.runsOf(v.id) {
			if r.from.Before(v.e) {
				before = append(before, r)
			}
		}
		switch {
		case removed:
			v.pos = next[v.group]
			next[v.group]++
		case len(before) == 0:
			v.pos = prev.pos
		default:
			last := before[len(before)-1]
			if last.ver == prev.ver && last.how == prev.plan.final() && !last.lost && last.to.Before(v.b) {
				v.pos = next[v.group]
				next[v.group]++
			}
		}
	}
}

// limitsIn returns every limit of queue that may have been in force at
// some moment of [a, z].
func (l *lmLog) limitsIn(queue string, a, z time.Time) []lmLimits {
	ls := l.limits[queue]
	var out []lmLimits
	for i, c := range ls {
		// c is in force from some moment in [c.b, c.e] until the next one
		// that surely came in is, at the latest at its e (one that
		// returned an error may not have).
		to := time.Time{}
		for _, n := range ls[i+1:] {
			if !n.maybe {
				to = n.e
				break
			}
		}
		if !c.b.After(z) && (to.IsZero() || !to.Before(a)) {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		out = append(out, lmLimits{})
	}
	return out
}

// limitAt returns queue's limit in force at t, or false when a change may
// be underway.
func (l *lmLog) limitAt(queue string, t time.Time) (tide.QueueLimits, bool) {
	ls := l.limitsIn(queue, t, t)
	return ls[0].l, len(ls) == 1
}

// lmFigures is what a run of the model did, for the test's log.
type lmFigures struct {
	runs, killed, leaseLost, deferred, throttled, removed, dups int
	replaces                                                    map[string]int
	peakQ                                                       map[string]string
	idleChecked, idleViolations, groupsAtLimit                  int
	longestFreeWait                                             time.Duration
}

func (f *lmFigures) summary() string {
	return fmt.Sprintf("%d runs (%d cut short by a SIGKILL, %d stopped by the lease watchdog), %d RetryAfter, %d ThrottleGroup; %d tasks removed; %d duplicate successes (each after a run whose settlement a SIGKILL, the cut or a restart may have lost); Replace: %s; peaks (running at once/limit when reached): %s, %d groups reached their GroupConcurrency; %d waits checked for idle slots, longest stretch with a slot free while a task waited %v",
		f.runs, f.killed, f.leaseLost, f.deferred, f.throttled, f.removed, f.dups, joinCounts(f.replaces), joinStrings(f.peakQ), f.groupsAtLimit, f.idleChecked, f.longestFreeWait.Round(time.Millisecond))
}

func joinStrings(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(k + " " + m[k])
	}
	return sb.String()
}

// violations collects what a check found, printing the first few of each
// kind.
type violations struct {
	t      *testing.T
	counts map[string]int
}

func (v *violations) add(kind, format string, args ...any) {
	v.t.Helper()
	v.counts[kind]++
	if v.counts[kind] <= 8 {
		v.t.Errorf("%s: %s", kind, fmt.Sprintf(format, args...))
	}
}

// checkLimitModel checks the log of a limit model run:
//
//   - limits: when a run started, the runs of its queue (of its group) that
//     had started and not ended were no more than the largest Concurrency
//     (GroupConcurrency) that may have been in force in the lmLag before
//     (a lowered limit lets running tasks finish: it bounds starts); no
//     Limit+1 starts of a queue (a group) came within Per-lmRateLag of
//     each other under every Rate (GroupRate) that may have been in force.
//   - Ordered: no two runs of a group of the Ordered queue overlap, and the
//     group's runs come in the order of their tasks' places.
//   - every task: its last version ran to its plan's end (ok, or archived
//     by skip) unless an operator removed it after it was enqueued; a
//     second success of a version only after a run whose settlement may
//     have been lost; no run of a version after a Cancel or Delete of it
//     returned, nor of a version a Replace superseded before it started;
//     a task deferred by RetryAfter or ThrottleGroup for d runs again no
//     earlier than d after its run ended, and no task of a throttled group
//     starts in that time.
//   - idle slots: see checkIdle.
func checkLimitModel(t *testing.T, lines []modelLine) *lmFigures {
	t.Helper()
	l, err := parseLimitLog(lines)
	if err != nil {
		t.Fatal(err)
	}
	v := &violations{t: t, counts: map[string]int{}}
	fig := &lmFigures{replaces: map[string]int{}, peakQ: map[string]string{}}
	fig.runs = len(l.runs)
	for _, r := range l.runs {
		switch {
		case r.how == "killed":
			fig.killed++
		case r.how == "ctx:leaselost":
			fig.leaseLost++
		case strings.HasPrefix(r.how, "ra:"):
			fig.deferred++
		case strings.HasPrefix(r.how, "thr:"):
			fig.throttled++
		}
	}
	l.checkLimits(v, fig)
	l.checkOrdered(v)
	l.checkTasks(v, fig)
	l.checkIdle(v, fig)
	for _, vs := range l.byID {
		for _, x := range vs {
			if !x.replace {
				continue
			}
			switch {
			case x.queue != limitOrdered || x.group == "":
				fig.replaces["unordered"]++
			case x.pos < 0:
				fig.replaces["ordered, place unknown"]++
			default:
				fig.replaces["ordered"]++
			}
		}
	}
	if len(v.counts) > 0 {
		t.Errorf("limit model: violations by kind: %v", v.counts)
	}
	return fig
}

// checkLimits checks Concurrency, GroupConcurrency, Rate and GroupRate.
func (l *lmLog) checkLimits(v *violations, fig *lmFigures) {
	byQ := map[string][]*lmRun{}
	byG := map[string][]*lmRun{}
	for _, r := range l.runs {
		byQ[r.queue] = append(byQ[r.queue], r)
		if r.group != "" {
			byG[r.queue+" "+r.group] = append(byG[r.queue+" "+r.group], r)
		}
	}
	check := func(key, queue string, runs []*lmRun, group bool) {
		slices.SortFunc(runs, func(a, b *lmRun) int { return a.from.Compare(b.from) })
		peak, peakLimit := 0, 0
		for j, x := range runs {
			ls := l.limitsIn(queue, x.from.Add(-lmLag), x.from)
			// Concurrency: the runs open at x's start.
			open := 0
			for _, y := range runs[:j+1] {
				if y.to.After(x.from) || y == x {
					open++
				}
			}
			allowed, rateOK := 0, false
			var lims []tide.QueueLimits
			for _, lim := range ls {
				lims = append(lims, lim.l)
				c, rate, since := lim.l.Concurrency, lim.l.Rate, time.Time{}
				if group {
					c, rate, since = lim.l.GroupConcurrency, lim.l.GroupRate, lim.grFrom
				}
				if c == 0 {
					allowed = 1 << 30
				}
				allowed = max(allowed, c)
				if rate.Limit == 0 {
					rateOK = true
					continue
				}
				n := 0
				for i := j; i >= 0 && x.from.Sub(runs[i].from) < rate.Per-lmRateLag && !runs[i].from.Before(since); i-- {
					n++
				}
				if n <= rate.Limit {
					rateOK = true
				}
			}
			if open > peak || (open == peak && allowed < peakLimit) {
				peak, peakLimit = open, allowed
			}
			kind := "Concurrency"
			if group {
				kind = "GroupConcurrency"
			}
			if open > allowed {
				var others []string
				for _, y := range runs[:j] {
					if y.to.After(x.from) {
						others = append(others, fmt.Sprintf("%s (v%d) on %s %s-%s %s", y.id, y.ver, y.server, y.from.Format("15:04:05.000"), y.to.Format("15:04:05.000"), y.how))
					}
				}
				v.add(kind, "%s: %d running when %s (v%d) started on %s at %s, limit %d (limits %v; running: %s)", key, open, x.id, x.ver, x.server, x.from.Format("15:04:05.000000"), allowed, lims, strings.Join(others, "; "))
			}
			if !rateOK {
				v.add(strings.Replace(kind, "Concurrency", "Rate", 1), "%s: %s (v%d) started at %s, over every rate that may have been in force (%v)", key, x.id, x.ver, x.from.Format("15:04:05.000000"), lims)
			}
		}
		lim := "none"
		if peakLimit < 1<<30 {
			lim = strconv.Itoa(peakLimit)
		}
		if !group {
			fig.peakQ[key] = fmt.Sprintf("%d/%s", peak, lim)
		} else if lim != "none" && peak >= peakLimit {
			fig.groupsAtLimit++
		}
	}
	for q, runs := range byQ {
		check(q, q, runs, false)
	}
	for k, runs := range byG {
		check(k, strings.Fields(k)[0], runs, true)
	}
}

// checkOrdered checks that the groups of the Ordered queue run one task at
// a time, in their tasks' order.
func (l *lmLog) checkOrdered(v *violations) {
	byG := map[string][]*lmRun{}
	for _, r := range l.runs {
		if r.queue == limitOrdered && r.group != "" {
			byG[r.group] = append(byG[r.group], r)
		}
	}
	pos := func(r *lmRun) int {
		for _, x := range l.byID[r.id] {
			if x.ver == r.ver {
				return x.pos
			}
		}
		return -1
	}
	for g, runs := range byG {
		slices.SortFunc(runs, func(a, b *lmRun) int { return a.from.Compare(b.from) })
		var prev, prevPlaced *lmRun
		for _, r := range runs {
			if prev != nil && prev.to.After(r.from) {
				v.add("Ordered overlap", "group %s: %s (v%d) started on %s at %s while %s (v%d) ran on %s until %s",
					g, r.id, r.ver, r.server, r.from.Format("15:04:05.000000"), prev.id, prev.ver, prev.server, prev.to.Format("15:04:05.000000"))
			}
			if prev == nil || r.to.After(prev.to) {
				prev = r
			}
			p := pos(r)
			if p < 0 {
				continue
			}
			if prevPlaced != nil && p < pos(prevPlaced) {
				v.add("Ordered order", "group %s: %s (v%d, place %d) started at %s after %s (v%d, place %d) started at %s",
					g, r.id, r.ver, p, r.from.Format("15:04:05.000000"), prevPlaced.id, prevPlaced.ver, pos(prevPlaced), prevPlaced.from.Format("15:04:05.000000"))
			}
			if prevPlaced == nil || p >= pos(prevPlaced) {
				prevPlaced = r
			}
		}
	}
}

// removedAfter returns the first Cancel or Delete of id that succeeded
// after version x was enqueued, or nil.
func (l *lmLog) removedAfter(x *lmVer) *lmOp {
	for _, op := range l.opsByID[x.id] {
		if op.result == "ok" && op.b.After(x.e) {
			return op
		}
	}
	return nil
}

// checkTasks checks that every task ran as its versions and the
// operator's actions say.
func (l *lmLog) checkTasks(v *violations, fig *lmFigures) {
	for id, vs := range l.byID {
		for i, x := range vs {
			last := i == len(vs)-1
			rm := l.removedAfter(x)
			if rm != nil && (last || vs[i+1].b.After(rm.e)) {
				fig.removed++
				for _, r := range x.runs {
					if r.from.After(rm.e.Add(lmLag)) {
						v.add("ran after removal", "%s (v%d) started on %s at %s, after %s returned at %s",
							id, x.ver, r.server, r.from.Format("15:04:05.000000"), rm.kind, rm.e.Format("15:04:05.000000"))
					}
				}
			} else if last {
				done := 0
				for _, r := range x.runs {
					if r.how == x.plan.final() {
						done++
					}
				}
				if done == 0 {
					var hs []string
					for _, r := range x.runs {
						hs = append(hs, r.server+":"+r.how)
					}
					v.add("lost", "%s (v%d, %s, in %s) never ran to its end (%s); runs: %v", id, x.ver, x.plan, x.queue, x.plan.final(), hs)
				}
			}
			if !last && x.runs != nil {
				// Superseded by a Replace: only if it had not started
				// before the Replace returned must it never start after.
				nx := vs[i+1]
				started := false
				for _, r := range l.runsOf(id) {
					if r.from.Before(nx.e) && r.ver <= x.ver {
						started = true
					}
				}
				for _, r := range x.runs {
					if !started && r.from.After(nx.e.Add(lmLag)) && l.removedAfter(x) == nil {
						v.add("replaced ran", "%s v%d started on %s at %s, after a Replace (v%d) returned at %s",
							id, x.ver, r.server, r.from.Format("15:04:05.000000"), nx.ver, nx.e.Format("15:04:05.000000"))
					}
				}
			}
			// Duplicates and deferrals.
			var endedOK []*lmRun
			for j, r := range x.runs {
				if r.how == x.plan.final() {
					explained := false
					for _, p := range endedOK {
						explained = explained || p.lost
					}
					if len(endedOK) > 0 {
						fig.dups++
						if !explained {
							v.add("duplicate", "%s (v%d) ended %s again on %s at %s; earlier runs' settlements could not have been lost", id, x.ver, r.how, r.server, r.from.Format("15:04:05.000000"))
						}
					}
					endedOK = append(endedOK, r)
				}
				kind, ms, ok := strings.Cut(r.how, ":")
				if r.lost || !ok || (kind != "ra" && kind != "thr") {
					continue
				}
				n, _ := strconv.Atoi(ms)
				d := time.Duration(n) * time.Millisecond
				if j+1 < len(x.runs) {
					if nx := x.runs[j+1]; nx.from.Before(r.to.Add(d - lmDeferSlack)) {
						v.add("deferral", "%s (v%d) ran again on %s %v after its run ended with %s", id, x.ver, nx.server, nx.from.Sub(r.to).Round(time.Millisecond), r.how)
					}
				}
				if kind == "thr" {
					for _, y := range l.runs {
						if y.queue == r.queue && y.group == r.group && y.from.After(r.to.Add(lmThrottleSlack)) && y.from.Before(r.to.Add(d-lmDeferSlack)) {
							v.add("throttle", "group %s %s: %s (v%d) started on %s %v after %s (v%d) throttled it with %s", r.queue, r.group, y.id, y.ver, y.server, y.from.Sub(r.to).Round(time.Millisecond), id, x.ver, r.how)
						}
					}
				}
			}
		}
	}
}

// checkIdle checks that no runnable task waits longer than lmIdleBound
// while a slot for it is free. Precisely: a task's first version, enqueued
// without delay and untouched by the operator before its first start,
// waits from when its Enqueue returned until lmLag before its first start
// record. It fails the check when within that wait there is a stretch of
// lmIdleBound or more during which, at every moment t:
//
//   - no fault, restart, server start, limit change of its queue or
//     repartition of its queue is near (the windows of lmLog.excluded and
//     exclQ: lease recoveries and restarts make slots invisible to the log);
//   - its queue runs fewer tasks than its Concurrency and started fewer
//     than Rate.Limit in the Rate.Per+lmRateLag before t;
//   - for a grouped task, its group runs fewer than GroupConcurrency,
//     started fewer than GroupRate.Limit in GroupRate.Per+lmRateLag, and no
//     ThrottleGroup run of the group ended in the throttle's d+lmLag
//     before t; in the Ordered queue the group runs nothing and every task
//     placed before it has finished (its final run ended, or it was
//     removed) lmLag before t, and every earlier place is known;
//   - some live server runs at most limitConcurrency-2 tasks (one slot for
//     a settlement still being written).
//
// The limits are those in force at t (no change is near).
func (l *lmLog) checkIdle(v *violations, fig *lmFigures) {
	type tl struct{ from, to []time.Time }
	mk := func() *tl { return &tl{} }
	tls := map[string]*tl{}
	get := func(k string) *tl {
		if tls[k] == nil {
			tls[k] = mk()
		}
		return tls[k]
	}
	var points []time.Time
	throttles := map[string][]lmWindow{}
	for _, r := range l.runs {
		for _, k := range []string{"q " + r.queue, "g " + r.queue + " " + r.group, "s " + r.server} {
			x := get(k)
			x.from = append(x.from, r.from)
			x.to = append(x.to, r.to)
		}
		points = append(points, r.from, r.to)
		for per := time.Second; per <= 3*time.Second; per += time.Second {
			points = append(points, r.from.Add(per+lmRateLag)) // a rate window's end
		}
		if kind, ms, ok := strings.Cut(r.how, ":"); ok && kind == "thr" {
			n, _ := strconv.Atoi(ms)
			w := lmWindow{r.to, r.to.Add(time.Duration(n)*time.Millisecond + lmLag), "throttled"}
			gk := "g " + r.queue + " " + r.group
			throttles[gk] = append(throttles[gk], w)
			points = append(points, w.to)
		}
	}
	for _, x := range tls {
		slices.SortFunc(x.from, time.Time.Compare)
		slices.SortFunc(x.to, time.Time.Compare)
	}
	count := func(ts []time.Time, t time.Time) int { // entries <= t
		return sort.Search(len(ts), func(i int) bool { return ts[i].After(t) })
	}
	open := func(k string, t time.Time) int {
		x := tls[k]
		if x == nil {
			return 0
		}
		return count(x.from, t) - count(x.to, t)
	}
	started := func(k string, a, z time.Time) int { // starts in (a, z]
		x := tls[k]
		if x == nil {
			return 0
		}
		return count(x.from, z) - count(x.from, a)
	}
	for _, w := range l.excluded {
		points = append(points, w.from, w.to)
	}
	for _, ws := range l.exclQ {
		for _, w := range ws {
			points = append(points, w.from, w.to)
		}
	}
	// Ordered places: when each finished.
	type place struct {
		done  time.Time // zero: never
		known bool
	}
	places := map[string][]place{} // group -> by place
	var unknownPlace = map[string]time.Time{}
	for _, x := range l.vers {
		if !x.ok || x.queue != limitOrdered || x.group == "" {
			continue
		}
		if x.pos < 0 {
			if _, ok := unknownPlace[x.group]; !ok {
				unknownPlace[x.group] = x.b
			}
			continue
		}
		ps := places[x.group]
		for len(ps) <= x.pos {
			ps = append(ps, place{})
		}
		// The last version at a place decides when it finished.
		p := place{known: true}
		if rm := l.removedAfter(x); rm != nil {
			p.done = rm.e
		}
		for _, r := range x.runs {
			if r.how == x.plan.final() && (p.done.IsZero() || r.to.Before(p.done)) {
				p.done = r.to
			}
		}
		ps[x.pos] = p
		places[x.group] = ps
		if !p.done.IsZero() {
			points = append(points, p.done.Add(lmLag))
		}
	}
	slices.SortFunc(points, time.Time.Compare)
	excluded := func(q string, t time.Time) bool {
		for _, w := range l.excluded {
			if !t.Before(w.from) && t.Before(w.to) {
				return true
			}
		}
		for _, w := range l.exclQ[q] {
			if !t.Before(w.from) && t.Before(w.to) {
				return true
			}
		}
		return false
	}
	serverFree := func(t time.Time) bool {
		for inc, up := range l.up {
			if up.After(t) {
				continue
			}
			if gone, ok := l.gone[inc]; ok && !gone.After(t) {
				continue
			}
			if open("s "+inc, t) <= limitConcurrency-2 {
				return true
			}
		}
		return false
	}
	for _, x := range l.vers {
		if !x.ok || x.replace || x.delay > 0 || len(x.runs) == 0 || l.byID[x.id][0] != x {
			continue
		}
		first := x.runs[0]
		for _, r := range x.runs {
			if r.from.Before(first.from) {
				first = r
			}
		}
		from, to := x.e, first.from.Add(-lmLag)
		if to.Sub(from) < lmIdleBound {
			continue
		}
		touched := false
		for _, op := range l.opsByID[x.id] {
			touched = touched || op.b.Before(first.from)
		}
		if len(l.byID[x.id]) > 1 && l.byID[x.id][1].b.Before(first.from) {
			touched = true
		}
		ordered := x.queue == limitOrdered && x.group != ""
		if touched || (ordered && x.pos < 0) {
			continue
		}
		if at, ok := unknownPlace[x.group]; ordered && ok && at.Before(x.b) {
			continue
		}
		fig.idleChecked++
		free := func(t time.Time) bool {
			if excluded(x.queue, t) {
				return false
			}
			lim, ok := l.limitAt(x.queue, t)
			if !ok {
				return false
			}
			qk := "q " + x.queue
			if lim.Concurrency > 0 && open(qk, t) >= lim.Concurrency {
				return false
			}
			if r := lim.Rate; r.Limit > 0 && started(qk, t.Add(-r.Per-lmRateLag), t) >= r.Limit {
				return false
			}
			if x.group != "" {
				gk := "g " + x.queue + " " + x.group
				if lim.GroupConcurrency > 0 && open(gk, t) >= lim.GroupConcurrency {
					return false
				}
				if r := lim.GroupRate; r.Limit > 0 && started(gk, t.Add(-r.Per-lmRateLag), t) >= r.Limit {
					return false
				}
				for _, w := range throttles[gk] {
					if !t.Before(w.from) && t.Before(w.to) {
						return false
					}
				}
				if ordered {
					if open(gk, t) > 0 {
						return false
					}
					for _, p := range places[x.group][:x.pos] {
						if !p.known || p.done.IsZero() || p.done.Add(lmLag).After(t) {
							return false
						}
					}
				}
			}
			return serverFree(t)
		}
		// The conditions change only at points: judge each stretch between
		// two by its middle.
		i := sort.Search(len(points), func(i int) bool { return points[i].After(from) })
		seg, freeFrom := from, time.Time{}
		longest, longFrom := time.Duration(0), time.Time{}
		for ; seg.Before(to); i++ {
			nxt := to
			if i < len(points) && points[i].Before(to) {
				nxt = points[i]
			}
			if nxt.After(seg) {
				mid := seg.Add(nxt.Sub(seg) / 2)
				if free(mid) {
					if freeFrom.IsZero() {
						freeFrom = seg
					}
					if d := nxt.Sub(freeFrom); d > longest {
						longest, longFrom = d, freeFrom
					}
				} else {
					freeFrom = time.Time{}
				}
			}
			seg = nxt
			if i >= len(points) {
				break
			}
		}
		fig.longestFreeWait = max(fig.longestFreeWait, longest)
		if longest >= lmIdleBound {
			fig.idleViolations++
			v.add("idle", "%s (%s, group %q) waited %v from %s to its start on %s; a slot was free for %v of it, from %s",
				x.id, x.queue, x.group, first.from.Sub(x.e).Round(time.Millisecond), x.e.Format("15:04:05.000000"), first.server,
				longest.Round(time.Millisecond), longFrom.Format("15:04:05.000000"))
		}
	}
}
