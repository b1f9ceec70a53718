// Package engine runs a server's services against a broker: the processor
// (fetch, workers, lease keeper, acknowledgements), one maintainer per queue
// partition (forwarding due tasks, recovering expired leases) and the notifier
// that turns broker events into wake-ups. Each service has the same shape:
// start launches its goroutines, stop returns when they have all exited.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
)

// RunFunc processes one delivery and reports its outcome. It must not panic
// (the caller recovers) and must return once ctx is done.
type RunFunc func(ctx context.Context, d *broker.Delivery) broker.Settlement

// Config configures an Engine. All fields are required unless noted.
type Config struct {
	Broker      broker.Broker
	Queues      map[string]int // queue name to weight (> 0)
	Strict      bool
	Concurrency int
	Lease       time.Duration
	Shutdown    time.Duration // grace period for in-flight tasks
	Owner       string        // unique server ID
	Logger      *slog.Logger
	Run         RunFunc
	// Info describes the server in the broker's server registry (when the
	// broker implements broker.Admin); Active is filled in by the engine.
	Info broker.ServerInfo
	// Now is the clock due times are compared with (the broker's clock when
	// it has one, e.g. a membroker with a fake clock). Default time.Now.
	Now func() time.Time

	health *health // shared by the services; set by New
}

// ErrCanceled is the cause of the context cancellation a handler sees when an
// operator cancelled its task; the task is archived with this error.
var ErrCanceled = errors.New("tide: task cancelled by an operator")

// ErrShutdown is the cause of the context cancellation a handler sees when the
// server's shutdown grace period ran out; such tasks are requeued.
var ErrShutdown = errors.New("tide: server shutting down")

// Engine is a running set of services.
type Engine struct {
	cfg        Config
	proc       *processor
	notifier   *notifier
	maintainer []*maintainer
	heartbeat  *heartbeat
	log        *slog.Logger
}

// New builds an engine; Start runs it.
func New(cfg Config) *Engine {
	cfg.health = newHealth(cfg.Logger)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Engine{cfg: cfg, log: cfg.Logger}
	e.proc = newProcessor(cfg)
	names := make([]string, 0, len(cfg.Queues))
	for q := range cfg.Queues {
		names = append(names, q)
	}
	sort.Strings(names)
	byQP := make(map[string][]*maintainer)
	for _, q := range names {
		for p := 0; p < cfg.Broker.Partitions(q); p++ {
			m := newMaintainer(cfg, q, p, e.proc.wake)
			e.maintainer = append(e.maintainer, m)
			byQP[q] = append(byQP[q], m)
		}
	}
	e.heartbeat = newHeartbeat(cfg, e.proc.snapshot)
	e.notifier = newNotifier(cfg, names, e.proc.wake, e.proc.cancelTask, func(ev broker.Event) {
		ms := byQP[ev.Queue]
		if ev.Partition >= 0 && ev.Partition < len(ms) {
			ms[ev.Partition].hint(ev.At)
		}
	}, func() {
		for _, m := range e.maintainer {
			m.hint(time.Time{})
		}
	})
	return e
}

// Start launches every service.
func (e *Engine) Start() {
	for _, m := range e.maintainer {
		m.start()
	}
	e.notifier.start()
	e.proc.start()
	e.heartbeat.start()
}

// Stop stops fetching, lets in-flight tasks finish within the shutdown grace
// period, requeues the rest, writes every outcome, then stops the other
// services. It returns when no goroutine of the engine is left.
func (e *Engine) Stop() {
	e.proc.stop()
	e.heartbeat.stop()
	e.notifier.stop()
	for _, m := range e.maintainer {
		m.stop()
	}
}

// Active returns the number of tasks being processed.
func (e *Engine) Active() int { return e.proc.activeCount() }

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

// sleep waits d or until done is closed; it reports false when done closed.
func sleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// group is a WaitGroup with a Go method.
type group struct{ wg sync.WaitGroup }

func (g *group) Go(f func()) { g.wg.Go(f) }
func (g *group) Wait()       { g.wg.Wait() }
