package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/engine"
)

// Attempt states as History records them. The middleware runs before the
// server settles the attempt, so it applies the server's rule to the
// handler's error and the cause of its context; not foreseen, and so
// recorded as StateRetry, is a failed attempt of a task past its
// tide.Deadline (the server archives it).
const (
	StateDone     = "done"     // the handler succeeded
	StateRetry    = "retry"    // failed; the task will be retried
	StateDeferred = "deferred" // the handler asked to run later (tide.RetryAfter); no retry used
	StateArchived = "archived" // failed for good (SkipRetry, no retries left)
	StateCanceled = "canceled" // cancelled (Client.Cancel) and archived
	StateRequeued = "requeued" // cut off by the server's shutdown; runs again
	StateLost     = "lost"     // the lease was lost; another server owns the task
)

// Defaults of the History options.
const (
	// DefaultHistoryTable is the history table's name.
	DefaultHistoryTable = "tide_history"
	// DefaultRetention is how long History keeps an attempt.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultFlushInterval is how often History writes what it buffered.
	DefaultFlushInterval = time.Second
	// DefaultHistoryBuffer is how many attempts History buffers before it
	// drops new ones (counted by Dropped).
	DefaultHistoryBuffer = 10000
	historyBatch         = 500
	maxHistoryErr        = 4096
)

// Attempt is one finished attempt of a task, as History records it.
type Attempt struct {
	Queue    string
	ID       string
	Type     string
	State    string // one of the State constants
	Attempt  int    // retries used so far plus one: 1 for the first (a deferred attempt uses none)
	Error    string // empty on success; at most 4 KiB
	Started  time.Time
	Finished time.Time
	Server   string
}

// HistoryOption configures a History.
type HistoryOption func(*historyConfig) error

type historyConfig struct {
	table     string
	logger    *slog.Logger
	retention time.Duration
	flush     time.Duration
	buffer    int
	server    string
}

// WithHistoryTable names the history table (default DefaultHistoryTable;
// the rules of WithTable apply).
func WithHistoryTable(name string) HistoryOption {
	return func(c *historyConfig) error {
		if err := checkTable(name); err != nil {
			return err
		}
		c.table = name
		return nil
	}
}

// WithRetention sets how long attempts are kept (default DefaultRetention,
// at least a minute); older ones are deleted in the background. 0 keeps
// them forever.
func WithRetention(d time.Duration) HistoryOption {
	return func(c *historyConfig) error {
		if d != 0 && d < time.Minute {
			return fmt.Errorf("%w: retention %v: want 0 (forever) or at least 1m", ErrInvalidArgument, d)
		}
		c.retention = d
		return nil
	}
}

// WithFlushInterval sets how often buffered attempts are written (default
// DefaultFlushInterval, 1ms to 1m). A full batch (500) is written at once.
func WithFlushInterval(d time.Duration) HistoryOption {
	return func(c *historyConfig) error {
		if d < time.Millisecond || d > time.Minute {
			return fmt.Errorf("%w: flush interval %v: want 1ms to 1m", ErrInvalidArgument, d)
		}
		c.flush = d
		return nil
	}
}

// WithHistoryBuffer sets how many attempts may wait to be written (default
// DefaultHistoryBuffer, 1 to 1e6; the writer holds up to one more batch of
// 500 besides). When the database is slow or down and
// the buffer is full, new attempts are dropped, not waited for: history
// never slows task processing.
func WithHistoryBuffer(n int) HistoryOption {
	return func(c *historyConfig) error {
		if n < 1 || n > 1_000_000 {
			return fmt.Errorf("%w: history buffer %d: want 1 to 1000000", ErrInvalidArgument, n)
		}
		c.buffer = n
		return nil
	}
}

// WithServerName sets the server name recorded with each attempt (default
// host:pid).
func WithServerName(name string) HistoryOption {
	return func(c *historyConfig) error {
		if name == "" || len(name) > 256 {
			return fmt.Errorf("%w: server name: want 1 to 256 bytes", ErrInvalidArgument)
		}
		c.server = name
		return nil
	}
}

