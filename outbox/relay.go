package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
)

// maxBackoff bounds the pause after a failure (database or Redis down).
const maxBackoff = 5 * time.Second

// row is a claimed outbox row.
type row struct {
	id       int64
	kind     int
	queue    string
	taskID   []byte // nil for NULL
	info     []byte
	attempts int
}

// outcome of sending a row.
type outcome int

const (
	sent      outcome = iota // reached Redis: delete the row
	transient                // try again later
	permanent                // keep the row, marked failed
)

type result struct {
	out outcome
	err error
}

// Relay moves committed outbox rows into tide through client until ctx
// ends, and then returns nil. Several relays, in one process or many, may
// run on the same table: each row is claimed by one relay at a time (for
// WithClaimTimeout) and deleted once Redis has it. A relay that dies or is
// cut off between Redis and the database leaves its rows to be claimed
// again after the claim timeout; sending them again stores nothing twice
// (see Enqueue's idempotency key).
//
// Rows of one task (same queue and ID) are relayed in the order they were
// written, so that a cancel follows the enqueue it cancels. A row Redis
// refuses for good (tide.ErrInvalidTask, tide.ErrTaskIDConflict: another
// task holds the ID) or that cannot be decoded is kept, marked failed with
// the error, logged, and listed by Failed; it no longer holds back later
// rows of its task. A Unique task refused with tide.ErrDuplicateTask is
// complete (that is what Unique asks for): its row is deleted and the
// refusal logged. Database and Redis failures are logged and retried with
// a growing pause (up to 5s) while Redis or the database is unreachable;
// a row that fails for another reason waits longer after each attempt (up
// to a minute) without holding up the others.
//
// On PostgreSQL with the pgx driver, the relay keeps one connection of db
// listening for the notifications Enqueue and Delete send at commit, and
// polls every WithPollInterval in case one is lost; with another driver it
// only polls. That connection counts against db's limit: allow db at least
// two open connections per relay. Relay returns an error wrapping
// ErrInvalidArgument for a nil client, and the error of a closed client
// (tide.ErrClientClosed).
func (o *Outbox) Relay(ctx context.Context, client *tide.Client) error {
	if client == nil {
		return fmt.Errorf("%w: Relay: nil *tide.Client", ErrInvalidArgument)
	}
	log := o.cfg.logger.With("outbox", o.cfg.table)
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.d.pg() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.listen(ctx, wake, log)
		}()
	}
	backoff := time.Duration(0)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		n, err := o.relayBatch(ctx, client, log)
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case errors.Is(err, tide.ErrClientClosed), errors.Is(err, errAbandon):
			return fmt.Errorf("outbox: relay: %w", err)
		case err != nil:
			backoff = min(max(2*backoff, 50*time.Millisecond), max(maxBackoff, o.cfg.poll))
			wait = backoff
			log.Warn("outbox: relay failed; retrying", "err", err, "retry_in", wait)
		case n == o.cfg.batch:
			backoff = 0
			continue // more may be waiting
		default:
			backoff = 0
			wait = o.cfg.poll
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-wake:
			if err == nil {
				break
			}
			// After a failure, a notification does not cut the pause short.
			select {
			case <-ctx.Done():
				return nil
			case <-timer.C:
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// errNotSent marks the rows of a batch left untried after Redis failed.
var errNotSent = errors.New("outbox: not sent: Redis failed on an earlier row of the batch")

// errAbandon is returned by a test hook to make the relay stop dead, as a
// killed process would: rows it sent are neither deleted nor released.
var errAbandon = errors.New("relay abandoned (test)")

// relayBatch claims up to a batch of rows, sends them and settles them. It
// returns how many rows it claimed.
func (o *Outbox) relayBatch(ctx context.Context, client *tide.Client, log *slog.Logger) (int, error) {
	token := broker.NewID()
	rows, err := o.claim(ctx, token)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	sendCtx, cancel := context.WithTimeout(ctx, o.cfg.claimTimeout/2)
	defer cancel()
	results := make([]result, len(rows))
	var (
		wg      sync.WaitGroup
		sem     = make(chan struct{}, o.cfg.concurrency)
		mu      sync.Mutex
		stopErr error // ErrClientClosed or a hook's errAbandon
		down    bool  // Redis unavailable: do not try the rest
	)
	for i := range rows {
		mu.Lock()
		skip := down || stopErr != nil
		mu.Unlock()
		if skip {
			results[i] = result{transient, errNotSent}
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			r := o.send(sendCtx, client, &rows[i], log)
			if r.out == sent && o.afterSend != nil {
				if err := o.afterSend(rows[i].id); err != nil {
					mu.Lock()
					stopErr = err
					mu.Unlock()
				}
			}
			mu.Lock()
			switch {
			case errors.Is(r.err, tide.ErrClientClosed):
				stopErr = r.err
			case r.out == transient && (errors.Is(r.err, tide.ErrUnavailable) || sendCtx.Err() != nil):
				down = true
			}
			mu.Unlock()
			results[i] = r
		}(i)
	}
	wg.Wait()
	if errors.Is(stopErr, errAbandon) {
		return len(rows), stopErr
	}
	// Settle with a context of its own: rows that reached Redis should be
	// deleted even when the relay is being stopped.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer scancel()
	settleErr := o.settle(sctx, token, rows, results)
	if stopErr != nil {
		return len(rows), stopErr
	}
	if settleErr != nil {
		return len(rows), settleErr
	}
	if down {
		for _, r := range results {
			if r.out == transient && errors.Is(r.err, tide.ErrUnavailable) {
				return len(rows), fmt.Errorf("outbox: send: %w", r.err)
			}
		}
		return len(rows), errors.New("outbox: send: timed out")
	}
	return len(rows), nil
}

// claim marks up to a batch of relayable rows as this relay's for the claim
// timeout and returns them. A row is relayable when it is not failed, not
// claimed (or its claim ran out) and no earlier live row of the same task
// exists.
func (o *Outbox) claim(ctx context.Context, token string) ([]row, error) {
	t, d := o.d.quote(o.cfg.table), o.d
	tx, err := o.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	q := `SELECT id, kind, queue, task_id, info, attempts FROM ` + t + ` o
WHERE failed_at IS NULL AND (claimed_until IS NULL OR claimed_until < ` + d.now() + `)
AND (task_id IS NULL OR NOT EXISTS (SELECT 1 FROM ` + t + ` p WHERE p.queue = o.queue AND p.task_id = o.task_id AND p.id < o.id AND p.failed_at IS NULL))
ORDER BY id LIMIT ` + d.ph(1) + ` FOR UPDATE SKIP LOCKED`
	rs, err := tx.QueryContext(ctx, q, o.cfg.batch)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	var rows []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.id, &r.kind, &r.queue, &r.taskID, &r.info, &r.attempts); err != nil {
			rs.Close()
			return nil, fmt.Errorf("outbox: claim: read row: %w", err)
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	args := []any{token, o.cfg.claimTimeout.Milliseconds()}
	for _, r := range rows {
		args = append(args, r.id)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+t+` SET claim_token = `+d.ph(1)+`, claimed_until = `+d.plusMillis(d.ph(2))+
		`, attempts = attempts + 1 WHERE id IN `+d.in(3, len(rows)), args...); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return rows, nil
}

// send moves one row into tide.
func (o *Outbox) send(ctx context.Context, client *tide.Client, r *row, log *slog.Logger) result {
	rlog := log.With("row", r.id, "queue", r.queue, "id", string(r.taskID))
	switch r.kind {
	case kindEnqueue:
		info, err := decodeEnqueue(r)
		if err != nil {
			rlog.Error("outbox: row cannot be relayed; marked failed", "err", err)
			return result{permanent, err}
		}
		rlog = rlog.With("type", info.Type)
		got, err := client.EnqueuePrepared(ctx, info)
		switch {
		case err == nil:
			o.relayed(r, got.ID, info.Type, false)
			return result{sent, nil}
		case errors.Is(err, tide.ErrDuplicateTask):
			rlog.Info("outbox: task refused as a duplicate (Unique); row done", "err", err)
			o.relayedAs(Relayed{Row: r.id, Queue: r.queue, ID: info.ID, Type: info.Type, Duplicate: true})
			return result{sent, nil}
		case errors.Is(err, tide.ErrInvalidTask), errors.Is(err, tide.ErrTaskIDConflict):
			rlog.Error("outbox: tide refused the task; row marked failed", "err", err)
			return result{permanent, fmt.Errorf("outbox: row %d: tide refused the task: %w", r.id, err)}
		case errors.Is(err, tide.ErrClientClosed):
			return result{transient, err}
		default:
			logTransient(rlog, "outbox: enqueue failed; will retry", err, r.attempts)
			return result{transient, err}
		}
	case kindCancel:
		if r.taskID == nil {
			err := fmt.Errorf("%w: row %d: cancel without a task ID", ErrCorruptRow, r.id)
			rlog.Error("outbox: row cannot be relayed; marked failed", "err", err)
			return result{permanent, err}
		}
		err := client.Cancel(ctx, r.queue, string(r.taskID))
		switch {
		case err == nil || errors.Is(err, tide.ErrTaskNotFound):
			if err != nil {
				rlog.Debug("outbox: nothing to cancel", "err", err)
			}
			o.relayed(r, string(r.taskID), "", true)
			return result{sent, nil}
		case errors.Is(err, tide.ErrInvalidTask):
			rlog.Error("outbox: cancel refused; row marked failed", "err", err)
			return result{permanent, fmt.Errorf("outbox: row %d: tide refused the cancel: %w", r.id, err)}
		default:
			logTransient(rlog, "outbox: cancel failed; will retry", err, r.attempts)
			return result{transient, err}
		}
	}
	err := fmt.Errorf("%w: row %d: unknown kind %d", ErrCorruptRow, r.id, r.kind)
	rlog.Error("outbox: row cannot be relayed; marked failed", "err", err)
	return result{permanent, err}
}

// logTransient logs a failure that is retried: quietly when Redis is
// unreachable (the relay reports that once per batch), loudly otherwise.
func logTransient(log *slog.Logger, msg string, err error, attempts int) {
	if errors.Is(err, tide.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		log.Debug(msg, "err", err, "attempts", attempts+1)
		return
	}
	log.Warn(msg, "err", err, "attempts", attempts+1)
}

// retryDelay is how long a row that failed on its attempts-th try waits
// before the next: 100ms doubling up to a minute.
func retryDelay(attempts int) time.Duration {
	return min(100*time.Millisecond<<min(max(attempts-1, 0), 10), time.Minute)
}

func (o *Outbox) relayed(r *row, id, typ string, cancel bool) {
	o.relayedAs(Relayed{Row: r.id, Queue: r.queue, ID: id, Type: typ, Cancel: cancel})
}

func (o *Outbox) relayedAs(x Relayed) {
	if o.cfg.onRelayed != nil {
		x.At = time.Now()
		o.cfg.onRelayed(x)
	}
}

// decodeEnqueue reads an enqueue row's task back and checks that it agrees
// with the row's columns. EnqueuePrepared validates the rest.
func decodeEnqueue(r *row) (*tide.TaskInfo, error) {
	var info tide.TaskInfo
	if err := json.Unmarshal(r.info, &info); err != nil {
		return nil, fmt.Errorf("%w: row %d: task does not decode: %v", ErrCorruptRow, r.id, err)
	}
	if info.Queue != r.queue || info.ID != string(r.taskID) || (info.ID == "") != (r.taskID == nil) {
		return nil, fmt.Errorf("%w: row %d: the task (queue %q, ID %q) does not match the row (queue %q, ID %q)",
			ErrCorruptRow, r.id, info.Queue, info.ID, r.queue, r.taskID)
	}
	if info.IdempotencyKey == "" {
		return nil, fmt.Errorf("%w: row %d: the task has no idempotency key", ErrCorruptRow, r.id)
	}
	return &info, nil
}

// settle deletes the rows that reached Redis, marks the refused ones failed
// and releases the others for a later try, each only while this relay
// still holds its claim.
func (o *Outbox) settle(ctx context.Context, token string, rows []row, results []result) error {
	t, d := o.d.quote(o.cfg.table), o.d
	var done []any
	retry := map[time.Duration][]any{}
	var errs []error
	for i, r := range results {
		switch r.out {
		case sent:
			done = append(done, rows[i].id)
		case transient:
			// Redis down, or not tried: the relay's own pause paces the
			// next try. Otherwise the row waits longer after each attempt
			// (rows[i].attempts is the count before this claim).
			delay := time.Duration(0)
			if !errors.Is(r.err, tide.ErrUnavailable) && !errors.Is(r.err, errNotSent) &&
				!errors.Is(r.err, context.Canceled) && !errors.Is(r.err, context.DeadlineExceeded) {
				delay = retryDelay(rows[i].attempts + 1)
			}
			retry[delay] = append(retry[delay], rows[i].id)
		case permanent:
			if _, err := o.db.ExecContext(ctx, `UPDATE `+t+` SET failed_at = `+d.now()+`, last_error = `+d.ph(1)+
				`, claim_token = NULL, claimed_until = NULL WHERE id = `+d.ph(2)+` AND claim_token = `+d.ph(3),
				truncate(r.err.Error(), 2000), rows[i].id, token); err != nil {
				errs = append(errs, fmt.Errorf("outbox: mark row %d failed: %w", rows[i].id, err))
			}
		}
	}
	if len(done) > 0 {
		args := append([]any{token}, done...)
		if _, err := o.db.ExecContext(ctx, `DELETE FROM `+t+` WHERE claim_token = `+d.ph(1)+` AND id IN `+d.in(2, len(done)), args...); err != nil {
			errs = append(errs, fmt.Errorf("outbox: delete %d relayed rows: %w", len(done), err))
		}
	}
	for delay, ids := range retry {
		// Released with an empty claim that runs out after the delay: the
		// row waits that long before anyone tries again.
		args := append([]any{delay.Milliseconds(), token}, ids...)
		if _, err := o.db.ExecContext(ctx, `UPDATE `+t+` SET claim_token = NULL, claimed_until = `+d.plusMillis(d.ph(1))+
			` WHERE claim_token = `+d.ph(2)+` AND id IN `+d.in(3, len(ids)), args...); err != nil {
			errs = append(errs, fmt.Errorf("outbox: release %d rows: %w", len(ids), err))
		}
	}
	return errors.Join(errs...)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// listen wakes the relay on the table's notifications until ctx ends,
// reconnecting after failures.
func (o *Outbox) listen(ctx context.Context, wake chan<- struct{}, log *slog.Logger) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := o.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNotPgx) {
			log.Info("outbox: the database driver is not pgx; the relay polls only", "poll", o.cfg.poll)
			return
		}
		log.Warn("outbox: listening for notifications failed; polling meanwhile", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

var errNotPgx = errors.New("not a pgx connection")

func (o *Outbox) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := o.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errNotPgx
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, "LISTEN "+o.d.quote(o.cfg.table)); err != nil {
			return err
		}
		// Rows committed while nobody listened: look now.
		signal(wake)
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				return err
			}
			signal(wake)
		}
	})
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
