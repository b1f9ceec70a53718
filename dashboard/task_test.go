package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// hostileServerID is a server ID full of markup and a bidi override, to
// check that the pages escape what servers report about themselves.
const hostileServerID = "srv<script>alert(3)</script>\u202eevil"

// startServer runs a tide server on e's broker until the test ends.
func (e *env) startServer(cfg tide.Config, fn func(context.Context, *tide.Task) error) {
	e.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(e.t)
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = time.Second
	}
	srv := tide.NewServer(e.b, cfg)
	if err := srv.Start(tide.HandlerFunc(fn)); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(srv.Shutdown)
}

// unescaped lists markup that must never reach a page raw.
var unescaped = []string{"<script>alert", "</script><script>", "<img src=x", "<svg onload", "\u202e"}

func checkNoRaw(t *testing.T, where, body string) {
	t.Helper()
	for _, r := range unescaped {
		if strings.Contains(body, r) {
			t.Errorf("%s contains unescaped %q", where, r)
		}
	}
}

func TestTaskPageRunningAndAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	started := make(chan struct{}, 1)
	e.startServer(tide.Config{
		Concurrency:    1,
		Queues:         map[string]int{"jobs": 1},
		ServerID:       hostileServerID,
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 0 },
	}, func(ctx context.Context, task *tide.Task) error {
		if n, _ := tide.GetRetryCount(ctx); n < 2 {
			return errors.New("boom </script><script>alert(1)</script> \u202eevil\nsecond line")
		}
		started <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	ti := e.enqueue("job:<svg onload=alert(2)>", []byte(`{"a":1}`), tide.Queue("jobs"), tide.MaxRetry(5))
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the third attempt did not start")
	}
	path := "/task?" + url.Values{"q": {"jobs"}, "id": {ti.ID}}.Encode()
	// The heartbeat that reports the start may lag.
	var body string
	testwait.Until(t, 20*time.Second, func() error {
		var resp *http.Response
		resp, body = e.get(path)
		wantStatus(t, resp, body, http.StatusOK)
		if !strings.Contains(body, `id="running-server"><code>srv`) {
			return fmt.Errorf("the running task's page does not show its server:\n%s", body)
		}
		return nil
	})
	checkNoRaw(t, path, body)
	for _, want := range []string{
		`id="running-started"`, `id="running-for"`, `id="running-lease"`,
		`srv&lt;script&gt;alert(3)&lt;/script&gt;\u202eevil`, // the server, escaped and with the bidi override shown
		`id="attempts"`,
		`boom &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt; \u202eevil`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, "Next process at") {
		t.Error("the page of a running task shows its due time")
	}
	if n := strings.Count(body, `<tr class="attempt" data-outcome="retry">`); n != 2 {
		t.Errorf("task page shows %d failed attempts, want 2", n)
	}

	// The active tab lists the start, server and lease, not a due time.
	_, body = e.get("/queue?q=jobs&state=active")
	checkNoRaw(t, "active tab", body)
	for _, want := range []string{`data-task-id="` + ti.ID + `"`, "<th>Started</th>", "<th>Server</th>", "<th>Lease expires</th>", "srv&lt;script&gt;"} {
		if !strings.Contains(body, want) {
			t.Errorf("active tab lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<th>Due</th>") {
		t.Error("active tab shows a due time")
	}
}

func TestTaskPageNotRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	ti := e.enqueue("a", []byte("1"), tide.ProcessIn(time.Hour))
	_, body := e.get("/task?" + url.Values{"q": {"default"}, "id": {ti.ID}}.Encode())
	if !strings.Contains(body, "Next process at") || strings.Contains(body, `id="running-lease"`) || strings.Contains(body, `id="attempts"`) {
		t.Errorf("a scheduled task's page: want its due time, no running facts, no attempts:\n%s", body)
	}
}

func TestAttemptRows(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rows := attemptRows([]tide.Attempt{
		{Started: t0, Ended: t0.Add(1500 * time.Millisecond), Server: "a", Outcome: "retry", Err: "a long error with an escape \x1b[31m in it"},
		{Ended: t0.Add(time.Minute), Server: "b", Outcome: "lease expired"},
		{Started: t0.Add(2 * time.Minute), Ended: t0.Add(3 * time.Minute), Server: "c", Outcome: "done"},
	})
	if len(rows) != 3 || rows[0].N != 3 || rows[0].Server != "c" || rows[2].N != 1 {
		t.Fatalf("rows not newest first: %+v", rows)
	}
	if rows[2].Took != "2s" || rows[1].Took != "" || rows[0].Took != "1m 0s" {
		t.Errorf("durations %q %q %q", rows[2].Took, rows[1].Took, rows[0].Took)
	}
	if rows[2].Err != `a long error with an escape \u001b[31m in it` {
		t.Errorf("control character not shown escaped: %q", rows[2].Err)
	}
}

