// Package engine runs a server's services against a broker: the processor
// (fetch, workers, lease keeper, settlements), one maintainer per queue
// partition (forwarding due tasks, recovering expired leases, trimming), the
// layout watcher that starts and stops maintainers as partitions come and go,
// the notifier that turns broker events into wake-ups, the heartbeat that
// keeps the server's record in the registry, and the repairer that finishes
// the creation of workflows and batches whose creator died. Each service has the same
// shape: start launches its goroutines, stop returns when they have all
// exited.
//
// # Leases
//
// Every task a worker runs has a local deadline by which its lease may
// have ended on the broker: the time the lease was asked for (the Dequeue
// that handed it out, then each Extend that succeeded) plus nine tenths of
// the lease. The watchdog, one timer for all tasks set for the earliest
// deadline, cancels the handler's context with the cause
// broker.ErrLeaseLost at that deadline, whether or not a
// renewal call is still waiting for its answer; a successful renewal moves
// the deadline from the renewal's send time, so an answer that comes late
// moves it no further. The tenth held back covers clock rates that differ
// by up to 1% between this process and the broker and leaves the handler
// at least 9% of the lease to see the cancellation and return before the
// broker, on its own clock, can let the lease expire and hand the task to
// another worker. The broker's clock is assumed not to be stepped. A task
// stopped this way is not settled (its RunFunc reports nothing to write);
// its worker slot is free again only when the handler has returned, and the
// task is retried after lease recovery. A handler that ignores its context
// keeps running: the guarantee holds only for handlers that return once
// their context is done.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// RunFunc processes one delivery and returns its settlement, decided from
// the handler's error and the cause of the context's end; ok is false when
// nothing must be written (the lease was lost). It must not panic (the
// caller recovers) and must return once ctx is done.
type RunFunc func(ctx context.Context, d *broker.Delivery) (s broker.Settlement, ok bool)

// Config configures an Engine. Fields are named like tide.Config's; all are
// required unless noted.
type Config struct {
	Broker          broker.Broker
	Queues          map[string]int // queue name to weight (> 0)
	StrictPriority  bool
	Concurrency     int
	LeaseDuration   time.Duration
	ShutdownTimeout time.Duration // grace period for in-flight tasks
	ServerID        string        // unique server ID: the owner of partition claims
	Logger          *slog.Logger
	Run             RunFunc
	// Info describes the server in the broker's registry (when the broker
	// implements broker.Registry); ID and Active are filled in by the engine.
	Info tidetype.ServerInfo
	// Now is the clock due times are compared with: the broker's when it is
	// a broker.Clock. Default time.Now.
	Now func() time.Time
	// Repair, when not nil, is called every RepairEvery (jittered) to
	// finish the creation of workflows and batches whose creator died; it
	// returns how many it repaired. RepairEvery 0 means the default.
	Repair      func(ctx context.Context) (int, error)
	RepairEvery time.Duration

	health *health // shared by the services; set by New
}

// ErrShutdown is the cause of the context cancellation a handler sees when the
// server's shutdown grace period ran out; such tasks are requeued.
var ErrShutdown = errors.New("tide: server shutting down")

// Engine is a running set of services.
type Engine struct {
	cfg       Config
	proc      *processor
	notifier  *notifier
	layouts   *layoutWatcher
	heartbeat *heartbeat
	repairer  *repairer
}

// New builds an engine; Start runs it.
func New(cfg Config) *Engine {
	cfg.health = newHealth(cfg.Logger)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Engine{cfg: cfg}
	e.proc = newProcessor(cfg)
	names := make([]string, 0, len(cfg.Queues))
	for q := range cfg.Queues {
		names = append(names, q)
	}
	sort.Strings(names)
	e.layouts = newLayoutWatcher(cfg, names, e.proc.wake)
	e.heartbeat = newHeartbeat(cfg, e.proc.snapshot)
	e.repairer = newRepairer(cfg)
	e.notifier = newNotifier(cfg, names, e.proc.wake, e.proc.cancelTask, e.layouts.hint, e.layouts.recheck, e.layouts.pokeAll)
	return e
}

// Start launches every service.
func (e *Engine) Start() {
	e.layouts.start()
	e.notifier.start()
	e.proc.start()
	e.heartbeat.start()
	e.repairer.start()
}

// Stop stops fetching, lets in-flight tasks finish within the shutdown grace
// period, requeues the rest, writes every settlement, then stops the other
// services; maintainers give up their partition claims so that another
// server takes over at once. It returns when no goroutine of the engine is
// left.
func (e *Engine) Stop() {
	e.repairer.stop()
	e.proc.stop()
	e.heartbeat.stop()
	e.notifier.stop()
	e.layouts.stop()
}

// queueOrder returns the queues in the order to try them: by weight for strict
// priority, otherwise a weighted random permutation.
func queueOrder(qs []string, weights map[string]int, strict bool, r *rand.Rand) []string {
	out := make([]string, len(qs))
	copy(out, qs)
	if len(out) < 2 {
		return out
	}
	if strict {
		return out // pre-sorted by weight at construction
	}
	// Weighted sampling without replacement (Efraimidis–Spirakis keys).
	keys := make([]float64, len(out))
	for i, q := range out {
		u := r.Float64()
		for u == 0 {
			u = r.Float64()
		}
		keys[i] = -math.Log(u) / float64(weights[q])
	}
	sort.Sort(byKey{out, keys})
	return out
}

// byKey sorts queue names by their sampling keys.
type byKey struct {
	qs   []string
	keys []float64
}

func (b byKey) Len() int           { return len(b.qs) }
func (b byKey) Less(i, j int) bool { return b.keys[i] < b.keys[j] }
func (b byKey) Swap(i, j int) {
	b.qs[i], b.qs[j] = b.qs[j], b.qs[i]
	b.keys[i], b.keys[j] = b.keys[j], b.keys[i]
}

// backoff is a capped exponential back-off for retrying broker calls.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur *= 2
		if b.cur > b.max {
			b.cur = b.max
		}
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

func (b *backoff) reset() { b.cur = 0 }
