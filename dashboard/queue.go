package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/tidequeue/tide"
)

// Limits of a search.
const (
	// maxTermBytes caps each search term.
	maxTermBytes = 200
	// maxSearchOffset caps where a search may continue from.
	maxSearchOffset = 10_000_000
	// searchCalls bounds the Inspector.SearchTasks calls of one page (each
	// looks at a bounded number of tasks).
	searchCalls = 4
)

// queueData is the data of the queue page.
type queueData struct {
	Info                 *tide.QueueInfo
	State                tide.TaskState
	Tabs                 []stateTab
	Tasks                []taskRow
	Bulk                 []string
	Select               []string // actions on selected rows
	Page, Size, Count    int
	From, To, Pages      int
	PrevURL, NextURL     string
	WhenLabel            string
	Days                 int
	Chart                *chart
	DaysURL7, DaysURL30  string
	PageSizes            []pageSize
	ShowErrors, ShowWhen bool
	ShowRunning          bool // active tasks: server and lease columns
	// Search is the filter; Searching is set when any term is.
	Search    tide.TaskFilter
	Searching bool
	// Cursor is set when the page goes on from Offset rather than by page
	// number: a search, and the retry and waiting tabs (the two states lie
	// together and are counted together; each tab lists its own).
	Cursor bool
	// ShowWaiting: the waiting tab's column of what each task waits for.
	ShowWaiting bool
	Offset      int    // where this search page started
	ClearURL    string // the state's tab without the filter
	// Overdue is set when scheduled or retry tasks are past due and no
	// live server serves the queue.
	Overdue bool
	Served  bool // a live server serves the queue
	LiveURL string
	// Flow is the queue's limits and top groups; nil when the broker
	// keeps neither.
	Flow *flowData
}

type stateTab struct {
	State   tide.TaskState
	Count   int // -1: not counted on its own (waiting)
	Current bool
	URL     string
	Title   string
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
	ServerText string
	When       time.Time
	Actions    []string
}

// whenOf returns the time that matters for a task in a listing.
func whenOf(t *tide.TaskInfo) time.Time {
	switch t.State {
	case tide.StateActive:
		return t.StartedAt
	case tide.StateArchived:
		return t.LastFailedAt
	case tide.StateCompleted:
		return t.CompletedAt
	}
	return t.NextProcessAt
}

var whenLabels = map[tide.TaskState]string{
	tide.StatePending: "Due", tide.StateActive: "Started", tide.StateScheduled: "Runs",
	tide.StateRetry: "Next retry", tide.StateArchived: "Failed", tide.StateCompleted: "Completed",
	tide.StateWaiting: "Until",
}

// selectActions are the actions on selected tasks in state st.
func selectActions(st tide.TaskState) []string {
	var out []string
	for _, op := range taskActions(st) {
		if op != "cancel" {
			out = append(out, op)
		}
	}
	return out
}

// parseFilter reads the search terms of the queue page. For a term longer
// than maxTermBytes it returns a message for the 400 page.
func parseFilter(q url.Values) (tide.TaskFilter, string) {
	f := tide.TaskFilter{ID: q.Get("id"), Type: q.Get("type"), Payload: q.Get("payload"), Err: q.Get("err")}
	for _, t := range []struct{ name, v string }{{"ID", f.ID}, {"type", f.Type}, {"payload", f.Payload}, {"error", f.Err}} {
		if len(t.v) > maxTermBytes {
			return f, fmt.Sprintf("The %s search term is %d bytes; the limit is %d.", t.name, len(t.v), maxTermBytes)
		}
	}
	return f, ""
}

