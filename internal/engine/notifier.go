package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
)

// notifier subscribes to the broker's events and turns them into wake-ups:
// pending work wakes the processor, an earlier due time re-arms a
// maintainer's timer, pending work held back by a queue's rate limit wakes
// the processor when room opens, a released claim makes a maintainer claim it, a
// cancellation cancels a running handler. Events are hints; when the subscription breaks it
// re-subscribes with back-off and pokes everyone once, since events may have
// been missed.
type notifier struct {
	cfg       Config
	log       *slog.Logger
	queues    []string
	wake      func()
	cancel    func(queue, id string)
	partition func(broker.Event) // scheduled and released events
	relayout  func(queue string)
	pokeAll   func()

	ctx       context.Context
	cancelCtx context.CancelFunc
	g         sync.WaitGroup

	mu     sync.Mutex
	timers map[*time.Timer]struct{} // wake-ups armed by wakeAt
}

func newNotifier(cfg Config, queues []string, wake func(), cancelTask func(queue, id string), partition func(broker.Event), relayout func(string), pokeAll func()) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	return &notifier{cfg: cfg, log: cfg.Logger, queues: queues, wake: wake, cancel: cancelTask, partition: partition, relayout: relayout, pokeAll: pokeAll, ctx: ctx, cancelCtx: cancel}
}

func (n *notifier) start() { n.g.Go(n.loop) }

func (n *notifier) stop() {
	n.cancelCtx()
	n.g.Wait()
	n.mu.Lock()
	defer n.mu.Unlock()
	for t := range n.timers {
		t.Stop()
	}
	n.timers = nil
}

// rateWakeSlack is added to an announced instant so that a local estimate
// of the broker's clock that runs a little ahead does not wake the processor
// before room opens (the broker announces an instant once; a processor that
// looked too early would wait for the partition's maintenance instead).
const rateWakeSlack = 10 * time.Millisecond

// wakeAt wakes the processor at at, on the broker's clock: pending work that
// a rate limit holds back may start then. Each announced instant gets its
// own timer; the broker announces an instant once, so none may be dropped
// for an earlier one.
func (n *notifier) wakeAt(at time.Time) {
	d := at.Sub(n.cfg.Now()) + rateWakeSlack
	if d <= 0 {
		n.wake()
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx.Err() != nil {
		return
	}
	if n.timers == nil {
		n.timers = map[*time.Timer]struct{}{}
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		n.mu.Lock()
		delete(n.timers, t)
		n.mu.Unlock()
		n.wake()
	})
	n.timers[t] = struct{}{}
}

func (n *notifier) loop() {
	bo := backoff{min: 100 * time.Millisecond, max: 5 * time.Second}
	first := true
	for n.ctx.Err() == nil {
		began := time.Now()
		ch, err := n.cfg.Broker.Subscribe(n.ctx, n.queues)
		if err != nil {
			if n.ctx.Err() != nil {
				return
			}
			n.cfg.health.fail("event subscription", err, began)
			if !n.pause(bo.next()) {
				return
			}
			continue
		}
		// Events sent before the subscription was made are lost: look now.
		// Also at the first: the processor's first lease call may have
		// been made before the subscription, and a task enqueued between
		// the two is announced to no one.
		n.wake()
		if !first {
			// Maintainers look again too (they are new at the first).
			n.pokeAll()
		}
		first = false
		start := time.Now()
		for ev := range ch {
			switch ev.Kind {
			case broker.EventPending:
				if ev.At.IsZero() {
					n.wake()
				} else {
					n.wakeAt(ev.At)
				}
			case broker.EventScheduled, broker.EventReleased:
				n.partition(ev)
			case broker.EventCancel:
				n.cancel(ev.Queue, ev.ID)
			case broker.EventLayout:
				n.relayout(ev.Queue)
			}
		}
		if time.Since(start) > time.Minute {
			bo.reset()
		}
		if n.ctx.Err() == nil && !n.pause(bo.next()) {
			return
		}
	}
}

// pause waits d, or less when another loop sees the broker come back; it
// reports false when the notifier is stopping.
func (n *notifier) pause(d time.Duration) bool { return n.cfg.health.wait(n.ctx.Done(), d) }