// WithHistoryLogger sets the logger History reports write failures and
// drops to (default slog.Default()).
func WithHistoryLogger(l *slog.Logger) HistoryOption {
	return func(c *historyConfig) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidArgument)
		}
		c.logger = l
		return nil
	}
}

// History records every finished task attempt in an SQL table, in batches,
// off the task's path (Middleware), and reads them back (Attempts). It is
// safe for concurrent use. Close it to write what is buffered. Create one
// with NewHistory; methods on a nil *History panic, and no method panics
// otherwise (Middleware re-raises a handler's own panic after recording
// the attempt).
type History struct {
	db  *sql.DB
	d   Dialect
	cfg historyConfig

	ch      chan Attempt
	flushes chan chan error
	stop    chan struct{}
	done    chan struct{}
	start   sync.Once
	running atomic.Bool
	closed  atomic.Bool
	dropped atomic.Int64
}

// run starts the writer once.
func (h *History) run() {
	h.start.Do(func() {
		h.running.Store(true)
		go h.loop()
	})
}

// NewHistory returns a History writing to db in dialect d. Call Migrate to
// create its table. The error wraps ErrInvalidArgument for a nil db, an
// invalid dialect or option.
func NewHistory(db *sql.DB, d Dialect, opts ...HistoryOption) (*History, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidArgument)
	}
	if !d.valid() {
		return nil, fmt.Errorf("%w: dialect %s: use outbox.Postgres or outbox.MySQL", ErrInvalidArgument, d)
	}
	host, _ := os.Hostname()
	c := historyConfig{table: DefaultHistoryTable, logger: slog.Default(), retention: DefaultRetention,
		flush: DefaultFlushInterval, buffer: DefaultHistoryBuffer, server: host + ":" + strconv.Itoa(os.Getpid())}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil HistoryOption", ErrInvalidArgument)
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return &History{db: db, d: d, cfg: c, ch: make(chan Attempt, c.buffer), flushes: make(chan chan error),
		stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Migrate creates the history table and its indexes unless they exist. It
// is idempotent.
func (h *History) Migrate(ctx context.Context) error {
	return migrate(ctx, h.db, h.d, h.cfg.table, historySchema(h.d, h.cfg.table))
}

// Middleware returns a tide middleware that records each attempt of every
// task it wraps when the handler returns (or panics: the panic goes on
// after the attempt is recorded). Recording only queues the attempt; a
// background writer stores it within WithFlushInterval.
func (h *History) Middleware() tide.MiddlewareFunc {
	return func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) (err error) {
			started := time.Now()
			defer func() {
				if r := recover(); r != nil {
					h.Record(h.attempt(ctx, t, fmt.Errorf("panic: %v", r), started))
					panic(r)
				}
				h.Record(h.attempt(ctx, t, err, started))
			}()
			return next.ProcessTask(ctx, t)
		})
	}
}

func isRetryAfter(err error) bool {
	var ra *tide.RetryAfterError
	return errors.As(err, &ra)
}

// attempt describes the attempt that just ended with err.
func (h *History) attempt(ctx context.Context, t *tide.Task, err error, started time.Time) Attempt {
	a := Attempt{Type: t.Type(), Started: started, Finished: time.Now(), Server: h.cfg.server, State: StateDone}
	a.ID, _ = tide.GetTaskID(ctx)
	a.Queue, _ = tide.GetQueueName(ctx)
	retried, _ := tide.GetRetryCount(ctx)
	maxRetry, _ := tide.GetMaxRetry(ctx)
	a.Attempt = retried + 1
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, tide.ErrLeaseLost):
		a.State = StateLost
	case err == nil:
		a.State = StateDone
	case errors.Is(cause, engine.ErrShutdown):
		a.State = StateRequeued
	case errors.Is(cause, tide.ErrTaskCanceled):
		a.State = StateCanceled
	case errors.Is(err, tide.SkipRetry):
		a.State = StateArchived
	case isRetryAfter(err):
		a.State = StateDeferred
	case retried >= maxRetry:
		a.State = StateArchived
	default:
		a.State = StateRetry
	}
	if err != nil {
		a.Error = truncate(err.Error(), maxHistoryErr)
	}
	return a
}

