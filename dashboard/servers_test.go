package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestServersPageRedisAndCronHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.startServer(tide.Config{Concurrency: 2, Queues: map[string]int{"cron": 1}}, func(_ context.Context, task *tide.Task) error {
		return errors.New("tick failed: </script><script>alert(1)</script>")
	})
	s := tide.NewScheduler(e.b, &tide.SchedulerOpts{Logger: testLogger(t), SchedulerID: "sched-<b>1</b>"})
	if _, err := s.RegisterEntry(tide.CronEntry{ID: "every-second", Spec: "@every 1s", Task: tide.NewTask("tick", nil),
		Options: []tide.Option{tide.Queue("cron"), tide.MaxRetry(0)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)

	var body string
	testwait.For(t, 20*time.Second, "a failed run in the cron history", func() bool {
		var resp *http.Response
		resp, body = e.get("/servers")
		wantStatus(t, resp, body, http.StatusOK)
		return strings.Contains(body, `class="run run-failed"`)
	})
	checkNoRaw(t, "/servers", body)
	for _, want := range []string{
		`data-entry="every-second"`,
		`href="/task?id=cron%3Aevery-second%3A`, // the tick's task, linked
		`tick failed: &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;`,
		`sched-&lt;b&gt;1&lt;/b&gt;`,
		`id="store"`, `id="store-version"`, `id="store-eviction"`,
		`href="/cron?id=every-second&amp;s=sched-%3Cb%3E1%3C%2Fb%3E"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("servers page lacks %s", want)
		}
	}

	// The entry's own page lists its latest runs.
	resp, body := e.get("/cron?" + url.Values{"id": {"every-second"}, "s": {"sched-<b>1</b>"}}.Encode())
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "/cron", body)
	for _, want := range []string{`id="cron-runs"`, `<tr data-outcome="failed">`, `tick failed: &lt;/script&gt;`, `<code>@every 1s</code>`} {
		if !strings.Contains(body, want) {
			t.Errorf("cron page lacks %s:\n%s", want, body)
		}
	}
	if n := strings.Count(body, "<tr data-outcome="); n != cronPageRuns {
		t.Errorf("cron page lists %d ticks, want %d", n, cronPageRuns)
	}
	for path, want := range map[string]int{
		"/cron?id=every-second":                http.StatusOK,
		"/cron?id=nope":                        http.StatusNotFound,
		"/cron?id=every-second&s=other":        http.StatusNotFound,
		"/cron":                                http.StatusBadRequest,
		"/cron?id=a%00b":                       http.StatusBadRequest,
		"/cron?id=" + strings.Repeat("x", 300): http.StatusBadRequest,
	} {
		resp, body := e.get(path)
		if resp.StatusCode != want {
			t.Errorf("%s: status %d, want %d:\n%s", path, resp.StatusCode, want, body)
		}
	}
}

func TestStoreFacts(t *testing.T) {
	t.Parallel()
	f := newStoreFacts(&tide.StoreInfo{Kind: "redis", Version: "7.2.4", UsedMemory: 3 << 20, MaxMemory: 12 << 20, EvictionPolicy: "allkeys-lru", Nodes: 1})
	if !f.Evicting || f.Used != "3.0 MiB" || f.Max != "12.0 MiB" || f.Percent != "25.0%" {
		t.Errorf("facts %+v", f)
	}
	f = newStoreFacts(&tide.StoreInfo{UsedMemory: 5 << 30, EvictionPolicy: "noeviction"})
	if f.Evicting || f.Max != "no limit" || f.Percent != "" || f.Used != "5.00 GiB" {
		t.Errorf("facts %+v", f)
	}

	// The servers page highlights an evicting policy, escaped.
	e := newEnv(t, testToken)
	for _, c := range []struct {
		policy string
		warn   bool
	}{{"noeviction", false}, {"volatile-lru<script>", true}} {
		d := &serversData{Store: newStoreFacts(&tide.StoreInfo{Version: "7.2.4", EvictionPolicy: c.policy, Nodes: 1})}
		var sb strings.Builder
		if err := e.h.pages["servers"].ExecuteTemplate(&sb, "layout", &view{Title: "t", Data: d, Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
		body := sb.String()
		if got := strings.Contains(body, `class="warnbox"`); got != c.warn {
			t.Errorf("policy %q: warning shown %v", c.policy, got)
		}
		if strings.Contains(body, "<script>") {
			t.Errorf("policy %q shown unescaped", c.policy)
		}
	}
}

func TestCronOutcome(t *testing.T) {
	t.Parallel()
	for st, want := range map[tide.TaskState]string{
		tide.StateCompleted: "succeeded", tide.StateArchived: "failed", tide.StateActive: "running",
		tide.StateRetry: "retrying", tide.StatePending: "waiting", tide.StateScheduled: "waiting",
	} {
		if got := cronOutcome(tide.CronRun{Task: &tide.TaskInfo{State: st}}).Outcome; got != want {
			t.Errorf("%v: %q, want %q", st, got, want)
		}
	}
	if c := cronOutcome(tide.CronRun{TaskID: "x"}); c.Exists || c.Outcome != "no task" {
		t.Errorf("gone task: %+v", c)
	}
}
