package tide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/engine"
	"github.com/tidequeue/tide/internal/outbound"
	"github.com/tidequeue/tide/tidetype"
)

// Config configures a Server. The zero Config is valid: every field has a
// documented default. NewServer checks the values; Start reports a bad one
// with an error wrapping ErrInvalidConfig.
type Config struct {
	// Concurrency is how many tasks the server processes at once.
	// Default 10. Must not be negative.
	Concurrency int

	// Queues maps the queues to serve to their weights. With StrictPriority
	// false a queue with weight 6 is tried first three times as often as one
	// with weight 2; with StrictPriority true a queue is served only when all
	// heavier queues are empty. Default: {"default": 1}. Weights must be
	// positive and names valid (see ValidateQueueName).
	Queues map[string]int

	// StrictPriority serves queues strictly by weight. Default false.
	StrictPriority bool

	// LeaseDuration is how long a task stays leased to this server without a
	// renewal. The server renews leases every third of it while handlers run;
	// when a server dies its tasks are recovered and retried once this much
	// time has passed. Default 30s; at least 300ms.
	//
	// A server that cannot renew a lease (Redis unreachable, renewals
	// hanging) cancels the handler's context, with the cause ErrLeaseLost,
	// nine tenths of LeaseDuration after it sent the last request that
	// granted or renewed the lease, whether or not a renewal is still
	// waiting for its answer. The lease cannot expire on Redis before send
	// + LeaseDuration on Redis's clock; the tenth held back covers clock
	// rates that differ by up to 1% between the server's host and Redis's
	// (NTP keeps each within 0.05%) and leaves the handler at least 9% of
	// LeaseDuration (27ms at the minimum, 2.7s at the default) to return
	// before the task can be recovered and started elsewhere. So a handler
	// that returns promptly once its context is done never overlaps the
	// task's next delivery, and QueueLimits hold also when a server is cut
	// off; a handler slower to stop than that margin needs a longer
	// LeaseDuration. The settlement of a task stopped this way is
	// discarded and the task is retried after its lease expires.
	LeaseDuration time.Duration

	// ShutdownTimeout is how long Shutdown lets in-flight tasks finish. Tasks
	// still running then have their context cancelled and go back to pending
	// without using up a retry. Default 10s; 0 keeps the default, a negative
	// value is invalid.
	ShutdownTimeout time.Duration

	// RetryDelayFunc returns the delay before retrying a failed task.
	// Default DefaultRetryDelay (exponential back-off with jitter); see also
	// RetrySchedule and NotificationRetryDelay.
	RetryDelayFunc RetryDelayFunc

	// NotifySecret signs the POSTs of NotifyURL notifications with the
	// Tide-Signature header of webhook tasks, which receivers check with
	// webhook.Verify (see NotifyURL). Default: empty, the POSTs are not
	// signed. A secret shorter than 16 bytes makes Start fail with
	// ErrInvalidConfig (webhook secrets have the same minimum).
	NotifySecret string

	// NotifyAllowPrivate lets NotifyURL notifications connect to loopback,
	// private, link-local, shared (CGNAT) and other non-public addresses,
	// such as 127.0.0.1 or the metadata address 169.254.169.254. Default
	// false: such an address is refused, checked on the address dialled
	// after DNS resolution (so also a name that resolves to one), and the
	// notification archived with the reason. Set it only when the
	// receivers are inside your network and whoever enqueues tasks (the
	// gateway's clients included) may make this server call them.
	NotifyAllowPrivate bool

	// NotifyAllowedHosts, when not empty, are the only hosts NotifyURL
	// notifications may go to, redirects included: "hooks.example.com"
	// (that host, any port), "hooks.example.com:8443" (that host and
	// port), "*.example.com" (any subdomain of example.com, not
	// example.com itself) or an IP literal ("10.0.0.5", "[::1]:8080");
	// names are compared case-insensitively. A notification to another
	// host is archived with the reason. Default: empty, any host (public
	// unless NotifyAllowPrivate). An invalid entry makes Start fail with
	// ErrInvalidConfig.
	NotifyAllowedHosts []string

	// ErrorHandler, when set, is called with every error a handler returns
	// (including recovered panics), before the task is retried or archived.
	// It is called concurrently from worker goroutines.
	ErrorHandler func(ctx context.Context, t *Task, err error)

	// Logger receives the server's logs. Default slog.Default(). Payloads are
	// never logged.
	Logger *slog.Logger

	// ServerID names this server in partition claims and logs. It must be
	// unique among live servers. Default: host name, process ID and a random
	// suffix.
	ServerID string

	// QueueLimits maps queue names to limits that hold across all servers
	// together (see QueueLimits). Start writes each entry to the broker
	// (as Inspector.SetQueueLimits does), replacing what was recorded, and
	// fails if it cannot; the broker must implement broker.Admin. Queues
	// without an entry keep the limits recorded in the broker. Servers that
	// declare different limits for a queue overwrite each other at Start:
	// the last one started wins. Default: none. Names must be valid and
	// limits valid (see Inspector.SetQueueLimits).
	QueueLimits map[string]QueueLimits
}

