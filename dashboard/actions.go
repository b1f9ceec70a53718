package dashboard

import (
	"context"
	"net/http"
	"net/url"

	"github.com/tidequeue/tide"
)

// taskOp returns the Inspector call of a per-task action: run, archive,
// delete, and cancel when withCancel; nil for any other op.
func (h *handler) taskOp(op string, withCancel bool) func(context.Context, string, string) error {
	switch op {
	case "run":
		return h.in.RunTask
	case "archive":
		return h.in.ArchiveTask
	case "delete":
		return h.in.DeleteTask
	case "cancel":
		if withCancel {
			return h.in.CancelProcessing
		}
	}
	return nil
}

// taskAction handles POST /task/{run,archive,delete,cancel}.
func (h *handler) taskAction(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	do := h.taskOp(op, true)
	if do == nil {
		h.notFound(w, r)
		return
	}
	bearer, ok := h.authorize(w, r)
	if !ok {
		return
	}
	queue, id := r.PostFormValue("q"), r.PostFormValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	if err := do(ctx, queue, id); err != nil {
		h.log.Info("tide dashboard: task "+op+" failed", "queue", queue, "id", id, "remote", r.RemoteAddr, "err", err)
		h.failed(w, r, bearer, err)
		return
	}
	h.log.Info("tide dashboard: task "+op, "queue", queue, "id", id, "remote", r.RemoteAddr, "bearer", bearer)
	f := &flash{Kind: op, Queue: queue, ID: id}
	ret := r.PostFormValue("return")
	if ret == "" {
		ret = "/queue?" + url.Values{"q": {queue}}.Encode()
	}
	h.succeeded(w, r, bearer, ret, f)
}

// queueAction handles POST /queue/{pause,unpause,run-all,archive-all,delete-all}.
func (h *handler) queueAction(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	var bulk func(context.Context, string, tide.TaskState) (int, error)
	switch op {
	case "pause", "unpause":
	case "run-all":
		bulk = h.in.RunAllTasks
	case "archive-all":
		bulk = h.in.ArchiveAllTasks
	case "delete-all":
		bulk = h.in.DeleteAllTasks
	default:
		h.notFound(w, r)
		return
	}
	bearer, ok := h.authorize(w, r)
	if !ok {
		return
	}
	queue := r.PostFormValue("q")
	f := &flash{Kind: op, Queue: queue}
	var err error
	if bulk == nil {
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		if op == "pause" {
			err = h.in.PauseQueue(ctx, queue)
		} else {
			err = h.in.UnpauseQueue(ctx, queue)
		}
	} else {
		st, ok := parseState(r.PostFormValue("state"))
		if !ok || st == tide.StateActive {
			h.refuse(w, r, bearer, http.StatusBadRequest, "Bad request", "The state must be pending, scheduled, retry, archived or completed.")
			return
		}
		f.State = st.String()
		ctx, cancel := context.WithTimeout(r.Context(), bulkTimeout)
		defer cancel()
		f.N, err = bulk(ctx, queue, st)
	}
	if err != nil {
		h.log.Info("tide dashboard: queue "+op+" failed", "queue", queue, "state", f.State, "done", f.N, "remote", r.RemoteAddr, "err", err)
		if f.N > 0 {
			err = &partialError{n: f.N, err: err}
		}
		h.failed(w, r, bearer, err)
		return
	}
	h.log.Info("tide dashboard: queue "+op, "queue", queue, "state", f.State, "count", f.N, "remote", r.RemoteAddr, "bearer", bearer)
	ret := r.PostFormValue("return")
	if ret == "" {
		ret = "/queue?" + url.Values{"q": {queue}}.Encode()
	}
	h.succeeded(w, r, bearer, ret, f)
}

// partialError is a bulk operation that stopped part way.
type partialError struct {
	n   int
	err error
}

func (e *partialError) Error() string {
	return "stopped after " + number(e.n) + " tasks: " + e.err.Error()
}

func (e *partialError) Unwrap() error { return e.err }

func (h *handler) failed(w http.ResponseWriter, r *http.Request, bearer bool, err error) {
	if bearer {
		status, heading := classify(err, true)
		writeJSON(w, status, map[string]any{"ok": false, "error": heading + ": " + err.Error()})
		return
	}
	h.fail(w, r, err, true)
}

func (h *handler) succeeded(w http.ResponseWriter, r *http.Request, bearer bool, ret string, f *flash) {
	if bearer {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "message": f.Message(), "count": f.N})
		return
	}
	h.redirect(w, r, ret, f)
}
