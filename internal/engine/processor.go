package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
)

// maxFetch caps how many tasks one Dequeue call asks for.
const maxFetch = 100

// maxAckBatch caps how many settlements one Settle call carries.
const maxAckBatch = 128

// brokerCallTimeout bounds a single broker call made by a background loop.
const brokerCallTimeout = 10 * time.Second

// processor fetches tasks into free worker slots, runs them, keeps their
// leases alive and writes their outcomes in batches.
type processor struct {
	cfg    Config
	log    *slog.Logger
	queues []string

	slots chan struct{} // one token per free worker slot
	wakeC chan struct{} // work may have arrived

	fetchStop chan struct{} // closed: stop fetching
	hardCtx   context.Context
	hardStop  context.CancelCauseFunc // cancels every handler with ErrShutdown

	acks      chan broker.Settlement
	ackStop   chan struct{} // closed: flush and exit
	ackDone   chan struct{} // closed when the acker exited
	keeperEnd chan struct{}

	mu     sync.Mutex
	active map[broker.LeaseRef]*inflight

	fetcher, workers, background group
	stopOnce                     sync.Once
}

type inflight struct {
	cancel   context.CancelCauseFunc
	extended time.Time // last time the lease was known good
	typ      string
	started  time.Time
}

func newProcessor(cfg Config) *processor {
	qs := make([]string, 0, len(cfg.Queues))
	for q := range cfg.Queues {
		qs = append(qs, q)
	}
	sort.Slice(qs, func(i, j int) bool {
		wi, wj := cfg.Queues[qs[i]], cfg.Queues[qs[j]]
		if wi != wj {
			return wi > wj
		}
		return qs[i] < qs[j]
	})
	hard, cancel := context.WithCancelCause(context.Background())
	p := &processor{
		cfg:       cfg,
		log:       cfg.Logger,
		queues:    qs,
		slots:     make(chan struct{}, cfg.Concurrency),
		wakeC:     make(chan struct{}, 1),
		fetchStop: make(chan struct{}),
		hardCtx:   hard,
		hardStop:  cancel,
		acks:      make(chan broker.Settlement, cfg.Concurrency*2),
		ackStop:   make(chan struct{}),
		ackDone:   make(chan struct{}),
		keeperEnd: make(chan struct{}),
		active:    make(map[broker.LeaseRef]*inflight),
	}
	for range cfg.Concurrency {
		p.slots <- struct{}{}
	}
	return p
}

// wake tells the fetcher that work may be waiting. It never blocks.
func (p *processor) wake() {
	select {
	case p.wakeC <- struct{}{}:
	default:
	}
}

func (p *processor) start() {
	p.fetcher.Go(p.fetchLoop)
	p.background.Go(p.ackLoop)
	p.background.Go(p.keepLoop)
}

// cancelTask cancels the handler running queue/id, if this server runs it.
func (p *processor) cancelTask(queue, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ref, f := range p.active {
		if ref.Queue == queue && ref.ID == id {
			f.cancel(ErrCanceled)
		}
	}
}

// snapshot lists the tasks being processed.
func (p *processor) snapshot() []broker.ActiveTask {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]broker.ActiveTask, 0, len(p.active))
	for ref, f := range p.active {
		out = append(out, broker.ActiveTask{Queue: ref.Queue, ID: ref.ID, Type: f.typ, StartedAt: f.started})
	}
	return out
}

func (p *processor) activeCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.active)
}

// stop implements the shutdown sequence described on Engine.Stop.
func (p *processor) stop() {
	p.stopOnce.Do(func() {
		close(p.fetchStop)
		p.fetcher.Wait()

		done := make(chan struct{})
		go func() { p.workers.Wait(); close(done) }()
		grace := time.NewTimer(p.cfg.Shutdown)
		select {
		case <-done:
		case <-grace.C:
			n := p.activeCount()
			p.log.Warn("tide: shutdown timeout reached; cancelling in-flight tasks, they will be requeued", "tasks", n, "timeout", p.cfg.Shutdown)
			p.hardStop(ErrShutdown)
			// Handlers must return once their context is done; give them a
			// moment to do so before leaving them to lease recovery.
			extra := time.NewTimer(max(p.cfg.Lease/2, time.Second))
			select {
			case <-done:
			case <-extra.C:
				p.log.Error("tide: handlers ignored cancellation; their tasks return through lease recovery", "tasks", p.activeCount())
			}
			extra.Stop()
		}
		grace.Stop()
		p.hardStop(ErrShutdown)
		close(p.ackStop)
		close(p.keeperEnd)
		p.background.Wait()
	})
}

func (p *processor) fetchLoop() {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	bo := backoff{min: 50 * time.Millisecond, max: 5 * time.Second}
	for {
		select {
		case <-p.fetchStop:
			return
		case <-p.slots:
		}
		n := 1
	more:
		for n < cap(p.slots) && n < maxFetch {
			select {
			case <-p.slots:
				n++
			default:
				break more
			}
		}
		order := queueOrder(p.queues, p.cfg.Queues, p.cfg.Strict, r)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
		ds, err := p.cfg.Broker.Dequeue(ctx, order, n, p.cfg.Lease)
		cancel()
		for range n - len(ds) {
			p.slots <- struct{}{}
		}
		// Deliveries come with their leases even when a later part of the
		// call failed (another partition, another node): run them, or their
		// slots and tasks would be stranded until lease recovery.
		now := time.Now()
		for _, d := range ds {
			ref := broker.LeaseRef{Queue: d.Message.Queue, ID: d.Message.ID, Token: d.Token}
			ctx, cancel := context.WithCancelCause(p.hardCtx)
			p.mu.Lock()
			p.active[ref] = &inflight{cancel: cancel, extended: now, typ: d.Message.Type, started: now}
			p.mu.Unlock()
			p.workers.Go(func() { p.work(ctx, cancel, ref, d) })
		}
		if err != nil {
			p.cfg.health.fail("dequeue", err, start)
			if !p.pause(bo.next()) {
				return
			}
			continue
		}
		p.cfg.health.ok()
		bo.reset()
		if len(ds) == 0 {
			select {
			case <-p.fetchStop:
				return
			case <-p.wakeC:
			}
		}
	}
}

