package engine

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

const (
	// cronMinRetention is the least Retention of a tick's task.
	cronMinRetention = time.Minute
	// cronLookback bounds how far back a run-once entry looks for a missed tick.
	cronLookback = 366 * 24 * time.Hour
	// cronEnqueueTimeout bounds one enqueue call.
	cronEnqueueTimeout = 5 * time.Second
	// cronRetryMin and cronRetryMax bound the back-off between attempts to
	// enqueue a tick after a broker error.
	cronRetryMin, cronRetryMax = 100 * time.Millisecond, 30 * time.Second
	// cronHeartbeat is how often entries are published to a broker.Registry,
	// and cronEntryTTL how long a publication lasts.
	cronHeartbeat, cronEntryTTL = 5 * time.Second, 15 * time.Second
)

// CronSchedule gives the ticks of a periodic entry.
type CronSchedule interface {
	// Next returns the first tick after t, or the zero time when none comes.
	Next(t time.Time) time.Time
	// Prev returns the latest tick at or before now, looking back at most
	// lookback; ok is false when there is none.
	Prev(now time.Time, lookback time.Duration) (tick time.Time, ok bool)
}

// CronEntry is a periodic task of the cron service. The fields above the
// line are set by the caller before Add and not changed afterwards; the
// others are the service's.
type CronEntry struct {
	ID, Spec, Type, Queue string
	Location              string // the zone the spec is read in without CRON_TZ=
	Schedule              CronSchedule
	// RunOnce enqueues the latest missed tick however late; otherwise a
	// tick reached more than CronConfig.Grace late is dropped.
	RunOnce bool
	// Retention is the task's own Retention, before the floor the service
	// puts under it (see RetentionFor).
	Retention time.Duration
	// Build returns the task of tick, with the given ID and retention, and
	// the options of its enqueue.
	Build func(id string, tick time.Time, retention time.Duration) (*tidetype.TaskInfo, broker.EnqueueOptions, error)

	started bool
	latest  time.Time // latest tick at or before the last plan; zero when none
	next    time.Time // first tick after the last plan; zero when none
	last    time.Time // latest tick enqueued (or found enqueued)
	wake    time.Time // when to plan again; zero: never
	failing time.Time // tick whose enqueue failed and is being retried
	attempt int       // failed attempts at enqueueing failing
}

// Plan advances e to now and reports the tick to enqueue, if any: the
// latest tick at or before now, when it is not enqueued yet and either e is
// RunOnce or the tick is at most grace old. missed reports that ticks were
// dropped (from is the first one dropped). The service calls it with its
// lock held; it is exported for the root package's tests.
func (e *CronEntry) Plan(now time.Time, grace time.Duration) (tick time.Time, fire bool, from time.Time, missed bool) {
	expected := e.next
	switch {
	case e.started && now.Before(e.next):
		// No tick since the last plan: latest stays (a retry).
	case e.started && !e.next.IsZero() && e.Schedule.Next(e.next).After(now):
		e.latest, e.next = e.next, e.Schedule.Next(e.next)
	default:
		lookback := cronLookback
		if !e.RunOnce {
			lookback = grace
		}
		e.latest, _ = e.Schedule.Prev(now, lookback)
		e.next = e.Schedule.Next(now)
	}
	e.wake = e.next
	if !e.latest.IsZero() && e.latest.After(e.last) {
		if e.RunOnce || now.Sub(e.latest) <= grace {
			tick, fire = e.latest, true
		}
	}
	// Ticks this scheduler was waiting for and will never enqueue.
	if e.started && !expected.IsZero() && !expected.After(now) && expected.After(e.last) && (!fire || expected.Before(tick)) {
		from, missed = expected, true
	}
	e.started = true
	return tick, fire, from, missed
}

// MarkEnqueued records tick as enqueued (tests).
func (e *CronEntry) MarkEnqueued(tick time.Time) { e.last = tick }

// RetentionFor is the Retention of the task of tick: the task's own, raised
// to max(2×interval, 1 minute), interval being the time to the next tick, so
// that the tick's ID stays taken until no replica can enqueue it any more.
func (e *CronEntry) RetentionFor(tick time.Time) time.Duration {
	r := cronMinRetention
	if n := e.Schedule.Next(tick); !n.IsZero() {
		r = max(r, 2*n.Sub(tick))
	}
	return max(r, e.Retention)
}

// CronTaskID is the ID of the task of an entry's tick.
func CronTaskID(entryID string, tick time.Time) string {
	return "cron:" + entryID + ":" + strconv.FormatInt(tick.UnixMilli(), 10)
}

