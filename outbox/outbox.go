package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
)

// Errors of this package. Errors about a task itself wrap tide.ErrInvalidTask
// instead.
var (
	// ErrInvalidArgument is wrapped by the error of a call given a nil
	// database, transaction or client, an invalid Dialect, table name or
	// option value.
	ErrInvalidArgument = errors.New("outbox: invalid argument")
	// ErrCorruptRow is wrapped by the error recorded for (and logged about)
	// an outbox row whose stored fields cannot be read back as a task. The
	// row is kept, marked failed, and listed by Failed.
	ErrCorruptRow = errors.New("outbox: corrupt row")
)

// Row kinds.
const (
	kindEnqueue = 1
	kindCancel  = 2
)

// Defaults of the options.
const (
	// DefaultTable is the outbox table's name.
	DefaultTable = "tide_outbox"
	// DefaultBatchSize is how many rows a relay claims at a time.
	DefaultBatchSize = 100
	// DefaultPollInterval is how often a PostgreSQL relay looks at the table
	// when no notification came; DefaultMySQLPollInterval is how often a
	// MySQL relay does.
	DefaultPollInterval      = 2 * time.Second
	DefaultMySQLPollInterval = 100 * time.Millisecond
	// DefaultClaimTimeout is how long a relay holds the rows it claimed
	// before another relay may take them over.
	DefaultClaimTimeout = 30 * time.Second
	// DefaultConcurrency is how many rows of a batch a relay sends to Redis
	// at once.
	DefaultConcurrency = 16
)

// Option configures an Outbox (New). Options are immutable values.
type Option func(*config) error

type config struct {
	table        string
	logger       *slog.Logger
	batch        int
	poll         time.Duration
	claimTimeout time.Duration
	concurrency  int
	onRelayed    func(Relayed)
}

// WithTable names the outbox table (default DefaultTable): 1 to 48 bytes of
// lower-case letters, digits and underscores, not starting with a digit.
// Reserved words ("order") are fine: every statement quotes the name.
// Several outboxes may share a database under different tables. On
// PostgreSQL the name is also the notification channel.
func WithTable(name string) Option {
	return func(c *config) error {
		if err := checkTable(name); err != nil {
			return err
		}
		c.table = name
		return nil
	}
}

// WithLogger sets the logger the relay reports to (default slog.Default()).
// Log records name rows, queues, task IDs and types, never payloads.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidArgument)
		}
		c.logger = l
		return nil
	}
}

// WithBatchSize sets how many rows a relay claims in one statement (default
// DefaultBatchSize, 1 to 10000).
func WithBatchSize(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 10000 {
			return fmt.Errorf("%w: batch size %d: want 1 to 10000", ErrInvalidArgument, n)
		}
		c.batch = n
		return nil
	}
}

// WithPollInterval sets how often the relay looks at the table when nothing
// woke it (default DefaultPollInterval on PostgreSQL, where notifications
// wake it at once, and DefaultMySQLPollInterval on MySQL). It must be
// between 1ms and 1h.
func WithPollInterval(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond || d > time.Hour {
			return fmt.Errorf("%w: poll interval %v: want 1ms to 1h", ErrInvalidArgument, d)
		}
		c.poll = d
		return nil
	}
}

// WithClaimTimeout sets how long a relay holds the rows it claimed (default
// DefaultClaimTimeout, 1s to 1h). A relay that dies leaves its rows to the
// others once it passes; a live relay gives up on a batch's Redis calls after
// half of it. Sending a row twice is harmless (see the package doc), so a
// short timeout only costs duplicate work.
func WithClaimTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second || d > time.Hour {
			return fmt.Errorf("%w: claim timeout %v: want 1s to 1h", ErrInvalidArgument, d)
		}
		c.claimTimeout = d
		return nil
	}
}

// WithConcurrency sets how many rows of a batch a relay sends to Redis at
// once (default DefaultConcurrency, 1 to 1024). Rows of one task (the same
// queue and ID) are never in one batch, so their order is kept whatever the
// concurrency.
func WithConcurrency(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 1024 {
			return fmt.Errorf("%w: concurrency %d: want 1 to 1024", ErrInvalidArgument, n)
		}
		c.concurrency = n
		return nil
	}
}

