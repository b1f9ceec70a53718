package dashboard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/outbound"
)

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
	// Running is set for an active task: the due time means nothing then,
	// and the page shows when and where it runs instead.
	Running    bool
	RunningFor string // "" when the start is not known yet
	Server     string
	// Attempts are the task's recorded attempts, newest first.
	Attempts []attemptRow
	// HistoryOn is set when Options.History is; History are the attempts
	// it returned, newest first, and HistoryErr its error, if any.
	HistoryOn  bool
	History    []attemptRow
	HistoryErr string
	// Gone is set for a task no longer stored (not found) that History
	// still knows: Task is nil then, and Queue and ID name the task.
	Gone      bool
	Queue, ID string
}

type header struct{ Key, Value string }

// attemptRow is one attempt of a task, ready for display.
type attemptRow struct {
	N              int // 1 for the oldest recorded attempt
	Started, Ended time.Time
	Took           string
	Server         string
	Outcome        string
	Err            string
}

// oneText returns stored text for display: control and bidi characters
// shown as \u escapes, binary data as a short preview.
func oneText(s string) string {
	if s == "" {
		return ""
	}
	if b := viewText(s); !b.IsBinary() {
		return b.Text
	}
	return preview([]byte(s))
}

func attemptRows(as []tide.Attempt) []attemptRow {
	out := make([]attemptRow, 0, len(as))
	for i := len(as) - 1; i >= 0; i-- {
		a := as[i]
		row := attemptRow{N: i + 1, Started: a.Started, Ended: a.Ended, Server: previewText(a.Server),
			Outcome: previewText(a.Outcome), Err: oneText(a.Err)}
		if !a.Started.IsZero() && !a.Ended.IsZero() {
			row.Took = human(a.Ended.Sub(a.Started))
		}
		out = append(out, row)
	}
	return out
}

func (h *handler) taskPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	queue, id := q.Get("q"), q.Get("id")
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	t, err := h.in.GetTaskInfo(ctx, queue, id)
	if err != nil {
		if h.history != nil && errors.Is(err, tide.ErrTaskNotFound) {
			d := &taskData{Gone: true, Queue: queue, ID: id,
				QueueURL: "/queue?" + url.Values{"q": {queue}}.Encode()}
			h.fillHistory(ctx, d, queue, id)
			if len(d.History) > 0 {
				h.render(w, http.StatusOK, "task", h.newView(w, r, "queue", "Task "+id, d))
				return
			}
		}
		h.fail(w, r, err, false)
		return
	}
	d := &taskData{
		Task: t, Payload: viewBlob(t.Payload), Result: viewBlob(t.Result), Err: viewText(t.LastErr),
		Actions:  taskActions(t.State),
		QueueURL: "/queue?" + url.Values{"q": {t.Queue}, "state": {t.State.String()}}.Encode(),
		Running:  t.State == tide.StateActive,
		Server:   previewText(t.Server),
		Attempts: attemptRows(t.Attempts),
	}
	if h.history != nil {
		h.fillHistory(ctx, d, t.Queue, t.ID)
	}
	if d.Running && !t.StartedAt.IsZero() {
		d.RunningFor = human(h.now().Sub(t.StartedAt))
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

// fillHistory fills in the task's recorded history from Options.History.
// An error (or a panic of the hook) becomes a note on the page.
func (h *handler) fillHistory(ctx context.Context, d *taskData, queue, id string) {
	d.HistoryOn = true
	as, err := func() (as []tide.Attempt, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return h.history(ctx, queue, id)
	}()
	if err != nil {
		h.log.Warn("tide dashboard: task history", "queue", queue, "id", id, "err", err)
		d.HistoryErr = oneText(truncateErr(err.Error()))
		return
	}
	d.History = attemptRows(as)
}

// truncateErr bounds an error message shown on a page to 1 KiB.
func truncateErr(s string) string { return outbound.ClipTo(s, 1<<10) }
