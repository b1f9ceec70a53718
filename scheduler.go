package tide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/engine"
)

// This file holds the Scheduler: cron-driven periodic tasks.
//
// How a tick becomes a task, and why it happens once:
//
//   - Every entry has an ID that is the same in every process that registers
//     the same entry (a digest of its spec, time zone, task and options, or a
//     name the user gives). The task of the tick at T gets the ID
//     "cron:<entry ID>:<T in Unix ms>", so replicas that fire the same tick
//     enqueue the same ID and the broker keeps one (ErrTaskIDConflict for the
//     others, which the scheduler treats as success).
//   - The ID is reserved only while the task exists, so every tick's task is
//     kept as completed for a Retention of at least max(2×interval, 1 min),
//     interval being the time to the entry's next tick. A scheduler enqueues
//     tick T only while T is its latest tick, i.e. before the next one, so a
//     late replica (or a restart that catches up) finds the ID still taken.
//   - A single goroutine sleeps on a Go timer until the earliest tick of all
//     entries and enqueues everything due in one broker call.

// ErrSchedulerClosed is returned by Scheduler.Start, Run, Register and
// RegisterEntry after Shutdown.
var ErrSchedulerClosed = errors.New("tide: scheduler closed")

// MisfirePolicy says what a Scheduler does with a tick it missed: one that
// came while the scheduler was not running (before Start, during a restart,
// while the process was suspended) or that could not be enqueued in time.
// Whatever the policy, at most one missed tick per entry is enqueued: the
// latest.
type MisfirePolicy int

const (
	// MisfireDefault, the zero value, uses SchedulerOpts.Misfire in a
	// CronEntry, and means MisfireSkip in SchedulerOpts.
	MisfireDefault MisfirePolicy = iota
	// MisfireSkip drops a tick that the scheduler reaches more than
	// SchedulerOpts.MisfireGrace late. A tick reached within the grace still
	// runs (a restart that takes a few seconds loses nothing).
	MisfireSkip
	// MisfireRunOnce enqueues the latest missed tick, however late, as soon
	// as the scheduler gets to it; earlier missed ticks are dropped. At Start
	// this is the latest tick before now (looking back at most a year),
	// which is enqueued unless its task still exists, so a restart does not
	// repeat a tick that ran, but an entry that never ran before also gets
	// its latest past tick at its first Start.
	MisfireRunOnce
)

// String returns "default", "skip", "run-once" or "MisfirePolicy(n)".
func (p MisfirePolicy) String() string {
	switch p {
	case MisfireDefault:
		return "default"
	case MisfireSkip:
		return "skip"
	case MisfireRunOnce:
		return "run-once"
	}
	return "MisfirePolicy(" + strconv.Itoa(int(p)) + ")"
}

// DefaultMisfireGrace is the default SchedulerOpts.MisfireGrace.
const DefaultMisfireGrace = time.Minute

// maxEntryIDLength leaves room in a task ID for "cron:", ":" and the tick.
const maxEntryIDLength = MaxIDLength - 32

// SchedulerOpts configures a Scheduler. The zero value (or nil) is valid:
// every field has a documented default.
type SchedulerOpts struct {
	// Location is the time zone of cron specs without a CRON_TZ= or TZ=
	// prefix. Default time.UTC, so that replicas on machines with different
	// local zones agree on the ticks. (@every is not affected: see Register.)
	Location *time.Location

	// Misfire is the policy of entries that do not choose one (every entry
	// added with Register). Default MisfireSkip.
	Misfire MisfirePolicy

	// MisfireGrace is how late a tick may be reached and still run under
	// MisfireSkip. Default DefaultMisfireGrace (1 minute); must not be
	// negative.
	MisfireGrace time.Duration

	// Logger receives the scheduler's logs. Default slog.Default(). A tick
	// another replica enqueued first is logged at debug level only.
	Logger *slog.Logger

	// EnqueueErrorHandler, when set, is called after each failed attempt to
	// enqueue a tick's task, with a copy of the task, the options of that
	// attempt (the entry's options followed by the TaskID and Retention the
	// scheduler adds, so Client.Enqueue(ctx, t, opts...) repeats it
	// faithfully) and the error. It is not called for ErrTaskIDConflict (the
	// tick was already enqueued) nor ErrDuplicateTask (a Unique entry whose
	// previous task is unfinished). It is called from the scheduler's
	// goroutine, which waits for it; a panic in it is logged and dropped.
	EnqueueErrorHandler func(t *Task, opts []Option, err error)

	// SchedulerID names this scheduler in logs and in the entries it
	// publishes for the CLI (when the broker implements broker.Registry).
	// Default: host name, process ID and a random suffix.
	SchedulerID string
}

