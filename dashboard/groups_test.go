package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestQueueLimitsAndGroups checks the queue page's Groups panel and the
// limits and groups of GET /api/live?q=.
func TestQueueLimitsAndGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	ctx := e.ctx()

	// A queue with neither limits nor groups has no panel; its JSON says
	// so with zero limits and no groups.
	e.enqueue("plain", nil, tide.Queue("plain"))
	resp, body := e.get("/queue?q=plain")
	wantStatus(t, resp, body, http.StatusOK)
	if strings.Contains(body, `id="groups"`) {
		t.Errorf("a queue without limits or groups has the Groups panel:\n%s", body)
	}
	_, _, d := e.live("/api/live?q=plain", nil)
	if d == nil || d.Limits == nil || *d.Limits != (tide.QueueLimits{}) || d.Groups == nil || len(*d.Groups) != 0 {
		t.Errorf("live JSON of a plain queue: %+v", d)
	}
	if _, body, _ := e.live("/api/live", nil); strings.Contains(body, `"limits"`) || strings.Contains(body, `"groups"`) {
		t.Errorf("the live JSON of every queue has limits or groups: %s", body)
	}

	// Limits alone: the panel with every limit and the empty state.
	if err := e.in.SetQueueLimits(ctx, "plain", tide.QueueLimits{Concurrency: 10, Rate: tide.Rate{Limit: 100, Per: time.Second},
		GroupConcurrency: 2, GroupRate: tide.Rate{Limit: 5, Per: time.Minute}, Ordered: true}); err != nil {
		t.Fatal(err)
	}
	_, body = e.get("/queue?q=plain")
	for _, want := range []string{`id="groups"`, `<h2>Groups</h2>`, `data-limit="concurrency">10<`, `data-limit="rate">100 per 1s<`,
		`data-limit="group-concurrency">2<`, `data-limit="group-rate">5 per 1m<`, `data-limit="ordered">yes<`, `id="groups-empty"`} {
		if !strings.Contains(body, want) {
			t.Errorf("queue page with limits lacks %s", want)
		}
	}
	_, _, d = e.live("/api/live?q=plain", nil)
	if d == nil || d.Limits == nil || *d.Limits != (tide.QueueLimits{Concurrency: 10, Rate: tide.Rate{Limit: 100, Per: time.Second},
		GroupConcurrency: 2, GroupRate: tide.Rate{Limit: 5, Per: time.Minute}, Ordered: true}) {
		t.Errorf("live JSON limits: %+v", d.Limits)
	}

	// Groups without limits: the panel, limits "none", the groups by
	// backlog with their names escaped.
	evil := `<b>x</b>` + "\u202egpj.exe"
	for g, n := range map[string]int{"acme": 3, "globex": 5, evil: 1} {
		for range n {
			e.enqueue("send", nil, tide.Queue("mail"), tide.Group(g))
		}
	}
	e.enqueue("send", nil, tide.Queue("mail")) // no group
	// (The archived tab lists no task: the pending ones carry the group in
	// their IDs, raw in the forms' fields.)
	resp, body = e.get("/queue?q=mail&state=archived")
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "queue page with groups", body)
	if strings.Contains(body, "<b>x</b>") {
		t.Errorf("a group name is not escaped")
	}
	for _, want := range []string{`id="groups-table"`, `data-limit="concurrency">none<`, `data-limit="rate">none<`, `data-limit="ordered">no<`,
		`&lt;b&gt;x&lt;/b&gt;\u202egpj.exe`} {
		if !strings.Contains(body, want) {
			t.Errorf("queue page with groups lacks %s", want)
		}
	}
	if strings.Contains(body, `id="groups-empty"`) || strings.Contains(body, `id="groups-more"`) {
		t.Errorf("the empty state or the more note is shown with 3 groups")
	}
	if got := groupRows(body); got != `globex acme &lt;b&gt;x&lt;/b&gt;\u202egpj.exe` {
		t.Errorf("group rows %q", got)
	}
	// The pending tasks' IDs, which carry the group, are shown escaped.
	_, body = e.get("/queue?q=mail")
	if !strings.Contains(body, `{&lt;b&gt;x&lt;/b&gt;\u202egpj.exe}</a></td>`) {
		t.Errorf("a task ID with the group's U+202E is not shown escaped")
	}
	_, _, d = e.live("/api/live?q=mail", nil)
	if d == nil || d.Groups == nil || len(*d.Groups) != 3 {
		t.Fatalf("live JSON groups: %+v", d)
	}
	if g := (*d.Groups)[0]; g.Group != "globex" || g.Waiting != 5 || g.Running != 0 || g.ThrottledUntil != nil {
		t.Errorf("live JSON, first group: %+v", g)
	}
	if g := (*d.Groups)[2]; g.Group != evil || g.Waiting != 1 { // JSON is exact
		t.Errorf("live JSON, third group: %+v", g)
	}

	// A running group and a throttled one.
	release := make(chan struct{})
	e.startServer(tide.Config{Concurrency: 4, Queues: map[string]int{"mail": 1}}, func(ctx context.Context, _ *tide.Task) error {
		switch g, _ := tide.GetGroup(ctx); g {
		case "acme":
			return fmt.Errorf("slow down: %w", tide.ThrottleGroup(time.Hour))
		case "globex":
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	t.Cleanup(func() { close(release) })
	testwait.For(t, 20*time.Second, "globex running and acme throttled", func() bool {
		_, _, d = e.live("/api/live?q=mail", nil)
		var running, held bool
		for _, g := range *d.Groups {
			running = running || g.Group == "globex" && g.Running > 0
			held = held || g.Group == "acme" && g.ThrottledUntil != nil && time.Until(*g.ThrottledUntil) > 50*time.Minute
		}
		return running && held
	})
	_, body = e.get("/queue?q=mail")
	// An hour from the throttle, read a few milliseconds later: "in 59m
	// 59s", or "in 1h 0m" when the page's clock (the broker's view of Redis
	// time) is that much behind the one the throttle was set with.
	if !strings.Contains(body, `<span class="badge throttled">throttled</span>`) || !strings.Contains(body, ">in 59m") && !strings.Contains(body, ">in 1h 0m") {
		t.Errorf("the queue page does not show acme throttled:\n%s", section(body, `id="groups"`))
	}
}

// groupRows returns the group names of the rows of the Groups panel.
func groupRows(body string) string {
	var names []string
	for _, part := range strings.Split(body, `<tr data-group="`)[1:] {
		names = append(names, part[:strings.IndexByte(part, '"')])
	}
	return strings.Join(names, " ")
}

// section returns body from marker to the end of its section.
func section(body, marker string) string {
	i := strings.Index(body, marker)
	if i < 0 {
		return ""
	}
	s := body[i:]
	if j := strings.Index(s, "</section>"); j >= 0 {
		s = s[:j]
	}
	return s
}