// CronConfig configures the cron service. All fields are required unless
// noted.
type CronConfig struct {
	Broker      broker.Broker
	SchedulerID string
	Grace       time.Duration // how late a tick may be reached and still run
	Logger      *slog.Logger
	Now         func() time.Time
	// Failed, when set, is called after each failed attempt to enqueue a
	// tick, except for ID conflicts (the tick is enqueued already) and
	// duplicates (a Unique entry whose previous task is unfinished).
	Failed func(e *CronEntry, tick time.Time, err error)
}

// Cron enqueues the ticks of its entries: one goroutine sleeps on a Go timer
// until the earliest tick of all entries and enqueues everything due in one
// broker call; another publishes the entries to the broker's registry.
// Entries may be added while it runs. It is safe for concurrent use.
type Cron struct {
	cfg CronConfig
	log *slog.Logger

	mu      sync.Mutex
	entries []*CronEntry
	stop    chan struct{}
	wake    chan struct{} // the loop: an entry was added
	beat    chan struct{} // the heartbeat: an entry was added
	running bool
	g       sync.WaitGroup
}

// NewCron returns a stopped cron service.
func NewCron(cfg CronConfig) *Cron {
	return &Cron{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), wake: make(chan struct{}, 1), beat: make(chan struct{}, 1)}
}

// Add adds an entry; a running service considers it at once.
func (c *Cron) Add(e *CronEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, e)
	if c.running {
		nudge(c.wake)
		nudge(c.beat)
	}
}

// Len returns the number of entries.
func (c *Cron) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Start launches the loop and the heartbeat (which ends at once when the
// broker has no registry).
func (c *Cron) Start() {
	c.mu.Lock()
	c.running = true
	c.mu.Unlock()
	c.g.Go(c.loop)
	c.g.Go(func() { c.heartbeat(c.cfg.Broker) })
}

// Stop stops the service and returns when its goroutines have exited. An
// enqueue in flight finishes first (it is bounded by a 5-second timeout).
func (c *Cron) Stop() {
	close(c.stop)
	c.g.Wait()
}

func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// fire is a tick to enqueue.
type fire struct {
	e    *CronEntry
	tick time.Time
}

func (c *Cron) loop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		now := c.cfg.Now()
		c.mu.Lock()
		batch := c.collect(now)
		var wake time.Time
		for _, e := range c.entries {
			if !e.wake.IsZero() && (wake.IsZero() || e.wake.Before(wake)) {
				wake = e.wake
			}
		}
		c.mu.Unlock()
		if len(batch) > 0 {
			c.enqueue(batch)
			continue
		}
		var fired <-chan time.Time
		if !wake.IsZero() {
			timer.Reset(wake.Sub(now))
			fired = timer.C
		}
		select {
		case <-c.stop:
			return
		case <-c.wake:
			timer.Stop()
		case <-fired:
		}
	}
}

// collect plans every entry whose wake-up has come. c.mu is held.
func (c *Cron) collect(now time.Time) []fire {
	var batch []fire
	for _, e := range c.entries {
		if e.started && (e.wake.IsZero() || e.wake.After(now)) {
			continue
		}
		tick, ok, from, missed := e.Plan(now, c.cfg.Grace)
		policy := "skip"
		if e.RunOnce {
			policy = "run-once"
		}
		if missed {
			attrs := []any{"entry", e.ID, "spec", e.Spec, "type", e.Type, "first_missed", from, "policy", policy}
			if ok {
				attrs = append(attrs, "catching_up", tick)
			}
			c.log.Warn("tide: missed cron ticks", attrs...)
		}
		if !e.failing.IsZero() && (!ok || !tick.Equal(e.failing)) {
			c.log.Error("tide: gave up enqueueing a cron tick", "entry", e.ID, "type", e.Type, "queue", e.Queue,
				"tick", e.failing, "attempts", e.attempt, "policy", policy)
			e.failing, e.attempt = time.Time{}, 0
		}
		if ok {
			batch = append(batch, fire{e: e, tick: tick})
		}
	}
	return batch
}

