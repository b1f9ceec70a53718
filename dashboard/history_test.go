package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

// fakeHistory is an Options.History backed by a map of "queue/id" keys.
type fakeHistory struct {
	mu    sync.Mutex
	calls int
	as    map[string][]tide.Attempt
	err   error
}

func (f *fakeHistory) get(_ context.Context, queue, id string) ([]tide.Attempt, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return f.as[queue+"/"+id], nil
}

func taskPath(queue, id string) string {
	return "/task?" + url.Values{"q": {queue}, "id": {id}}.Encode()
}

func recorded(errText string) []tide.Attempt {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	return []tide.Attempt{
		{Started: at, Ended: at.Add(time.Second), Server: hostileServerID, Outcome: "retry", Err: errText},
		{Started: at.Add(time.Minute), Ended: at.Add(time.Minute + 2*time.Second), Server: "w1", Outcome: "done"},
	}
}

const hostileErr = "bad </script><script>alert(1)</script> <img src=x onerror=alert(4)> \u202eevil"

func TestTaskPageRecordedHistory(t *testing.T) {
	t.Parallel()
	f := &fakeHistory{as: map[string][]tide.Attempt{}}
	e := newEnvOpts(t, Options{History: f.get})
	ti := e.enqueue("job", nil, tide.Queue("jobs"))
	f.mu.Lock()
	f.as["jobs/"+ti.ID] = recorded(hostileErr)
	f.mu.Unlock()

	resp, body := e.get(taskPath("jobs", ti.ID))
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "task page", body)
	for _, want := range []string{`id="history"`, "History (recorded)", `class="history-attempt" data-outcome="retry"`,
		`class="history-attempt" data-outcome="done"`, "&lt;/script&gt;&lt;script&gt;alert(1)", "&lt;img src=x", `\u202e`, "w1"} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %q", want)
		}
	}
	if strings.Contains(body, "task-gone") {
		t.Error("a stored task is described as gone")
	}

	// A task with nothing recorded shows an empty panel.
	other := e.enqueue("job", nil, tide.Queue("jobs"))
	resp, body = e.get(taskPath("jobs", other.ID))
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, "No attempts recorded.") {
		t.Error("empty history not shown as such")
	}
}

func TestTaskPageFinishedTaskFromHistory(t *testing.T) {
	t.Parallel()
	f := &fakeHistory{as: map[string][]tide.Attempt{"jobs/gone-1": recorded(hostileErr)}}
	e := newEnvOpts(t, Options{History: f.get})
	resp, body := e.get(taskPath("jobs", "gone-1"))
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "finished task page", body)
	for _, want := range []string{`id="task-gone"`, "no longer stored", "History (recorded)", "gone-1",
		`data-outcome="done"`, "&lt;img src=x"} {
		if !strings.Contains(body, want) {
			t.Errorf("finished task page lacks %q", want)
		}
	}
	if strings.Contains(body, `id="task-facts"`) {
		t.Error("finished task page shows the stored task's facts or actions")
	}
	// Nothing recorded, or unknown: still 404.
	resp, body = e.get(taskPath("jobs", "never"))
	wantStatus(t, resp, body, http.StatusNotFound)
}

func TestTaskPageHistoryError(t *testing.T) {
	t.Parallel()
	f := &fakeHistory{err: errors.New("db down <script>alert(5)</script> \u202e")}
	e := newEnvOpts(t, Options{History: f.get})
	ti := e.enqueue("job", nil, tide.Queue("jobs"))
	resp, body := e.get(taskPath("jobs", ti.ID))
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "task page", body)
	if !strings.Contains(body, `id="history-error"`) || !strings.Contains(body, "db down &lt;script&gt;") {
		t.Errorf("the hook's error is not shown as a note:\n%s", body)
	}
	// A task not in Redis whose history cannot be read: the usual 404.
	resp, body = e.get(taskPath("jobs", "gone-2"))
	wantStatus(t, resp, body, http.StatusNotFound)

	// A panicking hook is a note too.
	p := newEnvOpts(t, Options{History: func(context.Context, string, string) ([]tide.Attempt, error) { panic("boom") }})
	ti = p.enqueue("job", nil, tide.Queue("jobs"))
	resp, body = p.get(taskPath("jobs", ti.ID))
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, `id="history-error"`) || !strings.Contains(body, "panic: boom") {
		t.Error("the hook's panic is not shown as a note")
	}
}

func TestTaskPageWithoutHistory(t *testing.T) {
	t.Parallel()
	e := newEnvOpts(t, Options{})
	ti := e.enqueue("job", nil, tide.Queue("jobs"))
	resp, body := e.get(taskPath("jobs", ti.ID))
	wantStatus(t, resp, body, http.StatusOK)
	if strings.Contains(body, "History (recorded)") || strings.Contains(body, `id="history"`) {
		t.Error("history panel shown without Options.History")
	}
	resp, body = e.get(taskPath("jobs", "gone-3"))
	wantStatus(t, resp, body, http.StatusNotFound)
}