// OnRelayed registers f to be called after each row reached Redis (an
// enqueue stored or recognised as already stored, a cancel carried out or
// found nothing to cancel), before the row is deleted. It is for metrics:
// f is called from the relay's goroutines, concurrently, and must be quick.
func OnRelayed(f func(Relayed)) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: nil OnRelayed func", ErrInvalidArgument)
		}
		c.onRelayed = f
		return nil
	}
}

// Relayed describes a row a relay moved into tide (see OnRelayed).
type Relayed struct {
	Row    int64  // the row's ID in the outbox table
	Queue  string // the task's queue
	ID     string // the task's ID (the broker's choice for a Unique task enqueued without TaskID)
	Type   string // the task's type; empty for a cancel
	Cancel bool   // a cancel (Delete after the task was relayed), not an enqueue
	// Duplicate is set for a Unique task that tide refused because an
	// identical task holds the lock (tide.ErrDuplicateTask): nothing was
	// stored, as Unique asks, and ID is the row's (empty without TaskID).
	Duplicate bool
	At        time.Time // when the relay saw the outcome
}

// Outbox writes tasks into an outbox table within the caller's
// transactions and relays committed rows into tide. It is safe for
// concurrent use, including several Relay calls at once. Create one with
// New; methods on a nil *Outbox panic, and no method panics otherwise.
type Outbox struct {
	db  *sql.DB
	d   Dialect
	cfg config

	// testing hooks
	afterSend func(row int64) error
}

// New returns an Outbox on db in dialect d. It does not touch the
// database; call Migrate to create the table. The error wraps
// ErrInvalidArgument when db is nil, d is invalid or an option is.
func New(db *sql.DB, d Dialect, opts ...Option) (*Outbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidArgument)
	}
	if !d.valid() {
		return nil, fmt.Errorf("%w: dialect %s: use outbox.Postgres or outbox.MySQL", ErrInvalidArgument, d)
	}
	c := config{table: DefaultTable, logger: slog.Default(), batch: DefaultBatchSize, poll: DefaultPollInterval,
		claimTimeout: DefaultClaimTimeout, concurrency: DefaultConcurrency}
	if d == MySQL {
		c.poll = DefaultMySQLPollInterval
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrInvalidArgument)
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return &Outbox{db: db, d: d, cfg: c}, nil
}

// Table returns the outbox table's name, unquoted: quote it in SQL of your
// own ("order" on PostgreSQL, `order` on MySQL).
func (o *Outbox) Table() string { return o.cfg.table }

// Migrate creates the outbox table and its index unless they exist. It is
// idempotent and safe to run from several processes at once.
func (o *Outbox) Migrate(ctx context.Context) error {
	return migrate(ctx, o.db, o.d, o.cfg.table, outboxSchema(o.d, o.cfg.table))
}

func migrate(ctx context.Context, db *sql.DB, d Dialect, table string, stmts []string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", table, err)
	}
	defer func() { _ = tx.Rollback() }()
	if d.pg() {
		// CREATE ... IF NOT EXISTS races with itself; serialise.
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "tide-outbox-migrate:"+table); err != nil {
			return fmt.Errorf("outbox: migrate %s: %w", table, err)
		}
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("outbox: migrate %s: %w", table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", table, err)
	}
	return nil
}

// Enqueue records task, with opts over the task's own options, in tx: the
// task reaches tide when, and only when, tx commits (once a relay runs).
// Options are resolved now, as tide.Prepare does: a ProcessIn delay counts
// from this call, not from the relay. tide.WaitForReplicas is refused.
//
// The returned TaskInfo is the task as it will be stored. Its ID is the
// TaskID option's, or one chosen here, so that Delete can name it, except
// for a task with tide.Unique and no TaskID: on a queue with several
// partitions the broker must choose the ID of such a task, so ID is empty
// and the task cannot be deleted through the outbox. IdempotencyKey is the
// option's, or a random key chosen here ("outbox:..."), under which the
// relay stores the task: a row sent twice (a relay died after Redis took
// the task but before it deleted the row) is recognised and stored once.
// The broker remembers a key for its idempotency window (24 hours by
// default), so rows must be relayed within it.
//
// The error wraps tide.ErrInvalidTask for a nil or invalid task or option
// and ErrInvalidArgument for a nil tx; otherwise it is the database's.
// Enqueue never commits or rolls back tx.
func (o *Outbox) Enqueue(ctx context.Context, tx *sql.Tx, task *tide.Task, opts ...tide.Option) (*tide.TaskInfo, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: Enqueue: nil *sql.Tx", ErrInvalidArgument)
	}
	info, err := tide.Prepare(task, opts...)
	if err != nil {
		return nil, fmt.Errorf("outbox: enqueue: %w", err)
	}
	if info.ID == "" && info.UniqueKey == "" {
		info.ID = broker.NewID()
		if info.Group != "" {
			// As the brokers draw a grouped task's ID: tagged with its
			// group, so it goes on a queue of any partition count.
			info.ID += "{" + info.Group + "}"
		}
	}
	if info.IdempotencyKey == "" {
		info.IdempotencyKey = "outbox:" + broker.NewID() + broker.NewID()
	}
	data, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("outbox: enqueue %s: encode: %w", info.Type, err)
	}
	var taskID any
	if info.ID != "" {
		taskID = []byte(info.ID)
	}
	if err := o.insert(ctx, tx, kindEnqueue, info.Queue, taskID, data); err != nil {
		return nil, fmt.Errorf("outbox: enqueue %s: %w", info.Type, err)
	}
	return info, nil
}

