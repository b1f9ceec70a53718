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
	"github.com/tidequeue/tide/tidetype"
)

// maxFetch caps how many tasks one Dequeue call asks for.
const maxFetch = 100

// maxSettleBatch caps how many settlements one Settle call carries.
const maxSettleBatch = 128

// brokerCallTimeout bounds a single broker call made by a background loop.
const brokerCallTimeout = 10 * time.Second

// leaseBudget returns how long after sending the request that granted or
// renewed a lease of length d the worker may count on that lease: d less a
// tenth.
//
// The broker starts (or renews) a lease when its script runs, on its own
// clock, which is no earlier than the request was sent; so the lease lasts
// until at least send + d as the broker's clock counts. The processor
// counts on its own monotonic clock. It assumes the two clocks' rates
// differ by at most 1% (NTP keeps a host's clock within 0.05% of true time,
// and quartz drifts far less than 1%) and that the broker's clock is not
// stepped. When the local clock has measured 0.9d since the send, the
// broker's has then measured at most 0.9d × 1.01 < 0.91d, so at least 0.09d
// (27 ms at the 300 ms minimum lease, 2.7 s at the 30 s default) is left
// for the watchdog's timer to fire and the handler to see its context end
// and return before the lease can have expired on the broker and the task
// be handed to another worker.
func leaseBudget(d time.Duration) time.Duration { return d - d/10 }

// leaseClock is the local clock lease deadlines are kept on: time.Now (with
// its monotonic reading) and time.AfterFunc; tests substitute a fake one.
type leaseClock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) leaseTimer
}

// leaseTimer is the part of *time.Timer a watchdog uses.
type leaseTimer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) leaseTimer { return time.AfterFunc(d, f) }

// processor fetches tasks into free worker slots, runs them, keeps their
// leases alive and writes their settlements in batches.
type processor struct {
	cfg    Config
	log    *slog.Logger
	queues []string

	slots chan struct{}  // one token per free worker slot
	jobs  chan *inflight // to an idle worker; closed when fetching stopped
	wakeC chan struct{}  // work may have arrived

	fetchStop chan struct{} // closed: stop fetching

	settlements chan broker.Settlement
	settleStop  chan struct{} // closed: flush and exit
	settleDone  chan struct{} // closed when the settler exited
	keeperEnd   chan struct{}

	clock leaseClock // lease deadlines; set before start

	mu     sync.Mutex
	active map[broker.LeaseRef]*inflight
	hard   bool // every handler is cancelled with ErrShutdown (hardStop)
	// One watchdog timer serves every task (see watch): it is set for
	// dogAt, the earliest deadline it knows of, zero while it is not set;
	// dogOff stops it for good.
	dog    leaseTimer
	dogAt  time.Time
	dogOff bool

	// dogMu is held while the watchdog runs, from before p.mu to after
	// its log lines, so that stop can wait for it.
	dogMu sync.Mutex

	fetcher, workers, background sync.WaitGroup
	stopOnce                     sync.Once
}

// inflight is a task being processed. The watchdog cancels the handler's
// context with broker.ErrLeaseLost at deadline, the local time from which
// the lease may have ended on the broker (see leaseBudget); a successful
// renewal moves the deadline. Every field but ctx, cancel, ref, d, typ and
// started, which do not change, is guarded by processor.mu.
type inflight struct {
	ctx      context.Context // the handler's
	cancel   context.CancelCauseFunc
	ref      broker.LeaseRef
	d        *broker.Delivery
	typ      string
	started  time.Time
	deadline time.Time // on the processor's leaseClock
	disarmed bool      // the watchdog stopped the handler, or leaves it alone for good
}

// renew moves f's deadline to d, computed from the send time of a renewal
// that succeeded, unless the watchdog already stopped its handler (a
// stopped handler is never resumed) or d is not later. The watchdog's timer
// stays set for the earlier deadline; when it fires it finds f's moved and
// sets itself again (see watch). p.mu must be held.
func (p *processor) renew(f *inflight, d time.Time) {
	if f.disarmed || !d.After(f.deadline) {
		return
	}
	f.deadline = d
}

// arm makes sure the watchdog's timer fires no later than deadline d, a
// time still to come. p.mu must be held.
func (p *processor) arm(d time.Time) {
	if p.dogOff || (!p.dogAt.IsZero() && !d.Before(p.dogAt)) {
		return
	}
	p.dogAt = d
	// Never a wait of zero or less: a leaseClock may then run the function
	// in the caller (the tests' fake does), and watch takes p.mu, which is
	// held here.
	in := max(d.Sub(p.clock.Now()), time.Nanosecond)
	if p.dog == nil {
		p.dog = p.clock.AfterFunc(in, p.watch)
		return
	}
	p.dog.Reset(in)
}