// Record queues a finished attempt for writing, as Middleware does; it is
// for attempts seen elsewhere. It never blocks: when the buffer is full the
// attempt is dropped and counted (Dropped). After Close it does nothing.
func (h *History) Record(a Attempt) {
	if h.closed.Load() {
		return
	}
	h.run()
	select {
	case h.ch <- a:
	default:
		if h.dropped.Add(1)%1000 == 1 {
			h.cfg.logger.Warn("outbox: history buffer full; attempts dropped", "table", h.cfg.table, "dropped", h.dropped.Load())
		}
	}
}

// Dropped returns how many attempts were dropped because the buffer was
// full.
func (h *History) Dropped() int64 { return h.dropped.Load() }

// Flush writes every attempt recorded before the call and returns the
// write's error.
func (h *History) Flush(ctx context.Context) error {
	if h.closed.Load() {
		return nil
	}
	h.run()
	reply := make(chan error, 1)
	select {
	case h.flushes <- reply:
	case <-h.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("outbox: history flush: %w", ctx.Err())
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return fmt.Errorf("outbox: history flush: %w", ctx.Err())
	}
}

// Close writes what is buffered (trying for up to 10 seconds) and stops the
// writer; later Records are ignored. It is idempotent.
func (h *History) Close() error {
	if h.closed.Swap(true) {
		return nil
	}
	h.start.Do(func() {}) // nothing recorded yet: no writer to start now
	close(h.stop)
	if h.running.Load() {
		<-h.done
	}
	return nil
}

func (h *History) loop() {
	defer close(h.done)
	log := h.cfg.logger.With("table", h.cfg.table)
	tick := time.NewTicker(h.cfg.flush)
	defer tick.Stop()
	var buf []Attempt
	lastPrune := time.Time{}
	write := func(ctx context.Context) error {
		for len(buf) > 0 {
			n := min(len(buf), historyBatch)
			if err := h.insert(ctx, buf[:n]); err != nil {
				// Keep them for the next try, within the buffer's size.
				if over := len(buf) - h.cfg.buffer; over > 0 {
					buf = buf[over:]
					h.dropped.Add(int64(over))
				}
				return err
			}
			buf = buf[n:]
		}
		buf = nil
		return nil
	}
	drain := func() {
		for {
			select {
			case a := <-h.ch:
				buf = append(buf, a)
			default:
				return
			}
		}
	}
	for {
		select {
		case a := <-h.ch:
			buf = append(buf, a)
			if len(buf) < historyBatch {
				continue
			}
		case reply := <-h.flushes:
			drain()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			reply <- write(ctx)
			cancel()
			continue
		case <-tick.C:
		case <-h.stop:
			drain()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := write(ctx); err != nil {
				log.Error("outbox: history: attempts lost at Close", "err", err, "attempts", len(buf))
			}
			cancel()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := write(ctx); err != nil {
			log.Warn("outbox: history write failed; will retry", "err", err, "attempts", len(buf))
		}
		if h.cfg.retention > 0 && time.Since(lastPrune) > min(max(h.cfg.retention/10, time.Minute), time.Hour) {
			lastPrune = time.Now()
			if err := h.prune(ctx); err != nil {
				log.Warn("outbox: history retention failed", "err", err)
			}
		}
		cancel()
	}
}

func (h *History) insert(ctx context.Context, as []Attempt) error {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + h.d.quote(h.cfg.table) + ` (queue, task_id, task_type, state, attempt, error, started_at, finished_at, server) VALUES `)
	args := make([]any, 0, len(as)*9)
	for i, a := range as {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(h.d.in(len(args)+1, 9))
		args = append(args, a.Queue, []byte(a.ID), []byte(a.Type), a.State, a.Attempt, a.Error, a.Started.UTC(), a.Finished.UTC(), a.Server)
	}
	if _, err := h.db.ExecContext(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("outbox: history: write %d attempts: %w", len(as), err)
	}
	return nil
}

