package dashboard

import (
	"context"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidequeue/tide"
)

// states lists the task states in the order of the queue page's tabs.
var states = []tide.TaskState{tide.StatePending, tide.StateActive, tide.StateScheduled,
	tide.StateRetry, tide.StateArchived, tide.StateCompleted}

func parseState(s string) (tide.TaskState, bool) {
	for _, st := range states {
		if st.String() == s {
			return st, true
		}
	}
	return 0, false
}

// countOf returns qi's size of state st.
func countOf(qi *tide.QueueInfo, st tide.TaskState) int {
	switch st {
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
	case tide.StateScheduled, tide.StateRetry:
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
	"label":       func(op string) string { return actionLabels[op] },
	"confirm":     confirmText,
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
	"taskURL": func(q, id string) string {
		return "/task?" + url.Values{"q": {q}, "id": {id}}.Encode()
	},
}

// parsePages parses every page template together with the layout and the
// shared partials.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, p := range []string{"overview", "queue", "task", "servers", "login", "error"} {
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

// queueData is the data of the queue page.
type queueData struct {
	Info                 *tide.QueueInfo
	State                tide.TaskState
	Tabs                 []stateTab
	Tasks                []taskRow
	Bulk                 []string
	Page, Size, Count    int
	From, To, Pages      int
	PrevURL, NextURL     string
	WhenLabel            string
	Days                 int
	Chart                *chart
	DaysURL7, DaysURL30  string
	PageSizes            []pageSize
	ShowErrors, ShowWhen bool
}

type stateTab struct {
	State   tide.TaskState
	Count   int
	Current bool
	URL     string
}

type pageSize struct {
	N       int
	URL     string
	Current bool
}

// taskRow is a task in a table.
type taskRow struct {
	*tide.TaskInfo
	Preview    string
	ErrPreview string
	When       time.Time
	Actions    []string
}

// whenOf returns the time that matters for a task in a listing.
func whenOf(t *tide.TaskInfo) time.Time {
	switch t.State {
	case tide.StateArchived:
		return t.LastFailedAt
	case tide.StateCompleted:
		return t.CompletedAt
	}
	return t.NextProcessAt
}

var whenLabels = map[tide.TaskState]string{
	tide.StatePending: "Due", tide.StateActive: "Due", tide.StateScheduled: "Runs",
	tide.StateRetry: "Next retry", tide.StateArchived: "Failed", tide.StateCompleted: "Completed",
}

func (h *handler) queuePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	queue := q.Get("q")
	if err := tide.ValidateQueueName(queue); err != nil {
		h.fail(w, r, err, false)
		return
	}
	st := tide.StatePending
	if s := q.Get("state"); s != "" {
		var ok bool
		if st, ok = parseState(s); !ok {
			h.failWith(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("Unknown task state %q.", s))
			return
		}
	}
	d := &queueData{
		State: st,
		Page:  intParam(r, "page", 1, 1, maxPage),
		Size:  intParam(r, "size", defaultPageSize, 1, maxPageSize),
		Days:  daysParam(r),
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	qi, err := h.in.QueueInfo(ctx, queue)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	tasks, err := h.in.ListTasks(ctx, queue, st, d.Page, d.Size)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	hs, err := h.in.History(ctx, queue, d.Days)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d.Info = qi
	link := func(st tide.TaskState, page, size, days int) string {
		v := url.Values{"q": {queue}, "state": {st.String()}}
		if page > 1 {
			v.Set("page", strconv.Itoa(page))
		}
		if size != defaultPageSize {
			v.Set("size", strconv.Itoa(size))
		}
		if days != 7 {
			v.Set("days", strconv.Itoa(days))
		}
		return "/queue?" + v.Encode()
	}
	for _, s := range states {
		d.Tabs = append(d.Tabs, stateTab{State: s, Count: countOf(qi, s), Current: s == st, URL: link(s, 1, d.Size, d.Days)})
	}
	for _, n := range []int{20, 50, 100} {
		d.PageSizes = append(d.PageSizes, pageSize{N: n, URL: link(st, 1, n, d.Days), Current: n == d.Size})
	}
	d.Count = countOf(qi, st)
	d.Pages = max(1, (d.Count+d.Size-1)/d.Size)
	if len(tasks) > 0 {
		d.From = (d.Page-1)*d.Size + 1
		d.To = d.From + len(tasks) - 1
	}
	if d.Page > 1 {
		d.PrevURL = link(st, min(d.Page-1, d.Pages), d.Size, d.Days)
	}
	if d.Page*d.Size < d.Count {
		d.NextURL = link(st, d.Page+1, d.Size, d.Days)
	}
	d.DaysURL7, d.DaysURL30 = link(st, d.Page, d.Size, 7), link(st, d.Page, d.Size, 30)
	d.WhenLabel = whenLabels[st]
	d.ShowWhen = true
	d.ShowErrors = st != tide.StatePending && st != tide.StateScheduled && st != tide.StateCompleted
	for _, t := range tasks {
		row := taskRow{TaskInfo: t, Preview: preview(t.Payload), ErrPreview: previewText(t.LastErr), When: whenOf(t), Actions: taskActions(t.State)}
		if t.LastErr != "" {
			d.ShowErrors = true
		}
		d.Tasks = append(d.Tasks, row)
	}
	d.Bulk = bulkActions(st)
	if d.Count == 0 {
		d.Bulk = nil
	}
	var hist []day
	for _, s := range hs {
		hist = append(hist, day{Date: s.Date, Processed: s.Processed, Failed: s.Failed})
	}
	d.Chart = newChart(mergeHistory([][]day{hist}, d.Days, h.now()))
	h.render(w, http.StatusOK, "queue", h.newView(w, r, "queue", "Queue "+queue, d))
}

// taskData is the data of the task page.
type taskData struct {
	Task      *tide.TaskInfo
	Payload   blob
	Result    blob
	Err       blob
	Headers   []header
	Actions   []string
	QueueURL  string
	Timeout   string
	Retention string
}

type header struct{ Key, Value string }

func (h *handler) taskPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	queue, id := q.Get("q"), q.Get("id")
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	t, err := h.in.GetTaskInfo(ctx, queue, id)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d := &taskData{
		Task: t, Payload: viewBlob(t.Payload), Result: viewBlob(t.Result), Err: viewText(t.LastErr),
		Actions:  taskActions(t.State),
		QueueURL: "/queue?" + url.Values{"q": {t.Queue}, "state": {t.State.String()}}.Encode(),
	}
	if t.Timeout > 0 {
		d.Timeout = t.Timeout.String()
	}
	if t.Retention > 0 {
		d.Retention = t.Retention.String()
	}
	keys := slices.Sorted(maps.Keys(t.Headers))
	for i, k := range keys {
		if i == 100 {
			d.Headers = append(d.Headers, header{Key: "…", Value: fmt.Sprintf("%d more headers not shown", len(keys)-i)})
			break
		}
		d.Headers = append(d.Headers, header{Key: previewText(k), Value: previewText(t.Headers[k])})
	}
	h.render(w, http.StatusOK, "task", h.newView(w, r, "queue", "Task "+id, d))
}

