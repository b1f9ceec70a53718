package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/tidequeue/tide"
)

// maxSelection caps the task IDs of one selection action (a page's worth).
const maxSelection = maxPageSize

// selectionData is the data of the page that reports a selection action
// some of whose tasks failed.
type selectionData struct {
	Op       string
	Queue    string
	Done     int
	Failed   []selectionFailure
	Return   string
	Selected int
}

// selectionFailure is a selected task the action failed on.
type selectionFailure struct {
	ID     string `json:"id"`
	Status int    `json:"status"`
	Error  string `json:"error"`
}

// checkID validates a task ID from a form like the Inspector does, so that a
// bad one fails the whole request up front.
func checkID(id string) string {
	if id == "" {
		return "A task ID is empty."
	}
	if len(id) > tide.MaxIDLength {
		return fmt.Sprintf("A task ID is %d bytes; the limit is %d.", len(id), tide.MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] == 0x7f {
			return fmt.Sprintf("Task ID %q has a control character.", previewText(id))
		}
	}
	return ""
}

// selectionAction handles POST /selection/{run,archive,delete}: form fields
// q, id (repeated, at most maxSelection) and, from a browser, csrf and
// return. Each task is changed on its own; the answer lists the ones that
// failed.
func (h *handler) selectionAction(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	do := h.taskOp(op, false)
	if do == nil {
		h.notFound(w, r)
		return
	}
	bearer, ok := h.authorize(w, r)
	if !ok {
		return
	}
	queue := r.PostFormValue("q")
	if err := tide.ValidateQueueName(queue); err != nil {
		h.refuse(w, r, bearer, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	raw := r.PostForm["id"]
	if len(raw) == 0 {
		h.refuse(w, r, bearer, http.StatusBadRequest, "Nothing selected", "Select at least one task.")
		return
	}
	if len(raw) > maxSelection {
		h.refuse(w, r, bearer, http.StatusBadRequest, "Too many tasks selected",
			fmt.Sprintf("%d tasks were selected; one action takes at most %d. Use the buttons for all tasks in a state instead.", len(raw), maxSelection))
		return
	}
	seen := make(map[string]bool, len(raw))
	var ids []string
	for _, id := range raw {
		if msg := checkID(id); msg != "" {
			h.refuse(w, r, bearer, http.StatusBadRequest, "Bad request", msg)
			return
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	ret := r.PostFormValue("return")
	if ret == "" {
		ret = "/queue?" + url.Values{"q": {queue}}.Encode()
	}
	d := &selectionData{Op: op, Queue: queue, Return: localPath(ret), Selected: len(ids)}
	ctx, cancel := context.WithTimeout(r.Context(), bulkTimeout)
	defer cancel()
	status := http.StatusOK
	for _, id := range ids {
		err := do(ctx, queue, id)
		if err == nil {
			d.Done++
			continue
		}
		st, heading := classify(err, true)
		if len(d.Failed) == 0 {
			status = st
		}
		d.Failed = append(d.Failed, selectionFailure{ID: id, Status: st, Error: heading + ": " + err.Error()})
	}
	h.log.Info("tide dashboard: selection "+op, "queue", queue, "selected", len(ids), "done", d.Done,
		"failed", len(d.Failed), "remote", r.RemoteAddr, "bearer", bearer)
	if d.Done > 0 {
		status = http.StatusOK
	}
	if bearer {
		failed := d.Failed
		if failed == nil {
			failed = []selectionFailure{}
		}
		writeJSON(w, status, map[string]any{"ok": len(d.Failed) == 0, "count": d.Done, "failed": failed})
		return
	}
	if len(d.Failed) == 0 {
		h.redirect(w, r, ret, &flash{Kind: "sel-" + op, Queue: queue, N: d.Done})
		return
	}
	for i := range d.Failed {
		d.Failed[i].ID = previewText(d.Failed[i].ID)
		d.Failed[i].Error = oneText(d.Failed[i].Error)
	}
	h.render(w, status, "selection", h.newView(w, r, "queue", "Selected tasks", d))
}