// maxErrLen bounds the error text stored with a failed task.
const maxErrLen = 16 << 10

// Server processes tasks from a broker. Start it with a Handler (usually a
// ServeMux); stop it with Shutdown. A Server is safe for concurrent use and is
// not restartable: after Shutdown, Start returns ErrServerClosed.
type Server struct {
	b      broker.Broker
	now    func() time.Time // the broker's clock (see clockOf)
	cfg    Config
	cfgErr error
	log    *slog.Logger

	mu      sync.Mutex
	state   int // 0 new, 1 running, 2 closed
	eng     *engine.Engine
	handler Handler
	notify  *outbound.Sender // sends NotifyURL notifications
}

// NewServer returns a server that processes tasks from b with cfg. An invalid
// cfg is reported by Start. NewServer panics if b is nil.
func NewServer(b broker.Broker, cfg Config) *Server {
	if b == nil {
		panic("tide: NewServer: nil broker")
	}
	s := &Server{b: b, now: clockOf(b)}
	s.cfg, s.cfgErr = cfg.withDefaults()
	notify, err := s.cfg.notifySender()
	s.notify, s.cfgErr = notify, errors.Join(s.cfgErr, err)
	s.log = s.cfg.Logger
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// minNotifySecret is the shortest Config.NotifySecret accepted, in bytes,
// as webhook.MinSecretLength.
const minNotifySecret = 16

func (c Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.Concurrency < 0 {
		bad("Concurrency %d is negative", c.Concurrency)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 10
	}
	if len(c.Queues) == 0 {
		c.Queues = map[string]int{DefaultQueue: 1}
	} else {
		qs := make(map[string]int, len(c.Queues))
		for q, w := range c.Queues {
			if err := ValidateQueueName(q); err != nil {
				bad("Queues: %v", err)
			}
			if w <= 0 {
				bad("Queues[%q] weight %d must be positive", q, w)
			}
			qs[q] = w
		}
		c.Queues = qs
	}
	switch {
	case c.LeaseDuration == 0:
		c.LeaseDuration = 30 * time.Second
	case c.LeaseDuration < 300*time.Millisecond:
		bad("LeaseDuration %v is under the 300ms minimum", c.LeaseDuration)
	}
	if c.NotifySecret != "" && len(c.NotifySecret) < minNotifySecret {
		bad("NotifySecret is %d bytes, under the %d-byte minimum (use 32 random bytes: openssl rand -hex 32)", len(c.NotifySecret), minNotifySecret)
	}
	switch {
	case c.ShutdownTimeout == 0:
		c.ShutdownTimeout = 10 * time.Second
	case c.ShutdownTimeout < 0:
		bad("ShutdownTimeout %v is negative", c.ShutdownTimeout)
	}
	if len(c.QueueLimits) > 0 {
		ls := make(map[string]QueueLimits, len(c.QueueLimits))
		for q, l := range c.QueueLimits {
			if err := ValidateQueueName(q); err != nil {
				bad("QueueLimits: %v", err)
			}
			if err := broker.CheckQueueLimits(l); err != nil {
				bad("QueueLimits[%q]: %w", q, err)
			}
			ls[q] = l
		}
		c.QueueLimits = ls
	}
	if c.RetryDelayFunc == nil {
		c.RetryDelayFunc = DefaultRetryDelay
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ServerID == "" {
		c.ServerID = fmt.Sprintf("%s:%d:%s", hostname(), os.Getpid(), broker.NewID()[:8])
	}
	return c, errors.Join(errs...)
}

// Start starts processing tasks with h and returns at once. It returns an
// error wrapping ErrInvalidConfig for a bad Config, an error wrapping
// ErrLayout when a served queue's partition count recorded in the broker
// differs from this process's configuration (nothing of it would settle),
// the error of writing Config.QueueLimits (an unreachable broker),
// ErrServerClosed after Shutdown, and an error when the server is already
// running. A broker that cannot be reached does not stop Start (the server
// keeps trying) unless Config.QueueLimits has limits to write. Start panics
// if h is nil.
func (s *Server) Start(h Handler) error {
	if h == nil {
		panic("tide: Server.Start: nil handler")
	}
	if s.cfgErr != nil {
		return s.cfgErr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case 1:
		return errors.New("tide: server already started")
	case 2:
		return ErrServerClosed
	}
	if err := s.checkLayouts(); err != nil {
		return err
	}
	if err := s.writeLimits(); err != nil {
		return err
	}
	s.handler = h
	s.eng = engine.New(engine.Config{
		Broker:          s.b,
		Queues:          s.cfg.Queues,
		StrictPriority:  s.cfg.StrictPriority,
		Concurrency:     s.cfg.Concurrency,
		LeaseDuration:   s.cfg.LeaseDuration,
		ShutdownTimeout: s.cfg.ShutdownTimeout,
		ServerID:        s.cfg.ServerID,
		Logger:          s.log,
		Run:             s.run,
		Now:             s.now,
		Repair:          s.repairFlows,
		RepairEvery:     repairEvery,
		Info: tidetype.ServerInfo{
			Host: hostname(), PID: os.Getpid(), Concurrency: s.cfg.Concurrency,
			Queues: s.cfg.Queues, StrictPriority: s.cfg.StrictPriority, StartedAt: time.Now(),
		},
	})
	s.eng.Start()
	s.state = 1
	s.log.Info("tide: server started", "server", s.cfg.ServerID, "concurrency", s.cfg.Concurrency, "queues", len(s.cfg.Queues))
	return nil
}

// Run starts the server with h, waits for SIGINT or SIGTERM, then shuts down
// gracefully. It returns nil after a signal, or Start's error.
func (s *Server) Run(h Handler) error {
	return runUntilSignal(s.log, func() error { return s.Start(h) }, s.Shutdown)
}

// Shutdown stops fetching tasks, waits up to ShutdownTimeout for in-flight
// tasks, requeues the ones still running (without using up a retry), writes
// every settlement, gives up its partition claims (another server maintains
// them at once) and returns when all of the server's goroutines have exited.
// It is idempotent and safe to call from any goroutine.
func (s *Server) Shutdown() {
	s.mu.Lock()
	eng := s.eng
	was := s.state
	s.state = 2
	s.mu.Unlock()
	if was != 1 {
		return
	}
	eng.Stop()
	s.notify.CloseIdleConnections()
	s.log.Info("tide: server stopped", "server", s.cfg.ServerID)
}

// layoutCheckTimeout bounds Start's look at the queues' partition counts.
const layoutCheckTimeout = 5 * time.Second

// checkLayouts asks the broker for every served queue's partition count, so
// that a process configured with another count fails at Start instead of
// running tasks it cannot settle. An unreachable broker is no reason to fail.
func (s *Server) checkLayouts() error {
	ctx, cancel := context.WithTimeout(context.Background(), layoutCheckTimeout)
	defer cancel()
	for q := range s.cfg.Queues {
		if _, err := s.b.Partitions(ctx, q); err != nil {
			if errors.Is(err, ErrLayout) || errors.Is(err, ErrClosed) {
				return err
			}
			if !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			s.log.Warn("tide: broker unreachable at start; the server keeps trying", "queue", q, "err", err)
			return nil
		}
	}
	return nil
}

// writeLimits records Config.QueueLimits in the broker. Unlike a layout
// check it must succeed: a server that ran without the limits written could
// exceed them.
func (s *Server) writeLimits() error {
	if len(s.cfg.QueueLimits) == 0 {
		return nil
	}
	a := s.b
	ctx, cancel := context.WithTimeout(context.Background(), layoutCheckTimeout)
	defer cancel()
	for q, l := range s.cfg.QueueLimits {
		if err := a.SetQueueLimits(ctx, q, l); err != nil {
			return fmt.Errorf("tide: server start: queue limits of %q: %w", q, err)
		}
	}
	return nil
}

// run processes one delivery: it builds the task and its context, calls the
// handler with panics recovered, and settles the attempt. decide alone
// chooses the settlement; callbacks and the log line follow it and never
// contradict it.
func (s *Server) run(ctx context.Context, d *broker.Delivery) (broker.Settlement, bool) {
	m := d.Task
	// The task, its metadata and its durable records in one allocation.
	r := &struct {
		t    Task
		meta taskMeta
		dur  durState
	}{
		t: Task{typ: m.Type, payload: m.Payload, headers: m.Headers},
		meta: taskMeta{
			id: m.ID, queue: m.Queue, group: m.Group, retried: m.Retried, maxRetry: m.MaxRetry, due: m.NextProcessAt, b: s.b,
			lease: d.Lease(), flow: m.Headers[flowHeader], step: m.Headers[stepHeader],
		},
		dur: durState{loaded: d.StepsLoaded, recs: d.Steps},
	}
	t := &r.t
	r.meta.dur = &r.dur
	ctx = withTaskMeta(ctx, &r.meta)
	if m.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.Timeout)
		defer cancel()
	}
	if !m.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, m.Deadline)
		defer cancel()
	}
	var err error
	switch {
	case (m.Type == NotifyType || m.Type == FlowType) && !d.Internal:
		// Enqueue refuses these types; one that is here anyway (written
		// to the store directly, or stored before the refusal existed)
		// is not run: it could forge a workflow step's end or send a
		// signed notification of the sender's choosing.
		err = fmt.Errorf("tide: a %s task that tide did not store itself is never run: %w", m.Type, SkipRetry)
	case m.Type == NotifyType:
		err = s.deliverNotification(ctx, m.Queue, t)
	case m.Type == FlowType:
		err = s.advanceFlow(ctx, m.Queue, t)
	default:
		if err = s.flowLive(ctx, m); err == nil {
			if err = loadBatch(ctx); err == nil {
				err = s.call(ctx, t)
			}
		}
	}
	now := s.now()
	var park *suspension
	if meta, ok := metaFrom(ctx); ok {
		park = meta.already()
	}
	set, why := decide(m, err, context.Cause(ctx), now, park)
	if set.Kind == broker.SettleDone {
		// The common case logs nothing: no attributes are built for it.
		return set, true
	}
	attrs := []any{"type", m.Type, "queue", m.Queue, "id", m.ID, "retried", m.Retried}
	switch set.Kind {
	case 0:
		s.log.Warn("tide: lease lost while the task ran; its settlement is discarded (the task was recovered)", attrs...)
		return set, false
	case broker.SettleRequeue:
		s.log.Info("tide: task interrupted by shutdown; requeued", attrs...)
		return set, true
	case broker.SettleDefer:
		s.log.Info("tide: task deferred by its handler; runs again later, no retry used", append(attrs, "in", set.RetryAt.Sub(now))...)
		return set, true
	case broker.SettlePark:
		s.log.Debug("tide: durable handler parked", append(attrs, "waiting_for", set.WaitFor, "until", set.RetryAt)...)
		return set, true
	}
	if s.cfg.ErrorHandler != nil {
		safely(s.log, "ErrorHandler", func() { s.cfg.ErrorHandler(ctx, t, err) })
	}
	attrs = append(attrs, "err", set.Err)
	if set.Kind == broker.SettleArchive {
		s.log.Warn("tide: task failed; archived ("+why+")", attrs...)
		return set, true
	}
	delay := DefaultRetryDelay(m.Retried+1, err, t)
	safely(s.log, "RetryDelayFunc", func() { delay = s.cfg.RetryDelayFunc(m.Retried+1, err, t) })
	// RetryIn: the broker counts the delay on its own clock.
	set.RetryAt, set.RetryIn = now.Add(max(delay, 0)), max(delay, 0)
	s.log.Info("tide: task failed; will retry", append(attrs, "in", max(delay, 0))...)
	return set, true
}

