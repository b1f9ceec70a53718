package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/outbox/internal/sqltest"
)

var servers = map[Dialect]*sqltest.Server{}

func TestMain(m *testing.M) {
	pg, err := sqltest.Start(sqltest.Postgres)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	maria, err := sqltest.Start(sqltest.MariaDB)
	if err != nil {
		pg.Stop()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	servers[Postgres], servers[MySQL] = pg, maria
	code := m.Run()
	pg.Stop()
	maria.Stop()
	os.Exit(code)
}

// both runs f as a parallel subtest for each dialect.
func both(t *testing.T, f func(t *testing.T, d Dialect)) {
	t.Helper()
	t.Parallel()
	for _, d := range []Dialect{Postgres, MySQL} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

// testLogger writes to the test log at debug level.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

var _ io.Writer = tWriter{}

// env is one test's database, outbox and Redis.
type env struct {
	t      *testing.T
	d      Dialect
	db     *sql.DB
	dsn    string
	ob     *Outbox
	rdb    *redisbroker.Broker
	client *tide.Client
	insp   *tide.Inspector

	redisAddr, prefix string
}

func newEnv(t *testing.T, d Dialect, opts ...Option) *env {
	t.Helper()
	db, dsn := servers[d].NewDB(t)
	return newEnvOn(t, d, db, dsn, redistest.Addr(t), opts...)
}

func newEnvOn(t *testing.T, d Dialect, db *sql.DB, dsn, redisAddr string, opts ...Option) *env {
	t.Helper()
	prefix := redistest.Prefix(t)
	b := redisbroker.New(redistest.Client(t, redisAddr), redisbroker.WithPrefix(prefix))
	t.Cleanup(func() { _ = b.Close() })
	opts = append([]Option{WithLogger(testLogger(t)), WithPollInterval(20 * time.Millisecond)}, opts...)
	ob, err := New(db, d, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, d: d, db: db, dsn: dsn, ob: ob, rdb: b, client: tide.NewClient(b), insp: tide.NewInspector(b),
		redisAddr: redisAddr, prefix: prefix}
}

// inTx runs f in a transaction and commits it (or rolls back when commit
// is false).
func (e *env) inTx(commit bool, f func(tx *sql.Tx)) {
	e.t.Helper()
	tx, err := e.db.BeginTx(context.Background(), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	f(tx)
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// enqueue enqueues one task in a transaction of its own and commits.
func (e *env) enqueue(task *tide.Task, opts ...tide.Option) *tide.TaskInfo {
	e.t.Helper()
	var info *tide.TaskInfo
	e.inTx(true, func(tx *sql.Tx) {
		var err error
		if info, err = e.ob.Enqueue(context.Background(), tx, task, opts...); err != nil {
			e.t.Fatal(err)
		}
	})
	return info
}

// relay runs a relay of ob until the test ends and returns a func that
// stops it and returns its error.
func (e *env) relay(ob *Outbox) func() error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ob.Relay(ctx, e.client) }()
	stopped := false
	var err error
	stop := func() error {
		if !stopped {
			cancel()
			err = <-done
			stopped = true
		}
		return err
	}
	e.t.Cleanup(func() { _ = stop() })
	return stop
}

// rows counts the outbox rows that are not failed.
func (e *env) rows() int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(`SELECT COUNT(*) FROM ` + e.d.quote(e.ob.Table()) + ` WHERE failed_at IS NULL`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// waitEmpty waits until every live row has been relayed.
func (e *env) waitEmpty() {
	e.t.Helper()
	testwait.For(e.t, 60*time.Second, "the outbox table to empty", func() bool { return e.rows() == 0 })
}

// count returns how many tasks queue holds in every state.
func (e *env) count(queue string) int {
	e.t.Helper()
	qi, err := e.insp.QueueInfo(context.Background(), queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return qi.Size
}
