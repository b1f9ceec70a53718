package dashboard

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/tidequeue/tide"
)

// states lists the task states in the order of the queue page's tabs.
var states = []tide.TaskState{tide.StatePending, tide.StateActive, tide.StateScheduled,
	tide.StateRetry, tide.StateWaiting, tide.StateArchived, tide.StateCompleted}

func parseState(s string) (tide.TaskState, bool) {
	for _, st := range states {
		if st.String() == s {
			return st, true
		}
	}
	return 0, false
}

// countOf returns qi's size of state st; -1 for StateWaiting, which
// QueueInfo counts with the retry tasks.
func countOf(qi *tide.QueueInfo, st tide.TaskState) int {
	switch st {
	case tide.StateWaiting:
		return -1
	case tide.StatePending:
		return qi.Pending
	case tide.StateActive:
		return qi.Active
	case tide.StateScheduled:
		return qi.Scheduled
	case tide.StateRetry:
		return qi.Retry
	case tide.StateArchived:
		return qi.Archived
	case tide.StateCompleted:
		return qi.Completed
	}
	return 0
}

// taskActions are the buttons of a task in state st.
func taskActions(st tide.TaskState) []string {
	switch st {
	case tide.StatePending:
		return []string{"archive", "delete"}
	case tide.StateActive:
		return []string{"cancel"}
	case tide.StateScheduled, tide.StateRetry, tide.StateWaiting:
		return []string{"run", "archive", "delete"}
	case tide.StateArchived:
		return []string{"run", "delete"}
	case tide.StateCompleted:
		return []string{"delete"}
	}
	return nil
}

// bulkActions are the "all tasks in this state" buttons of state st.
func bulkActions(st tide.TaskState) []string {
	var out []string
	for _, op := range taskActions(st) {
		if op != "cancel" {
			out = append(out, op+"-all")
		}
	}
	return out
}

var actionLabels = map[string]string{
	"run": "Run now", "archive": "Archive", "delete": "Delete", "cancel": "Cancel",
	"run-all": "Run all", "archive-all": "Archive all", "delete-all": "Delete all",
	"pause": "Pause", "unpause": "Resume",
}

func confirmText(op string) string {
	switch op {
	case "delete":
		return "Delete this task? This cannot be undone."
	case "cancel":
		return "Cancel this running task?"
	case "run-all":
		return "Run every task in this state now?"
	case "archive-all":
		return "Archive every task in this state?"
	case "delete-all":
		return "Delete every task in this state? This cannot be undone."
	case "pause":
		return "Pause this queue? Servers stop taking its tasks until it is resumed."
	}
	return ""
}

var funcs = template.FuncMap{
	"human":       human,
	"relative":    relative,
	"stamp":       stamp,
	"number":      number,
	"bytesize":    byteSize,
	"preview":     preview,
	"previewText": previewText,
	"limit":       limitText,
	"rate":        rateText,
	"shown":       shown,
	"label":       func(op string) string { return actionLabels[op] },
	"confirm":     confirmText,
	"since":       func(t, now time.Time) time.Duration { return now.Sub(t) },
	"iso": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	},
	"pct": func(part, whole int) string {
		if whole == 0 {
			return "0%"
		}
		return strconv.FormatFloat(100*float64(part)/float64(whole), 'f', 1, 64) + "%"
	},
	// dict builds a map for passing several values to a template.
	"dict": func(kv ...any) (map[string]any, error) {
		if len(kv)%2 != 0 {
			return nil, fmt.Errorf("dict: odd number of arguments")
		}
		m := make(map[string]any, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			k, ok := kv[i].(string)
			if !ok {
				return nil, fmt.Errorf("dict: key %v is not a string", kv[i])
			}
			m[k] = kv[i+1]
		}
		return m, nil
	},
	"queueURL": func(q, state string) string {
		return "/queue?" + url.Values{"q": {q}, "state": {state}}.Encode()
	},
	"list": func(s ...string) []string { return s },
	"cronURL": func(id, scheduler string) string {
		return "/cron?" + url.Values{"id": {id}, "s": {scheduler}}.Encode()
	},
	"taskURL":     taskLink,
	"workflowURL": workflowPath,
	"batchURL":    batchPath,
	// flowRetention is how long workflows and batches are kept after they
	// end.
	"flowRetention": flowRetention,
}

// parsePages parses every page template together with the layout and the
// shared partials.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, p := range []string{"overview", "queue", "task", "servers", "login", "error", "selection", "cron",
		"workflows", "workflow", "batches", "batch"} {
		t, err := template.New(p).Funcs(funcs).ParseFS(templateFS,
			"templates/layout.html", "templates/partials.html", "templates/"+p+".html")
		if err != nil {
			return nil, err
		}
		pages[p] = t
	}
	return pages, nil
}

// intParam returns the query parameter name as an int clamped to lo..hi,
// or def when it is missing or not a number.
func intParam(r *http.Request, name string, def, lo, hi int) int {
	n, err := strconv.Atoi(r.URL.Query().Get(name))
	if err != nil {
		return def
	}
	return min(max(n, lo), hi)
}

// daysParam returns the chart span: 30 when asked, otherwise 7.
func daysParam(r *http.Request) int {
	if r.URL.Query().Get("days") == "30" {
		return 30
	}
	return 7
}

// overviewData is the data of the overview page.
type overviewData struct {
	Queues  []*tide.QueueInfo
	More    int // queues not shown
	Total   tide.QueueInfo
	Servers int
	Days    int
	Chart   *chart
	// Unserved are the queues with overdue tasks that no live server
	// serves.
	Unserved []*tide.QueueInfo
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	names, err := h.in.Queues(ctx)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d := &overviewData{Days: daysParam(r)}
	if len(names) > maxQueues {
		d.More = len(names) - maxQueues
		names = names[:maxQueues]
	}
	infos := make([]*tide.QueueInfo, len(names))
	hists := make([][]day, len(names))
	errs := make([]error, len(names))
	parallel(len(names), 8, func(i int) {
		qi, err := h.in.QueueInfo(ctx, names[i])
		if err != nil {
			errs[i] = err
			return
		}
		hs, err := h.in.History(ctx, names[i], d.Days)
		if err != nil {
			errs[i] = err
			return
		}
		infos[i] = qi
		for _, s := range hs {
			hists[i] = append(hists[i], day{Date: s.Date, Processed: s.Processed, Failed: s.Failed})
		}
	})
	for _, err := range errs {
		if err != nil {
			h.fail(w, r, err, false)
			return
		}
	}
	servers, err := h.in.Servers(ctx)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d.Queues, d.Servers = infos, len(servers)
	for _, qi := range infos {
		if qi.Overdue > 0 && !serves(servers, qi.Queue) {
			d.Unserved = append(d.Unserved, qi)
		}
	}
	t := &d.Total
	for _, qi := range infos {
		t.Size += qi.Size
		t.Pending += qi.Pending
		t.Active += qi.Active
		t.Scheduled += qi.Scheduled
		t.Retry += qi.Retry
		t.Archived += qi.Archived
		t.Completed += qi.Completed
		t.Processed += qi.Processed
		t.Failed += qi.Failed
		t.Latency = max(t.Latency, qi.Latency)
	}
	d.Chart = newChart(mergeHistory(hists, d.Days, h.now()))
	h.render(w, http.StatusOK, "overview", h.newView(w, r, "overview", "Queues", d))
}

// parallel runs fn(0..n-1) on at most k goroutines.
func parallel(n, k int, fn func(int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, k) {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
