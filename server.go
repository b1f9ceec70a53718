package tide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/engine"
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
}

// NewServer returns a server that processes tasks from b with cfg. An invalid
// cfg is reported by Start. NewServer panics if b is nil.
func NewServer(b broker.Broker, cfg Config) *Server {
	if b == nil {
		panic("tide: NewServer: nil broker")
	}
	s := &Server{b: b, now: clockOf(b)}
	s.cfg, s.cfgErr = cfg.withDefaults()
	s.log = s.cfg.Logger
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

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
	switch {
	case c.ShutdownTimeout == 0:
		c.ShutdownTimeout = 10 * time.Second
	case c.ShutdownTimeout < 0:
		bad("ShutdownTimeout %v is negative", c.ShutdownTimeout)
	}
	if c.RetryDelayFunc == nil {
		c.RetryDelayFunc = DefaultRetryDelay
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ServerID == "" {
		c.ServerID = fmt.Sprintf("%s:%d:%s", hostname(), os.Getpid(), newID()[:8])
	}
	return c, errors.Join(errs...)
}

// Start starts processing tasks with h and returns at once. It returns an
// error wrapping ErrInvalidConfig for a bad Config, ErrServerClosed after
// Shutdown, and an error when the server is already running. Start panics
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
	s.handler = h
	s.eng = engine.New(engine.Config{
		Broker:      s.b,
		Queues:      s.cfg.Queues,
		Strict:      s.cfg.StrictPriority,
		Concurrency: s.cfg.Concurrency,
		Lease:       s.cfg.LeaseDuration,
		Shutdown:    s.cfg.ShutdownTimeout,
		Owner:       s.cfg.ServerID,
		Logger:      s.log,
		Run:         s.run,
		Now:         s.now,
		Info: broker.ServerInfo{
			Host: hostname(), PID: os.Getpid(), Concurrency: s.cfg.Concurrency,
			Queues: s.cfg.Queues, Strict: s.cfg.StrictPriority, StartedAt: time.Now(),
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
	// Listen before starting: a signal that arrives as soon as the server
	// has started must still shut it down gracefully.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	if err := s.Start(h); err != nil {
		return err
	}
	got := <-sig
	s.log.Info("tide: signal received; shutting down", "signal", got.String())
	s.Shutdown()
	return nil
}

// Shutdown stops fetching tasks, waits up to ShutdownTimeout for in-flight
// tasks, requeues the ones still running (without using up a retry), writes
// every outcome and returns when all of the server's goroutines have exited.
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
	s.log.Info("tide: server stopped", "server", s.cfg.ServerID)
}

// run processes one delivery: it builds the task and its context, calls the
// handler with panics recovered, and decides the outcome.
func (s *Server) run(ctx context.Context, d *broker.Delivery) broker.Settlement {
	m := d.Message
	t := &Task{typ: m.Type, payload: m.Payload, headers: m.Headers}
	ctx = withTaskMeta(ctx, &taskMeta{
		id: m.ID, queue: m.Queue, retried: m.Retried, maxRetry: m.MaxRetry, due: m.ProcessAt, b: s.b,
		lease: broker.LeaseRef{Queue: m.Queue, ID: m.ID, Token: d.Token},
	})
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
	err := s.call(ctx, t)
	now := s.now()
	if err == nil {
		return broker.Settlement{Outcome: broker.OutcomeDone, At: now}
	}
	if cause := context.Cause(ctx); errors.Is(cause, engine.ErrShutdown) {
		// Cut off by Shutdown: the engine requeues the task without using a
		// retry; it is not a failure of the task.
		s.log.Info("tide: task interrupted by shutdown; requeued", "type", m.Type, "queue", m.Queue, "id", m.ID)
		return broker.Settlement{Outcome: broker.OutcomeRequeue, At: now}
	}
	if s.cfg.ErrorHandler != nil {
		s.safely("ErrorHandler", func() { s.cfg.ErrorHandler(ctx, t, err) })
	}
	msg := err.Error()
	if len(msg) > maxErrLen {
		msg = msg[:maxErrLen] + "…(truncated)"
	}
	attrs := []any{"type", m.Type, "queue", m.Queue, "id", m.ID, "retried", m.Retried, "err", msg}
	switch {
	case errors.Is(err, SkipRetry):
		s.log.Warn("tide: task failed with SkipRetry; archived", attrs...)
		return broker.Settlement{Outcome: broker.OutcomeArchive, Err: msg, At: now}
	case m.Retried >= m.MaxRetry:
		s.log.Warn("tide: task failed with no retries left; archived", attrs...)
		return broker.Settlement{Outcome: broker.OutcomeArchive, Err: msg, At: now}
	case !m.Deadline.IsZero() && !now.Before(m.Deadline):
		s.log.Warn("tide: task failed after its deadline; archived", attrs...)
		return broker.Settlement{Outcome: broker.OutcomeArchive, Err: msg, At: now}
	}
	delay := DefaultRetryDelay(m.Retried+1, err, t)
	s.safely("RetryDelayFunc", func() { delay = s.cfg.RetryDelayFunc(m.Retried+1, err, t) })
	if delay < 0 {
		delay = 0
	}
	s.log.Info("tide: task failed; will retry", append(attrs, "in", delay)...)
	return broker.Settlement{Outcome: broker.OutcomeRetry, Err: msg, At: now, RetryAt: now.Add(delay)}
}

// call runs the handler, turning a panic into an error with its stack.
func (s *Server) call(ctx context.Context, t *Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return s.handler.ProcessTask(ctx, t)
}

// safely calls a user callback, logging (not propagating) a panic.
func (s *Server) safely(what string, f func()) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("tide: "+what+" panicked", "panic", fmt.Sprint(r))
		}
	}()
	f()
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