// decide is the one place that decides how an attempt ends, from the
// handler's error and why the handler's context ended, before any callback
// runs or any line is logged. A zero Kind means nothing is written: the
// lease was lost and the task is someone else's now. why says, for an
// archived task, what made it final. park is the park a durable handler
// asked for (Sleep, WaitSignal), or nil: the task is parked when the
// handler returned ErrSuspended, and also when it swallowed it and
// returned nil.
func decide(m *TaskInfo, err, cause error, now time.Time, park *suspension) (set broker.Settlement, why string) {
	set.At = now
	switch {
	case errors.Is(cause, ErrLeaseLost):
		return broker.Settlement{}, ""
	case park != nil && (err == nil || errors.Is(err, ErrSuspended)):
		set.Kind, set.RetryAt, set.WaitFor = broker.SettlePark, park.until, park.wait
		return set, ""
	case err == nil:
		set.Kind = broker.SettleDone
		return set, ""
	case errors.Is(cause, engine.ErrShutdown):
		// Cut off by Shutdown: not a failure of the task.
		set.Kind = broker.SettleRequeue
		return set, ""
	}
	set.Err = err.Error()
	if len(set.Err) > maxErrLen {
		set.Err = set.Err[:maxErrLen] + "…(truncated)"
	}
	set.Kind = broker.SettleArchive
	switch {
	case errors.Is(cause, ErrTaskCanceled):
		set.Err = ErrTaskCanceled.Error() + ": " + set.Err
		return set, "cancelled"
	case errors.Is(err, SkipRetry):
		return set, "SkipRetry"
	case m.Retried >= m.MaxRetry && !isRetryAfter(err):
		return set, "no retries left"
	case !m.Deadline.IsZero() && !now.Before(m.Deadline):
		return set, "past its deadline"
	}
	if d, group, ok := retryAfter(err); ok {
		// The handler asked to wait: no retry is used, even by a task
		// that has none left. The broker counts the wait (and a group's
		// throttle) on its own clock, from when it applies the settlement:
		// a server whose clock was stepped since it last measured the
		// broker's would otherwise end a throttle before it began.
		set.Kind, set.RetryAt, set.RetryIn, set.Throttle = broker.SettleDefer, now.Add(d), d, group && m.Group != ""
		return set, ""
	}
	set.Kind = broker.SettleRetry
	return set, ""
}

func isRetryAfter(err error) bool { _, _, ok := retryAfter(err); return ok }

// call runs the handler, turning a panic into an error with its stack.
func (s *Server) call(ctx context.Context, t *Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return s.handler.ProcessTask(ctx, t)
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}

// PanicError is the error a recovered handler panic becomes. Its message
// includes the panic value and the stack.
type PanicError struct {
	Value any
	Stack []byte
}

// Error returns "tide: handler panic: <value>" followed by the stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("tide: handler panic: %v\n%s", e.Value, e.Stack)
}
