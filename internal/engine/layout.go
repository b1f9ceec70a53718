package engine

import (
	"context"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
)

// layoutEvery is how often the layout watcher reads every queue's partition
// count again, so that a queue repartitioned by an operator gets its new
// partitions maintained.
const layoutEvery = 30 * time.Second

// layoutWatcher keeps one maintainer running for each partition of each
// served queue: it reads the queues' partition counts from the broker (again
// every layoutEvery, and at once when a maintainer reports a layout error)
// and starts or stops maintainers to match.
type layoutWatcher struct {
	cfg    Config
	queues []string
	wake   func()

	mu    sync.Mutex
	parts map[string][]*maintainer // by queue, by partition

	again chan string // a queue whose layout to read now
	done  chan struct{}
	g     sync.WaitGroup
}

func newLayoutWatcher(cfg Config, queues []string, wake func()) *layoutWatcher {
	return &layoutWatcher{
		cfg: cfg, queues: queues, wake: wake,
		parts: map[string][]*maintainer{},
		again: make(chan string, len(queues)+1),
		done:  make(chan struct{}),
	}
}

func (w *layoutWatcher) start() { w.g.Go(w.loop) }

// stop stops the watcher, then every maintainer (each gives up its claim).
func (w *layoutWatcher) stop() {
	close(w.done)
	w.g.Wait()
	w.mu.Lock()
	var all []*maintainer
	for _, ms := range w.parts {
		all = append(all, ms...)
	}
	w.parts = nil
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range all {
		wg.Go(m.stop)
	}
	wg.Wait()
}

// recheck asks for queue's layout to be read again now. It never blocks.
func (w *layoutWatcher) recheck(queue string) {
	select {
	case w.again <- queue:
	default:
	}
}

// hint passes a scheduled or released event to its partition's maintainer.
func (w *layoutWatcher) hint(ev broker.Event) {
	w.mu.Lock()
	ms := w.parts[ev.Queue]
	var m *maintainer
	if ev.Partition >= 0 && ev.Partition < len(ms) {
		m = ms[ev.Partition]
	}
	w.mu.Unlock()
	if m == nil {
		return
	}
	if ev.Kind == broker.EventReleased {
		m.hint(time.Time{}) // claim it now
		return
	}
	m.hint(ev.At)
}

// pokeAll makes every maintainer look now (events may have been missed).
func (w *layoutWatcher) pokeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ms := range w.parts {
		for _, m := range ms {
			m.hint(time.Time{})
		}
	}
}

func (w *layoutWatcher) loop() {
	todo := map[string]bool{}
	for _, q := range w.queues {
		todo[q] = true
	}
	bo := backoff{min: 100 * time.Millisecond, max: 5 * time.Second}
	every := time.NewTicker(layoutEvery)
	defer every.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		failed := false
		for q := range todo {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
			n, err := w.cfg.Broker.Partitions(ctx, q)
			cancel()
			if err != nil {
				failed = true
				if unavailable(err) {
					w.cfg.health.fail("layout", err, start)
				} else {
					// A misconfiguration (another partition count): say so
					// every time; nothing of the queue runs meanwhile.
					w.cfg.Logger.Error("tide: cannot serve queue", "queue", q, "err", err)
					w.resize(q, 0)
				}
				continue
			}
			w.cfg.health.ok()
			w.resize(q, n)
			delete(todo, q)
		}
		if failed {
			resetTimer(retry, bo.next())
		} else {
			bo.reset()
		}
		select {
		case <-w.done:
			return
		case q := <-w.again:
			todo[q] = true
		case <-every.C:
			for _, q := range w.queues {
				todo[q] = true
			}
		case <-retry.C:
		}
	}
}

// resize runs maintainers for partitions 0..n-1 of queue and stops the rest.
func (w *layoutWatcher) resize(queue string, n int) {
	w.mu.Lock()
	ms := w.parts[queue]
	var gone []*maintainer
	for len(ms) > n {
		gone = append(gone, ms[len(ms)-1])
		ms = ms[:len(ms)-1]
	}
	for p := len(ms); p < n; p++ {
		m := newMaintainer(w.cfg, queue, p, w.wake, w.recheck)
		m.start()
		ms = append(ms, m)
	}
	w.parts[queue] = ms
	w.mu.Unlock()
	for _, m := range gone {
		m.stop()
	}
	if len(gone) > 0 || n > 0 {
		w.wake()
	}
}