// CronEntry is a periodic task for Scheduler.RegisterEntry: Register with
// a name and a misfire policy of its own.
type CronEntry struct {
	// Spec is the schedule; see Scheduler.Register.
	Spec string
	// Task is enqueued at every tick. The scheduler keeps a copy: changing
	// the task after registering has no effect.
	Task *Task
	// Options apply to every tick's task, over the task's own options.
	Options []Option
	// Misfire is the entry's policy; MisfireDefault uses SchedulerOpts.Misfire.
	Misfire MisfirePolicy
	// ID names the entry; tick tasks get the ID "cron:<ID>:<tick in Unix ms>".
	// It must be the same in every replica and unique among the entries of
	// the queue. Default: a digest of the spec, time zone, task type,
	// payload, headers and options (16 hexadecimal digits). An ID is 1
	// to 224 bytes of ASCII letters, digits and . _ - :
	ID string
}

// Scheduler enqueues tasks on cron schedules. Several schedulers (one per
// replica, for availability) may run the same entries on the same broker:
// each tick is still enqueued once, because the tick's task has an ID
// derived from the entry and the tick time, which the broker accepts only
// once while the task is kept (its Retention is raised to at least
// max(2×interval, 1 minute)). This holds while the replicas' clocks differ
// by less than about 30 seconds, nobody deletes a tick's task early, and
// the replicas register the same entries; docs/design.md ("Periodic tasks:
// exactly once per tick") has the argument and what happens otherwise (at
// most one enqueue per Scheduler value). A tick is enqueued at least once
// when a scheduler runs it in time (MisfirePolicy): after a broker error it
// retries with back-off (100 ms doubling up to 30 s) until the tick is
// dropped. Processing stays at least once, as for every task.
//
// # Identifying ticks
//
// A handler learns the tick from its task ID (GetTaskID): "cron:<entry
// ID>:<tick in Unix milliseconds>". Tasks are due at once when enqueued.
//
// A Scheduler is safe for concurrent use. Entries may be registered before
// or after Start. It is not restartable: after Shutdown, Start returns
// ErrSchedulerClosed. A scheduler needs no server: tasks are processed by
// the Servers of their queues.
type Scheduler struct {
	b       broker.Broker
	c       *Client
	opts    SchedulerOpts
	optsErr error
	log     *slog.Logger
	now     func() time.Time
	cron    *engine.Cron

	mu    sync.Mutex
	state int // 0 new, 1 running, 2 closed
	byID  map[string]*engine.CronEntry
	tasks map[string]registered // by entry ID
}

// registered is what an entry was registered with (private copies).
type registered struct {
	task *Task
	opts []Option
}

// NewScheduler returns a scheduler that enqueues into b. opts may be nil.
// Invalid opts are reported by Start with an error wrapping
// ErrInvalidConfig. The scheduler does not own b: Shutdown leaves it open.
// NewScheduler panics if b is nil.
func NewScheduler(b broker.Broker, opts *SchedulerOpts) *Scheduler {
	if b == nil {
		panic("tide: NewScheduler: nil broker")
	}
	s := &Scheduler{
		b:     b,
		c:     NewClient(b),
		now:   clockOf(b),
		byID:  make(map[string]*engine.CronEntry),
		tasks: make(map[string]registered),
	}
	if opts != nil {
		s.opts = *opts
	}
	s.opts, s.optsErr = s.opts.withDefaults()
	s.log = s.opts.Logger
	s.cron = engine.NewCron(engine.CronConfig{
		Broker: b, SchedulerID: s.opts.SchedulerID, Grace: s.opts.MisfireGrace,
		Logger: s.log, Now: s.now, Failed: s.failed,
	})
	return s
}

func (o SchedulerOpts) withDefaults() (SchedulerOpts, error) {
	var errs []error
	if o.Location == nil {
		o.Location = time.UTC
	}
	switch o.Misfire {
	case MisfireDefault:
		o.Misfire = MisfireSkip
	case MisfireSkip, MisfireRunOnce:
	default:
		errs = append(errs, fmt.Errorf("%w: SchedulerOpts.Misfire %v is not a policy", ErrInvalidConfig, o.Misfire))
		o.Misfire = MisfireSkip
	}
	switch {
	case o.MisfireGrace == 0:
		o.MisfireGrace = DefaultMisfireGrace
	case o.MisfireGrace < 0:
		errs = append(errs, fmt.Errorf("%w: SchedulerOpts.MisfireGrace %v is negative", ErrInvalidConfig, o.MisfireGrace))
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.SchedulerID == "" {
		host, _ := os.Hostname()
		o.SchedulerID = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), broker.NewID()[:8])
	}
	return o, errors.Join(errs...)
}