// watch is the watchdog, one timer for every task, set for the earliest
// deadline: it stops each handler whose deadline has come, for its lease
// may have ended on the broker, where the task can be recovered and handed
// to another worker, whether or not a renewal is still on its way; then it
// sets itself for the earliest deadline left. A timer a task would cost
// each task a timer's start and stop; this one fires about once a lease
// (deadlines come in the order of the requests, and a task's ends with it).
// It stops handlers under p.mu, so that a handler it stopped is stopped
// before its worker goes on, and logs after, outside it.
func (p *processor) watch() {
	p.dogMu.Lock()
	defer p.dogMu.Unlock()
	var stopped []broker.LeaseRef
	p.mu.Lock()
	p.dogAt = time.Time{}
	if p.dogOff {
		p.mu.Unlock()
		return
	}
	now := p.clock.Now()
	var next time.Time
	for ref, f := range p.active {
		switch {
		case f.disarmed:
		case !now.Before(f.deadline):
			f.disarmed = true
			f.cancel(broker.ErrLeaseLost)
			stopped = append(stopped, ref)
		case next.IsZero() || f.deadline.Before(next):
			next = f.deadline
		}
	}
	if !next.IsZero() {
		p.arm(next)
	}
	p.mu.Unlock()
	for _, ref := range stopped {
		p.log.Warn("tide: no lease renewal was answered in time; handler stopped before its lease can run out (the task will be recovered and retried)",
			"queue", ref.Queue, "id", ref.ID)
	}
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
	p := &processor{
		cfg:         cfg,
		log:         cfg.Logger,
		queues:      qs,
		slots:       make(chan struct{}, cfg.Concurrency),
		jobs:        make(chan *inflight),
		wakeC:       make(chan struct{}, 1),
		fetchStop:   make(chan struct{}),
		settlements: make(chan broker.Settlement, cfg.Concurrency*2),
		settleStop:  make(chan struct{}),
		settleDone:  make(chan struct{}),
		keeperEnd:   make(chan struct{}),
		clock:       realClock{},
		active:      make(map[broker.LeaseRef]*inflight),
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
	p.background.Go(p.settleLoop)
	p.background.Go(p.keepLoop)
}

// cancelTask cancels the handler running queue/id, if this server runs it,
// with the cause broker.ErrTaskCanceled.
func (p *processor) cancelTask(queue, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ref, f := range p.active {
		if ref.Queue == queue && ref.ID == id {
			f.cancel(broker.ErrTaskCanceled)
		}
	}
}

// snapshot lists the tasks being processed.
func (p *processor) snapshot() []tidetype.ActiveTask {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]tidetype.ActiveTask, 0, len(p.active))
	for ref, f := range p.active {
		out = append(out, tidetype.ActiveTask{Queue: ref.Queue, ID: ref.ID, Type: f.typ, StartedAt: f.started})
	}
	return out
}

func (p *processor) activeCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.active)
}

// hardStop cancels every handler with ErrShutdown, and any launched later.
// A handler's context is not derived from one the processor cancels: a
// child of a shared context costs each task an entry in its parent's
// children and the parent's lock, twice.
func (p *processor) hardStop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hard = true
	for _, f := range p.active {
		f.cancel(ErrShutdown)
	}
}

