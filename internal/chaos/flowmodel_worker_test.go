package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// The flow model's worker processes (TestFlowModel) are the test binary
// re-executed like TestChaos's workers, with envModel set: they serve the
// model's queues with modelHandler, talking to Redis through the proxy, and
// log what their handlers do straight to Redis (envDirect), beside the
// proxy, so that the log itself suffers no fault.
const (
	envModel  = "TIDE_FLOWMODEL"        // set: run runModelWorker
	envDirect = "TIDE_FLOWMODEL_DIRECT" // Redis's own address, for the log
)

// The model's servers, the same in processes and in process.
const (
	modelConcurrency = 8
	modelLease       = 2 * time.Second
	// modelShutdown is short, so that a rolling restart interrupts the slow
	// tasks it finds running: they go back to their queues (not an end).
	modelShutdown = 300 * time.Millisecond
	// lateWait bounds how long a handler that started after its workflow's
	// CancelWorkflow returned waits for its cancellation to reach it: at
	// once by notice, at the next lease renewal (a third of the lease) when
	// the notice is lost.
	lateWait = 3 * modelLease
)

var modelQueues = []string{"fm-a", "fm-b", "fm-c"}

// modelServerConfig is the configuration of every server of the model.
func modelServerConfig(logger *slog.Logger, id string) tide.Config {
	qs := map[string]int{}
	for _, q := range modelQueues {
		qs[q] = 1
	}
	return tide.Config{
		Concurrency:     modelConcurrency,
		Queues:          qs,
		LeaseDuration:   modelLease,
		ShutdownTimeout: modelShutdown,
		RetryDelayFunc:  tide.RetrySchedule(50*time.Millisecond, 100*time.Millisecond, 200*time.Millisecond),
		Logger:          logger,
		ServerID:        id,
	}
}

// A plan is what a model task's handler does, carried as its payload:
// "ok" succeeds, "skip" fails with SkipRetry, "retry:N" fails while fewer
// than N attempts were made (GetRetryCount, so recovered attempts count)
// and then succeeds, "slow:MS" succeeds after MS milliseconds unless its
// context ends first.
type plan struct {
	kind string // ok, skip, retry, slow
	n    int    // retry: failures; slow: milliseconds
}

func (p plan) String() string {
	switch p.kind {
	case "retry", "slow":
		return p.kind + ":" + strconv.Itoa(p.n)
	}
	return p.kind
}

// succeeds reports whether a run of the plan left alone ends in success.
func (p plan) succeeds() bool { return p.kind != "skip" }

func parsePlan(b []byte) (plan, error) {
	kind, n, _ := strings.Cut(string(b), ":")
	p := plan{kind: kind}
	switch kind {
	case "ok", "skip":
		return p, nil
	case "retry", "slow":
		v, err := strconv.Atoi(n)
		if err != nil || v < 0 {
			return p, fmt.Errorf("bad plan %q", b)
		}
		p.n = v
		return p, nil
	}
	return p, fmt.Errorf("bad plan %q", b)
}

// skipMsg is the reason of a planned failure with SkipRetry.
const skipMsg = "fm: planned skip"

// recorder is the model's log: one total order of events (a sequence
// number each), shared by the test and every server, which outlives any of
// them. In Redis it is a list appended to by one Lua script (the order is
// Redis's); in process a slice under a mutex.
type recorder interface {
	// add appends line and returns its sequence number. When look is not
	// "", it also reports whether flow look's cancel marker (mark) was set
	// before this line.
	add(ctx context.Context, line, look string) (seq int64, marked bool, err error)
	// mark appends line and sets flow's cancel marker (once): what comes
	// later in the log came after that CancelWorkflow returned.
	mark(ctx context.Context, line, flow string) (int64, error)
	// lines returns the whole log in order, each line with its sequence
	// number.
	lines(ctx context.Context) ([]modelLine, error)
}

// modelLine is one line of the model's log.
type modelLine struct {
	seq  int64
	text string
}