// Register adds a periodic task: t, with opts over its own options, is
// enqueued at every tick of cronspec, under SchedulerOpts.Misfire. It
// returns the entry's ID, which is the same in every process that registers
// the same spec, time zone, task (type, payload, headers) and options, and
// appears in the ID of every tick's task; see Scheduler for the guarantee.
//
// cronspec is one of
//
//   - a crontab line with 5 fields (minute hour day-of-month month
//     day-of-week) or 6, seconds first: "30 9 * * MON-FRI",
//     "*/10 * * * * *";
//   - a descriptor: @yearly (@annually), @monthly, @weekly, @daily
//     (@midnight), @hourly;
//   - "@every <duration>", a whole number of seconds of at least 1s
//     ("@every 90s", "@every 1h30m"). Its ticks are the multiples of the
//     duration since the Unix epoch, not counted from Start, so that every
//     replica has the same ticks: "@every 1h" fires on the hour (UTC),
//     "@every 10s" at :00, :10, ... of each minute.
//
// Crontab lines and descriptors are read in SchedulerOpts.Location unless
// they start with "CRON_TZ=<zone> " or "TZ=<zone> " (an IANA name such as
// "CRON_TZ=Europe/Berlin 0 9 * * *"); daylight-saving gaps and repeats
// follow robfig/cron. The scheduler sets each task's ID and keeps it for a
// while after success (see Scheduler), so TaskID, ProcessAt and ProcessIn
// are refused. Unique works (a tick is skipped while the previous tick's
// task is unfinished) on queues with one partition, and so does Group (a
// tick's ID does not carry the group's tag, see Group).
//
// Register returns an error naming the spec for a spec that does not parse
// or never fires, an error wrapping ErrInvalidTask for a task Enqueue would
// refuse (nil, empty type, over-size payload, bad option), an error for an
// entry already registered with this scheduler, and ErrSchedulerClosed after
// Shutdown. It may be called before or after Start, from any goroutine; an
// entry added while the scheduler runs is considered at once, as at Start.
func (s *Scheduler) Register(cronspec string, t *Task, opts ...Option) (entryID string, err error) {
	return s.RegisterEntry(CronEntry{Spec: cronspec, Task: t, Options: opts})
}

// RegisterEntry is Register with a name and a misfire policy for the entry;
// see CronEntry. It returns the entry's ID (e.ID when given).
func (s *Scheduler) RegisterEntry(e CronEntry) (string, error) {
	if e.Task == nil {
		return "", fmt.Errorf("%w: nil task", ErrInvalidTask)
	}
	ce, reg, err := s.newEntry(e)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == 2 {
		return "", ErrSchedulerClosed
	}
	if old, ok := s.byID[ce.ID]; ok {
		return "", fmt.Errorf("tide: scheduler entry %s is already registered (spec %q, task %s on queue %s)", ce.ID, old.Spec, old.Type, old.Queue)
	}
	s.byID[ce.ID] = ce
	s.tasks[ce.ID] = reg
	s.cron.Add(ce)
	return ce.ID, nil
}

