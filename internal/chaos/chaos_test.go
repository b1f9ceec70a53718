package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/redistest"
)

// The chaos run. Times are from the end of the initial enqueue.
const (
	chaosTasks     = 20000
	chaosWorkers   = 3
	chaosMaxRetry  = 20 // planned failures (<= 2) plus recoveries stay far below
	killEvery      = 2 * time.Second
	redisRestartAt = 5 * time.Second
	cutAt          = 11 * time.Second
	cutFor         = 10 * time.Second
	stopAt         = 22 * time.Second // a worker paused past its lease
	stopFor        = workerLease + 1500*time.Millisecond
	delayAt        = 25 * time.Second // replies slower than the read timeout, faster than a lease
	dropAt         = 28 * time.Second // replies lost after Redis ran the command
	resendFaults   = 12               // commands hit by each of delay and drop
	probes         = 300              // single Enqueues with broker-chosen IDs during them
	faultsFor      = 30 * time.Second // no fault is started after this
	drainLimit     = 90 * time.Second // after the last fault
	enqueueBatch   = 500
)

// failsFor is how many attempts of task i fail on purpose: 20% fail once,
// 10% twice.
func failsFor(i int) int {
	switch {
	case i%5 == 0:
		return 1
	case i%10 == 1:
		return 2
	}
	return 0
}

