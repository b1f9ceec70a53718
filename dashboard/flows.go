package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/tidetype"
)

// Limits of the workflow and batch pages.
const (
	// stepsPerPage is how many steps the workflow page's table lists per
	// page.
	stepsPerPage = 100
	// failedShown is how many failed task IDs the batch page lists.
	failedShown = 100
)

// flowRetention says how long workflows and batches are kept after they
// end: "24 hours".
func flowRetention() string {
	if h := tide.WorkflowRetention.Hours(); h == float64(int(h)) {
		return strconv.Itoa(int(h)) + " hours"
	}
	return tide.WorkflowRetention.String()
}

// workflowPath and batchPath are the pages of a workflow and a batch; the
// ID is path-escaped.
func workflowPath(id string) string { return "/workflows/" + url.PathEscape(id) }
func batchPath(id string) string    { return "/batches/" + url.PathEscape(id) }

// taskLink is a task's page.
func taskLink(queue, id string) string {
	return "/task?" + url.Values{"q": {queue}, "id": {id}}.Encode()
}

// progressBar is a bar of a workflow's or batch's outcomes, drawn as SVG
// (inline styles are not allowed by the pages' Content-Security-Policy):
// succeeded, failed and cancelled segments over a track that stands for
// the steps still to finish. Coordinates are in a 1000-unit-wide viewBox.
type progressBar struct {
	Segs  []barSeg
	Label string
}

type barSeg struct {
	Class string
	X, W  float64
}

func newProgressBar(total, succeeded, failed, cancelled int) *progressBar {
	b := &progressBar{}
	pending := max(total-succeeded-failed-cancelled, 0)
	parts := []string{number(succeeded) + " succeeded", number(failed) + " failed"}
	if cancelled > 0 {
		parts = append(parts, number(cancelled)+" cancelled")
	}
	parts = append(parts, number(pending)+" pending")
	b.Label = strings.Join(parts, ", ") + " of " + number(total)
	if total <= 0 {
		return b
	}
	x := 0.0
	for _, p := range []struct {
		class string
		n     int
	}{{"ok", succeeded}, {"failed", failed}, {"cancelled", cancelled}} {
		if p.n <= 0 {
			continue
		}
		w := 1000 * float64(min(p.n, total)) / float64(total)
		b.Segs = append(b.Segs, barSeg{Class: p.class, X: x, W: w})
		x += w
	}
	return b
}

// pager is the paging of a list page.
type pager struct {
	Page, Size, Count, Pages int
	From, To                 int
	PrevURL, NextURL         string
	PageSizes                []pageSize
}

// newPager pages count items for the list at path, shown rows at a time.
func newPager(path string, page, size, count, shown int) pager {
	link := func(page, size int) string {
		v := url.Values{}
		if page > 1 {
			v.Set("page", strconv.Itoa(page))
		}
		if size != defaultPageSize {
			v.Set("size", strconv.Itoa(size))
		}
		if len(v) == 0 {
			return path
		}
		return path + "?" + v.Encode()
	}
	p := pager{Page: page, Size: size, Count: count, Pages: max(1, (count+size-1)/size)}
	if shown > 0 {
		p.From = (page-1)*size + 1
		p.To = p.From + shown - 1
	}
	if page > 1 {
		p.PrevURL = link(min(page-1, p.Pages), size)
	}
	if page*size < count {
		p.NextURL = link(page+1, size)
	}
	for _, n := range []int{20, 50, 100} {
		p.PageSizes = append(p.PageSizes, pageSize{N: n, URL: link(1, n), Current: n == size})
	}
	return p
}

// workflowRow is a workflow in the list.
type workflowRow struct {
	*tide.WorkflowInfo
	URL     string
	Bar     *progressBar
	Pending int
}

// workflowsData is the data of the workflows page.
type workflowsData struct {
	pager
	Rows []workflowRow
}

func (h *handler) workflowsPage(w http.ResponseWriter, r *http.Request) {
	page := intParam(r, "page", 1, 1, maxPage)
	size := intParam(r, "size", defaultPageSize, 1, maxPageSize)
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	fs, n, err := h.in.Workflows(ctx, (page-1)*size, size)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d := &workflowsData{pager: newPager("/workflows", page, size, n, len(fs))}
	for _, f := range fs {
		d.Rows = append(d.Rows, workflowRow{WorkflowInfo: f, URL: workflowPath(f.ID),
			Bar:     newProgressBar(f.Total, f.Succeeded, f.Failed, f.Canceled),
			Pending: max(f.Total-f.Succeeded-f.Failed-f.Canceled, 0)})
	}
	h.render(w, http.StatusOK, "workflows", h.newView(w, r, "workflows", "Workflows", d))
}

// stepRow is a step in the workflow page's table.
type stepRow struct {
	N       int // 1 for the first step added
	Name    string
	Look    string
	State   string
	URL     string
	Queue   string
	TaskID  string
	After   []string
	Depth   int
	OnFail  bool
	ErrText string
}

