package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// figure is one row of the table.
type figure struct {
	key   string
	label string
	unit  string // tasks/s, dur, bytes, rate, count
	lower bool   // lower is better
	ratio bool   // print a ratio

	// only, when set, is the one system that has this figure; the other
	// column shows absent (a feature it does not have).
	only   string
	absent string
}

// val is one measured value. atLeast marks a lower bound (the measurement
// gave up at its cap).
type val struct {
	v       float64
	atLeast bool
}

type results map[string]val

// workload is a named group of figures, run once per system.
type workload struct {
	name  string
	once  bool // runs once, not per system (the floor): its figures fill both columns
	about string
	figs  []figure
	limit time.Duration // time box of one system's run
	run   func(ctx context.Context, e *env, kind string) (results, error)

	// systems, when set, are the only systems the workload runs on; the
	// cells of the others say absent (a feature they do not have).
	systems []string
	absent  string
}

// sizes are the task counts and durations of a run (full or -quick).
type sizes struct {
	enqN, batchN, batch      int
	procN                    int
	pickupN                  int
	pickupMin, pickupMax     time.Duration
	schedN                   int
	schedSpread, schedLead   time.Duration
	burstN                   int
	burstLead, burstLimit    time.Duration
	memN                     int
	memDelay                 time.Duration
	crashLease, crashCap     time.Duration
	idleQueues               int
	idleWarm, idleWindow     time.Duration
	concurrency, enqWorkers  int
	warmups                  int
	floorN                   int
	soakDur, soakEvery       time.Duration
	rollLead, rollEvery      time.Duration
	rollBaseline, rollBudget time.Duration
	rollTail, rollGap        time.Duration
	rollWait                 time.Duration
	grpN, grpGroups          int
	grpRounds                int
	blockedGroups, blockedN  int
	blockedCap               time.Duration
	fairBigN, fairSmallN     int
	fairConcurrency          int
	chainN                   int
	chainCap                 time.Duration
	fanN                     int
	waitN, waitFloorN        int
	waitCap                  time.Duration
}

func fullSizes() sizes {
	return sizes{
		enqN: 20000, batchN: 100000, batch: 1000,
		procN:   20000,
		pickupN: 200, pickupMin: 20 * time.Millisecond, pickupMax: 100 * time.Millisecond,
		schedN: 500, schedSpread: 8 * time.Second, schedLead: 2 * time.Second,
		burstN: 100000, burstLead: 20 * time.Second, burstLimit: 180 * time.Second,
		memN: 50000, memDelay: time.Hour,
		crashLease: 2 * time.Second, crashCap: 120 * time.Second,
		idleQueues: 10, idleWarm: 2 * time.Second, idleWindow: 10 * time.Second,
		concurrency: 50, enqWorkers: 8, warmups: 5,
		floorN:  20000,
		soakDur: 30 * time.Second, soakEvery: 5 * time.Second,
		rollLead: 3 * time.Second, rollEvery: 10 * time.Millisecond,
		rollBaseline: 10 * time.Second, rollBudget: 15 * time.Second, rollTail: 5 * time.Second,
		rollGap: time.Second, rollWait: time.Minute,
		grpN: 100000, grpGroups: 10000, grpRounds: 3,
		blockedGroups: 10000, blockedN: 200, blockedCap: 30 * time.Second,
		fairBigN: 50000, fairSmallN: 50, fairConcurrency: 10,
		chainN: 1000, chainCap: 15 * time.Second,
		fanN:  10000,
		waitN: 2000, waitFloorN: 20000, waitCap: 10 * time.Second,
	}
}

func quickSizes() sizes {
	s := fullSizes()
	s.enqN, s.batchN = 5000, 20000
	s.procN = 5000
	s.pickupN = 40
	s.schedN, s.schedSpread = 100, 3*time.Second
	s.burstN, s.burstLead, s.burstLimit = 10000, 8*time.Second, 60*time.Second
	s.memN = 10000
	s.crashCap = 15 * time.Second
	s.idleWarm, s.idleWindow = time.Second, 4*time.Second
	s.floorN = 5000
	s.soakDur, s.soakEvery = 15*time.Second, time.Second
	s.rollBaseline, s.rollBudget, s.rollTail = 4*time.Second, 8*time.Second, 2*time.Second
	s.grpN, s.grpGroups, s.grpRounds = 20000, 2000, 1
	s.blockedGroups, s.blockedN, s.blockedCap = 2000, 50, 15*time.Second
	s.fairBigN = 10000
	s.chainN, s.chainCap = 200, 5*time.Second
	s.fanN = 2000
	s.waitN, s.waitFloorN, s.waitCap = 300, 5000, 5*time.Second
	return s
}

