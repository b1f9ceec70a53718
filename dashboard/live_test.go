package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

func (e *env) live(path string, hdr map[string]string) (*http.Response, string, *liveData) {
	e.t.Helper()
	resp, body := e.do(http.MethodGet, path, nil, hdr)
	if resp.StatusCode != http.StatusOK {
		return resp, body, nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Errorf("%s: Content-Type %q", path, ct)
	}
	var d liveData
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		e.t.Fatalf("%s: %v\n%s", path, err, body)
	}
	return resp, body, &d
}

func TestLiveAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	resp, body, d := e.live("/api/live?q=work", nil)
	wantStatus(t, resp, body, http.StatusOK)
	if len(d.Points) < 60 || len(d.Points) > 62 || d.ProcessedLastHour != 0 || d.Queue != "work" {
		t.Fatalf("empty queue: %d points, %d processed, queue %q", len(d.Points), d.ProcessedLastHour, d.Queue)
	}
	for i := 1; i < len(d.Points); i++ {
		if d.Points[i].At-d.Points[i-1].At != 60_000 {
			t.Fatalf("points are not a minute apart: %+v", d.Points[i-1:i+1])
		}
	}
	if resp.Header.Get("Cache-Control") != "no-store" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("live API headers %v", resp.Header)
	}

	e.startServer(tide.Config{Concurrency: 2, Queues: map[string]int{"work": 1}}, func(_ context.Context, task *tide.Task) error {
		if string(task.Payload()) == "fail" {
			return tide.SkipRetry
		}
		return nil
	})
	for _, p := range []string{"ok", "ok", "ok", "fail"} {
		e.enqueue("job", []byte(p), tide.Queue("work"))
	}
	e.enqueue("later", []byte("x"), tide.Queue("work"), tide.ProcessIn(time.Hour))
	testwait.For(t, 20*time.Second, "four tasks processed in the live view", func() bool {
		_, _, d = e.live("/api/live?q=work", nil)
		return d != nil && d.ProcessedLastHour == 4 && d.Sizes.Processed == 4 && d.Sizes.Archived == 1
	})
	if d.FailedLastHour != 1 || d.Sizes.Archived != 1 || d.Sizes.Scheduled != 1 || d.Sizes.Processed != 4 {
		t.Errorf("live view after processing: %+v", d)
	}
	// Without q: every queue summed.
	e.enqueue("other", []byte("x"), tide.Queue("elsewhere"), tide.ProcessIn(time.Hour))
	_, _, all := e.live("/api/live", nil)
	if all == nil || all.Queues != 2 || all.ProcessedLastHour != 4 || all.Sizes.Scheduled != 2 {
		t.Errorf("all queues: %+v", all)
	}

	// Hostile or bad input: a JSON 400 with the markup escaped.
	resp, body, _ = e.live("/api/live?"+url.Values{"q": {"</script><script>alert(1)</script>"}}.Encode(), nil)
	wantStatus(t, resp, body, http.StatusBadRequest)
	if strings.Contains(body, "<") || !strings.Contains(body, `"ok":false`) || !strings.Contains(body, `\u003c/script\u003e`) {
		t.Errorf("bad queue answer: %s", body)
	}
	resp, body, _ = e.live("/api/live?q=", nil)
	wantStatus(t, resp, body, http.StatusBadRequest)

	// The host check applies.
	resp, body, _ = e.live("/api/live", map[string]string{"Host": "evil.example"})
	wantStatus(t, resp, body, http.StatusMisdirectedRequest)

	// The pages carry the live panel, pointing at the endpoint.
	_, body = e.get("/queue?q=work")
	if !strings.Contains(body, `id="live" data-src="/api/live?q=work"`) {
		t.Errorf("queue page lacks the live panel")
	}
	_, body = e.get("/")
	if !strings.Contains(body, `id="live" data-src="/api/live"`) || !strings.Contains(body, `id="chart"`) {
		t.Errorf("overview lacks the live panel or the daily chart")
	}
}

func TestLiveAPINeedsReadToken(t *testing.T) {
	t.Parallel()
	const readToken = "read-token-for-tests-0123456789"
	e := newEnvOpts(t, Options{Token: testToken, ReadToken: readToken})
	resp, body, _ := e.live("/api/live", nil)
	wantStatus(t, resp, body, http.StatusUnauthorized)
	if strings.Contains(body, `"points"`) {
		t.Error("the live view leaks to a visitor without a token")
	}
	resp, body, _ = e.live("/api/live", map[string]string{"Authorization": "Bearer wrong"})
	wantStatus(t, resp, body, http.StatusUnauthorized)
	resp, body, _ = e.live("/api/live", map[string]string{"Authorization": "Bearer " + readToken})
	wantStatus(t, resp, body, http.StatusOK)
	s := e.loginWith(readToken)
	resp, body = e.get("/api/live?q=default", s)
	wantStatus(t, resp, body, http.StatusOK)
	// A read session cannot act on a selection.
	resp, body = e.do(http.MethodPost, "/selection/delete", url.Values{"q": {"default"}, "id": {"x"}}, e.browser(), s)
	wantStatus(t, resp, body, http.StatusForbidden)
	resp, body = e.do(http.MethodPost, "/selection/delete", url.Values{"q": {"default"}, "id": {"x"}}, map[string]string{"Authorization": "Bearer " + readToken})
	wantStatus(t, resp, body, http.StatusForbidden)
}