// prune deletes attempts older than the retention, in chunks.
func (h *History) prune(ctx context.Context) error {
	cut := time.Now().Add(-h.cfg.retention).UTC()
	q := `DELETE FROM ` + h.d.quote(h.cfg.table) + ` WHERE finished_at < ? LIMIT 10000`
	if h.d.pg() {
		q = `DELETE FROM ` + h.d.quote(h.cfg.table) + ` WHERE id IN (SELECT id FROM ` + h.d.quote(h.cfg.table) + ` WHERE finished_at < $1 LIMIT 10000)`
	}
	for {
		res, err := h.db.ExecContext(ctx, q, cut)
		if err != nil {
			return fmt.Errorf("outbox: history: delete old attempts: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n < 10000 {
			return err
		}
	}
}

// Attempts returns the recorded attempts of the task with the given queue
// and ID, oldest first (at most the latest 1000). Rows that cannot be read
// are reported as an error naming the row.
func (h *History) Attempts(ctx context.Context, queue, id string) ([]Attempt, error) {
	if err := tide.ValidateQueueName(queue); err != nil {
		return nil, fmt.Errorf("outbox: history: %w", err)
	}
	if err := validateID(id); err != nil {
		return nil, fmt.Errorf("outbox: history: %w", err)
	}
	d := h.d
	rs, err := h.db.QueryContext(ctx, `SELECT id, task_type, state, attempt, error, started_at, finished_at, server FROM `+h.d.quote(h.cfg.table)+
		` WHERE queue = `+d.ph(1)+` AND task_id = `+d.ph(2)+` ORDER BY id DESC LIMIT 1000`, queue, []byte(id))
	if err != nil {
		return nil, fmt.Errorf("outbox: history: read %s/%s: %w", queue, id, err)
	}
	defer rs.Close()
	var out []Attempt
	for rs.Next() {
		var (
			rowID    int64
			typ      []byte
			started  dbTime
			finished dbTime
		)
		a := Attempt{Queue: queue, ID: id}
		if err := rs.Scan(&rowID, &typ, &a.State, &a.Attempt, &a.Error, &started, &finished, &a.Server); err != nil {
			return nil, fmt.Errorf("outbox: history: read %s/%s: row %d: %w", queue, id, rowID, err)
		}
		a.Type, a.Started, a.Finished = string(typ), started.t, finished.t
		out = append(out, a)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: history: read %s/%s: %w", queue, id, err)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// TaskAttempts returns the recorded attempts of the task with the given
// queue and ID, oldest first (at most the latest 1000), in the shape tide
// itself keeps them (tide.Attempt), so that a dashboard or the CLI can show
// them; see dashboard.Options.History. Ended is the attempt's Finished
// time, Err its Error. The State becomes tide's Outcome word:
//
//	StateDone     "done"
//	StateRetry    "retry"
//	StateDeferred "deferred"
//	StateArchived "archive"
//	StateLost     "lease expired"
//	StateCanceled "canceled" (tide archives the task)
//	StateRequeued "requeued" (tide runs it again)
//
// Any other stored state is passed on unchanged. Errors are those of
// Attempts.
func (h *History) TaskAttempts(ctx context.Context, queue, id string) ([]tide.Attempt, error) {
	as, err := h.Attempts(ctx, queue, id)
	if err != nil {
		return nil, err
	}
	out := make([]tide.Attempt, 0, len(as))
	for _, a := range as {
		out = append(out, tide.Attempt{Started: a.Started, Ended: a.Finished, Server: a.Server,
			Outcome: outcomeOf(a.State), Err: a.Error})
	}
	return out, nil
}

// outcomeOf maps a State constant to tide's Outcome word.
func outcomeOf(state string) string {
	switch state {
	case StateArchived:
		return "archive"
	case StateLost:
		return "lease expired"
	}
	return state
}
