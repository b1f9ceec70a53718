package outbox

import (
	"context"
	"fmt"
	"time"
)

// FailedRow is an outbox row that a relay gave up on (see Relay): it is
// kept, with the error, until someone deals with it (Retry, Discard).
type FailedRow struct {
	Row      int64  // the row's ID
	Cancel   bool   // a cancel row, not an enqueue
	Queue    string // the task's queue
	ID       string // the task's ID; empty for a Unique task without TaskID
	Attempts int
	Created  time.Time // when the row was written
	FailedAt time.Time
	Error    string
}

// Failed lists up to limit (1 to 1000) failed rows, oldest first.
func (o *Outbox) Failed(ctx context.Context, limit int) ([]FailedRow, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("%w: Failed: limit %d: want 1 to 1000", ErrInvalidArgument, limit)
	}
	rs, err := o.db.QueryContext(ctx, `SELECT id, kind, queue, task_id, attempts, created_at, failed_at, last_error FROM `+o.d.quote(o.cfg.table)+
		` WHERE failed_at IS NOT NULL ORDER BY id LIMIT `+o.d.ph(1), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list failed rows: %w", err)
	}
	defer rs.Close()
	var out []FailedRow
	for rs.Next() {
		var (
			f         FailedRow
			kind      int
			id        []byte
			created   dbTime
			failedAt  dbTime
			lastError *string
		)
		if err := rs.Scan(&f.Row, &kind, &f.Queue, &id, &f.Attempts, &created, &failedAt, &lastError); err != nil {
			return nil, fmt.Errorf("outbox: list failed rows: %w", err)
		}
		f.Cancel, f.ID, f.Created, f.FailedAt = kind == kindCancel, string(id), created.t, failedAt.t
		if lastError != nil {
			f.Error = *lastError
		}
		out = append(out, f)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list failed rows: %w", err)
	}
	return out, nil
}

// Retry makes a failed row relayable again (after fixing what made it
// fail, e.g. deleting the task that held its ID). It reports whether the row
// was failed. A retried enqueue row is relayed after cancels of its task
// that were written later, so retry with care.
func (o *Outbox) Retry(ctx context.Context, row int64) (bool, error) {
	res, err := o.db.ExecContext(ctx, `UPDATE `+o.d.quote(o.cfg.table)+` SET failed_at = NULL, claimed_until = NULL, claim_token = NULL WHERE id = `+
		o.d.ph(1)+` AND failed_at IS NOT NULL`, row)
	if err != nil {
		return false, fmt.Errorf("outbox: retry row %d: %w", row, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("outbox: retry row %d: %w", row, err)
	}
	return n > 0, nil
}

// Discard deletes a failed row. It reports whether there was such a row.
func (o *Outbox) Discard(ctx context.Context, row int64) (bool, error) {
	res, err := o.db.ExecContext(ctx, `DELETE FROM `+o.d.quote(o.cfg.table)+` WHERE id = `+o.d.ph(1)+` AND failed_at IS NOT NULL`, row)
	if err != nil {
		return false, fmt.Errorf("outbox: discard row %d: %w", row, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("outbox: discard row %d: %w", row, err)
	}
	return n > 0, nil
}

// Backlog returns how many rows wait to be relayed (failed ones not
// counted) and when the oldest of them was written (zero when none).
func (o *Outbox) Backlog(ctx context.Context) (n int, oldest time.Time, err error) {
	var t dbTime
	if err := o.db.QueryRowContext(ctx, `SELECT COUNT(*), MIN(created_at) FROM `+o.d.quote(o.cfg.table)+` WHERE failed_at IS NULL`).Scan(&n, &t); err != nil {
		return 0, time.Time{}, fmt.Errorf("outbox: backlog: %w", err)
	}
	return n, t.t, nil
}

// dbTime scans a timestamp whatever form the driver gives it in: a
// time.Time, or (MySQL without parseTime) text read as UTC.
type dbTime struct{ t time.Time }

func (d *dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		d.t = time.Time{}
	case time.Time:
		d.t = x
	case []byte:
		return d.parse(string(x))
	case string:
		return d.parse(x)
	default:
		return fmt.Errorf("outbox: cannot read %T as a time", v)
	}
	return nil
}

func (d *dbTime) parse(s string) error {
	for _, layout := range []string{"2006-01-02 15:04:05.999999", time.RFC3339Nano} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			d.t = t
			return nil
		}
	}
	return fmt.Errorf("outbox: cannot read %q as a time", s)
}