// A running task's progress shows on its page as a bar with the percent
// and the note (escaped, bidi overrides shown), with its group.
func TestTaskPageProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	reported := make(chan struct{}, 1)
	e.startServer(tide.Config{Queues: map[string]int{"jobs": 1}}, func(ctx context.Context, _ *tide.Task) error {
		if err := tide.ReportProgress(ctx, 40, "resized <b>4</b> of 10 \u202eevil"); err != nil {
			return err
		}
		reported <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	ti := e.enqueue("img:resize", nil, tide.Queue("jobs"), tide.Group("acme"))
	select {
	case <-reported:
	case <-time.After(20 * time.Second):
		t.Fatal("the task did not report progress")
	}
	resp, body := e.get("/task?" + url.Values{"q": {"jobs"}, "id": {ti.ID}}.Encode())
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "task page", body)
	for _, want := range []string{
		`id="task-progress"><progress max="100" value="40">`,
		`resized &lt;b&gt;4&lt;/b&gt; of 10 \u202eevil`,
		`<dt>Group</dt><dd><code>acme</code></dd>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %s:\n%s", want, body)
		}
	}
	// The active tab shows it too.
	_, body = e.get("/queue?q=jobs&state=active")
	checkNoRaw(t, "active tab", body)
	if want := `<td class="progress"><progress max="100" value="40"`; !strings.Contains(body, want) {
		t.Errorf("active tab lacks %s:\n%s", want, body)
	}
}

// The task page of a parked durable handler says what it waits for, lists
// its steps and offers run, archive and delete.
func TestTaskPageDurable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.startServer(tide.Config{Queues: map[string]int{"jobs": 1}}, func(ctx context.Context, _ *tide.Task) error {
		if _, err := tide.Step(ctx, "reserve<b>", func(context.Context) (int, error) { return 3, nil }); err != nil {
			return err
		}
		_, err := tide.WaitSignal[int](ctx, "paid", time.Hour)
		return err
	})
	ti := e.enqueue("order:flow", nil, tide.Queue("jobs"))
	testwait.For(t, 20*time.Second, "the task to park", func() bool {
		got, err := tide.NewInspector(e.b).GetTaskInfo(context.Background(), "jobs", ti.ID)
		return err == nil && got.State == tide.StateWaiting
	})
	resp, body := e.get("/task?" + url.Values{"q": {"jobs"}, "id": {ti.ID}}.Encode())
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "task page", body)
	for _, want := range []string{`id="task-waiting"><code>signal:paid</code>`, `id="steps"`, `reserve&lt;b&gt;`, `wait:paid`} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %s:\n%s", want, body)
		}
	}
	if got := strings.Join(taskActions(tide.StateWaiting), ","); got != "run,archive,delete" {
		t.Errorf("actions of a waiting task: %s", got)
	}
}

// Parked tasks have a tab of their own, which says what each waits for
// and until when; the retry tab lists the retry tasks alone.
func TestQueueWaitingTab(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.startServer(tide.Config{Queues: map[string]int{"jobs": 1},
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return time.Hour }}, func(ctx context.Context, task *tide.Task) error {
		if task.Type() == "boom" {
			return errors.New("boom")
		}
		_, err := tide.WaitSignal[int](ctx, "paid", time.Hour)
		return err
	})
	parked := e.enqueue("order:flow", nil, tide.Queue("jobs"))
	failed := e.enqueue("boom", nil, tide.Queue("jobs"))
	in := tide.NewInspector(e.b)
	testwait.For(t, 20*time.Second, "one task to park and one to wait for its retry", func() bool {
		p, err1 := in.GetTaskInfo(context.Background(), "jobs", parked.ID)
		f, err2 := in.GetTaskInfo(context.Background(), "jobs", failed.ID)
		return err1 == nil && err2 == nil && p.State == tide.StateWaiting && f.State == tide.StateRetry
	})
	resp, body := e.get("/queue?q=jobs&state=waiting")
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "waiting tab", body)
	for _, want := range []string{`data-state="waiting"`, `<th>Waiting for</th>`, `<th>Until</th>`,
		`data-task-id="` + parked.ID + `"`, `<td class="waiting-for"><code>signal:paid</code></td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("waiting tab lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, `data-task-id="`+failed.ID+`"`) {
		t.Errorf("the waiting tab lists the retry task %s", failed.ID)
	}
	_, body = e.get("/queue?q=jobs&state=retry")
	if !strings.Contains(body, `data-task-id="`+failed.ID+`"`) || strings.Contains(body, `data-task-id="`+parked.ID+`"`) {
		t.Errorf("the retry tab should list %s alone:\n%s", failed.ID, body)
	}
}