// TestChaos runs three server processes against a Redis with AOF
// (appendfsync always), all through a TCP proxy, and processes 20,000 tasks
// (half delayed by up to 5 s, 30% failing once or twice on purpose) while
// a worker process is SIGKILLed and restarted every 2 s, Redis is SIGKILLed
// and restarted once, and the proxy cuts every connection for 10 s. Then it
// checks that every task succeeded at least once, that the queue drained,
// that duplicate successes stay within what the killed and cut-off processes
// could have had in flight, and that the surviving processes shut down
// gracefully with no goroutine left.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test (server processes, Redis restart, 10 s network cut): skipped with -short")
	}
	ctx := context.Background()
	dir := t.TempDir()
	if keep := os.Getenv("TIDE_CHAOS_KEEP"); keep != "" {
		// Keep the processes' records and logs for a post-mortem.
		var err error
		if dir, err = os.MkdirTemp(keep, "chaos-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("run files kept in %s", dir)
	}
	rs := redistest.StartIn(t, dir, "--appendonly", "yes", "--appendfsync", "always")
	px, err := faultproxy.New(rs.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	const prefix = "chaos"
	opts := []redisbroker.Option{redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(chaosPartitions)}

	// The producer goes through the proxy like the servers; the observer
	// (the test's own view) talks to Redis directly.
	crdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ReadTimeout: workerReadTimeout})
	t.Cleanup(func() { _ = crdb.Close() })
	client := tide.NewClient(redisbroker.New(crdb, opts...))
	ordb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = ordb.Close() })
	insp := tide.NewInspector(redisbroker.New(ordb, opts...))

	f := newFleet(t, dir, px.Addr(), prefix)
	names := make([]string, chaosWorkers)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i+1)
		f.start(names[i])
	}

	begin := time.Now()
	for off := 0; off < chaosTasks; off += enqueueBatch {
		ts := make([]*tide.Task, 0, enqueueBatch)
		for i := off; i < min(off+enqueueBatch, chaosTasks); i++ {
			o := []tide.Option{tide.TaskID(taskID(i)), tide.MaxRetry(chaosMaxRetry)}
			if i%2 == 1 {
				o = append(o, tide.ProcessIn(time.Duration(i*7919%5000)*time.Millisecond))
			}
			ts = append(ts, tide.NewTask(chaosTaskType, []byte(strconv.Itoa(failsFor(i))), o...))
		}
		if _, err := client.EnqueueMany(ctx, ts); err != nil {
			t.Fatalf("EnqueueMany at %d: %v", off, err)
		}
	}
	t0 := time.Now()
	t.Logf("enqueued %d tasks in %v", chaosTasks, t0.Sub(begin).Round(time.Millisecond))

	// The observer: how many tasks are not final yet (-1: unknown).
	var remaining atomic.Int64
	remaining.Store(-1)
	stopPoll := make(chan struct{})
	var pollWG sync.WaitGroup
	pollWG.Go(func() {
		for {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			qi, err := insp.QueueInfo(c, tide.DefaultQueue)
			cancel()
			if err == nil {
				remaining.Store(int64(qi.Pending + qi.Active + qi.Scheduled + qi.Retry))
			} else {
				remaining.Store(-1)
			}
			select {
			case <-stopPoll:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	defer pollWG.Wait()
	defer close(stopPoll)

	// The faults, in time order.
	type event struct {
		at   time.Duration
		kind string // "kill", "redis", "cut"
	}
	var events []event
	for d := killEvery; d < faultsFor; d += killEvery {
		events = append(events, event{d, "kill"})
	}
	events = append(events, event{redisRestartAt, "redis"}, event{cutAt, "cut"},
		event{stopAt, "stop"}, event{delayAt, "delay"}, event{dropAt, "drop"})
	slices.SortStableFunc(events, func(a, b event) int { return int(a.at - b.at) })

	var windows []window
	var drainedAt time.Time
	victim := 0
	var pr probeRun
	var bg sync.WaitGroup
	for _, ev := range events {
		time.Sleep(time.Until(t0.Add(ev.at)))
		switch ev.kind {
		case "kill":
			f.killAndRestart(names[victim%len(names)])
			victim++
		case "redis":
			w := window{name: "Redis SIGKILL+restart", from: time.Now(), remaining: remaining.Load()}
			if err := rs.Restart(); err != nil {
				t.Fatalf("restart Redis: %v", err)
			}
			w.to = time.Now()
			windows = append(windows, w)
		case "cut":
			w := window{name: "proxy cut", from: time.Now(), remaining: remaining.Load()}
			px.Cut(cutFor)
			w.to = w.from.Add(cutFor)
			windows = append(windows, w)
		case "stop":
			name := names[victim%len(names)]
			victim++
			bg.Go(func() { f.pause(name, stopFor) })
		case "delay":
			// go-redis sends these again after its read timeout and Redis
			// runs them twice: no task may be doubled by that.
			px.DelayReplies(faultproxy.Commands("EVALSHA"), workerReadTimeout+500*time.Millisecond, resendFaults)
			bg.Go(func() { pr.run(t, client, probes/2) })
		case "drop":
			px.DropReplies(faultproxy.Commands("EVALSHA"), resendFaults)
			bg.Go(func() { pr.run(t, client, probes/2) })
		}
	}
	bg.Wait()
	faultsEnd := time.Now()
	deadline := faultsEnd.Add(drainLimit)
	for remaining.Load() != 0 {
		if time.Now().After(deadline) {
			qi, err := insp.QueueInfo(ctx, tide.DefaultQueue)
			t.Fatalf("queue not drained %v after the last fault: %+v (err %v)", drainLimit, qi, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	drainedAt = time.Now()
	if px.Seen("EVALSHA") == 0 || px.Dropped() == 0 {
		t.Errorf("the re-send faults did not happen: %d EVALSHA seen, %d replies dropped", px.Seen("EVALSHA"), px.Dropped())
	}

	// Graceful stop of the survivors, with their own goroutine-leak check.
	for _, err := range f.terminate(workerShutdown + 30*time.Second) {
		t.Error(err)
	}
	for _, u := range f.unexpected() {
		t.Errorf("worker exited unexpectedly: %s", u)
	}
	stderrs, _ := filepath.Glob(filepath.Join(dir, "stderr-*.txt"))
	for _, p := range stderrs {
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte("DATA RACE")) || bytes.Contains(b, []byte("panic:")) {
			t.Errorf("%s:\n%s", filepath.Base(p), tail(b, 8000))
		}
	}

	// Final state in Redis: nothing left but (possibly) archived tasks.
	qi, err := insp.QueueInfo(ctx, tide.DefaultQueue)
	if err != nil {
		t.Fatal(err)
	}
	if n := qi.Pending + qi.Active + qi.Scheduled + qi.Retry + qi.Completed; n != 0 {
		t.Errorf("tasks left in non-final states: %+v", qi)
	}
	if qi.Archived > 0 {
		arch, _ := insp.ListTasks(ctx, tide.DefaultQueue, tide.StateArchived, 0, 10)
		for _, a := range arch {
			t.Logf("archived: %s retried %d: %s", a.ID, a.Retried, a.LastErr)
		}
	}

	// What the processes recorded.
	x, err := readExecs(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The probes: single Enqueues with broker-chosen IDs sent while replies
	// were delayed and dropped. Each reported stored (or of unknown outcome)
	// is at most one task, and each reported stored ran.
	probeRan := map[string]int{}
	for id, s := range x.succ {
		if strings.HasPrefix(id, "task-") {
			continue
		}
		probeRan[id] = len(s)
	}
	stored, unknown := pr.result()
	for id := range stored {
		if probeRan[id] == 0 {
			t.Errorf("probe %s was reported stored but never ran (lost)", id)
		}
	}
	for id := range probeRan {
		if !stored[id] && !unknown[id] {
			t.Errorf("probe task %s ran but no Enqueue reported it: a re-sent enqueue stored a second task", id)
		}
	}
	if len(stored) == 0 {
		t.Error("no probe was stored: the re-send faults were not survived")
	}

	var lost []string
	dups := 0
	for i := range chaosTasks {
		s := x.succ[taskID(i)]
		if len(s) == 0 {
			lost = append(lost, taskID(i))
			continue
		}
		dups += len(s) - 1
		if first := s[0]; first.retried < failsFor(i) {
			t.Errorf("%s succeeded on attempt %d, before its %d planned failures", taskID(i), first.retried, failsFor(i))
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d tasks never succeeded (lost): %v", len(lost), lost[:min(len(lost), 20)])
	}

	// The duplicate bound. A task succeeds twice only when the outcome of
	// the first success never reached Redis: its process was SIGKILLed
	// first, or Redis stayed out of its reach past the lease. What a process
	// can lose that way is what it holds between "success recorded" and
	// "outcome written" (internal/engine/processor.go):
	//   - Concurrency handlers that finished but have not queued their
	//     outcome (a worker keeps its slot until then, so no more);
	//   - the acknowledgement queue, 2 x Concurrency;
	//   - the batch being written, taken from that queue in one
	//     non-blocking sweep of it and of the workers waiting on it, so at
	//     most 3 x Concurrency (growing it further within the sweep would
	//     take a whole fetch and handler run; the hard cap is 128).
	// That is 6 x Concurrency per affected process. Handlers alone
	// (Concurrency per fault) are not a sound bound: finished outcomes wait
	// in the queue. A kill hits one process; the Redis restart and the
	// proxy cut hit all of them.
	f.mu.Lock()
	kills := append([]kill(nil), f.kills...)
	stops := append([]stop(nil), f.stops...)
	incarnations := len(f.all)
	f.mu.Unlock()
	perProc := 6 * workerConcurrency
	affected := len(kills) + len(stops) + len(windows)*chaosWorkers
	bound := affected * perProc
	if dups > bound {
		t.Errorf("%d duplicate successes, over the bound %d (%d process-faults x %d)", dups, bound, affected, perProc)
	}
	byKill, byStop, byOutage, unexplained, maxPerKill := attribute(x, kills, stops, windows)
	if unexplained > 0 {
		t.Errorf("%d duplicate successes explained by no kill, pause or outage: re-sent requests doubled work", unexplained)
	}

	lines := countLogLines(t, dir)
	t.Logf("tasks %d; attempts recorded %d (%d successes, %d planned failures); worker incarnations %d",
		chaosTasks, x.total, x.successes, x.failures, incarnations)
	t.Logf("faults: %d SIGKILLs of a worker (every %v), Redis SIGKILL+restart, proxy cut %v, a worker SIGSTOPped for %v, %d replies delayed past the read timeout and %d dropped (%d EVALSHA sent through the proxy)",
		len(kills), killEvery, cutFor, stopFor, resendFaults, px.Dropped(), px.Seen("EVALSHA"))
	t.Logf("probes: %d Enqueues during the re-send faults reported stored, %d of unknown outcome; %d probe tasks ran", len(stored), len(unknown), len(probeRan))
	t.Logf("drained %v after the enqueue (%v after the last fault); archived %d",
		drainedAt.Sub(t0).Round(time.Millisecond), drainedAt.Sub(faultsEnd).Round(time.Millisecond), qi.Archived)
	t.Logf("duplicates: %d (tasks that succeeded more than once: %d); bound %d = %d process-faults x %d (6 x Concurrency); handlers alone would give %d",
		dups, x.dupTasks(), bound, affected, perProc, affected*workerConcurrency)
	t.Logf("duplicates explained: by a SIGKILL %d (at most %d for one kill), by a paused worker %d, by an outage %d, by re-sent requests (unexplained) %d",
		byKill, maxPerKill, byStop, byOutage, unexplained)
	for _, w := range windows {
		gap, resume := x.gapAround(w.from, w.to)
		t.Logf("%s: %v, %d tasks not final when it started; longest gap between executions %v, first execution %v after it ended",
			w.name, w.to.Sub(w.from).Round(time.Millisecond), w.remaining, gap.Round(time.Millisecond), resume.Round(time.Millisecond))
	}
	gap, _ := x.gapAround(t0, drainedAt)
	t.Logf("longest gap between executions over the whole run: %v", gap.Round(time.Millisecond))
	t.Logf("worker log lines: %s", lines)
}

func taskID(i int) string { return fmt.Sprintf("task-%05d", i) }

// window is a fault that hit every process: the Redis restart or the cut.
type window struct {
	name      string
	from, to  time.Time
	remaining int64 // tasks not final when it started (-1: unknown)
}

// attempt is one recorded attempt.
type attempt struct {
	worker  string
	inc     int
	retried int
	at      time.Time
}

type execs struct {
	succ                       map[string][]attempt // by task ID, in time order
	times                      []time.Time          // every attempt, sorted
	total, successes, failures int
}

func (x *execs) dupTasks() int {
	n := 0
	for _, s := range x.succ {
		if len(s) > 1 {
			n++
		}
	}
	return n
}

// gapAround returns the longest interval without any recorded attempt that
// overlaps [from, to], and how long after to the first attempt came.
func (x *execs) gapAround(from, to time.Time) (gap, resume time.Duration) {
	resume = -1
	for i := 1; i < len(x.times); i++ {
		a, b := x.times[i-1], x.times[i]
		if b.Before(from) || a.After(to) {
			continue
		}
		gap = max(gap, b.Sub(a))
	}
	if i, _ := slices.BinarySearchFunc(x.times, to, func(e, t time.Time) int { return e.Compare(t) }); i < len(x.times) {
		resume = x.times[i].Sub(to)
	}
	return gap, resume
}

// readExecs parses every exec-<worker>-<inc>.log in dir.
func readExecs(dir string) (*execs, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "exec-*.log"))
	if err != nil {
		return nil, err
	}
	x := &execs{succ: map[string][]attempt{}}
	for _, p := range paths {
		base := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "exec-"), ".log")
		name, incs, _ := strings.Cut(base, "-")
		inc, _ := strconv.Atoi(incs)
		fh, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) != 4 {
				fh.Close()
				return nil, fmt.Errorf("%s: bad line %q", p, sc.Text())
			}
			n, _ := strconv.Atoi(fs[2])
			ns, _ := strconv.ParseInt(fs[3], 10, 64)
			e := attempt{worker: name, inc: inc, retried: n, at: time.Unix(0, ns)}
			x.total++
			x.times = append(x.times, e.at)
			switch fs[0] {
			case "S":
				x.successes++
				x.succ[fs[1]] = append(x.succ[fs[1]], e)
			case "F":
				x.failures++
			}
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(x.times, func(a, b time.Time) int { return a.Compare(b) })
	for _, s := range x.succ {
		slices.SortFunc(s, func(a, b attempt) int { return a.at.Compare(b.at) })
	}
	return x, nil
}

// attribute explains each duplicate success: every success of a task but the
// last had its outcome lost. An outage accounts for a success from just
// before it to its end (the outcome could not be written within the lease);
// a SIGKILL of the process accounts for a success shortly before it (an
// outcome not written within a lease is given up and the task recovered).
func attribute(x *execs, kills []kill, stops []stop, outages []window) (byKill, byStop, byOutage, unexplained, maxPerKill int) {
	slack := workerLease + 3*time.Second
	perKill := map[int]int{}
	for _, s := range x.succ {
		for _, e := range s[:len(s)-1] {
			if slices.ContainsFunc(outages, func(o window) bool {
				return !e.at.Before(o.from.Add(-time.Second)) && !e.at.After(o.to)
			}) {
				byOutage++
				continue
			}
			// A paused worker finishes what it ran before the pause after
			// its leases expired and others ran the tasks again.
			if slices.ContainsFunc(stops, func(s stop) bool {
				return s.name == e.worker && s.inc == e.inc && !e.at.Before(s.from.Add(-slack)) && !e.at.After(s.to.Add(slack))
			}) {
				byStop++
				continue
			}
			k := slices.IndexFunc(kills, func(k kill) bool {
				return k.name == e.worker && k.inc == e.inc && !k.at.Before(e.at) && k.at.Sub(e.at) <= slack
			})
			if k >= 0 {
				byKill++
				perKill[k]++
				continue
			}
			unexplained++
		}
	}
	for _, n := range perKill {
		maxPerKill = max(maxPerKill, n)
	}
	return byKill, byStop, byOutage, unexplained, maxPerKill
}

// probeRun enqueues tasks one at a time with broker-chosen IDs and records
// what each call reported.
type probeRun struct {
	mu      sync.Mutex
	stored  map[string]bool
	unknown map[string]bool
}

func (p *probeRun) run(t *testing.T, c *tide.Client, n int) {
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		info, err := c.Enqueue(ctx, tide.NewTask(chaosTaskType, []byte("0")), tide.MaxRetry(chaosMaxRetry))
		cancel()
		p.mu.Lock()
		if p.stored == nil {
			p.stored, p.unknown = map[string]bool{}, map[string]bool{}
		}
		switch {
		case err == nil:
			p.stored[info.ID] = true
		case info != nil:
			p.unknown[info.ID] = true // ErrOutcomeUnknown: may or may not exist
		case !errors.Is(err, tide.ErrUnavailable):
			t.Errorf("probe enqueue: %v", err)
		}
		p.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *probeRun) result() (stored, unknown map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stored, p.unknown
}

// countLogLines counts the engine's log lines about broker health and lost
// outcomes over every worker's JSON log.
func countLogLines(t *testing.T, dir string) string {
	paths, _ := filepath.Glob(filepath.Join(dir, "log-*.json"))
	kinds := []struct{ name, frag string }{
		{"unreachable", "tide: broker unreachable"},
		{"reachable again", "tide: broker reachable again"},
		{"settlements given up", "could not write settlements"},
		{"settlement refused (lease lost)", "settlement refused"},
		{"handler lease lost", "lease lost while the task ran"},
		{"maintenance errors", "queue maintenance failed"},
	}
	counts := make([]int, len(kinds))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			var rec struct {
				Msg string `json:"msg"`
			}
			if len(line) == 0 || json.Unmarshal(line, &rec) != nil {
				continue
			}
			for i, k := range kinds {
				if strings.Contains(rec.Msg, k.frag) {
					counts[i]++
				}
			}
		}
	}
	var sb strings.Builder
	for i, k := range kinds {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s %d", k.name, counts[i])
	}
	return sb.String()
}
