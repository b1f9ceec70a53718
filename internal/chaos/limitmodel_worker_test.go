package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// The limit model's servers, the same in processes and in process.
const (
	limitConcurrency = 6
	limitLease       = 2 * time.Second
	// limitShutdown is short, so that a graceful restart interrupts the
	// long tasks it finds running: they go back to their queues.
	limitShutdown   = 300 * time.Millisecond
	limitPartitions = 2 // the queues' partitions on Redis before a Repartition
)

var limitQueues = []string{"lm-a", "lm-b", "lm-o"}

// limitOrdered is the model's Ordered queue: its groups are sequences, its
// tasks are never delayed (a scheduled task is not ready, so it would not
// hold its place), and its limits keep Ordered when they change.
const limitOrdered = "lm-o"

// limitServerConfig is the configuration of every server of the limit
// model.
func limitServerConfig(logger *slog.Logger, id string) tide.Config {
	return serverConfigFor(limitQueues, limitConcurrency, limitLease, limitShutdown, logger, id)
}

// An lmPlan is what a limit model task's handler does, carried in its
// payload as "<plan>|<version>" (the version tells Replace's payloads
// apart):
//
//	ok:MS      succeeds after MS milliseconds (unless its context ends)
//	fail:N:MS  fails after MS milliseconds while fewer than N attempts were
//	           made (GetRetryCount), then succeeds
//	skip       fails with SkipRetry: archived
//	ra:MS      the first attempt returns RetryAfter(MS ms), the next
//	           succeeds after 30 ms
//	thr:MS     the first attempt returns ThrottleGroup(MS ms), the next
//	           succeeds after 30 ms
type lmPlan struct {
	kind string
	n    int // fail: failures
	ms   int
}

func (p lmPlan) String() string {
	switch p.kind {
	case "skip":
		return "skip"
	case "fail":
		return fmt.Sprintf("fail:%d:%d", p.n, p.ms)
	}
	return fmt.Sprintf("%s:%d", p.kind, p.ms)
}

// final is how the plan's last run ends when nothing stops it: "ok" or
// "skip".
func (p lmPlan) final() string {
	if p.kind == "skip" {
		return "skip"
	}
	return "ok"
}

func parseLmPlan(s string) (lmPlan, error) {
	f := strings.Split(s, ":")
	p := lmPlan{kind: f[0]}
	var err error
	switch {
	case p.kind == "skip" && len(f) == 1:
		return p, nil
	case p.kind == "fail" && len(f) == 3:
		if p.n, err = strconv.Atoi(f[1]); err == nil {
			p.ms, err = strconv.Atoi(f[2])
		}
	case (p.kind == "ok" || p.kind == "ra" || p.kind == "thr") && len(f) == 2:
		p.ms, err = strconv.Atoi(f[1])
	default:
		err = fmt.Errorf("bad plan %q", s)
	}
	return p, err
}

// limitHandler runs the limit model's tasks. Each attempt has a token
// "<server>.<incarnation>.<n>" and logs, on the log's one clock:
//
//	S <queue> <group|-> <task ID> <version> <token>   when it starts
//	E <task ID> <version> <token> <how>               when it ends
//
// how is ok, fail, skip, ra:MS or thr:MS (deferred by RetryAfter or
// ThrottleGroup for MS ms), or ctx:<cause> when its context ended first
// (the handler then returns at once). A run records its end before it
// returns, so [start, end] lies within the time its slot was taken.
type limitHandler struct {
	rec  recorder
	name string // "<server>.<incarnation>"
	n    atomic.Int64
}

func (h *limitHandler) ProcessTask(ctx context.Context, t *tide.Task) error {
	id, _ := tide.GetTaskID(ctx)
	q, _ := tide.GetQueueName(ctx)
	g, _ := tide.GetGroup(ctx)
	if g == "" {
		g = "-"
	}
	ps, ver, _ := strings.Cut(string(t.Payload()), "|")
	p, err := parseLmPlan(ps)
	if err != nil {
		return fmt.Errorf("lm: %w: %w", err, tide.SkipRetry)
	}
	token := h.name + "." + strconv.FormatInt(h.n.Add(1), 10)
	once := "" // marker of a deferring plan's first attempt
	if p.kind == "ra" || p.kind == "thr" {
		once = "once " + q + " " + id + " " + ver
	}
	_, deferred, err := h.rec.add(ctx, fmt.Sprintf("S %s %s %s %s %s", q, g, id, ver, token), once)
	if err != nil {
		return fmt.Errorf("lm: logging the start: %w", err)
	}
	end := func(how, mark string) error {
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		line := fmt.Sprintf("E %s %s %s %s", id, ver, token, how)
		if mark != "" {
			_, err := h.rec.mark(c, line, mark)
			return err
		}
		_, _, err := h.rec.add(c, line, "")
		return err
	}
	work := func(ms int) error { // the plan's work, which honours ctx
		timer := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			cause := context.Cause(ctx)
			if err := end("ctx:"+causeName(cause), ""); err != nil {
				return err
			}
			return cause
		case <-timer.C:
			return nil
		}
	}
	switch p.kind {
	case "skip":
		if err := end("skip", ""); err != nil {
			return err
		}
		return fmt.Errorf("lm: planned skip: %w", tide.SkipRetry)
	case "ra", "thr":
		if !deferred {
			if err := end(fmt.Sprintf("%s:%d", p.kind, p.ms), once); err != nil {
				return err
			}
			if p.kind == "thr" {
				return tide.ThrottleGroup(time.Duration(p.ms) * time.Millisecond)
			}
			return tide.RetryAfter(time.Duration(p.ms) * time.Millisecond)
		}
		p.ms = 30
	case "fail":
		if n, _ := tide.GetRetryCount(ctx); n < p.n {
			if err := work(p.ms); err != nil {
				return err
			}
			if err := end("fail", ""); err != nil {
				return err
			}
			return fmt.Errorf("lm: planned failure %d of %d", n+1, p.n)
		}
	}
	if err := work(p.ms); err != nil {
		return err
	}
	return end("ok", "")
}

// runLimitWorker is a worker process of TestLimitModel: a server of the
// limit model's queues (see runModelProcess).
func runLimitWorker() int {
	opts := []redisbroker.Option{redisbroker.WithPartitions(limitPartitions)}
	return runModelProcess("lm", opts, func(_ broker.Broker, rec recorder, id string, logger *slog.Logger) (tide.Config, tide.Handler) {
		return limitServerConfig(logger, id), &limitHandler{rec: rec, name: id}
	})
}
