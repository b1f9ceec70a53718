// Package e2e drives the dashboard in headless Chromium. It is a module of
// its own so that the library module does not require chromedp.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/dashboard"
	"github.com/tidequeue/tide/internal/redistest"
)

// testToken is the dashboard token the test logs in with.
const testToken = "e2e-test-token-0123456789abcdef"

// env is a dashboard on a Redis broker of the test's own, served over HTTP.
type env struct {
	t   *testing.T
	b   *redisbroker.Broker
	c   *tide.Client
	in  *tide.Inspector
	srv *httptest.Server
}

func newEnv(t *testing.T, token string) *env {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	e := &env{t: t, b: b, c: tide.NewClient(b), in: tide.NewInspector(b)}
	h, err := dashboard.New(e.in, dashboard.Options{Token: token, Logger: testLogger(t), Client: e.c})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

// enqueue enqueues a task and returns its info.
func (e *env) enqueue(typ string, payload []byte, opts ...tide.Option) *tide.TaskInfo {
	e.t.Helper()
	ti, err := e.c.Enqueue(e.ctx(), tide.NewTask(typ, payload), opts...)
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return ti
}

func (e *env) state(queue, id string) tide.TaskState {
	e.t.Helper()
	ti, err := e.in.GetTaskInfo(e.ctx(), queue, id)
	if err != nil {
		e.t.Fatalf("GetTaskInfo %s: %v", id, err)
	}
	return ti.State
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// chromiumPath is the browser the end-to-end test drives; TIDE_CHROMIUM
// overrides it.
func chromiumPath() string {
	if p := os.Getenv("TIDE_CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

// seedDemo fills the broker with what a busy system looks like: a server
// that has processed (and failed) tasks, one running task, retries,
// archived tasks, scheduled tasks and a paused queue.
func seedDemo(t *testing.T, e *env) {
	t.Helper()
	srv := tide.NewServer(e.b, tide.Config{
		Concurrency:     4,
		Queues:          map[string]int{"emails": 2, "webhooks": 1, "maintenance": 1},
		ShutdownTimeout: time.Second,
		RetryDelayFunc:  func(int, error, *tide.Task) time.Duration { return 10 * time.Minute },
		Logger:          testLogger(t),
	})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		p := string(task.Payload())
		switch {
		case strings.Contains(p, "slow"):
			<-ctx.Done()
			return context.Cause(ctx)
		case strings.Contains(p, "bounce"):
			return fmt.Errorf("smtp: 550 5.1.1 mailbox unavailable: %w", tide.SkipRetry)
		case strings.Contains(p, "flaky"):
			return errors.New("POST https://hooks.example.com/orders: 502 Bad Gateway")
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	// Two periodic tasks: one that succeeds, one that fails.
	sched := tide.NewScheduler(e.b, &tide.SchedulerOpts{Logger: testLogger(t)})
	for _, c := range []struct{ id, typ, payload string }{
		{"metrics:flush", "metrics:flush", `{"ok":true}`},
		{"reports:rollup", "reports:rollup", `{"bounce":true}`},
	} {
		if _, err := sched.RegisterEntry(tide.CronEntry{ID: c.id, Spec: "@every 2s", Task: tide.NewTask(c.typ, []byte(c.payload)),
			Options: []tide.Option{tide.Queue("maintenance")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sched.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Shutdown)

	var ts []*tide.Task
	for i := range 24 {
		kind := "ok"
		if i%4 == 3 {
			kind = "bounce"
		}
		ts = append(ts, tide.NewTask("email:welcome", fmt.Appendf(nil, `{"user_id":%d,"to":"user%d@example.com","kind":%q}`, 1000+i, i, kind), tide.Queue("emails")))
	}
	for i := range 8 {
		kind := "ok"
		if i%3 == 0 {
			kind = "flaky"
		}
		ts = append(ts, tide.NewTask("webhook:deliver", fmt.Appendf(nil, `{"endpoint":"https://hooks.example.com/orders","event":"order.paid","order_id":%d,"mode":%q}`, 500+i, kind), tide.Queue("webhooks")))
	}
	if _, err := e.c.EnqueueMany(e.ctx(), ts); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		e1, err1 := e.in.QueueInfo(e.ctx(), "emails")
		w1, err2 := e.in.QueueInfo(e.ctx(), "webhooks")
		if err1 == nil && err2 == nil && e1.Processed >= 24 && w1.Processed >= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo tasks were not processed: %+v %v %+v %v", e1, err1, w1, err2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.enqueue("email:digest", []byte(`{"slow":true,"batch":7}`), tide.Queue("emails"))

	if err := e.in.PauseQueue(e.ctx(), "reports"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.enqueue("report:daily", fmt.Appendf(nil, `{"day":"2026-11-%02d"}`, 18+i), tide.Queue("reports"))
	}
	for i, d := range []time.Duration{20 * time.Minute, 45 * time.Minute, 2 * time.Hour} {
		e.enqueue("order:cancel", fmt.Appendf(nil, `{"order_id":%d,"reason":"unpaid"}`, 43+i), tide.ProcessIn(d), tide.TaskID(fmt.Sprint("cancel:order-", 43+i)))
	}
	e.enqueue("order:notify", []byte(`<script>window.__xss=1</script><img src=x onerror="window.__xss=2">`), tide.ProcessIn(3*time.Hour))
	e.enqueue("thumbnail:render", []byte{0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d}, tide.ProcessIn(4*time.Hour))
}

// seedGroups fills queue "exports" with grouped tasks (one group per
// customer) under limits, and serves it: globex's tasks throttle their
// group for an hour, the others run until the test ends, so that the queue
// page shows running, waiting and throttled groups.
func seedGroups(t *testing.T, e *env) {
	t.Helper()
	if err := e.in.SetQueueLimits(e.ctx(), "exports", tide.QueueLimits{Concurrency: 8, Rate: tide.Rate{Limit: 200, Per: time.Second},
		GroupConcurrency: 2, GroupRate: tide.Rate{Limit: 30, Per: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	for g, n := range map[string]int{"acme-corp": 9, "globex": 4, "initech": 14, "umbrella": 3, "hooli": 6, "stark-industries": 1} {
		for i := range n {
			e.enqueue("export:csv", fmt.Appendf(nil, `{"customer":%q,"report":%d}`, g, i), tide.Queue("exports"), tide.Group(g))
		}
	}
	// Eight workers, more than the six groups: the first round, one task
	// of each group, starts globex's.
	srv := tide.NewServer(e.b, tide.Config{
		Concurrency: 8, Queues: map[string]int{"exports": 1}, ShutdownTimeout: time.Second, Logger: testLogger(t),
	})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		if g, _ := tide.GetGroup(ctx); g == "globex" {
			return fmt.Errorf("export API says slow down: %w", tide.ThrottleGroup(time.Hour))
		}
		<-ctx.Done()
		return context.Cause(ctx)
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

// demoWorkflow is the workflow seedFlows runs: an order's fulfilment, with
// a step of every state once it settles (see seedFlows).
const demoWorkflow = "fulfil-order-1042"

// demoSteps are demoWorkflow's steps in the states seedFlows brings them
// to: their payload says how the handler treats them.
var demoSteps = []struct {
	name, payload, want string
	after               []string
}{
	{"validate", "ok", "succeeded", nil},
	{"charge-card", "ok", "succeeded", []string{"validate"}},
	{"reserve-stock", "ok", "succeeded", []string{"validate"}},
	{"fraud-check", "flaky", "retry", []string{"validate"}},
	{"pack", "hold", "active", []string{"charge-card", "reserve-stock"}},
	{"invoice", "ok", "succeeded", []string{"charge-card"}},
	{"ship", "ok", "waiting", []string{"pack", "fraud-check"}},
	{"notify-customer", "ok", "waiting", []string{"ship"}},
	{"sync-crm", "fail", "failed", []string{"invoice"}},
	{"crm-report", "ok", "cancelled", []string{"sync-crm"}},
}

// seedFlows serves queue "orders" and enqueues demoWorkflow and a batch of
// 40 rows (3 fail, 5 run until the test ends, a callback waits for them).
// It waits until every step is in the state demoSteps gives and the batch
// has 35 tasks finished, and returns the batch's ID.
func seedFlows(t *testing.T, e *env) string {
	t.Helper()
	srv := tide.NewServer(e.b, tide.Config{
		Concurrency: 12, Queues: map[string]int{"orders": 1}, ShutdownTimeout: time.Second, Logger: testLogger(t),
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 10 * time.Minute },
	})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		switch string(task.Payload()) {
		case "hold":
			<-ctx.Done()
			return context.Cause(ctx)
		case "flaky":
			return errors.New("fraud API: 503 Service Unavailable")
		case "fail":
			return fmt.Errorf("crm: 422 Unprocessable Entity: account <acme> is locked: %w", tide.SkipRetry)
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	wf := tide.NewWorkflow(demoWorkflow)
	for _, s := range demoSteps {
		wf.Add(s.name, tide.NewTask("order:"+s.name, []byte(s.payload)), tide.After(s.after...))
	}
	if _, err := e.c.EnqueueWorkflow(e.ctx(), wf, tide.Queue("orders")); err != nil {
		t.Fatal(err)
	}
	var rows []*tide.Task
	for i := range 40 {
		p := "ok"
		switch {
		case i%13 == 5:
			p = "fail"
		case i >= 35:
			p = "hold"
		}
		rows = append(rows, tide.NewTask("import:row", []byte(p)))
	}
	b, err := e.c.EnqueueBatch(e.ctx(), rows, tide.Queue("orders"), tide.OnBatchDone(tide.NewTask("import:report", nil)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, err1 := e.in.GetWorkflow(e.ctx(), demoWorkflow)
		bi, err2 := e.in.GetBatch(e.ctx(), b.ID)
		settled := err1 == nil && err2 == nil && bi.Succeeded+bi.Failed == 35
		if settled {
			for i, s := range f.Steps {
				got := s.State.String()
				if s.State == tide.StepEnqueued {
					got = s.TaskState.String()
				}
				settled = settled && got == demoSteps[i].want
			}
		}
		if settled {
			return b.ID
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workflow and the batch did not settle: %+v %v / %+v %v", f, err1, bi, err2)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestE2EBrowser drives the dashboard in headless Chromium: it logs in,
// runs a scheduled task with its button, deletes another one (accepting the
// confirmation), checks the pages and the Inspector, and takes screenshots
// (to the test's temp dir and, when TIDE_DASH_SCREENSHOT=path.png is set,
// to that path, with -queue, -errors, -task and -servers variants next to
// it). It then searches with the form and archives two selected rows, watches
// the live view count new tasks without a reload, and shows a task's attempt
// history and a running task (-search, -live, -task-history, -task-running),
// a queue's limits and groups, one running and one throttled (-groups), dark
// mode with a contrast check (-dark) and a phone-sized screen (-narrow).
// Last it opens a workflow's graph from the list and follows a box to its
// task (-workflow), shows a batch's progress (-batch) and cancels a
// workflow with its button.
func TestE2EBrowser(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("e2e browser test skipped in -short mode")
	}
	exe := chromiumPath()
	if _, err := os.Stat(exe); err != nil {
		t.Skipf("e2e browser test skipped: %s not found (install Debian's chromium: apt-get install -y chromium, or set TIDE_CHROMIUM)", exe)
	}
	e := newEnv(t, testToken)
	seedDemo(t, e)
	target := e.enqueue("order:cancel", []byte(`{"order_id":42,"reason":"unpaid"}`),
		tide.ProcessIn(15*time.Minute), tide.TaskID("cancel:order-42"))
	doomed := "cancel:order-44"

	profile, err := os.MkdirTemp("", "tide-dash-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	// Chromium's helper processes may still be writing when the test ends;
	// failing to remove the profile is not the test's concern.
	t.Cleanup(func() { _ = os.RemoveAll(profile) })

	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1360, 900),
	)
	defer cancelAlloc()
	quiet := func(format string, args ...any) {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "chromedp: "+format+"\n", args...)
		}
	}
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithErrorf(quiet), chromedp.WithLogf(quiet))
	defer cancelBrowser()

	// Accept confirmation dialogs (the delete button asks).
	var confirmed []string
	confirmedc := make(chan string, 8)
	dialogs := chromedp.Events(bctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			confirmedc <- ev.Message
			_, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()

	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("browser: %s: %v", what, err)
		}
	}
	eval := func(expr string) any {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[any](expr))
		if err != nil {
			t.Fatalf("browser: evaluate %s: %v", expr, err)
		}
		return v
	}
	// waitJS polls expr until it is true. It tolerates the errors of a page
	// that is navigating, which a form submission makes.
	waitJS := func(what, expr string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			ok, err := chromedp.Run(bctx, chromedp.Evaluate[bool](expr))
			if err == nil && ok {
				return
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				body, _ := chromedp.Run(bctx, chromedp.Evaluate[string]("document.body ? document.body.innerText : ''"))
				t.Fatalf("browser: %s: %s is not true (last error: %v)\npage:\n%s", what, expr, err, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFlash := func(what, want string) {
		t.Helper()
		waitJS(what, fmt.Sprintf(`(function(){var f=document.getElementById('flash');return !!f && document.readyState === 'complete' && f.textContent.indexOf(%q) >= 0})()`, want))
	}
	row := func(id string) chromedp.CSS { return chromedp.CSS(fmt.Sprintf(`tr[data-task-id=%q]`, id)) }

	// A visitor sees the task, escaped, and no buttons.
	run("open the scheduled tasks",
		chromedp.Navigate(e.srv.URL+"/queue?q=default&state=scheduled"),
		chromedp.WaitVisible(row(target.ID)),
	)
	if n := eval(`document.querySelectorAll('button[data-action]').length`); n != float64(0) {
		t.Errorf("a visitor sees %v action buttons", n)
	}
	if v := eval(`window.__xss === undefined && document.body.textContent.indexOf('<script>window.__xss=1</script>') >= 0`); v != true {
		t.Error("the <script> payload was not shown as text (or it ran)")
	}

	// Log in through the form; it returns to the page.
	run("log in",
		chromedp.Click(chromedp.ID("login-link")),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), testToken),
		chromedp.Click(chromedp.ID("login-btn")),
	)
	waitFlash("log in", "Logged in")
	if loc, _ := chromedp.Run(bctx, chromedp.Location()); !strings.Contains(loc, "/queue?q=default&state=scheduled") {
		t.Errorf("after login the browser is at %s, want the queue page", loc)
	}

	// Run the task now.
	runBtn := chromedp.CSS(fmt.Sprintf(`button[data-action="run"][data-task=%q]`, target.ID))
	run("press run now",
		chromedp.WaitVisible(runBtn),
		chromedp.Click(runBtn),
	)
	waitFlash("run now", "Task "+target.ID+" is now pending.")
	run("scheduled list without the task", chromedp.WaitNotPresent(row(target.ID)))
	if got, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`a[data-state="pending"] .count`))); got != "1" {
		t.Errorf("pending tab count %q, want 1", got)
	}
	if st := e.state("default", target.ID); st != tide.StatePending {
		t.Errorf("Inspector: task is %v after run now, want pending", st)
	}

	// Delete another one, accepting the confirmation.
	delBtn := chromedp.CSS(fmt.Sprintf(`button[data-action="delete"][data-task=%q]`, doomed))
	run("press delete", chromedp.WaitVisible(delBtn), chromedp.Click(delBtn))
	waitFlash("delete", "Task "+doomed+" was deleted.")
	select {
	case m := <-confirmedc:
		confirmed = append(confirmed, m)
	case <-time.After(5 * time.Second):
	}
	if len(confirmed) != 1 || !strings.Contains(confirmed[0], "Delete this task") {
		t.Errorf("confirmations %q, want one asking to delete", confirmed)
	}
	if _, err := e.in.GetTaskInfo(e.ctx(), "default", doomed); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Errorf("Inspector: deleted task: %v", err)
	}

	// The task is in the pending tab.
	run("open the pending tab",
		chromedp.Click(chromedp.CSS(`a[data-state="pending"]`)),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`tr[data-task-id=%q][data-state="pending"]`, target.ID))),
	)

	// save takes a screenshot of the page as it is, at least minWidth
	// pixels wide.
	save := func(name string, minWidth int) {
		t.Helper()
		img, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("browser: screenshot %s: %v", name, err)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(img))
		if err != nil || cfg.Width < minWidth || cfg.Height < 300 {
			t.Fatalf("screenshot %s: %dx%d %v", name, cfg.Width, cfg.Height, err)
		}
		file := "dashboard.png"
		if name != "" {
			file = "dashboard-" + name + ".png"
		}
		if err := os.WriteFile(filepath.Join(t.TempDir(), file), img, 0o644); err != nil {
			t.Fatal(err)
		}
		if p := os.Getenv("TIDE_DASH_SCREENSHOT"); p != "" {
			if name != "" {
				ext := filepath.Ext(p)
				p = strings.TrimSuffix(p, ext) + "-" + name + ext
			}
			if err := os.WriteFile(p, img, 0o644); err != nil {
				t.Fatalf("write screenshot: %v", err)
			}
			t.Logf("screenshot: %s", p)
		}
	}
	shot := func(name, url, ready string) {
		t.Helper()
		run("open "+name, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(ready)))
		save(name, 800)
	}
	shot("", e.srv.URL+"/", "#chart")
	shot("queue", e.srv.URL+"/queue?q=default&state=scheduled", "#tasks")
	shot("errors", e.srv.URL+"/queue?q=emails&state=archived", "#tasks")
	shot("task", e.srv.URL+"/task?q=default&id="+target.ID, "#payload")
	// The periodic tasks have run (and failed) at least once: the servers
	// page shows both outcomes (reloaded until the ticks have been processed).
	deadline := time.Now().Add(30 * time.Second)
	for {
		run("open the servers", chromedp.Navigate(e.srv.URL+"/servers"), chromedp.WaitVisible(chromedp.ID("servers")))
		if eval(`document.querySelectorAll('tr[data-entry="metrics:flush"] .run-succeeded').length > 0 && `+
			`document.querySelectorAll('tr[data-entry="reports:rollup"] .run-failed').length > 0`) == true {
			break
		}
		if time.Now().After(deadline) {
			body, _ := chromedp.Run(bctx, chromedp.Evaluate[string]("document.body.innerText"))
			t.Fatalf("the servers page shows no successful run of metrics:flush or no failed run of reports:rollup:\n%s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	save("servers", 800)
	if v := eval(`document.getElementById('store-version').textContent.length > 0 && !!document.getElementById('store-eviction')`); v != true {
		t.Error("the servers page lacks the Redis facts")
	}
	run("open a periodic task's runs",
		chromedp.Click(chromedp.CSS(`tr[data-entry="reports:rollup"] td.id a`)),
		chromedp.WaitVisible(chromedp.ID("cron-runs")),
	)
	if n := eval(`document.querySelectorAll('#cron-runs tr[data-outcome="failed"]').length`); n == float64(0) {
		t.Error("the periodic task's page shows no failed run")
	}
	save("cron", 800)

	// Search with the form: only the matching rows are listed.
	run("search by type",
		chromedp.Navigate(e.srv.URL+"/queue?q=default&state=scheduled"),
		chromedp.WaitVisible(chromedp.ID("search-type")),
		chromedp.SendKeys(chromedp.ID("search-type"), "order:cancel"),
		chromedp.Click(chromedp.ID("search-btn")),
	)
	waitJS("search results", `(function(){var n=document.getElementById('search-note');return !!n && document.readyState==='complete'})()`)
	if got := eval(`Array.from(document.querySelectorAll('tr[data-task-id]')).map(function(r){return r.getAttribute('data-task-id')}).sort().join(' ')`); got != "cancel:order-43 cancel:order-45" {
		t.Errorf("search rows %q, want the two order:cancel tasks", got)
	}
	save("search", 800)

	// Select both rows and archive them: they move to the archived tab.
	picked := []string{"cancel:order-43", "cancel:order-45"}
	for _, id := range picked {
		run("select "+id, chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-task-id=%q] input.sel-box`, id))))
	}
	if got := eval(`document.getElementById('selection-count').textContent`); got != "2 tasks selected:" {
		t.Errorf("selection count %q", got)
	}
	run("archive the selection", chromedp.Click(chromedp.CSS(`button[data-action="sel-archive"]`)))
	waitFlash("archive the selection", "2 selected tasks of queue default were archived.")
	for _, id := range picked {
		run("row gone after archive", chromedp.WaitNotPresent(row(id)))
		if st := e.state("default", id); st != tide.StateArchived {
			t.Errorf("Inspector: %s is %v after archiving the selection, want archived", id, st)
		}
	}
	run("open the archived tab",
		chromedp.Click(chromedp.CSS(`a[data-state="archived"]`)),
		chromedp.WaitVisible(row(picked[0])),
		chromedp.WaitVisible(row(picked[1])),
	)

	// The live view updates while the page stays loaded.
	run("open the emails queue", chromedp.Navigate(e.srv.URL+"/queue?q=emails&state=pending"))
	waitJS("first live update", `(function(){var l=document.getElementById('live');return !!l && l.hasAttribute('data-updates')})()`)
	before := eval(`window.__samePage = 'still here'; document.getElementById('live-processed-hour').textContent`)
	todayBefore := eval(`document.querySelector('.stats [data-live="processed"]').textContent`)
	for i := range 5 {
		e.enqueue("email:welcome", fmt.Appendf(nil, `{"user_id":%d,"kind":"ok"}`, 2000+i), tide.Queue("emails"))
	}
	waitJS("the live view to count the new tasks", fmt.Sprintf(
		`window.__samePage === 'still here' && document.getElementById('live-processed-hour').textContent !== %q`, before))
	if after := eval(`document.getElementById('live-processed-hour').textContent`); after == before {
		t.Errorf("live count stayed %v", before)
	}
	waitJS("the page's processed-today count to follow", fmt.Sprintf(
		`document.querySelector('.stats [data-live="processed"]').textContent !== %q`, todayBefore))
	if n := eval(`document.querySelectorAll('#live-throughput polyline').length`); n != float64(2) {
		t.Errorf("live chart has %v lines, want 2", n)
	}
	save("live", 800)

	// A retried task's page lists its failed attempts.
	retries, err := e.in.ListTasks(e.ctx(), "webhooks", tide.StateRetry, 1, 10)
	if err != nil || len(retries) == 0 {
		t.Fatalf("no retry task to show: %v", err)
	}
	shot("task-history", e.srv.URL+"/task?q=webhooks&id="+retries[0].ID, "#attempts")
	if got := eval(`document.querySelector('#attempts tr.attempt .errtext').textContent`); !strings.Contains(fmt.Sprint(got), "502 Bad Gateway") {
		t.Errorf("attempt error %q", got)
	}

	// The running task's page says where and since when it runs (the
	// server's heartbeat may lag a few seconds).
	active, _, err := e.in.SearchTasks(e.ctx(), "emails", tide.StateActive, tide.TaskFilter{Type: "email:digest"}, 0, 10)
	if err != nil || len(active) != 1 {
		t.Fatalf("the running email:digest task: %v %v", active, err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		run("open the running task", chromedp.Navigate(e.srv.URL+"/task?q=emails&id="+active[0].ID), chromedp.WaitVisible(chromedp.ID("running-server")))
		if eval(`!!document.querySelector('#running-server code')`) == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the running task's page never names its server")
		}
		time.Sleep(200 * time.Millisecond)
	}
	save("task-running", 800)

	// A queue with limits and groups: its page lists the groups by
	// backlog, one of them running and one throttled.
	seedGroups(t, e)
	waitGroups := func() {
		deadline := time.Now().Add(20 * time.Second)
		for {
			gs, err := e.in.Groups(e.ctx(), "exports", 20)
			var running, held bool
			for _, g := range gs {
				running = running || g.Group == "acme-corp" && g.Running > 0
				held = held || g.Group == "globex" && !g.ThrottledUntil.IsZero()
			}
			if err == nil && running && held {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the exports groups: %+v %v", gs, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitGroups()
	shot("groups", e.srv.URL+"/queue?q=exports", "#groups-table")
	if got := eval(`Array.from(document.querySelectorAll('#groups-table tbody tr')).map(function(r){return r.getAttribute('data-group')}).join(' ')`); !strings.HasPrefix(fmt.Sprint(got), "initech ") {
		t.Errorf("group rows %q, want initech (the largest backlog) first", got)
	}
	if got := eval(`document.querySelector('[data-limit="group-rate"]').textContent + ' · ' + document.querySelector('[data-limit="concurrency"]').textContent`); got != "30 per 1m · 8" {
		t.Errorf("limits shown: %q", got)
	}
	if n := eval(`document.querySelectorAll('#groups-table tr[data-group="globex"] .badge.throttled').length`); n != float64(1) {
		t.Errorf("globex is not shown throttled (%v badges)", n)
	}

	// A workflow's graph: opened from the list, a box per step coloured
	// by its state, an edge per dependency, boxes that do not overlap and
	// link to their tasks.
	batchID := seedFlows(t, e)
	run("open the workflows",
		chromedp.Navigate(e.srv.URL+"/workflows"),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`tr[data-workflow=%q] a`, demoWorkflow))),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-workflow=%q] a`, demoWorkflow))),
		chromedp.WaitVisible(chromedp.ID("workflow-graph")),
	)
	save("workflow", 800)
	edges := 0
	for _, s := range demoSteps {
		edges += len(s.after)
		look := s.want
		if got := eval(fmt.Sprintf(`(function(){var g=document.querySelector('#workflow-graph g.node[data-step=%q]');return g ? g.getAttribute('class') : ''})()`, s.name)); got != "node n-"+look {
			t.Errorf("box of %s: class %q, want node n-%s", s.name, got, look)
		}
	}
	if n := eval(`document.querySelectorAll('#workflow-graph g.node').length`); n != float64(len(demoSteps)) {
		t.Errorf("%v boxes, want %d", n, len(demoSteps))
	}
	if n := eval(`document.querySelectorAll('#workflow-graph path.edge').length`); n != float64(edges) {
		t.Errorf("%v edges, want %d", n, edges)
	}
	if ok := eval(`(function(){var r=Array.from(document.querySelectorAll('#workflow-graph g.node rect')).map(function(e){return e.getBoundingClientRect()});
		for(var i=0;i<r.length;i++){if(r[i].width<100||r[i].height<30)return false;for(var j=i+1;j<r.length;j++){var a=r[i],b=r[j];
		if(a.left<b.right&&b.left<a.right&&a.top<b.bottom&&b.top<a.bottom)return false}}return true})()`); ok != true {
		t.Error("the graph's boxes overlap or are not drawn")
	}
	if ok := eval(`(function(){var f=function(s){return getComputedStyle(document.querySelector('#workflow-graph g.'+s+' rect')).fill};
		var seen={};['n-succeeded','n-failed','n-active','n-retry','n-waiting'].forEach(function(s){seen[f(s)]=1});return Object.keys(seen).length===5})()`); ok != true {
		t.Error("the graph's states are not told apart by colour")
	}
	if n := eval(`document.querySelectorAll('#steps-table .errtext').length`); n != float64(len(demoSteps)) {
		t.Errorf("step table: %v error cells", n)
	}
	if got := eval(`document.querySelector('#steps-table tr[data-step="sync-crm"] .errtext').textContent`); !strings.Contains(fmt.Sprint(got), "account <acme> is locked") {
		t.Errorf("sync-crm's error in the table: %q", got)
	}
	run("follow a box to its task",
		chromedp.Click(chromedp.CSS(`#workflow-graph g.node[data-step="pack"] a rect`)),
		chromedp.WaitVisible(chromedp.ID("payload")),
	)
	if loc, _ := chromedp.Run(bctx, chromedp.Location()); !strings.Contains(loc, "id="+demoWorkflow+"%2Fpack") {
		t.Errorf("the pack box leads to %s", loc)
	}

	// A batch: its progress bar, counts, callback and failed tasks.
	run("open the batch",
		chromedp.Navigate(e.srv.URL+"/batches"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-batch=%q] a`, batchID))),
		chromedp.WaitVisible(chromedp.ID("batch-progress")),
	)
	save("batch", 800)
	if got := eval(`document.getElementById('batch-counts').textContent`); got != "32 succeeded, 3 failed, 5 pending of 40" {
		t.Errorf("batch counts %q", got)
	}
	if got := eval(`Array.from(document.querySelectorAll('#batch-progress svg.pbar rect')).map(function(r){return r.getAttribute('class')+':'+Math.round(r.getBBox().width)}).join(' ')`); got != "track:1000 ok:800 failed:75" {
		t.Errorf("batch bar %q", got)
	}
	if n := eval(`document.querySelectorAll('#failed-ids li a').length`); n != float64(3) {
		t.Errorf("%v failed task links, want 3", n)
	}
	if got := eval(`document.querySelector('#batch-callback .badge').textContent`); got != "waiting" {
		t.Errorf("callback state %q", got)
	}

	// Cancel a workflow with its button, accepting the confirmation.
	cancelMe := tide.NewWorkflow("cancel-me").
		Add("wait", tide.NewTask("order:wait", []byte("hold"))).
		Add("then", tide.NewTask("order:then", nil), tide.After("wait"))
	if _, err := e.c.EnqueueWorkflow(e.ctx(), cancelMe, tide.Queue("orders")); err != nil {
		t.Fatal(err)
	}
	run("cancel a workflow",
		chromedp.Navigate(e.srv.URL+"/workflows/cancel-me"),
		chromedp.WaitVisible(chromedp.ID("cancel-workflow")),
		chromedp.Click(chromedp.ID("cancel-workflow")),
	)
	waitFlash("cancel a workflow", "Workflow cancel-me was cancelled")
	if got := eval(`document.querySelector('#workflow-state .badge').textContent`); got != "cancelled" {
		t.Errorf("after cancel the page says %q", got)
	}
	if f, err := e.in.GetWorkflow(e.ctx(), "cancel-me"); err != nil || f.State != tide.FlowCanceled {
		t.Errorf("Inspector: cancel-me is %+v %v", f, err)
	}

	// Dark mode follows the browser's preference, with enough contrast.
	if _, err := chromedp.Call(bctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	run("open the archived emails in dark mode", chromedp.Navigate(e.srv.URL+"/queue?q=emails&state=archived"), chromedp.WaitVisible(chromedp.ID("tasks")))
	waitJS("the live view in dark mode", `document.getElementById('live').hasAttribute('data-updates')`)
	save("dark", 800)
	if dark := eval(contrastJS + `luminance(bg(document.body)) < 0.05`); dark != true {
		t.Error("the page is not dark under prefers-color-scheme: dark")
	}
	for _, sel := range []string{"body", "table.grid td.type", ".muted", "table.grid thead th", ".badge", ".btn", "table.grid .err"} {
		ratio, _ := chromedp.Run(bctx, chromedp.Evaluate[float64](contrastJS+fmt.Sprintf(`contrast(document.querySelector(%q))`, sel)))
		if ratio < 4.5 {
			t.Errorf("dark mode: %s has contrast %.2f, want at least 4.5", sel, ratio)
		}
	}
	run("open the groups in dark mode", chromedp.Navigate(e.srv.URL+"/queue?q=exports"), chromedp.WaitVisible(chromedp.ID("groups-table")))
	for _, sel := range []string{"dl.limits dt", "dl.limits dd", "#groups-table .badge.throttled", "#groups-table td.group-name"} {
		ratio, _ := chromedp.Run(bctx, chromedp.Evaluate[float64](contrastJS+fmt.Sprintf(`contrast(document.querySelector(%q))`, sel)))
		if ratio < 4.5 {
			t.Errorf("dark mode: %s has contrast %.2f, want at least 4.5", sel, ratio)
		}
	}
	run("open the workflow in dark mode", chromedp.Navigate(e.srv.URL+"/workflows/"+demoWorkflow), chromedp.WaitVisible(chromedp.ID("workflow-graph")))
	for _, sel := range []string{".badge.fl-running", "#steps-table .badge.n-active", "#steps-table .badge.n-retry", "#steps-table .badge.n-failed",
		"#steps-table .badge.n-waiting", "#steps-table .badge.n-succeeded", "#steps-table .errtext"} {
		ratio, _ := chromedp.Run(bctx, chromedp.Evaluate[float64](contrastJS+fmt.Sprintf(`contrast(document.querySelector(%q))`, sel)))
		if ratio < 4.5 {
			t.Errorf("dark mode: %s has contrast %.2f, want at least 4.5", sel, ratio)
		}
	}
	if _, err := chromedp.Call(bctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: ""}}}); err != nil {
		t.Fatal(err)
	}

	// A phone-sized screen: the page does not scroll sideways (tables
	// scroll in their own box) and the header wraps.
	run("narrow screen", chromedp.EmulateViewport(390, 844))
	run("open the queue on a narrow screen", chromedp.Navigate(e.srv.URL+"/queue?q=default&state=archived"), chromedp.WaitVisible(chromedp.ID("tasks")))
	if ok := eval(`document.documentElement.scrollWidth <= window.innerWidth + 1`); ok != true {
		t.Errorf("the narrow page scrolls sideways: %v > %v", eval(`document.documentElement.scrollWidth`), eval(`window.innerWidth`))
	}
	if ok := eval(`(function(){var s=document.querySelector('#tasks').closest('.scroll');return getComputedStyle(s).overflowX === 'auto'})()`); ok != true {
		t.Error("the task table is not in a scrolling box")
	}
	save("narrow", 300)
	run("open the groups on a narrow screen", chromedp.Navigate(e.srv.URL+"/queue?q=exports"), chromedp.WaitVisible(chromedp.ID("groups-table")))
	if ok := eval(`document.documentElement.scrollWidth <= window.innerWidth + 1`); ok != true {
		t.Errorf("the narrow groups page scrolls sideways: %v > %v", eval(`document.documentElement.scrollWidth`), eval(`window.innerWidth`))
	}
	run("open the workflow on a narrow screen", chromedp.Navigate(e.srv.URL+"/workflows/"+demoWorkflow), chromedp.WaitVisible(chromedp.ID("workflow-graph")))
	if ok := eval(`document.documentElement.scrollWidth <= window.innerWidth + 1`); ok != true {
		t.Errorf("the narrow workflow page scrolls sideways: %v > %v", eval(`document.documentElement.scrollWidth`), eval(`window.innerWidth`))
	}
	run("reset the viewport", chromedp.EmulateReset())
}

// contrastJS defines luminance, bg and contrast: the WCAG contrast ratio of
// an element's text against the first opaque background behind it.
const contrastJS = `
function rgb(s){var m=s.match(/[\d.]+/g)||[0,0,0,0];return {r:+m[0],g:+m[1],b:+m[2],a:m.length>3?+m[3]:1}}
function luminance(c){var f=function(v){v/=255;return v<=0.03928?v/12.92:Math.pow((v+0.055)/1.055,2.4)};return 0.2126*f(c.r)+0.7152*f(c.g)+0.0722*f(c.b)}
function bg(el){for(;el;el=el.parentElement){var c=rgb(getComputedStyle(el).backgroundColor);if(c.a>0.5)return c}return {r:255,g:255,b:255,a:1}}
function contrast(el){if(!el)return 0;var a=luminance(rgb(getComputedStyle(el).color)),b=luminance(bg(el));return (Math.max(a,b)+0.05)/(Math.min(a,b)+0.05)}
`