// workflowData is the data of the workflow page.
type workflowData struct {
	Info    *tide.WorkflowInfo
	Pending int
	Bar     *progressBar
	Graph   *graph
	Steps   []stepRow
	// StepPage pages the step table.
	StepPage, StepPages, From, To int
	PrevURL, NextURL              string
	// Running: the workflow can be cancelled; CanCancel when the dashboard
	// also has a Client to do it with.
	Running, CanCancel bool
	CancelURL          string
	// FailedShown are the first failed tasks, MoreFailed how many more
	// failed.
	FailedShown []failedRow
	MoreFailed  int
}

// failedRow is a failed task ID with its page ("" when its queue is not
// known).
type failedRow struct {
	ID, URL string
}

// failedRows returns the first failedShown of ids, linked to their task
// pages (the steps say in which queue each task is), and how many more
// there are.
func failedRows(ids []string, steps []tide.StepInfo) ([]failedRow, int) {
	queues := make(map[string]string, len(steps))
	for _, s := range steps {
		queues[s.TaskID] = s.Queue
	}
	var out []failedRow
	for i, id := range ids {
		if i == failedShown {
			return out, len(ids) - i
		}
		row := failedRow{ID: id}
		if q, ok := queues[id]; ok && q != "" {
			row.URL = taskLink(q, id)
		}
		out = append(out, row)
	}
	return out, 0
}

// flowNotFound answers 404 for a workflow or batch ID that names nothing
// of that kind: unknown, kept past its retention, malformed, or of the
// other kind.
func (h *handler) flowNotFound(w http.ResponseWriter, r *http.Request, what, id, extra string) {
	msg := "There is no " + what + " " + strconv.Quote(id) + ": it never existed, or it ended more than " +
		flowRetention() + " ago and was removed."
	if extra != "" {
		msg = extra
	}
	h.failWith(w, r, http.StatusNotFound, strings.ToUpper(what[:1])+what[1:]+" not found", msg)
}

// unknownFlow reports whether err from reading a workflow or batch means
// there is no such ID (malformed IDs name nothing either).
func unknownFlow(err error) bool {
	return errors.Is(err, tide.ErrWorkflowNotFound) || errors.Is(err, tide.ErrInvalidTask)
}

func (h *handler) workflowPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	f, err := h.in.GetWorkflow(ctx, id)
	if err != nil {
		if unknownFlow(err) {
			h.flowNotFound(w, r, "workflow", id, "")
			return
		}
		h.fail(w, r, err, false)
		return
	}
	if f.Kind != tidetype.KindWorkflow {
		h.flowNotFound(w, r, "workflow", id, strconv.Quote(id)+" is a batch, not a workflow: see "+batchPath(id)+".")
		return
	}
	d := &workflowData{Info: f, Graph: layoutGraph(f.Steps),
		Bar:     newProgressBar(f.Total, f.Succeeded, f.Failed, f.Canceled),
		Pending: max(f.Total-f.Succeeded-f.Failed-f.Canceled, 0),
		Running: f.State == tide.FlowRunning, CancelURL: workflowPath(f.ID) + "/cancel"}
	d.CanCancel = d.Running && h.client != nil
	d.FailedShown, d.MoreFailed = failedRows(f.FailedIDs, f.Steps)
	depth := stepDepths(f.Steps)
	d.StepPages = max(1, (len(f.Steps)+stepsPerPage-1)/stepsPerPage)
	d.StepPage = intParam(r, "page", 1, 1, d.StepPages)
	lo := (d.StepPage - 1) * stepsPerPage
	hi := min(lo+stepsPerPage, len(f.Steps))
	for i := lo; i < hi; i++ {
		s := &f.Steps[i]
		look, label := stepLook(s)
		d.Steps = append(d.Steps, stepRow{N: i + 1, Name: s.Name, Look: look, State: label, URL: stepTaskURL(s),
			Queue: s.Queue, TaskID: s.TaskID, After: s.After, Depth: depth[i], OnFail: s.RunOnFailure,
			ErrText: oneText(truncateErr(s.Err))})
	}
	if len(d.Steps) > 0 {
		d.From, d.To = lo+1, hi
	}
	page := func(n int) string {
		if n <= 1 {
			return workflowPath(f.ID) + "#steps"
		}
		return workflowPath(f.ID) + "?page=" + strconv.Itoa(n) + "#steps"
	}
	if d.StepPage > 1 {
		d.PrevURL = page(d.StepPage - 1)
	}
	if d.StepPage < d.StepPages {
		d.NextURL = page(d.StepPage + 1)
	}
	h.render(w, http.StatusOK, "workflow", h.newView(w, r, "workflows", "Workflow "+id, d))
}

// batchRow is a batch in the list.
type batchRow struct {
	*tide.BatchInfo
	URL     string
	Bar     *progressBar
	Pending int
}

// batchesData is the data of the batches page.
type batchesData struct {
	pager
	Rows []batchRow
}

