// Package tidetest helps users test their task handlers: a Harness runs a
// real tide.Server over an in-memory broker (broker/membroker) whose clock
// the test controls, so "advance 15 minutes, the cancel ran" is one line and
// takes no real time:
//
//	h := tidetest.New(t, mux)
//	h.Enqueue(cancelTask, tide.ProcessIn(15*time.Minute))
//	h.Advance(14 * time.Minute) // not yet
//	h.Advance(time.Minute)      // now the handler has run
//
// Everything a server does happens for real (routing, middleware, retries
// with their delays measured on the fake clock, archiving, unique locks), so
// a handler tested here behaves the same on Redis. The helpers fail the test
// with a clear message rather than returning errors.
package tidetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
)

// Clock is a fake clock. It only moves when told to. It is safe for
// concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d. It panics for a negative d.
func (c *Clock) Advance(d time.Duration) {
	if d < 0 {
		panic("tidetest: Clock.Advance with a negative duration")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Options configure a Harness. The zero value serves the queue "default"
// with one worker, starting the clock at 2026-01-01 00:00 UTC.
type Options struct {
	// Queues to serve, as in tide.Config. Default {"default": 1}.
	Queues map[string]int
	// Concurrency of the server. Default 1, which makes the order in which
	// tasks run deterministic.
	Concurrency int
	// Start is the clock's initial time.
	Start time.Time
	// RetryDelayFunc as in tide.Config; default tide.DefaultRetryDelay.
	RetryDelayFunc tide.RetryDelayFunc
	// Logger for the server; default discards.
	Logger *slog.Logger
}

// Harness is a server, a client and an in-memory broker sharing a fake
// clock. Its methods must be called from the test's goroutine.
type Harness struct {
	t         testing.TB
	Clock     *Clock
	Broker    *membroker.Broker
	Client    *tide.Client
	Inspector *tide.Inspector
	queues    []string
}

// settleTimeout bounds how long Settle waits for the server to go idle.
const settleTimeout = 10 * time.Second

// owner is the server ID the harness runs under; it maintains queues as the
// same owner, so its calls and the server's never contend.
const owner = "tidetest"

// New starts a Harness running h. It is shut down when the test ends.
func New(t testing.TB, h tide.Handler, opts ...Options) *Harness {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Start.IsZero() {
		o.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if len(o.Queues) == 0 {
		o.Queues = map[string]int{tide.DefaultQueue: 1}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	clock := NewClock(o.Start)
	b := membroker.New(membroker.WithClock(clock))
	hs := &Harness{t: t, Clock: clock, Broker: b, Client: tide.NewClient(b), Inspector: tide.NewInspector(b)}
	for q := range o.Queues {
		hs.queues = append(hs.queues, q)
	}
	sort.Strings(hs.queues)
	srv := tide.NewServer(b, tide.Config{
		Concurrency: o.Concurrency, Queues: o.Queues, RetryDelayFunc: o.RetryDelayFunc,
		Logger: o.Logger, ServerID: owner, ShutdownTimeout: time.Second,
	})
	if err := srv.Start(h); err != nil {
		t.Fatalf("tidetest: start server: %v", err)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		_ = b.Close()
	})
	return hs
}

// Enqueue enqueues task with opts and returns its info; it fails the test on
// error. Tasks due now run at the next Settle or Advance.
func (h *Harness) Enqueue(task *tide.Task, opts ...tide.Option) *tide.TaskInfo {
	h.t.Helper()
	info, err := h.Client.Enqueue(context.Background(), task, opts...)
	if err != nil {
		h.t.Fatalf("tidetest: enqueue %s: %v", task.Type(), err)
	}
	return info
}

// Advance moves the clock by d, then runs everything that has become due
// (see Settle).
func (h *Harness) Advance(d time.Duration) {
	h.t.Helper()
	h.Clock.Advance(d)
	h.Settle()
}

// Settle makes every due task run and waits until the served queues have
// nothing pending or active. Retries whose delay has not elapsed on the fake
// clock stay waiting; Advance past them to run them.
func (h *Harness) Settle() {
	h.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(settleTimeout)
	idleRounds := 0
	for idleRounds < 2 {
		if time.Now().After(deadline) {
			h.t.Fatalf("tidetest: tasks still pending or active after %v of real time: a handler is blocked or ignores its context", settleTimeout)
		}
		busy := false
		for _, q := range h.queues {
			if _, err := h.Broker.Maintain(ctx, broker.MaintainRequest{
				Queue: q, Owner: owner, OwnerTTL: time.Hour,
			}); err != nil {
				h.t.Fatalf("tidetest: maintain %s: %v", q, err)
			}
			qi, err := h.Inspector.QueueInfo(ctx, q)
			if err != nil {
				h.t.Fatalf("tidetest: queue %s: %v", q, err)
			}
			if qi.Pending > 0 || qi.Active > 0 {
				busy = true
			}
		}
		if busy {
			idleRounds = 0
			time.Sleep(time.Millisecond)
			continue
		}
		idleRounds++
	}
}

// Tasks returns the tasks of queue in state (at most 1000).
func (h *Harness) Tasks(queue string, state tide.TaskState) []*tide.TaskInfo {
	h.t.Helper()
	ts, err := h.Inspector.ListTasks(context.Background(), queue, state, 1, tide.MaxPageSize)
	if err != nil {
		h.t.Fatalf("tidetest: list %s tasks of %s: %v", state, queue, err)
	}
	return ts
}

// waiting are the states of a task that has been enqueued and not run yet.
var waiting = []tide.TaskState{tide.StatePending, tide.StateScheduled, tide.StateRetry}

// Enqueued returns the tasks of type typ waiting (pending, scheduled or
// retry) in any queue the harness has seen.
func (h *Harness) Enqueued(typ string) []*tide.TaskInfo {
	h.t.Helper()
	qs, err := h.Inspector.Queues(context.Background())
	if err != nil {
		h.t.Fatalf("tidetest: queues: %v", err)
	}
	var out []*tide.TaskInfo
	for _, q := range qs {
		for _, st := range waiting {
			for _, ti := range h.Tasks(q, st) {
				if ti.Type == typ {
					out = append(out, ti)
				}
			}
		}
	}
	return out
}

// AssertEnqueued fails the test unless a task of want's type whose JSON
// payload decodes to a value equal to want is waiting (pending, scheduled or
// retry) in some queue. It returns that task.
func AssertEnqueued[T tide.TaskArgs](t testing.TB, h *Harness, want T) *tide.TaskInfo {
	t.Helper()
	typ := want.TaskType()
	cands := h.Enqueued(typ)
	var seen []string
	for _, ti := range cands {
		var got T
		if err := json.Unmarshal(ti.Payload, &got); err != nil {
			seen = append(seen, fmt.Sprintf("%s (undecodable: %v)", ti.ID, err))
			continue
		}
		if reflect.DeepEqual(got, want) {
			return ti
		}
		seen = append(seen, fmt.Sprintf("%s %+v", ti.ID, got))
	}
	if len(seen) == 0 {
		t.Fatalf("tidetest: no %s task is enqueued; want %+v", typ, want)
	}
	t.Fatalf("tidetest: no %s task with args %+v; enqueued:\n  %s", typ, want, joinLines(seen))
	return nil
}

// AssertNotEnqueued fails the test if a task of type typ is waiting.
func AssertNotEnqueued(t testing.TB, h *Harness, typ string) {
	t.Helper()
	if ts := h.Enqueued(typ); len(ts) > 0 {
		ids := make([]string, len(ts))
		for i, ti := range ts {
			ids[i] = ti.ID + " (" + ti.State.String() + ")"
		}
		t.Fatalf("tidetest: %d %s task(s) enqueued, want none: %s", len(ts), typ, joinLines(ids))
	}
}

func joinLines(ss []string) string { return strings.Join(ss, "\n  ") }
