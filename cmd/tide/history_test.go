package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/outbox"
	"github.com/tidequeue/tide/outbox/sqltest"
)

// The PostgreSQL and MariaDB servers of the history tests, started by the
// first test that needs one and stopped by TestMain.
var (
	pgOnce, mariaOnce     sync.Once
	pgServer, mariaServer *sqltest.Server
	pgErr, mariaErr       error
)

func postgres(t *testing.T) *sqltest.Server {
	t.Helper()
	pgOnce.Do(func() { pgServer, pgErr = sqltest.Start(sqltest.Postgres) })
	if pgErr != nil {
		t.Fatal(pgErr)
	}
	return pgServer
}

func mariadb(t *testing.T) *sqltest.Server {
	t.Helper()
	mariaOnce.Do(func() { mariaServer, mariaErr = sqltest.Start(sqltest.MariaDB) })
	if mariaErr != nil {
		t.Fatal(mariaErr)
	}
	return mariaServer
}

// stopSQLServers stops the database servers the tests started.
func stopSQLServers() {
	if pgServer != nil {
		pgServer.Stop()
	}
	if mariaServer != nil {
		mariaServer.Stop()
	}
}

// historyDB returns a fresh PostgreSQL database with a migrated history
// and its DSN.
func historyDB(t *testing.T, opts ...outbox.HistoryOption) (*outbox.History, string) {
	t.Helper()
	db, dsn := postgres(t).NewDB(t)
	hist, err := outbox.NewHistory(db, outbox.Postgres, append([]outbox.HistoryOption{outbox.WithFlushInterval(10 * time.Millisecond),
		outbox.WithHistoryLogger(quietLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hist.Close() })
	if err := hist.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return hist, dsn
}

const hostileHistErr = "boom \x1b]0;owned\x07 \u202eevil\nsecond line"

func TestTasksShowHistory(t *testing.T) {
	e := setup(t)
	hist, dsn := historyDB(t)
	ctx := context.Background()

	// A task that fails once and then succeeds: Redis forgets it, the
	// history keeps both attempts.
	mux := tide.NewServeMux()
	mux.Use(hist.Middleware())
	done := make(chan struct{})
	mux.HandleFunc("flaky", func(ctx context.Context, _ *tide.Task) error {
		if n, _ := tide.GetRetryCount(ctx); n == 0 {
			return errors.New(hostileHistErr)
		}
		close(done)
		return nil
	})
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"hq": 1}, ShutdownTimeout: time.Second, Logger: quietLogger(),
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 0 }})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	e.enqueue("flaky", "{}", tide.Queue("hq"), tide.TaskID("gone-1"), tide.MaxRetry(3))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the task did not finish")
	}
	testwait.Until(t, 30*time.Second, func() error {
		_, err := e.in.GetTaskInfo(ctx, "hq", "gone-1")
		as, herr := hist.TaskAttempts(ctx, "hq", "gone-1")
		if errors.Is(err, tide.ErrTaskNotFound) && herr == nil && len(as) == 2 {
			return nil
		}
		_ = hist.Flush(ctx)
		return fmt.Errorf("task not deleted or history not written: %v, %v %v", err, as, herr)
	})

	// The deleted task: shown by its history, exit 0.
	r := e.tide("tasks", "show", "hq", "gone-1", "--history-dsn", dsn)
	r.want(t, exitOK, "no longer stored in Redis", "History (recorded) (2, oldest first):", "retry", "done", `\x1b]0;owned\x07`, `\u202e`, "…")
	if strings.ContainsAny(r.stdout, "\x1b\u202e") || strings.Contains(r.stdout, "second line") {
		t.Errorf("history not escaped or not cut to its first line:\n%q", r.stdout)
	}
	// The same with the environment variable, as JSON.
	e.vars["TIDE_HISTORY_DSN"] = dsn
	r = e.tide("tasks", "show", "hq", "gone-1", "--json")
	r.want(t, exitOK)
	var gone struct {
		ID      string        `json:"id"`
		Stored  bool          `json:"stored"`
		History []attemptJSON `json:"history"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &gone); err != nil || gone.ID != "gone-1" || gone.Stored || len(gone.History) != 2 ||
		gone.History[0].Outcome != "retry" || gone.History[0].Error != hostileHistErr || gone.History[1].Outcome != "done" {
		t.Errorf("--json of a deleted task: %v\n%s", err, r.stdout)
	}
	delete(e.vars, "TIDE_HISTORY_DSN")

	// A task still in Redis: its usual page, then the history.
	e.enqueue("later", "{}", tide.Queue("idle"), tide.TaskID("kept"))
	at := time.Now().Add(-time.Minute)
	hist.Record(outbox.Attempt{Queue: "idle", ID: "kept", Type: "later", State: outbox.StateLost, Attempt: 1, Started: at, Finished: at.Add(time.Second), Server: "w9"})
	if err := hist.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r = e.tide("tasks", "show", "idle", "kept", "--history-dsn", dsn)
	r.want(t, exitOK, "pending", "Attempts:", "History (recorded) (1, oldest first):", "lease expired", "w9")
	r = e.tide("tasks", "show", "idle", "kept", "--history-dsn", dsn, "--json")
	r.want(t, exitOK)
	var kept taskJSON
	if err := json.Unmarshal([]byte(r.stdout), &kept); err != nil || kept.History == nil || len(*kept.History) != 1 || (*kept.History)[0].Outcome != "lease expired" {
		t.Errorf("--json of a stored task: %v\n%s", err, r.stdout)
	}
	// No --history-dsn: no history, and a deleted task is not found.
	r = e.tide("tasks", "show", "idle", "kept", "--json")
	r.want(t, exitOK)
	if strings.Contains(r.stdout, `"history"`) {
		t.Errorf("history without --history-dsn:\n%s", r.stdout)
	}
	e.tide("tasks", "show", "hq", "gone-1").want(t, exitNotFound)
	// Nothing recorded and not in Redis: not found.
	e.tide("tasks", "show", "hq", "never", "--history-dsn", dsn).want(t, exitNotFound)
	// Another table name.
	r = e.tide("tasks", "show", "idle", "kept", "--history-dsn", dsn, "--history-table", "other_history")
	if r.code != exitError || !strings.Contains(r.stdout, "History (recorded): - (cannot read it:") || !strings.Contains(r.stderr, "cannot read the recorded history") {
		t.Errorf("missing table: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestHistoryDSNErrors(t *testing.T) {
	e := setup(t)
	for _, c := range []struct{ dsn, want string }{
		{"redis://u:s3cretpw@host/db", "--history-dsn: want postgres://"},
		{"postgres://u:s3cretpw@host:notaport/db", "--history-dsn: "},
		{"postgres://u:s3cretpw@host/db?sslmode=bogus", "--history-dsn: "},
		{"mysql://u:s3cretpw@tcp(host:3306)", "--history-dsn: "},
		{"mysql://u:s3cretpw@tcp(host:3306)/db?parseTime=maybe", "--history-dsn: "},
	} {
		r := e.tide("tasks", "show", "q", "id", "--history-dsn", c.dsn)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr+r.stdout, "s3cretpw") {
			t.Errorf("%s: exit %d\n%s", c.dsn, r.code, r.stderr)
		}
	}
	e.vars["TIDE_HISTORY_DSN"] = "mysql://u:s3cretpw@nope"
	r := e.tide("dash", "--addr", "127.0.0.1:0")
	if r.code != exitUsage || !strings.Contains(r.stderr, "TIDE_HISTORY_DSN: ") || strings.Contains(r.stderr, "s3cretpw") {
		t.Errorf("dash with a bad TIDE_HISTORY_DSN: exit %d\n%s", r.code, r.stderr)
	}
	delete(e.vars, "TIDE_HISTORY_DSN")
	r = e.tide("tasks", "show", "q", "id", "--history-dsn", "postgres://h/db", "--history-table", "Bad-Name")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--history-table: ") {
		t.Errorf("bad table: exit %d\n%s", r.code, r.stderr)
	}
	r = e.tide("tasks", "show", "q", "id", "--history-table", "t")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--history-table needs --history-dsn") {
		t.Errorf("table without DSN: exit %d\n%s", r.code, r.stderr)
	}
	// An unreachable database: the task is shown with a note, exit 1, no
	// password.
	e.enqueue("t", "{}", tide.Queue("q"), tide.TaskID("id"))
	r = e.tide("tasks", "show", "q", "id", "--history-dsn", "postgres://u:s3cretpw@"+closedPort(t)+"/db?connect_timeout=5")
	if r.code != exitError || !strings.Contains(r.stdout, "History (recorded): - (cannot read it:") || strings.Contains(r.stdout+r.stderr, "s3cretpw") {
		t.Errorf("unreachable history: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestDashHistory(t *testing.T) {
	e := setup(t)
	hist, dsn := historyDB(t)
	at := time.Now().Add(-time.Minute)
	hist.Record(outbox.Attempt{Queue: "dq", ID: "gone-2", Type: "t", State: outbox.StateArchived, Attempt: 1, Error: "bad <script>x</script>",
		Started: at, Finished: at.Add(time.Second), Server: "w1"})
	if err := hist.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.vars["TIDE_HISTORY_DSN"] = dsn
	base, stop := e.start("dash", "--addr", "127.0.0.1:0")
	code, body := get(t, base+"/task?"+url.Values{"q": {"dq"}, "id": {"gone-2"}}.Encode())
	if code != http.StatusOK || !strings.Contains(body, "History (recorded)") || !strings.Contains(body, `data-outcome="archive"`) ||
		!strings.Contains(body, "&lt;script&gt;x") {
		t.Errorf("task page of a deleted task: %d\n%.3000s", code, body)
	}
	code, _ = get(t, base+"/task?"+url.Values{"q": {"dq"}, "id": {"never"}}.Encode())
	if code != http.StatusNotFound {
		t.Errorf("task page of an unknown task: %d", code)
	}
	if r := stop(); r.code != exitOK {
		t.Errorf("dash exited with %d:\n%s", r.code, r.stderr)
	}
}

func TestTasksShowHistoryMySQL(t *testing.T) {
	e := setup(t)
	db, dsn := mariadb(t).NewDB(t)
	hist, err := outbox.NewHistory(db, outbox.MySQL, outbox.WithHistoryTable("jobs_history"), outbox.WithHistoryLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer hist.Close()
	ctx := context.Background()
	if err := hist.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Minute)
	for i, st := range []string{outbox.StateDeferred, outbox.StateDone} {
		hist.Record(outbox.Attempt{Queue: "mq", ID: "gone-3", Type: "t", State: st, Attempt: 1,
			Started: at.Add(time.Duration(i) * time.Second), Finished: at.Add(time.Duration(i)*time.Second + time.Millisecond), Server: "w2"})
	}
	if err := hist.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The CLI takes the driver's DSN behind mysql://.
	r := e.tide("tasks", "show", "mq", "gone-3", "--history-dsn", "mysql://"+dsn, "--history-table", "jobs_history")
	r.want(t, exitOK, "History (recorded) (2, oldest first):", "deferred", "done", "w2")
}
