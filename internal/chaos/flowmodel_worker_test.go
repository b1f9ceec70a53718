package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
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
// Its notifications go to the model's receiver on this host's loopback.
func modelServerConfig(logger *slog.Logger, id string) tide.Config {
	cfg := serverConfigFor(modelQueues, modelConcurrency, modelLease, modelShutdown, logger, id)
	cfg.NotifyAllowPrivate = true
	return cfg
}

// serverConfigFor is the configuration of a model's server (the flow and
// the limit model): each queue at priority 1, quick retries.
func serverConfigFor(queues []string, concurrency int, lease, shutdown time.Duration, logger *slog.Logger, id string) tide.Config {
	qs := map[string]int{}
	for _, q := range queues {
		qs[q] = 1
	}
	return tide.Config{
		Concurrency:     concurrency,
		Queues:          qs,
		LeaseDuration:   lease,
		ShutdownTimeout: shutdown,
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
// model's queues (see runModelProcess).
func runModelWorker() int {
	return runModelProcess("fm", nil, func(b broker.Broker, rec recorder, id string, logger *slog.Logger) (tide.Config, tide.Handler) {
		return modelServerConfig(logger, id), &modelHandler{rec: rec, name: id}
	})
}