// stop implements the shutdown sequence described on Engine.Stop.
func (p *processor) stop() {
	p.stopOnce.Do(func() {
		close(p.fetchStop)
		p.fetcher.Wait()
		close(p.jobs) // idle workers exit; busy ones when their task ends

		done := make(chan struct{})
		go func() { p.workers.Wait(); close(done) }()
		grace := time.NewTimer(p.cfg.ShutdownTimeout)
		select {
		case <-done:
		case <-grace.C:
			n := p.activeCount()
			p.log.Warn("tide: shutdown timeout reached; cancelling in-flight tasks, they will be requeued", "tasks", n, "timeout", p.cfg.ShutdownTimeout)
			p.hardStop()
			// Handlers must return once their context is done; give them a
			// moment to do so before leaving them to lease recovery.
			extra := time.NewTimer(max(p.cfg.LeaseDuration/2, time.Second))
			select {
			case <-done:
			case <-extra.C:
				p.log.Error("tide: handlers ignored cancellation; their tasks return through lease recovery", "tasks", p.activeCount())
			}
			extra.Stop()
		}
		grace.Stop()
		p.hardStop()
		close(p.settleStop)
		close(p.keeperEnd)
		p.background.Wait()
		// Handlers that ignored cancellation are left behind; the
		// watchdog must not stop them after stop returns.
		p.dogMu.Lock() // a watchdog run already under way ends first
		p.mu.Lock()
		p.dogOff = true
		if p.dog != nil {
			p.dog.Stop()
		}
		p.mu.Unlock()
		p.dogMu.Unlock()
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
		order := queueOrder(p.queues, p.cfg.Queues, p.cfg.StrictPriority, r)
		// A wake that came before this call is answered by it: the call
		// sees whatever the wake announced. Left pending, it would only
		// make the next wait end at once in an empty call.
		select {
		case <-p.wakeC:
		default:
		}
		start := time.Now()
		sent := p.clock.Now() // no lease handed out by this call starts earlier
		ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
		ds, err := p.cfg.Broker.Dequeue(ctx, order, n, p.cfg.LeaseDuration)
		cancel()
		for range n - len(ds) {
			p.slots <- struct{}{}
		}
		// Deliveries come with their leases even when a later part of the
		// call failed (another partition, another node): run them, or their
		// slots and tasks would be stranded until lease recovery.
		// One reading of each clock for the whole batch, not one a task.
		// The lease clock's may be a little early for the batch's last
		// tasks, which the watchdog, set for the deadline itself, makes up
		// for.
		now, lnow := time.Now(), p.clock.Now()
		for _, d := range ds {
			p.launch(d, sent, now, lnow)
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
func (p *processor) pause(d time.Duration) bool { return p.cfg.health.wait(p.fetchStop, d) }

// launch runs delivery d, whose lease was asked for at sent (on p.clock), in
// a worker under a watchdog; a delivery whose lease may already have ended
// at lnow (on p.clock; the answer came too late) is not run: its task
// returns through lease recovery. now is its start on the wall clock. It
// takes the slot fetchLoop took for d.
func (p *processor) launch(d *broker.Delivery, sent, now, lnow time.Time) {
	ref := d.Lease()
	lease := d.LeaseFor
	if lease <= 0 {
		lease = p.cfg.LeaseDuration
	}
	deadline := sent.Add(leaseBudget(lease))
	if !deadline.After(lnow) {
		p.log.Warn("tide: dequeue answered too late to count on the lease; the task is not run here and returns through lease recovery",
			"queue", ref.Queue, "id", ref.ID, "lease", lease)
		p.slots <- struct{}{}
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	f := &inflight{ctx: ctx, cancel: cancel, ref: ref, d: d, typ: d.Task.Type, started: now, deadline: deadline}
	p.mu.Lock()
	if p.hard {
		cancel(ErrShutdown)
	}
	p.active[ref] = f
	p.arm(deadline)
	p.mu.Unlock()
	// An idle worker takes the task; when none waits, a new one starts. A
	// worker is idle only while it holds no slot, so there are never more
	// workers than slots, and a task never waits for one.
	select {
	case p.jobs <- f:
	default:
		p.workers.Go(func() { p.worker(f) })
	}
}

// worker runs f, then the tasks handed to it while it waits idle, until
// fetching stopped. Workers are kept rather than started a task each: a
// goroutine's start, and the growth of its stack to what a handler call
// needs, cost more than the handler of a small task.
func (p *processor) worker(f *inflight) {
	for {
		p.work(f)
		var ok bool
		if f, ok = <-p.jobs; !ok {
			return
		}
	}
}

// work runs the handler of f's delivery and hands its settlement to the
// settler. The worker slot is given back only when the handler has
// returned, also when its watchdog stopped it.
func (p *processor) work(f *inflight) {
	ref, d := f.ref, f.d
	defer func() { p.slots <- struct{}{} }()
	s, write := p.cfg.Run(f.ctx, d)
	p.mu.Lock()
	delete(p.active, ref)
	f.disarmed = true
	p.mu.Unlock()
	f.cancel(nil)
	if !write {
		return
	}
	s.Lease, s.Task, s.Started, s.Server = ref, d.Task, f.started, p.cfg.ServerID
	select {
	case p.settlements <- s:
	case <-p.settleDone:
		p.log.Error("tide: settlement dropped after shutdown; the task returns through lease recovery", "queue", ref.Queue, "id", ref.ID)
	}
}

// settleLoop writes settlements in batches: it takes what is waiting, up to
// maxSettleBatch, so that a busy server needs few round trips and an idle one
// adds no delay.
func (p *processor) settleLoop() {
	defer close(p.settleDone)
	batch := make([]broker.Settlement, 0, maxSettleBatch)
	for {
		batch = batch[:0]
		select {
		case s := <-p.settlements:
			batch = append(batch, s)
		case <-p.settleStop:
			// Workers are done (or abandoned): flush what is left.
			for {
				select {
				case s := <-p.settlements:
					batch = append(batch, s)
					if len(batch) == maxSettleBatch {
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
		for len(batch) < maxSettleBatch {
			select {
			case s := <-p.settlements:
				batch = append(batch, s)
			default:
				break fill
			}
		}
		p.settle(batch)
	}
}

// settle writes a batch. Settlements the broker could not apply for want
// of a connection are written again with back-off while their leases last;
// each settlement's answer is its own, so one unreachable partition holds
// back only its own tasks.
func (p *processor) settle(batch []broker.Settlement) {
	bo := backoff{min: 50 * time.Millisecond, max: 2 * time.Second}
	give := time.Now().Add(p.cfg.LeaseDuration)
	todo := batch
	uncertain := map[broker.LeaseRef]bool{} // sent before with no answer
	for {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
		errs, err := p.cfg.Broker.Settle(ctx, todo)
		cancel()
		var again []broker.Settlement
		if err != nil {
			again = todo
		} else {
			for i, e := range errs {
				s := todo[i]
				switch {
				case e == nil:
				case unavailable(e):
					if errors.Is(e, broker.ErrOutcomeUnknown) {
						uncertain[s.Lease] = true
					}
					again = append(again, s)
					err = e
				case errors.Is(e, broker.ErrLeaseLost) && uncertain[s.Lease]:
					p.log.Info("tide: settlement written earlier or refused; its first attempt got no answer", "queue", s.Lease.Queue, "id", s.Lease.ID, "kind", s.Kind)
				case errors.Is(e, broker.ErrLeaseLost):
					p.log.Warn("tide: settlement refused: the lease was lost and the task recovered", "queue", s.Lease.Queue, "id", s.Lease.ID, "kind", s.Kind)
				default:
					p.log.Error("tide: settlement failed", "queue", s.Lease.Queue, "id", s.Lease.ID, "kind", s.Kind, "err", e)
				}
			}
		}
		if len(again) == 0 {
			p.cfg.health.ok()
			return
		}
		if time.Now().After(give) {
			p.log.Error("tide: could not write settlements before their leases ran out; the tasks return through lease recovery", "tasks", len(again), "err", err)
			return
		}
		p.cfg.health.fail("settle", err, start)
		time.Sleep(bo.next())
		todo = again
	}
}

// keepLoop renews the leases of running tasks every third of the lease, in one
// call, and cancels a handler whose lease is lost. A renewal that succeeds
// moves each task's watchdog to the renewal's send time plus leaseBudget, so
// a reply that comes late gains nothing; the watchdogs, not this loop, stop
// handlers whose renewals get no answer, also while a call is still blocked.
func (p *processor) keepLoop() {
	t := time.NewTicker(p.cfg.LeaseDuration / 3)
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
		deadline := p.clock.Now().Add(leaseBudget(p.cfg.LeaseDuration))
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.LeaseDuration/3)
		errs, err := p.cfg.Broker.Extend(ctx, refs, p.cfg.LeaseDuration)
		cancel()
		p.mu.Lock()
		for i, ref := range refs {
			f := p.active[ref]
			if f == nil {
				continue // finished meanwhile
			}
			var e error = err
			if err == nil {
				e = errs[i]
			}
			switch {
			case e == nil:
				p.renew(f, deadline)
			case errors.Is(e, broker.ErrTaskCanceled):
				// Renewed, but the task was cancelled: stop the handler
				// (the event may have been missed).
				p.renew(f, deadline)
				f.cancel(broker.ErrTaskCanceled)
			case errors.Is(e, broker.ErrLeaseLost):
				f.cancel(broker.ErrLeaseLost)
			}
			// Otherwise the lease stands as long as its last renewal
			// allows; the watchdog stops the handler when that ends.
		}
		p.mu.Unlock()
		if err == nil {
			for _, e := range errs {
				if e != nil && unavailable(e) {
					err = e
				}
			}
		}
		if err != nil {
			p.cfg.health.fail("lease renewal", err, start)
		} else {
			p.cfg.health.ok()
		}
	}
}