// serversData is the data of the servers page.
type serversData struct {
	Servers    []serverRow
	Schedulers []tide.SchedulerEntry
	MoreSched  int
}

type serverRow struct {
	tide.ServerInfo
	QueueList  string
	Shown      []tide.ActiveTask
	MoreActive int
}

// maxShown bounds the active tasks listed per server and the scheduler
// entries listed.
const maxShown = 50

func (h *handler) serversPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	ss, err := h.in.Servers(ctx)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	es, err := h.in.SchedulerEntries(ctx)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d := &serversData{}
	slices.SortFunc(ss, func(a, b tide.ServerInfo) int { return strings.Compare(a.ID, b.ID) })
	for _, s := range ss {
		row := serverRow{ServerInfo: s}
		var qs []string
		for _, q := range slices.Sorted(maps.Keys(s.Queues)) {
			qs = append(qs, fmt.Sprintf("%s (%d)", q, s.Queues[q]))
		}
		row.QueueList = strings.Join(qs, ", ")
		row.Shown = s.Active
		if len(row.Shown) > maxShown {
			row.MoreActive = len(row.Shown) - maxShown
			row.Shown = row.Shown[:maxShown]
		}
		d.Servers = append(d.Servers, row)
	}
	if len(es) > maxShown {
		d.MoreSched = len(es) - maxShown
		es = es[:maxShown]
	}
	d.Schedulers = es
	h.render(w, http.StatusOK, "servers", h.newView(w, r, "servers", "Servers", d))
}