func TestMergeSeries(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 30, 10, 0, time.UTC)
	since := now.Add(-liveSpan)
	at := func(m int) time.Time { return now.Truncate(time.Minute).Add(time.Duration(-m) * time.Minute) }
	pts := mergeSeries([][]tide.Point{
		{{At: at(0), Processed: 3, Failed: 1, Pending: 5}, {At: at(1), Processed: 2, Pending: -1}, {At: at(90), Processed: 100}},
		{{At: at(0), Processed: 1, Pending: 2}, {At: at(1), Pending: -1}},
	}, since, now)
	if len(pts) != 61 {
		t.Fatalf("%d points, want 61", len(pts))
	}
	last, prev := pts[60], pts[59]
	if last.Processed != 4 || last.Failed != 1 || last.Pending != 7 || prev.Processed != 2 || prev.Pending != -1 {
		t.Errorf("merged %+v %+v", prev, last)
	}
	total := 0
	for _, p := range pts {
		total += p.Processed
	}
	if total != 6 {
		t.Errorf("points outside the span were counted: total %d", total)
	}
}

func TestOverdueBanner(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.enqueue("late", []byte("x"), tide.Queue("lonely"), tide.ProcessIn(30*time.Millisecond))
	e.enqueue("now", []byte("x"), tide.Queue("served"))
	// A server for another queue does not help the lonely one.
	e.startServer(tide.Config{Concurrency: 1, Queues: map[string]int{"served": 1}}, func(context.Context, *tide.Task) error { return nil })
	testwait.For(t, 20*time.Second, "the task to be overdue", func() bool {
		qi, err := e.in.QueueInfo(e.ctx(), "lonely")
		return err == nil && qi.Overdue == 1
	})
	testwait.For(t, 20*time.Second, "the server's heartbeat", func() bool {
		ss, err := e.in.Servers(e.ctx())
		return err == nil && len(ss) == 1
	})
	_, body := e.get("/queue?q=lonely&state=scheduled")
	if !strings.Contains(body, `id="overdue-banner"`) || !strings.Contains(body, "no live server serves this queue") {
		t.Errorf("queue page without the overdue banner:\n%s", body)
	}
	_, body = e.get("/")
	if strings.Count(body, `id="overdue-banner"`) != 1 || !strings.Contains(body, "of queue lonely") {
		t.Errorf("overview without the banner for the lonely queue")
	}
	_, body = e.get("/queue?q=served")
	if strings.Contains(body, `id="overdue-banner"`) {
		t.Error("banner on a queue with nothing overdue")
	}

	// A server for the queue: no banner (it also moves the task on).
	e.startServer(tide.Config{Concurrency: 1, Queues: map[string]int{"lonely": 1}}, func(context.Context, *tide.Task) error { return nil })
	testwait.For(t, 20*time.Second, "the banner to go", func() bool {
		_, body := e.get("/queue?q=lonely")
		return !strings.Contains(body, `id="overdue-banner"`)
	})
}

func TestServes(t *testing.T) {
	t.Parallel()
	ss := []tide.ServerInfo{{ID: "a", Queues: map[string]int{"x": 1}}, {ID: "b", Queues: map[string]int{"y": 2, "z": 1}}}
	for q, want := range map[string]bool{"x": true, "z": true, "w": false} {
		if got := serves(ss, q); got != want {
			t.Errorf("serves(%q) = %v", q, got)
		}
	}
	if serves(nil, "x") {
		t.Error("no servers serve a queue")
	}
}

// TestOverdueBannerOnlyWhenUnserved renders the queue page's banner from
// data: overdue tasks with a server for the queue are a passing moment, not
// worth a banner.
func TestOverdueBannerOnlyWhenUnserved(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	h := e.h
	qi := &tide.QueueInfo{Queue: "q1", Overdue: 3, Scheduled: 3, Size: 3}
	for _, served := range []bool{false, true} {
		d := &queueData{Info: qi, State: tide.StateScheduled, Served: served, Overdue: !served, Chart: newChart(nil), Size: 20}
		v := &view{Title: "t", Data: d, Now: time.Now()}
		var sb strings.Builder
		if err := h.pages["queue"].ExecuteTemplate(&sb, "layout", v); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(sb.String(), `id="overdue-banner"`); got == served {
			t.Errorf("served %v: banner shown %v", served, got)
		}
	}
}

func TestRecentRates(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 30, 30, 0, time.UTC)
	cur := now.Truncate(time.Minute).UnixMilli()
	p, f := recentRates([]livePoint{{At: cur - 60_000, Processed: 60, Failed: 6}, {At: cur, Processed: 30}}, now)
	if p != 1 || f != 6.0/90 {
		t.Errorf("rates %v %v, want 1 and 6/90", p, f)
	}
	if p, f := recentRates(nil, now); p != 0 || f != 0 {
		t.Errorf("no points: %v %v", p, f)
	}
	// Right at a minute's start the previous minute carries the rate.
	p, _ = recentRates([]livePoint{{At: cur - 60_000, Processed: 120}, {At: cur}}, now.Truncate(time.Minute))
	if p != 2 {
		t.Errorf("at the minute's start: %v, want 2", p)
	}
}