// insert writes a row and, on PostgreSQL, notifies the relays (delivered at
// commit; PostgreSQL folds a transaction's identical notifications into
// one).
func (o *Outbox) insert(ctx context.Context, tx *sql.Tx, kind int, queue string, taskID any, info []byte) error {
	t := o.d.quote(o.cfg.table)
	var err error
	if o.d.pg() {
		_, err = tx.ExecContext(ctx, `WITH ins AS (INSERT INTO `+t+` (kind, queue, task_id, info) VALUES ($1, $2, $3, $4) RETURNING id)
SELECT pg_notify($5, '') FROM ins`, kind, queue, taskID, info, o.cfg.table)
	} else {
		_, err = tx.ExecContext(ctx, `INSERT INTO `+t+` (kind, queue, task_id, info) VALUES (?, ?, ?, ?)`, kind, queue, taskID, info)
	}
	return err
}

// Delete cancels, within tx, the task with the given queue and ID that an
// earlier (committed, or this same) transaction enqueued through the
// outbox:
//
//   - Outbox rows of the task that no relay has handed to Redis yet are
//     removed: they will never reach tide. ok is true when at least one row
//     was removed.
//   - A cancel row is recorded in every case, because an earlier row of the
//     task may have reached Redis already (relayed rows leave the table, so
//     the table cannot tell). After tx commits, a relay calls tide's
//     Client.Cancel for the task, once every earlier row of the task has
//     been relayed: a waiting task is deleted, a running one cancelled. A
//     task that does not exist (it ran already, or never reached Redis) is
//     not an error.
//
// Nothing happens if tx rolls back. The error wraps tide.ErrInvalidTask for
// an invalid queue name or ID and ErrInvalidArgument for a nil tx; a
// database error (on MySQL this includes being chosen as a deadlock victim
// when a relay touches the same rows) means tx should be rolled back and
// retried, as for any statement in it.
func (o *Outbox) Delete(ctx context.Context, tx *sql.Tx, queue, id string) (ok bool, err error) {
	if tx == nil {
		return false, fmt.Errorf("%w: Delete: nil *sql.Tx", ErrInvalidArgument)
	}
	if err := tide.ValidateQueueName(queue); err != nil {
		return false, fmt.Errorf("outbox: delete: %w", err)
	}
	if err := validateID(id); err != nil {
		return false, fmt.Errorf("outbox: delete: %w", err)
	}
	t, d := o.d.quote(o.cfg.table), o.d
	res, err := tx.ExecContext(ctx, `DELETE FROM `+t+` WHERE queue = `+d.ph(1)+` AND task_id = `+d.ph(2)+
		` AND kind = 1 AND attempts = 0 AND failed_at IS NULL`, queue, []byte(id))
	if err != nil {
		return false, fmt.Errorf("outbox: delete %s/%s: %w", queue, id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("outbox: delete %s/%s: %w", queue, id, err)
	}
	if err := o.insert(ctx, tx, kindCancel, queue, []byte(id), []byte("{}")); err != nil {
		return false, fmt.Errorf("outbox: delete %s/%s: record the cancel: %w", queue, id, err)
	}
	return n > 0, nil
}

// validateID checks a task ID as tide.TaskID does.
func validateID(id string) error {
	if _, err := tide.Prepare(tide.NewTask("outbox:check", nil), tide.TaskID(id)); err != nil {
		return err
	}
	return nil
}