// enqueue stores the ticks of batch and records the outcome of each.
func (c *Cron) enqueue(batch []fire) {
	tasks := make([]*tidetype.TaskInfo, 0, len(batch))
	results := make([]error, len(batch))
	var eo broker.EnqueueOptions
	for i, f := range batch {
		t, o, err := f.e.Build(CronTaskID(f.e.ID, f.tick), f.tick, f.e.RetentionFor(f.tick))
		if results[i] = err; err == nil {
			tasks = append(tasks, t)
			eo.WaitReplicas, eo.WaitTimeout = max(eo.WaitReplicas, o.WaitReplicas), max(eo.WaitTimeout, o.WaitTimeout)
		}
	}
	if len(tasks) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), cronEnqueueTimeout)
		errs, err := c.cfg.Broker.Enqueue(ctx, tasks, eo)
		cancel()
		j := 0
		for i := range batch {
			if results[i] != nil {
				continue
			}
			switch {
			case err != nil:
				results[i] = err
			case j < len(errs):
				results[i] = errs[j]
			}
			j++
		}
	}

	type report struct {
		f   fire
		err error
	}
	var failed []report
	c.mu.Lock()
	for i, f := range batch {
		e, err := f.e, results[i]
		attrs := []any{"entry", e.ID, "type", e.Type, "queue", e.Queue, "tick", f.tick, "id", CronTaskID(e.ID, f.tick)}
		switch {
		case err == nil:
			c.log.Debug("tide: cron tick enqueued", attrs...)
		case errors.Is(err, broker.ErrTaskIDConflict):
			c.log.Debug("tide: cron tick already enqueued (by another scheduler or before a restart)", attrs...)
			err = nil
		case errors.Is(err, broker.ErrDuplicateTask):
			c.log.Info("tide: cron tick skipped: the entry is Unique and its previous task is unfinished", attrs...)
			err = nil
		}
		if err == nil {
			if e.last.IsZero() {
				nudge(c.beat) // publish the entry's first tick now, not in 5s
			}
			e.last, e.failing, e.attempt = f.tick, time.Time{}, 0
			continue
		}
		failed = append(failed, report{f, err})
		if errors.Is(err, broker.ErrInvalidTask) || errors.Is(err, broker.ErrClosed) {
			e.last, e.failing, e.attempt = f.tick, time.Time{}, 0 // retrying cannot help
			c.log.Error("tide: cron tick not enqueued", append(attrs, "err", err)...)
			continue
		}
		e.failing = f.tick
		e.attempt++
		retry := c.cfg.Now().Add(min(cronRetryMax, cronRetryMin<<min(e.attempt-1, 20)))
		if e.next.IsZero() || retry.Before(e.next) {
			e.wake = retry
		}
		c.log.Error("tide: cron tick not enqueued; will retry", append(attrs, "attempt", e.attempt, "retry_at", e.wake, "err", err)...)
	}
	c.mu.Unlock()

	if c.cfg.Failed != nil {
		for _, r := range failed {
			c.cfg.Failed(r.f.e, r.f.tick, r.err)
		}
	}
}

// heartbeat publishes the entries to reg until Stop, then withdraws them.
func (c *Cron) heartbeat(reg broker.Registry) {
	ticker := time.NewTicker(cronHeartbeat)
	defer ticker.Stop()
	failing := false
	publish := func(entries []tidetype.SchedulerEntry, ttl time.Duration) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := reg.RegisterSchedulerEntries(ctx, c.cfg.SchedulerID, entries, ttl)
		switch {
		case errors.Is(err, broker.ErrNotSupported):
			c.log.Debug("tide: the broker has no registry; scheduler entries are not published", "scheduler", c.cfg.SchedulerID)
			return false
		case err != nil && !failing:
			failing = true
			c.log.Warn("tide: cannot publish scheduler entries (the scheduler keeps running)", "scheduler", c.cfg.SchedulerID, "err", err)
		case err != nil:
			c.log.Debug("tide: cannot publish scheduler entries", "scheduler", c.cfg.SchedulerID, "err", err)
		case failing:
			failing = false
			c.log.Info("tide: publishing scheduler entries again", "scheduler", c.cfg.SchedulerID)
		}
		return true
	}
	for {
		if !publish(c.Snapshot(), cronEntryTTL) {
			return
		}
		select {
		case <-c.stop:
			publish([]tidetype.SchedulerEntry{}, time.Second) // withdraw
			return
		case <-ticker.C:
		case <-c.beat:
		}
	}
}

// Snapshot describes the entries for the registry.
func (c *Cron) Snapshot() []tidetype.SchedulerEntry {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]tidetype.SchedulerEntry, 0, len(c.entries))
	for _, e := range c.entries {
		next := e.next
		if !e.started {
			next = e.Schedule.Next(now)
		}
		out = append(out, tidetype.SchedulerEntry{
			SchedulerID: c.cfg.SchedulerID,
			ID:          e.ID,
			Spec:        e.Spec,
			Type:        e.Type,
			Queue:       e.Queue,
			Next:        next,
			Prev:        e.last,
			Location:    e.Location,
		})
	}
	return out
}