// env is what every workload gets.
type env struct {
	addr  string
	admin *redis.Client // the bench's own client: FLUSHALL, INFO, checks
	sz    sizes
	notes []string
}

// note adds a line to the notes under the table, once (a workload run in
// several rounds notes the same thing each time).
func (e *env) note(format string, a ...any) {
	n := fmt.Sprintf(format, a...)
	if !slices.Contains(e.notes, n) {
		e.notes = append(e.notes, n)
	}
}

func (e *env) flush(ctx context.Context) error { return e.admin.FlushAll(ctx).Err() }

func kcount(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

func workloads(sz sizes) []workload {
	return []workload{
		{
			name:  "floor",
			once:  true,
			about: "physical floor: redis-benchmark running a two-command script (EVAL and EVALSHA) on the same Redis",
			figs: []figure{
				{key: floorKey(1), label: "floor: redis-benchmark EVAL HSETNX+LPUSH, 1 client (-c 1 -P 1; one figure for both)", unit: "tasks/s"},
				{key: floorKey(8), label: "floor: redis-benchmark EVAL HSETNX+LPUSH, 8 clients (-c 8 -P 1; one figure for both)", unit: "tasks/s"},
				{key: floorShaKey(1), label: "floor: redis-benchmark EVALSHA of the same script, 1 client (-c 1 -P 1; one figure for both)", unit: "tasks/s"},
				{key: floorShaKey(8), label: "floor: redis-benchmark EVALSHA of the same script, 8 clients (-c 8 -P 1; one figure for both)", unit: "tasks/s"},
			},
			limit: 2 * time.Minute,
			run:   runFloor,
		},
		{
			name:  "enqueue",
			about: "client throughput: single Enqueue calls from 1 and 8 goroutines; batch enqueue",
			figs: []figure{
				{key: "enq1", label: fmt.Sprintf("enqueue: %s × Enqueue, 1 goroutine", kcount(sz.enqN)), unit: "tasks/s", ratio: true},
				{key: "enq8", label: fmt.Sprintf("enqueue: %s × Enqueue, %d goroutines", kcount(sz.enqN), sz.enqWorkers), unit: "tasks/s", ratio: true},
				{key: "enqBatch", label: fmt.Sprintf("enqueue: EnqueueMany ×%d, %s tasks (asynq: no batch call → %s single Enqueue, 1 goroutine)", sz.batch, kcount(sz.batchN), kcount(sz.enqN)), unit: "tasks/s", ratio: true},
				{key: "enqOut8", label: fmt.Sprintf("enqueue: %d tasks outstanding, no call waiting on another (best of EnqueueMany ×%d from 1 goroutine and ×%d from 2)", sz.enqWorkers, sz.enqWorkers, sz.enqWorkers/2), unit: "tasks/s", only: sysTide, absent: noBatchCell},
			},
			limit: 5 * time.Minute,
			run:   runEnqueue,
		},
		{
			name:  "process",
			about: "server throughput: drain pending tasks with no-op handlers",
			figs: []figure{
				{key: "proc", label: fmt.Sprintf("process: drain %s pending, concurrency %d, no-op handler", kcount(sz.procN), sz.concurrency), unit: "tasks/s", ratio: true},
			},
			limit: 5 * time.Minute,
			run:   runProcess,
		},
		{
			name:  "pickup",
			about: "idle pickup latency: Enqueue → handler start on a waiting server",
			figs: []figure{
				{key: "pick50", label: fmt.Sprintf("idle pickup: enqueue → start, p50 (%d tasks)", sz.pickupN), unit: "dur", lower: true, ratio: true},
				{key: "pick99", label: "idle pickup: enqueue → start, p99", unit: "dur", lower: true, ratio: true},
				{key: "pickMax", label: "idle pickup: enqueue → start, max", unit: "dur", lower: true, ratio: true},
			},
			limit: 3 * time.Minute,
			run:   runPickup,
		},
		{
			name:  "sched",
			about: "scheduled lateness: handler start − due time (ProcessAt)",
			figs: []figure{
				{key: "sched50", label: fmt.Sprintf("scheduled: start − due, p50 (%d tasks over %v)", sz.schedN, sz.schedSpread), unit: "dur", lower: true, ratio: true},
				{key: "sched99", label: "scheduled: start − due, p99", unit: "dur", lower: true, ratio: true},
				{key: "schedMax", label: "scheduled: start − due, max", unit: "dur", lower: true, ratio: true},
				{key: "schedEarly", label: "scheduled: early starts (before due)", unit: "count", lower: true},
			},
			limit: 3 * time.Minute,
			run:   runScheduled,
		},
		{
			name:  "burst",
			about: "due burst: many tasks due at the same instant",
			figs: []figure{
				{key: "burstAll", label: fmt.Sprintf("due burst: %s due at once, last start − due", kcount(sz.burstN)), unit: "dur", lower: true, ratio: true},
				{key: "burst50", label: "due burst: start − due, p50", unit: "dur", lower: true, ratio: true},
				{key: "burstEarly", label: "due burst: early starts (before due)", unit: "count", lower: true},
			},
			limit: sz.burstLead + sz.burstLimit + 2*time.Minute,
			run:   runBurst,
		},
		{
			name:  "memory",
			about: "Redis used_memory growth per delayed task",
			figs: []figure{
				{key: "mem", label: fmt.Sprintf("memory: used_memory per task, %s tasks delayed %v, %d-byte payload", kcount(sz.memN), sz.memDelay, payloadSize), unit: "bytes", lower: true, ratio: true},
			},
			limit: 5 * time.Minute,
			run:   runMemory,
		},
		{
			name:  "crash",
			about: "crash recovery: worker process SIGKILLed mid-task → task starts again elsewhere",
			figs: []figure{
				{key: "crash", label: fmt.Sprintf("crash recovery: SIGKILL → restarted elsewhere (tide LeaseDuration %v; asynq defaults)", sz.crashLease), unit: "dur", lower: true, ratio: true},
			},
			limit: sz.crashCap + 2*time.Minute,
			run:   runCrash,
		},
		{
			name:  "idlecost",
			about: "commands an idle server sends to Redis",
			figs: []figure{
				{key: "idleExec", label: fmt.Sprintf("idle cost, %d queues: commands/s executed by Redis (incl. inside scripts)", sz.idleQueues), unit: "rate", lower: true, ratio: true},
				{key: "idleSent", label: "idle cost: commands/s sent by the server (top level, incl. EVALSHA)", unit: "rate", lower: true, ratio: true},
				{key: "idleScripts", label: "idle cost: script calls/s (EVALSHA/EVAL)", unit: "rate", lower: true, ratio: true},
				{key: "idleInScript", label: "idle cost: commands/s run inside scripts", unit: "rate", lower: true, ratio: true},
			},
			limit: 2 * time.Minute,
			run:   runIdleCost,
		},
		{
			name:  "soak",
			about: "Redis used_memory while processing at full speed with Retention(1ms)",
			figs: []figure{
				{key: "soakRate", label: fmt.Sprintf("soak %v: tasks/s processed (Retention 1ms; 1 in %d archived, 1 in %d retried once)", sz.soakDur, soakFailEvery, soakFailEvery), unit: "tasks/s", ratio: true},
				{key: "soakStart", label: "soak: used_memory at start (after warm-up)", unit: "mb", lower: true},
				{key: "soakPeak", label: "soak: used_memory peak", unit: "mb", lower: true, ratio: true},
				{key: "soakEnd", label: "soak: used_memory at end", unit: "mb", lower: true, ratio: true},
				{key: "soakSlope", label: "soak: used_memory slope (least squares, after warm-up)", unit: "kbmin", lower: true},
				{key: "soakSlope2", label: "soak: used_memory slope over the second half", unit: "kbmin", lower: true},
			},
			limit: sz.soakDur + 2*time.Minute,
			run:   runSoak,
		},
		{
			name:  "rolling",
			about: "scheduled lateness while 3 server processes are restarted one by one (SIGTERM, wait, start)",
			figs: []figure{
				{key: "roll50", label: fmt.Sprintf("rolling: %d server processes, task due every %v; steady baseline start − due, p50", rollProcs, sz.rollEvery), unit: "dur", lower: true, ratio: true},
				{key: "roll99", label: "rolling: baseline start − due, p99", unit: "dur", lower: true, ratio: true},
				{key: "rollMax", label: "rolling: baseline start − due, max", unit: "dur", lower: true, ratio: true},
				{key: "rollR50", label: "rolling: during restarts (SIGTERM → exit → start, one by one) start − due, p50", unit: "dur", lower: true, ratio: true},
				{key: "rollR99", label: "rolling: during restarts start − due, p99", unit: "dur", lower: true, ratio: true},
				{key: "rollRMax", label: "rolling: during restarts start − due, max", unit: "dur", lower: true, ratio: true},
				{key: "rollRCount", label: "rolling: tasks due during the restarts", unit: "count"},
				{key: "rollEarly", label: "rolling: early starts (before due)", unit: "count", lower: true},
			},
			limit: sz.rollLead + sz.rollBaseline + sz.rollBudget + sz.rollTail + sz.rollWait + 3*time.Minute,
			run:   runRolling,
		},
		groupsWorkload(sz),
		fairnessWorkload(sz),
		sharesWorkload(sz),
		blockedWorkload(sz),
		chainWorkload(sz),
		fanoutWorkload(sz),
		waitWorkload(sz),
		durableWorkload(sz),
	}
}

// ---- helpers ----

func payloads(n int, kind byte, ref time.Time) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = makePayload(kind, i, ref)
	}
	return out
}