// recordScript appends to the model's log in Redis.
//
//	KEYS[1] sequence  KEYS[2] log list  KEYS[3] cancel markers (hash: flow -> seq)
//	ARGV[1] line  ARGV[2] flow whose marker to look up ('')  ARGV[3] flow to mark ('')
//	returns {seq, 1 when ARGV[2]'s marker was set, else 0}
var recordScript = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[2], n .. ' ' .. t[1] .. '.' .. string.format('%06d', t[2]) .. ' ' .. ARGV[1])
if ARGV[3] ~= '' then redis.call('HSETNX', KEYS[3], ARGV[3], n) end
local late = 0
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then late = 1 end
return {n, late}
`)

type redisRecorder struct {
	rdb  *redis.Client
	keys []string
}

func newRedisRecorder(rdb *redis.Client, prefix string) *redisRecorder {
	return &redisRecorder{rdb: rdb, keys: []string{prefix + ":fm:seq", prefix + ":fm:log", prefix + ":fm:cx"}}
}

func (r *redisRecorder) run(ctx context.Context, line, look, mark string) (int64, bool, error) {
	if strings.ContainsAny(line, "\n") {
		return 0, false, fmt.Errorf("log line with a newline: %q", line)
	}
	v, err := recordScript.Run(ctx, r.rdb, r.keys, line, look, mark).Int64Slice()
	if err != nil {
		return 0, false, err
	}
	return v[0], v[1] == 1, nil
}

func (r *redisRecorder) add(ctx context.Context, line, look string) (int64, bool, error) {
	return r.run(ctx, line, look, "")
}

func (r *redisRecorder) mark(ctx context.Context, line, flow string) (int64, error) {
	n, _, err := r.run(ctx, line, "", flow)
	return n, err
}

func (r *redisRecorder) lines(ctx context.Context) ([]modelLine, error) {
	raw, err := r.rdb.LRange(ctx, r.keys[1], 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]modelLine, 0, len(raw))
	for _, s := range raw {
		seq, rest, ok := strings.Cut(s, " ")
		n, err := strconv.ParseInt(seq, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("bad log line %q", s)
		}
		_, text, _ := strings.Cut(rest, " ") // drop Redis's time
		out = append(out, modelLine{seq: n, text: text})
	}
	return out, nil
}

// memRecorder is the in-process log of the membroker model.
type memRecorder struct {
	mu      sync.Mutex
	log     []modelLine
	markers map[string]int64
}

func (r *memRecorder) add(_ context.Context, line, look string) (int64, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := int64(len(r.log) + 1)
	r.log = append(r.log, modelLine{seq: n, text: line})
	_, marked := r.markers[look]
	return n, look != "" && marked, nil
}

func (r *memRecorder) mark(_ context.Context, line, flow string) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := int64(len(r.log) + 1)
	r.log = append(r.log, modelLine{seq: n, text: line})
	if r.markers == nil {
		r.markers = map[string]int64{}
	}
	if _, ok := r.markers[flow]; !ok {
		r.markers[flow] = n
	}
	return n, nil
}

func (r *memRecorder) lines(context.Context) ([]modelLine, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]modelLine(nil), r.log...), nil
}

// modelHandler runs the model's tasks. Each attempt has a token
// "<server>.<incarnation>.<n>" and logs:
//
//	S <task ID> <token> <flow>        when the handler starts
//	L <task ID> <token> <what>        for a start after the flow's cancel
//	                                  marker: "stopped <cause>" when the
//	                                  context ended (the handler returns at
//	                                  once), "ran" when it did not within
//	                                  lateWait (the plan then runs)
//	E <task ID> <token> <how> [cause] when the plan is done: ok, fail (a
//	                                  planned failure to retry), skip, or
//	                                  ctx and the context's cause
type modelHandler struct {
	rec  recorder
	name string // "<server>.<incarnation>"
	n    atomic.Int64
}

func (h *modelHandler) ProcessTask(ctx context.Context, t *tide.Task) error {
	id, _ := tide.GetTaskID(ctx)
	flow, _ := tide.GetWorkflowID(ctx)
	if flow == "" {
		flow = "-"
	}
	token := h.name + "." + strconv.FormatInt(h.n.Add(1), 10)
	_, late, err := h.rec.add(ctx, fmt.Sprintf("S %s %s %s", id, token, flow), flow)
	if err != nil {
		return fmt.Errorf("fm: logging the start: %w", err)
	}
	logEnd := func(what string) error {
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _, err := h.rec.add(c, fmt.Sprintf("%s %s %s %s", what[:1], id, token, what[2:]), "")
		return err
	}
	if late {
		// The workflow's CancelWorkflow returned before this start: only a
		// delivery leased before the cancel may get here, and its
		// cancellation must reach it.
		timer := time.NewTimer(lateWait)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			cause := context.Cause(ctx)
			if err := logEnd("L stopped " + causeName(cause)); err != nil {
				return err
			}
			return cause
		case <-timer.C:
			if err := logEnd("L ran"); err != nil {
				return err
			}
		}
	}
	p, err := parsePlan(t.Payload())
	if err != nil {
		return fmt.Errorf("fm: %w: %w", err, tide.SkipRetry)
	}
	switch p.kind {
	case "skip":
		if err := logEnd("E skip"); err != nil {
			return err
		}
		return fmt.Errorf("%s: %w", skipMsg, tide.SkipRetry)
	case "retry":
		if n, _ := tide.GetRetryCount(ctx); n < p.n {
			if err := logEnd("E fail"); err != nil {
				return err
			}
			return fmt.Errorf("fm: planned failure %d of %d", n+1, p.n)
		}
	case "slow":
		timer := time.NewTimer(time.Duration(p.n) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			cause := context.Cause(ctx)
			if err := logEnd("E ctx " + causeName(cause)); err != nil {
				return err
			}
			return cause
		case <-timer.C:
		}
	}
	if err := ctx.Err(); err != nil {
		// Cancelled while it ran: a handler that honours its context does
		// not claim success then.
		cause := context.Cause(ctx)
		if err := logEnd("E ctx " + causeName(cause)); err != nil {
			return err
		}
		return cause
	}
	if err := logEnd("E ok"); err != nil {
		return err
	}
	return nil
}

// causeName names a handler context's cause in the log.
func causeName(err error) string {
	switch {
	case errors.Is(err, tide.ErrTaskCanceled):
		return "canceled"
	case errors.Is(err, tide.ErrLeaseLost):
		return "leaselost"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "other"
}

// runModelWorker is a worker process of TestFlowModel: a server of the
// model's queues through the proxy (envAddr) until SIGTERM, then a graceful
// shutdown and the same goroutine-leak check as runWorker.
func runModelWorker() int {
	baseline := goleak.IgnoreCurrent()
	name, addr, direct, prefix, dir := os.Getenv(workerEnv), os.Getenv(envAddr), os.Getenv(envDirect), os.Getenv(envPrefix), os.Getenv(envDir)
	inc, _ := strconv.Atoi(os.Getenv(envIncarnat))
	lf, err := os.OpenFile(logFile(dir, name, inc), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	defer lf.Close()
	logRDB := redis.NewClient(&redis.Options{Addr: direct})
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: workerReadTimeout})
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix))
	h := &modelHandler{rec: newRedisRecorder(logRDB, prefix), name: fmt.Sprintf("%s.%d", name, inc)}
	srv := tide.NewServer(b, modelServerConfig(slog.New(slog.NewJSONHandler(lf, nil)), h.name))
	if err := srv.Run(h); err != nil { // returns after SIGTERM and Shutdown
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	_ = b.Close()
	_ = rdb.Close()
	_ = logRDB.Close()
	leak := goleak.Find(baseline)
	report := "clean"
	if leak != nil {
		report = fmt.Sprintf("goroutines left after Shutdown (%d running):\n%v", runtime.NumGoroutine(), leak)
	}
	_ = os.WriteFile(exitFile(dir, name, inc), []byte(report), 0o644)
	if leak != nil {
		return exitLeak
	}
	return exitClean
}