// pause waits d after a failed dequeue, or less when another loop sees the
// broker come back; it reports false when fetching stops.
func (p *processor) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.fetchStop:
		return false
	case <-p.cfg.health.recovered():
		return true
	case <-t.C:
		return true
	}
}

func (p *processor) work(ctx context.Context, cancel context.CancelCauseFunc, ref broker.LeaseRef, d *broker.Delivery) {
	defer func() { p.slots <- struct{}{} }()
	s := p.cfg.Run(ctx, d)
	p.mu.Lock()
	delete(p.active, ref)
	p.mu.Unlock()
	cause := context.Cause(ctx)
	cancel(nil)
	if errors.Is(cause, broker.ErrLeaseLost) {
		p.log.Warn("tide: lease lost while the task ran; its outcome is discarded (the task was recovered)",
			"queue", ref.Queue, "id", ref.ID, "type", d.Message.Type)
		return
	}
	if errors.Is(cause, ErrShutdown) && s.Outcome != broker.OutcomeDone {
		s.Outcome = broker.OutcomeRequeue
	}
	if errors.Is(cause, ErrCanceled) && s.Outcome != broker.OutcomeDone {
		s.Outcome, s.Err = broker.OutcomeArchive, ErrCanceled.Error()
		p.log.Info("tide: task cancelled by an operator; archived", "queue", ref.Queue, "id", ref.ID, "type", d.Message.Type)
	}
	s.Lease = ref
	s.Message = d.Message
	select {
	case p.acks <- s:
	case <-p.ackDone:
		p.log.Error("tide: outcome dropped after shutdown; the task returns through lease recovery", "queue", ref.Queue, "id", ref.ID)
	}
}

// ackLoop writes settlements in batches: it takes what is waiting, up to
// maxAckBatch, so that a busy server needs few round trips and an idle one
// adds no delay.
func (p *processor) ackLoop() {
	defer close(p.ackDone)
	batch := make([]broker.Settlement, 0, maxAckBatch)
	for {
		batch = batch[:0]
		select {
		case s := <-p.acks:
			batch = append(batch, s)
		case <-p.ackStop:
			// Workers are done (or abandoned): flush what is left.
			for {
				select {
				case s := <-p.acks:
					batch = append(batch, s)
					if len(batch) == maxAckBatch {
						p.settle(batch)
						batch = batch[:0]
					}
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				p.settle(batch)
			}
			return
		}
	fill:
		for len(batch) < maxAckBatch {
			select {
			case s := <-p.acks:
				batch = append(batch, s)
			default:
				break fill
			}
		}
		p.settle(batch)
	}
}

// settle writes a batch, retrying transport errors while the leases last.
func (p *processor) settle(batch []broker.Settlement) {
	bo := backoff{min: 50 * time.Millisecond, max: 2 * time.Second}
	give := time.Now().Add(p.cfg.Lease)
	for {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
		errs, err := p.cfg.Broker.Settle(ctx, batch)
		cancel()
		if err == nil {
			p.cfg.health.ok()
			for i, e := range errs {
				if e == nil {
					continue
				}
				s := batch[i]
				if errors.Is(e, broker.ErrLeaseLost) {
					p.log.Warn("tide: acknowledgement refused: the lease was lost and the task recovered", "queue", s.Lease.Queue, "id", s.Lease.ID)
				} else {
					p.log.Error("tide: acknowledgement failed", "queue", s.Lease.Queue, "id", s.Lease.ID, "err", e)
				}
			}
			return
		}
		if time.Now().After(give) {
			p.log.Error("tide: could not write task outcomes before their leases ran out; the tasks return through lease recovery", "tasks", len(batch), "err", err)
			return
		}
		p.cfg.health.fail("acknowledge", err, start)
		time.Sleep(bo.next())
	}
}

// keepLoop renews the leases of running tasks every third of the lease, in one
// call, and cancels a handler whose lease is lost.
func (p *processor) keepLoop() {
	t := time.NewTicker(p.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-p.keeperEnd:
			return
		case <-t.C:
		}
		p.mu.Lock()
		refs := make([]broker.LeaseRef, 0, len(p.active))
		for ref := range p.active {
			refs = append(refs, ref)
		}
		p.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease/3)
		errs, err := p.cfg.Broker.Extend(ctx, refs, p.cfg.Lease)
		cancel()
		now := time.Now()
		p.mu.Lock()
		for i, ref := range refs {
			f := p.active[ref]
			if f == nil {
				continue // finished meanwhile
			}
			switch {
			case err == nil && errs[i] == nil:
				f.extended = now
			case err == nil && errors.Is(errs[i], broker.ErrLeaseLost):
				f.cancel(broker.ErrLeaseLost)
			case now.Sub(f.extended) >= p.cfg.Lease:
				// The lease may have run out without us; stop the handler so
				// that two workers do not run the task for long.
				f.cancel(broker.ErrLeaseLost)
			}
		}
		p.mu.Unlock()
		if err != nil {
			p.cfg.health.fail("lease renewal", err, start)
		} else {
			p.cfg.health.ok()
		}
	}
}