func enqueueSerial(ctx context.Context, s system, queue string, ps [][]byte, at time.Time) error {
	for i, p := range ps {
		if err := s.enqueue(ctx, queue, p, at); err != nil {
			return fmt.Errorf("enqueue task %d: %w", i, err)
		}
	}
	return nil
}

func enqueueParallel(ctx context.Context, s system, workers int, queue string, ps [][]byte, at time.Time) error {
	return spread(ctx, workers, 1, len(ps), func(ctx context.Context, i, _ int) error {
		if err := s.enqueue(ctx, queue, ps[i], at); err != nil {
			return fmt.Errorf("enqueue task %d: %w", i, err)
		}
		return nil
	})
}

// spread hands [0, n) out in pieces of per to g goroutines, each calling f
// with its piece [i, j) and waiting for it before taking the next. It
// returns f's first error, after which the others stop at their next piece
// (the context they were given is cancelled), or ctx's error if ctx ended
// first.
func spread(ctx context.Context, g, per, n int, f func(ctx context.Context, i, j int) error) error {
	inner, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range g {
		wg.Go(func() {
			for inner.Err() == nil {
				i := int(next.Add(int64(per))) - per
				if i >= n {
					return
				}
				if err := f(inner, i, min(i+per, n)); err != nil {
					once.Do(func() { first = err })
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// enqueueBatches stores ps with the system's batch call, batch tasks a call.
func enqueueBatches(ctx context.Context, s system, batch int, queue string, ps [][]byte, at time.Time) (bool, error) {
	for i := 0; i < len(ps); i += batch {
		ok, err := s.enqueueBatch(ctx, queue, ps[i:min(i+batch, len(ps))], at)
		if !ok {
			return false, nil
		}
		if err != nil {
			return true, fmt.Errorf("batch at %d: %w", i, err)
		}
	}
	return true, nil
}

// enqueueBulk stores many tasks the fastest way the system offers: its batch
// call, else single calls from the enqueue goroutines.
func enqueueBulk(ctx context.Context, e *env, s system, queue string, ps [][]byte, at time.Time) (string, error) {
	ok, err := enqueueBatches(ctx, s, e.sz.batch, queue, ps, at)
	if ok {
		return fmt.Sprintf("batch call ×%d", e.sz.batch), err
	}
	return fmt.Sprintf("single calls from %d goroutines", e.sz.enqWorkers), enqueueParallel(ctx, s, e.sz.enqWorkers, queue, ps, at)
}

func expectStored(ctx context.Context, e *env, s system, want int, what string) error {
	got, err := s.stored(ctx)
	if err != nil {
		return fmt.Errorf("%s: count stored tasks: %w", what, err)
	}
	if got != want {
		return fmt.Errorf("%s: Redis holds %d tasks, want %d; some keys: %s", what, got, want, describeKeys(ctx, e.admin, 12))
	}
	return nil
}

// describeKeys lists some of Redis's keys with their types and sizes, to
// explain a failed check.
func describeKeys(ctx context.Context, rdb *redis.Client, limit int) string {
	var parts []string
	iter := rdb.Scan(ctx, 0, "*", 100).Iterator()
	for iter.Next(ctx) && len(parts) < limit {
		k := iter.Val()
		typ, _ := rdb.Type(ctx, k).Result()
		var n int64
		switch typ {
		case "hash":
			n, _ = rdb.HLen(ctx, k).Result()
		case "list":
			n, _ = rdb.LLen(ctx, k).Result()
		case "zset":
			n, _ = rdb.ZCard(ctx, k).Result()
		case "set":
			n, _ = rdb.SCard(ctx, k).Result()
		case "string":
			n, _ = rdb.StrLen(ctx, k).Result()
		}
		parts = append(parts, fmt.Sprintf("%s (%s %d)", k, typ, n))
	}
	return strings.Join(parts, ", ")
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// warmUp runs n tasks through a freshly started server, one at a time, so
// that connections are open and scripts loaded before measuring.
// startRecorded starts a system and a server (the workload's concurrency)
// whose handler records n tasks, warmed up on the default queue. done stops
// the server and closes the system.
func startRecorded(ctx context.Context, e *env, kind string, n int) (system, *recorder, func(), error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, nil, nil, err
	}
	rec := newRecorder(n)
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency}, rec.handle)
	if err != nil {
		s.close()
		return nil, nil, nil, err
	}
	done := func() {
		srv.stop(time.Minute)
		s.close()
	}
	if err := warmUp(ctx, s, rec, e.sz.warmups, defaultQueue); err != nil {
		done()
		return nil, nil, nil, err
	}
	return s, rec, done, nil
}

func warmUp(ctx context.Context, s system, rec *recorder, n int, queue string) error {
	for i := range n {
		if err := s.enqueue(ctx, queue, makePayload(kindWarmup, i, time.Now()), time.Time{}); err != nil {
			return fmt.Errorf("warm-up enqueue: %w", err)
		}
		if err := rec.waitWarm(ctx, int64(i+1), 30*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// ---- workloads ----

func runEnqueue(ctx context.Context, e *env, kind string) (results, error) {
	res := results{}
	ps := payloads(e.sz.enqN, kindTask, time.Now())
	bps := payloads(e.sz.batchN, kindTask, time.Now())
	// Each figure on a flushed Redis with a fresh client (both libraries
	// remember which queues they have registered).
	measure := func(key, what string, f func(s system) (int, error)) error {
		if err := e.flush(ctx); err != nil {
			return err
		}
		s, err := newSystem(kind, e.addr)
		if err != nil {
			return err
		}
		defer s.close()
		// Warm up: open the pool's connections and load the scripts.
		warm := payloads(64, kindWarmup, time.Now())
		if err := enqueueParallel(ctx, s, e.sz.enqWorkers, defaultQueue, warm, time.Time{}); err != nil {
			return fmt.Errorf("%s: warm-up: %w", what, err)
		}
		start := time.Now()
		n, err := f(s)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		res[key] = val{v: rate(n, time.Since(start))}
		return expectStored(ctx, e, s, len(warm)+n, what)
	}
	if err := measure("enq1", "enqueue, 1 goroutine", func(s system) (int, error) {
		return len(ps), enqueueSerial(ctx, s, defaultQueue, ps, time.Time{})
	}); err != nil {
		return nil, err
	}
	if err := measure("enq8", fmt.Sprintf("enqueue, %d goroutines", e.sz.enqWorkers), func(s system) (int, error) {
		return len(ps), enqueueParallel(ctx, s, e.sz.enqWorkers, defaultQueue, ps, time.Time{})
	}); err != nil {
		return nil, err
	}
	if err := measure("enqBatch", "batch enqueue", func(s system) (int, error) {
		ok, err := enqueueBatches(ctx, s, e.sz.batch, defaultQueue, bps, time.Time{})
		if ok {
			return len(bps), err
		}
		// No batch call: single calls from one goroutine.
		return len(ps), enqueueSerial(ctx, s, defaultQueue, ps, time.Time{})
	}); err != nil {
		return nil, err
	}
	// The ceiling of enq8: as many tasks in flight at once as enq8 has
	// goroutines, from callers that never wait for one another because each
	// sends its share in one call of its own. Eight callers of single
	// Enqueue calls, whose tasks must first be gathered into shared round
	// trips, cannot do better. Systems without a batch call have no such
	// figure.
	if kind == sysTide {
		var each []string
		for _, g := range []int{1, 2} {
			per := max(e.sz.enqWorkers/g, 1)
			key := fmt.Sprintf("enqOut%d", g)
			if err := measure(key, fmt.Sprintf("%d tasks outstanding from %d goroutines", per*g, g), func(s system) (int, error) {
				return len(ps), enqueueOutstanding(ctx, s, g, per, defaultQueue, ps)
			}); err != nil {
				return nil, err
			}
			each = append(each, fmt.Sprintf("%s with EnqueueMany ×%d from %s", format("tasks/s", res[key].v), per, plural(g, "goroutine")))
			res["enqOut8"] = val{v: max(res["enqOut8"].v, res[key].v)}
		}
		e.note("enqueue/tide: %d tasks outstanding: %s", e.sz.enqWorkers, strings.Join(each, "; "))
	}
	return res, nil
}

// noBatchCell marks the ceiling rows of a system without a batch call.
const noBatchCell = "(no batch call)"

// enqueueOutstanding stores ps from g goroutines, each sending per tasks a
// call with the system's batch call and waiting for it before the next.
func enqueueOutstanding(ctx context.Context, s system, g, per int, queue string, ps [][]byte) error {
	return spread(ctx, g, per, len(ps), func(ctx context.Context, i, j int) error {
		ok, err := s.enqueueBatch(ctx, queue, ps[i:j], time.Time{})
		if err == nil && !ok {
			err = errors.New("no batch call")
		}
		if err != nil {
			return fmt.Errorf("enqueue tasks %d to %d: %w", i, j-1, err)
		}
		return nil
	})
}

func runProcess(ctx context.Context, e *env, kind string) (results, error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, err
	}
	defer s.close()
	n := e.sz.procN
	how, err := enqueueBulk(ctx, e, s, defaultQueue, payloads(n, kindTask, time.Now()), time.Time{})
	if err != nil {
		return nil, err
	}
	if err := expectStored(ctx, e, s, n, "process: before start"); err != nil {
		return nil, err
	}
	rec := newRecorder(n)
	start := time.Now()
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency}, rec.handle)
	if err != nil {
		return nil, err
	}
	defer srv.stop(time.Minute)
	if err := rec.wait(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	lastStart := rec.lastStart().Sub(start)
	// Drained means acknowledged: the task is gone from Redis.
	var drained time.Duration
	for deadline := time.Now().Add(time.Minute); ; {
		left, err := s.stored(ctx)
		if err != nil {
			return nil, err
		}
		if left == 0 {
			drained = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("process: every handler ran but Redis still holds %d of %d tasks a minute later; some keys: %s", left, n, describeKeys(ctx, e.admin, 12))
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.note("process/%s: %d tasks pre-enqueued (%s); from Start: last handler start %v, all acknowledged (gone from Redis) %v",
		kind, n, how, lastStart.Round(time.Millisecond), drained.Round(time.Millisecond))
	return results{"proc": {v: rate(n, drained)}}, nil
}

func runPickup(ctx context.Context, e *env, kind string) (results, error) {
	n := e.sz.pickupN
	s, rec, done, err := startRecorded(ctx, e, kind, n)
	if err != nil {
		return nil, err
	}
	defer done()
	time.Sleep(time.Second) // let the server go idle
	rng := rand.New(rand.NewPCG(1, 2))
	span := int64(e.sz.pickupMax - e.sz.pickupMin)
	for i := range n {
		time.Sleep(e.sz.pickupMin + time.Duration(rng.Int64N(span+1)))
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		t0 := time.Now()
		if err := s.enqueue(ctx, defaultQueue, makePayload(kindTask, i, t0), time.Time{}); err != nil {
			return nil, fmt.Errorf("enqueue task %d: %w", i, err)
		}
	}
	if err := rec.wait(ctx, time.Minute); err != nil {
		return nil, err
	}
	d := rec.delays()
	return results{
		"pick50":  {v: ms(pct(d, 50))},
		"pick99":  {v: ms(pct(d, 99))},
		"pickMax": {v: ms(d[len(d)-1])},
	}, nil
}

func runScheduled(ctx context.Context, e *env, kind string) (results, error) {
	n := e.sz.schedN
	s, rec, done, err := startRecorded(ctx, e, kind, n)
	if err != nil {
		return nil, err
	}
	defer done()
	// Due times on whole milliseconds (tide keeps milliseconds), spread
	// uniformly over schedSpread, starting schedLead from now.
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Now().Add(e.sz.schedLead).Truncate(time.Millisecond)
	for i := range n {
		due := base.Add(time.Duration(rng.Int64N(int64(e.sz.schedSpread/time.Millisecond))) * time.Millisecond)
		if err := s.enqueue(ctx, defaultQueue, makePayload(kindTask, i, due), due); err != nil {
			return nil, fmt.Errorf("enqueue task %d: %w", i, err)
		}
	}
	if late := time.Since(base); late > 0 {
		return nil, fmt.Errorf("enqueueing %d tasks took longer than the %v lead (%v past the first due time)", n, e.sz.schedLead, late)
	}
	if err := rec.wait(ctx, e.sz.schedLead+e.sz.schedSpread+time.Minute); err != nil {
		return nil, err
	}
	d := rec.delays()
	early := 0
	for _, x := range d {
		if x < 0 {
			early++
		}
	}
	if early > 0 {
		e.note("scheduled/%s: %d of %d tasks started early; earliest %.1f ms before due", kind, early, n, -ms(d[0]))
	}
	return results{
		"sched50":    {v: ms(pct(d, 50))},
		"sched99":    {v: ms(pct(d, 99))},
		"schedMax":   {v: ms(d[len(d)-1])},
		"schedEarly": {v: float64(early)},
	}, nil
}

func runBurst(ctx context.Context, e *env, kind string) (results, error) {
	n := e.sz.burstN
	s, rec, done, err := startRecorded(ctx, e, kind, n)
	if err != nil {
		return nil, err
	}
	defer done()
	// A whole second, so that asynq (which keeps due times in seconds) and
	// tide agree on the instant.
	due := time.Now().Add(e.sz.burstLead).Truncate(time.Second).Add(time.Second)
	start := time.Now()
	how, err := enqueueBulk(ctx, e, s, defaultQueue, payloads(n, kindTask, due), due)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	if left := time.Until(due); left < 200*time.Millisecond {
		return nil, fmt.Errorf("enqueueing %d tasks took %v, leaving %v before the due time; the burst would not be simultaneous (raise burstLead)", n, took.Round(time.Millisecond), left)
	}
	e.note("burst/%s: %d tasks enqueued in %v (%s), due %v later", kind, n, took.Round(time.Millisecond), how, time.Until(due).Round(time.Millisecond))
	if err := rec.wait(ctx, time.Until(due)+e.sz.burstLimit); err != nil {
		return nil, err
	}
	d := rec.delays()
	early := 0
	for _, x := range d {
		if x < 0 {
			early++
		}
	}
	if early > 0 {
		e.note("burst/%s: %d of %d tasks started early; earliest %.1f ms before due", kind, early, n, -ms(d[0]))
	}
	return results{
		"burstAll":   {v: ms(rec.lastStart().Sub(due))},
		"burst50":    {v: ms(pct(d, 50))},
		"burstEarly": {v: float64(early)},
	}, nil
}

func runMemory(ctx context.Context, e *env, kind string) (results, error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, err
	}
	defer s.close()
	at := time.Now().Add(e.sz.memDelay)
	// One task first, so that the queue's keys, registrations and scripts
	// exist: the figure is the marginal cost of a task.
	if err := s.enqueue(ctx, defaultQueue, makePayload(kindWarmup, 0, at), at); err != nil {
		return nil, err
	}
	before, err := usedMemory(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	n := e.sz.memN
	how, err := enqueueBulk(ctx, e, s, defaultQueue, payloads(n, kindTask, at), at)
	if err != nil {
		return nil, err
	}
	after, err := usedMemory(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	if err := expectStored(ctx, e, s, n+1, "memory"); err != nil {
		return nil, err
	}
	per := float64(after-before) / float64(n)
	e.note("memory/%s: used_memory %d → %d bytes (+%.1f MB) for %d tasks (%s)", kind, before, after, float64(after-before)/1e6, n, how)
	return results{"mem": {v: per}}, nil
}

// plural returns "1 goroutine", "2 goroutines".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