func (h *handler) batchesPage(w http.ResponseWriter, r *http.Request) {
	page := intParam(r, "page", 1, 1, maxPage)
	size := intParam(r, "size", defaultPageSize, 1, maxPageSize)
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	bs, n, err := h.in.Batches(ctx, (page-1)*size, size)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d := &batchesData{pager: newPager("/batches", page, size, n, len(bs))}
	for _, b := range bs {
		d.Rows = append(d.Rows, batchRow{BatchInfo: b, URL: batchPath(b.ID),
			Bar:     newProgressBar(b.Total, b.Succeeded, b.Failed, 0),
			Pending: max(b.Total-b.Succeeded-b.Failed, 0)})
	}
	h.render(w, http.StatusOK, "batches", h.newView(w, r, "batches", "Batches", d))
}

// batchData is the data of the batch page.
type batchData struct {
	Info    *tide.BatchInfo
	Pending int
	Bar     *progressBar
	// Callback is the callback step (nil for a batch without one); its
	// task page is CallbackURL ("" before it is enqueued).
	Callback                    *tide.StepInfo
	CallbackURL                 string
	CallbackLook, CallbackState string
	Failed                      []failedRow
	MoreFailed                  int
	Running, CanCancel          bool
	CancelURL                   string
}

func (h *handler) batchPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	b, err := h.in.GetBatch(ctx, id)
	if err != nil {
		if unknownFlow(err) {
			extra := ""
			if errors.Is(err, tide.ErrWorkflowNotFound) && h.isWorkflow(ctx, id) {
				extra = strconv.Quote(id) + " is a workflow, not a batch: see " + workflowPath(id) + "."
			}
			h.flowNotFound(w, r, "batch", id, extra)
			return
		}
		h.fail(w, r, err, false)
		return
	}
	d := &batchData{Info: b, Bar: newProgressBar(b.Total, b.Succeeded, b.Failed, 0),
		Pending: max(b.Total-b.Succeeded-b.Failed, 0),
		Running: b.State == tide.FlowRunning, CancelURL: batchPath(b.ID) + "/cancel"}
	d.CanCancel = d.Running && h.client != nil
	// The steps say in which queue each task is, for the links.
	var steps []tide.StepInfo
	if f, err := h.in.GetWorkflow(ctx, id); err == nil {
		steps = f.Steps
		for i := range steps {
			s := &steps[i]
			if b.CallbackID != "" && (s.TaskID == b.CallbackID || s.Name == b.CallbackID) {
				d.Callback = s
				d.CallbackURL = stepTaskURL(s)
				d.CallbackLook, d.CallbackState = stepLook(s)
			}
		}
	} else if !unknownFlow(err) {
		h.fail(w, r, err, false)
		return
	}
	d.Failed, d.MoreFailed = failedRows(b.FailedIDs, steps)
	h.render(w, http.StatusOK, "batch", h.newView(w, r, "batches", "Batch "+id, d))
}

// isWorkflow reports whether id names a workflow, for the batch page's 404.
func (h *handler) isWorkflow(ctx context.Context, id string) bool {
	f, err := h.in.GetWorkflow(ctx, id)
	return err == nil && f.Kind == tidetype.KindWorkflow
}

// flowAction handles POST /workflows/{id}/cancel and /batches/{id}/cancel:
// Client.CancelWorkflow, for a workflow or batch that is running.
func (h *handler) flowAction(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("op") != "cancel" {
			h.notFound(w, r)
			return
		}
		bearer, ok := h.authorize(w, r)
		if !ok {
			return
		}
		id := r.PathValue("id")
		if h.client == nil {
			h.refuse(w, r, bearer, http.StatusNotImplemented, "Not supported by this dashboard",
				"Cancelling workflows and batches needs a tide.Client: set Options.Client.")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), bulkTimeout)
		defer cancel()
		var state tide.FlowState
		var err error
		if kind == "workflow" {
			var f *tide.WorkflowInfo
			if f, err = h.in.GetWorkflow(ctx, id); err == nil {
				if f.Kind != tidetype.KindWorkflow {
					err = tide.ErrWorkflowNotFound
				}
				state = f.State
			}
		} else {
			var b *tide.BatchInfo
			if b, err = h.in.GetBatch(ctx, id); err == nil {
				state = b.State
			}
		}
		if err == nil && state != tide.FlowRunning {
			h.refuse(w, r, bearer, http.StatusConflict, "The "+kind+" has ended",
				"The "+kind+" is "+state.String()+": there is nothing left to cancel.")
			return
		}
		if err == nil {
			err = h.client.CancelWorkflow(ctx, id)
		}
		if err != nil {
			h.log.Info("tide dashboard: "+kind+" cancel failed", kind, id, "remote", r.RemoteAddr, "err", err)
			if unknownFlow(err) {
				h.refuse(w, r, bearer, http.StatusNotFound, strings.ToUpper(kind[:1])+kind[1:]+" not found",
					"There is no "+kind+" "+strconv.Quote(id)+".")
				return
			}
			h.failed(w, r, bearer, err)
			return
		}
		h.log.Info("tide dashboard: "+kind+" cancel", kind, id, "remote", r.RemoteAddr, "bearer", bearer)
		ret := r.PostFormValue("return")
		if ret == "" {
			if kind == "workflow" {
				ret = workflowPath(id)
			} else {
				ret = batchPath(id)
			}
		}
		h.succeeded(w, r, bearer, ret, &flash{Kind: kind + "-cancel", ID: id})
	}
}