// newEntry validates e and builds the entry.
func (s *Scheduler) newEntry(e CronEntry) (*engine.CronEntry, registered, error) {
	sched, locName, err := parseCronSpec(e.Spec, s.opts.Location)
	if err != nil {
		return nil, registered{}, err
	}
	if first := sched.Next(s.now()); first.IsZero() {
		return nil, registered{}, fmt.Errorf("tide: invalid cron spec %q: it never fires (no time matches within five years)", e.Spec)
	}
	misfire := e.Misfire
	switch misfire {
	case MisfireDefault:
		misfire = s.opts.Misfire
	case MisfireSkip, MisfireRunOnce:
	default:
		return nil, registered{}, fmt.Errorf("tide: cron entry %q: invalid misfire policy %v", e.Spec, e.Misfire)
	}
	t := &Task{
		typ:     e.Task.typ,
		payload: slices.Clone(e.Task.payload),
		headers: maps.Clone(e.Task.headers),
		opts:    slices.Clone(e.Task.opts),
	}
	opts := slices.Clone(e.Options)
	o := enqueueOptions{queue: DefaultQueue, maxRetry: DefaultMaxRetry}
	for _, list := range [][]Option{t.opts, opts} {
		for _, opt := range list {
			if opt == nil {
				return nil, registered{}, fmt.Errorf("%w: nil Option", ErrInvalidTask)
			}
			if err := opt.apply(&o); err != nil {
				if errors.Is(err, ErrInvalidTask) {
					return nil, registered{}, err
				}
				return nil, registered{}, fmt.Errorf("%w: %v", ErrInvalidTask, err)
			}
		}
	}
	switch {
	case o.id != "":
		return nil, registered{}, fmt.Errorf("%w: TaskID(%q) on a cron entry: the scheduler gives every tick's task its own ID (name the entry with CronEntry.ID instead)", ErrInvalidTask, o.id)
	case o.hasIn || !o.processAt.IsZero():
		return nil, registered{}, fmt.Errorf("%w: ProcessIn/ProcessAt on a cron entry: a tick's task is due at the tick", ErrInvalidTask)
	}
	id := e.ID
	if id == "" {
		id = cronEntryID(e.Spec, locName, t, &o)
	} else if err := validateEntryID(id); err != nil {
		return nil, registered{}, err
	}
	// Build one task as a tick would, so that whatever Enqueue would
	// refuse (empty type, over-size payload, ...) is refused now.
	info, _, err := s.c.task(t, append(slices.Clone(opts), TaskID(engine.CronTaskID(id, time.Now()))))
	if err != nil {
		return nil, registered{}, err
	}
	if info.UniqueKey != "" || info.Group != "" {
		// A tick's task has an ID, and the broker refuses Unique with an
		// ID, and a group with an ID that lacks its tag, on a queue with
		// several partitions.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		n, err := s.b.Partitions(ctx, info.Queue)
		cancel()
		switch {
		case err != nil || n < 2:
		case info.UniqueKey != "":
			return nil, registered{}, fmt.Errorf("%w: a periodic task cannot be Unique on queue %q, which has %d partitions (each tick's ID already makes it unique)", ErrInvalidTask, info.Queue, n)
		default:
			return nil, registered{}, fmt.Errorf("%w: a periodic task cannot be in a group on queue %q, which has %d partitions (a tick's ID does not carry the group's tag); use a queue of one partition", ErrInvalidTask, info.Queue, n)
		}
	}
	return &engine.CronEntry{
		ID:        id,
		Spec:      e.Spec,
		Type:      t.typ,
		Queue:     o.queue,
		Location:  s.opts.Location.String(),
		Schedule:  sched,
		RunOnce:   misfire == MisfireRunOnce,
		Retention: o.retention,
		Build: func(id string, _ time.Time, retention time.Duration) (*TaskInfo, broker.EnqueueOptions, error) {
			return s.c.task(t, append(slices.Clone(opts), TaskID(id), Retention(retention)))
		},
	}, registered{task: t, opts: opts}, nil
}

// failed reports a failed attempt to enqueue a tick to
// SchedulerOpts.EnqueueErrorHandler, with a copy of the task and the
// options that repeat the attempt.
func (s *Scheduler) failed(e *engine.CronEntry, tick time.Time, err error) {
	h := s.opts.EnqueueErrorHandler
	if h == nil {
		return
	}
	s.mu.Lock()
	reg := s.tasks[e.ID]
	s.mu.Unlock()
	cp := &Task{typ: reg.task.typ, payload: slices.Clone(reg.task.payload), headers: maps.Clone(reg.task.headers), opts: slices.Clone(reg.task.opts)}
	opts := append(slices.Clone(reg.opts), TaskID(engine.CronTaskID(e.ID, tick)), Retention(e.RetentionFor(tick)))
	safely(s.log, "EnqueueErrorHandler", func() { h(cp, opts, err) })
}

// Start starts enqueueing ticks and returns at once. It returns an error
// wrapping ErrInvalidConfig for bad SchedulerOpts, ErrSchedulerClosed after
// Shutdown, and an error when the scheduler is already running.
//
// At Start every entry is considered as if the scheduler had been down
// until now: see MisfirePolicy. When the broker implements broker.Registry
// the scheduler also publishes its entries (for the CLI) every 5 seconds; a
// failure to publish is logged and does not stop the scheduler.
func (s *Scheduler) Start() error {
	if s.optsErr != nil {
		return s.optsErr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case 1:
		return errors.New("tide: scheduler already started")
	case 2:
		return ErrSchedulerClosed
	}
	s.state = 1
	s.cron.Start()
	s.log.Info("tide: scheduler started", "scheduler", s.opts.SchedulerID, "entries", s.cron.Len())
	return nil
}

// Run starts the scheduler, waits for SIGINT or SIGTERM, then shuts it
// down. It returns nil after a signal, or Start's error.
func (s *Scheduler) Run() error { return runUntilSignal(s.log, s.Start, s.Shutdown) }

// Shutdown stops the scheduler and returns when its goroutines have
// exited. An enqueue in flight is allowed to finish (it is bounded by a
// 5-second timeout), and so is a call of EnqueueErrorHandler. Ticks that
// come later are left to the other replicas, if any. Shutdown is idempotent
// and safe to call from any goroutine, also on a scheduler that never
// started.
func (s *Scheduler) Shutdown() {
	s.mu.Lock()
	was := s.state
	s.state = 2
	s.mu.Unlock()
	if was == 1 {
		s.cron.Stop()
		s.log.Info("tide: scheduler stopped", "scheduler", s.opts.SchedulerID)
	}
}
