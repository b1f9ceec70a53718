package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/outbox"
)

// historyHelp is the part of the help of 'tasks show' and 'dash' about the
// recorded history.
const historyHelp = `With --history-dsn (default $TIDE_HISTORY_DSN), the task's full recorded
history is read from the SQL table that outbox.History (the outbox module's
history middleware) writes, and shown as "History (recorded)" after what
Redis keeps, even for a task Redis no longer holds (finished and deleted).
The DSN is postgres://user:password@host:5432/db?sslmode=disable for
PostgreSQL or mysql://user:password@tcp(host:3306)/db for MySQL and MariaDB;
--history-table names the table when it is not tide_history
(outbox.WithHistoryTable). Prefer the environment variable: flags show in
'ps'. Outcomes are tide's ("done", "retry", "archive", "deferred", "lease
expired"), plus "canceled" and "requeued" (cut off by a server's shutdown).`

// historyFlags registers --history-dsn and --history-table.
func historyFlags(fs *flag.FlagSet, o *cmdOpts) {
	fs.StringVar(&o.histDSN, "history-dsn", "", "`DSN` of the task history database: postgres://... or mysql://user:pass@tcp(host:port)/db (default $TIDE_HISTORY_DSN)")
	fs.StringVar(&o.histTable, "history-table", outbox.DefaultHistoryTable, "`name` of the task history table")
}

// openHistory reads the task history from the database that --history-dsn
// (or TIDE_HISTORY_DSN) names, if any: it sets a.hist. A bad DSN or table
// name is a usage error that names where it came from and never shows the
// password. Nothing is dialed until the history is read.
func (a *app) openHistory(o *cmdOpts) error {
	src, dsn := "--history-dsn", o.histDSN
	if strings.TrimSpace(dsn) == "" {
		src, dsn = "TIDE_HISTORY_DSN", a.env("TIDE_HISTORY_DSN")
	}
	if strings.TrimSpace(dsn) == "" {
		if o.histTable != outbox.DefaultHistoryTable {
			return usagef(o.cmd, "--history-table needs --history-dsn (or TIDE_HISTORY_DSN)")
		}
		return nil
	}
	db, dialect, secret, err := openHistoryDB(dsn)
	if err != nil {
		return usagef(o.cmd, "%s: %s", src, redact(err.Error(), secret))
	}
	h, err := outbox.NewHistory(db, dialect, outbox.WithHistoryTable(o.histTable))
	if err != nil {
		_ = db.Close()
		return usagef(o.cmd, "--history-table: %s", strings.TrimPrefix(err.Error(), outbox.ErrInvalidArgument.Error()+": "))
	}
	a.hist, a.histDB, a.histSecret = h, db, secret
	return nil
}

// openHistoryDB opens the database of a history DSN and returns its
// dialect and its password (to keep it out of messages).
func openHistoryDB(dsn string) (db *sql.DB, d outbox.Dialect, secret string, err error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://"):
		if u, err := url.Parse(dsn); err == nil && u.User != nil {
			secret, _ = u.User.Password()
		} else if err != nil {
			return nil, d, "", errors.New("not a valid URL; want postgres://user:password@host:5432/db")
		}
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			var pe *pgconn.ParseConfigError
			msg := "cannot be read"
			if errors.As(err, &pe) && pe.Unwrap() != nil {
				msg += ": " + pe.Unwrap().Error()
			}
			return nil, d, secret, fmt.Errorf("%s; want postgres://user:password@host:5432/db", msg)
		}
		return stdlib.OpenDB(*cfg), outbox.Postgres, secret, nil
	case strings.HasPrefix(dsn, "mysql://"):
		cfg, err := mysql.ParseDSN(strings.TrimPrefix(dsn, "mysql://"))
		if err != nil {
			return nil, d, "", fmt.Errorf("%v; want mysql://user:password@tcp(host:3306)/db", err)
		}
		cfg.ParseTime = true
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, d, cfg.Passwd, err
		}
		return sql.OpenDB(c), outbox.MySQL, cfg.Passwd, nil
	}
	return nil, d, "", errors.New("want postgres://user:password@host:5432/db or mysql://user:password@tcp(host:3306)/db")
}

// redact hides secret (a password) in msg.
func redact(msg, secret string) string {
	if secret == "" {
		return msg
	}
	return strings.ReplaceAll(msg, secret, "xxxxx")
}

// taskHistory reads the task's recorded history; the error never shows
// the password.
func (a *app) taskHistory(ctx context.Context, queue, id string) ([]tide.Attempt, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	as, err := a.hist.TaskAttempts(ctx, queue, id)
	if err != nil {
		return nil, errors.New(redact(err.Error(), a.histSecret))
	}
	return as, nil
}

// dashHistory is dashboard.Options.History for the history of --history-dsn.
func (a *app) dashHistory(ctx context.Context, queue, id string) ([]tide.Attempt, error) {
	return a.taskHistory(ctx, queue, id)
}

// historyErrRunes bounds the error of reading the history in 'tasks show'.
const historyErrRunes = 300

// printHistory prints a task's recorded history, oldest first.
func printHistory(a *app, as []tide.Attempt, err error, now time.Time) {
	switch {
	case err != nil:
		fmt.Fprintln(a.stdout, "History (recorded): - (cannot read it: "+escape(firstLine(err.Error(), historyErrRunes))+")")
		return
	case len(as) == 0:
		fmt.Fprintln(a.stdout, "History (recorded): - (no attempts recorded)")
		return
	}
	fmt.Fprintf(a.stdout, "History (recorded) (%d, oldest first):\n", len(as))
	printAttemptTable(a, as, now)
}

// historyJSON turns recorded attempts into their --json form.
func historyJSON(as []tide.Attempt) []attemptJSON {
	out := make([]attemptJSON, 0, len(as))
	for _, at := range as {
		out = append(out, attemptJSON{utcPtr(at.Started), utcPtr(at.Ended), at.Server, at.Outcome, at.Err})
	}
	return out
}

// goneJSON is a task Redis no longer holds, in --json output: its recorded
// history.
type goneJSON struct {
	ID      string        `json:"id"`
	Queue   string        `json:"queue"`
	Stored  bool          `json:"stored"` // always false
	History []attemptJSON `json:"history"`
}