func (f *queueData) filterValues(v url.Values) {
	for k, s := range map[string]string{"id": f.Search.ID, "type": f.Search.Type, "payload": f.Search.Payload, "err": f.Search.Err} {
		if s != "" {
			v.Set(k, s)
		}
	}
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
	filter, msg := parseFilter(q)
	if msg != "" {
		h.failWith(w, r, http.StatusBadRequest, "Bad request", msg)
		return
	}
	d := &queueData{
		State:     st,
		Page:      intParam(r, "page", 1, 1, maxPage),
		Size:      intParam(r, "size", defaultPageSize, 1, maxPageSize),
		Days:      daysParam(r),
		Search:    filter,
		Searching: filter != (tide.TaskFilter{}),
		LiveURL:   "/api/live?" + url.Values{"q": {queue}}.Encode(),
	}
	// Waiting tasks lie with the retry tasks: a search, which keeps one
	// state, lists either alone.
	d.Cursor = d.Searching || st == tide.StateWaiting || st == tide.StateRetry
	if d.Cursor {
		d.Offset = intParam(r, "from", 0, 0, maxSearchOffset)
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	qi, err := h.in.QueueInfo(ctx, queue)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	var tasks []*tide.TaskInfo
	next := -1
	if d.Cursor {
		tasks, next, err = h.search(ctx, queue, st, filter, d.Offset, d.Size)
	} else {
		tasks, err = h.in.ListTasks(ctx, queue, st, d.Page, d.Size)
	}
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	hs, err := h.in.History(ctx, queue, d.Days)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	if qi.Overdue > 0 {
		ss, err := h.in.Servers(ctx)
		if err != nil {
			h.fail(w, r, err, false)
			return
		}
		d.Served = serves(ss, queue)
		d.Overdue = !d.Served
	}
	if d.Flow, err = h.flow(ctx, queue); err != nil {
		h.fail(w, r, err, false)
		return
	}
	d.Info = qi
	link := func(st tide.TaskState, page, size, days int, search bool, from int) string {
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
		if search {
			d.filterValues(v)
			if from > 0 {
				v.Set("from", strconv.Itoa(from))
			}
		}
		return "/queue?" + v.Encode()
	}
	for _, s := range states {
		tab := stateTab{State: s, Count: countOf(qi, s), Current: s == st, URL: link(s, 1, d.Size, d.Days, d.Searching, 0)}
		switch s {
		case tide.StateRetry:
			tab.Title = "The count includes the waiting tasks; the list shows the retry tasks alone"
		case tide.StateWaiting:
			tab.Title = "Tasks parked by a durable handler (Sleep, WaitSignal), counted with the retry tasks"
		}
		d.Tabs = append(d.Tabs, tab)
	}
	for _, n := range []int{20, 50, 100} {
		d.PageSizes = append(d.PageSizes, pageSize{N: n, URL: link(st, 1, n, d.Days, d.Cursor, d.Offset), Current: n == d.Size})
	}
	d.Count = countOf(qi, st)
	d.Pages = max(1, (d.Count+d.Size-1)/d.Size)
	d.ClearURL = link(st, 1, d.Size, d.Days, false, 0)
	if d.Cursor {
		if d.Offset > 0 {
			d.PrevURL = link(st, 1, d.Size, d.Days, true, 0)
		}
		if next >= 0 {
			d.NextURL = link(st, 1, d.Size, d.Days, true, next)
		}
		d.From = len(tasks)
		d.DaysURL7, d.DaysURL30 = link(st, 1, d.Size, 7, true, d.Offset), link(st, 1, d.Size, 30, true, d.Offset)
	} else {
		if len(tasks) > 0 {
			d.From = (d.Page-1)*d.Size + 1
			d.To = d.From + len(tasks) - 1
		}
		if d.Page > 1 {
			d.PrevURL = link(st, min(d.Page-1, d.Pages), d.Size, d.Days, false, 0)
		}
		if d.Page*d.Size < d.Count {
			d.NextURL = link(st, d.Page+1, d.Size, d.Days, false, 0)
		}
		d.DaysURL7, d.DaysURL30 = link(st, d.Page, d.Size, 7, false, 0), link(st, d.Page, d.Size, 30, false, 0)
	}
	d.WhenLabel = whenLabels[st]
	d.ShowWhen = true
	d.ShowRunning = st == tide.StateActive
	d.ShowErrors = st != tide.StatePending && st != tide.StateScheduled && st != tide.StateCompleted && st != tide.StateWaiting
	d.ShowWaiting = st == tide.StateWaiting
	for _, t := range tasks {
		row := taskRow{TaskInfo: t, Preview: preview(t.Payload), ErrPreview: previewText(t.LastErr),
			ServerText: previewText(t.Server), When: whenOf(t), Actions: taskActions(t.State)}
		if t.LastErr != "" {
			d.ShowErrors = true
		}
		d.Tasks = append(d.Tasks, row)
	}
	d.Bulk = bulkActions(st)
	if d.Count == 0 || st == tide.StateWaiting {
		// A bulk action on the waiting state would also take the retry
		// tasks that lie with them: the waiting ones are acted on one by
		// one, or selected.
		d.Bulk = nil
	}
	if len(d.Tasks) > 0 {
		d.Select = selectActions(st)
	}
	var hist []day
	for _, s := range hs {
		hist = append(hist, day{Date: s.Date, Processed: s.Processed, Failed: s.Failed})
	}
	d.Chart = newChart(mergeHistory([][]day{hist}, d.Days, h.now()))
	h.render(w, http.StatusOK, "queue", h.newView(w, r, "queue", "Queue "+queue, d))
}

// search returns up to limit tasks matching f from offset, calling
// Inspector.SearchTasks a bounded number of times, and the offset to go on
// from (-1 when the search is done).
func (h *handler) search(ctx context.Context, queue string, st tide.TaskState, f tide.TaskFilter, offset, limit int) ([]*tide.TaskInfo, int, error) {
	var out []*tide.TaskInfo
	next := offset
	for range searchCalls {
		ts, n, err := h.in.SearchTasks(ctx, queue, st, f, next, limit-len(out))
		if err != nil {
			return nil, -1, err
		}
		out = append(out, ts...)
		if n < 0 || len(out) >= limit {
			return out, n, nil
		}
		if n <= next && len(ts) == 0 {
			return out, -1, nil // no progress: stop rather than loop
		}
		next = n
	}
	return out, next, nil
}

// serves reports whether a live server takes tasks from queue.
func serves(ss []tide.ServerInfo, queue string) bool {
	for _, s := range ss {
		if _, ok := s.Queues[queue]; ok {
			return true
		}
	}
	return false
}
