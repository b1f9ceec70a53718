package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// hostileStepErr is the error a failing step returns: markup and a
// bidirectional override that the pages must show as text.
const hostileStepErr = `<script>alert("step")</script><img src=x onerror=alert(3)>` + "\u202e"

var (
	nodeRe = regexp.MustCompile(`<g class="node n-([a-z]+)" data-step="([^"]+)" data-state="([^"]+)">`)
	edgeRe = regexp.MustCompile(`<path class="edge" d="[^"]+" marker-end="url\(#wf-arrow\)" data-from="([^"]+)" data-to="([^"]+)">`)
)

// graphOf returns the workflow page's SVG boxes (step → look) and edges
// ("from>to", sorted).
func graphOf(t *testing.T, body string) (map[string]string, []string) {
	t.Helper()
	svg, _, ok := strings.Cut(body[max(strings.Index(body, `<svg class="flow-graph"`), 0):], "</svg>")
	if !ok || !strings.HasPrefix(svg, `<svg class="flow-graph"`) {
		t.Fatalf("no workflow graph in the page:\n%s", body)
	}
	nodes := map[string]string{}
	for _, m := range nodeRe.FindAllStringSubmatch(svg, -1) {
		if _, dup := nodes[m[2]]; dup {
			t.Errorf("step %s drawn twice", m[2])
		}
		nodes[m[2]] = m[1]
	}
	if n := strings.Count(svg, `<g class="node `); n != len(nodes) {
		t.Errorf("%d boxes, %d parsed", n, len(nodes))
	}
	var edges []string
	for _, m := range edgeRe.FindAllStringSubmatch(svg, -1) {
		edges = append(edges, m[1]+">"+m[2])
	}
	if n := strings.Count(svg, `<path class="edge"`); n != len(edges) {
		t.Errorf("%d edges, %d parsed", n, len(edges))
	}
	slices.Sort(edges)
	return nodes, edges
}

// rowStates returns the step table's states by step.
func rowStates(body string) map[string]string {
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`<tr data-step="([^"]+)" data-state="([^"]+)">`).FindAllStringSubmatch(body, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// flowServer serves queue "flows": a task whose payload is "fail" fails
// for good with hostileStepErr, "hold" runs until release is closed (or it
// is cancelled), anything else succeeds.
func flowServer(t *testing.T, e *env, release <-chan struct{}, started chan<- string) {
	t.Helper()
	srv := tide.NewServer(e.b, tide.Config{Concurrency: 4, Queues: map[string]int{"flows": 1}, Logger: testLogger(t)})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		switch string(task.Payload()) {
		case "fail":
			return fmt.Errorf("%s: %w", hostileStepErr, tide.SkipRetry)
		case "hold":
			if started != nil {
				id, _ := tide.GetTaskID(ctx)
				started <- id
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-release:
				return nil
			}
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

// waitFlowState polls until the workflow or batch id is in state st.
func (e *env) waitFlowState(id string, st tide.FlowState) *tide.WorkflowInfo {
	e.t.Helper()
	var f *tide.WorkflowInfo
	testwait.Until(e.t, 20*time.Second, func() error {
		var err error
		f, err = e.in.GetWorkflow(e.ctx(), id)
		if err == nil && f.State == st && (st == tide.FlowRunning || !f.FinishedAt.IsZero()) {
			return nil
		}
		return fmt.Errorf("workflow %s: %+v %v, want %v", id, f, err, st)
	})
	return f
}

// nextMilli waits until the broker's clock has passed t's millisecond, so
// that the next workflow sorts after the last one.
func (e *env) nextMilli(t time.Time) {
	e.t.Helper()
	testwait.For(e.t, 10*time.Second, "the broker's clock to pass "+t.Format(time.StampMilli), func() bool {
		return e.b.Now().UnixMilli() > t.UnixMilli()
	})
}

func diamond(id, bPayload string) *tide.Workflow {
	return tide.NewWorkflow(id).
		Add("a", tide.NewTask("step", nil)).
		Add("b", tide.NewTask("step", []byte(bPayload)), tide.After("a")).
		Add("c", tide.NewTask("step", nil), tide.After("a")).
		Add("d", tide.NewTask("step", nil), tide.After("b", "c"))
}

var diamondEdges = []string{"a>b", "a>c", "b>d", "c>d"}

// TestWorkflowPages enqueues diamond workflows that succeed and fail, and
// one held by a running step; checks the list, the graph (boxes, edges,
// colours by state), the step table with its escaped error, and cancels
// the held one from its page.
func TestWorkflowPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.h.client = e.c // as Options.Client
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	started := make(chan string, 4)
	flowServer(t, e, release, started)
	ctx := e.ctx()

	ok, err := e.c.EnqueueWorkflow(ctx, diamond("order-ok", ""), tide.Queue("flows"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitFlowState("order-ok", tide.FlowSucceeded)
	e.nextMilli(ok.CreatedAt)
	bad, err := e.c.EnqueueWorkflow(ctx, diamond("order-bad", "fail"), tide.Queue("flows"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitFlowState("order-bad", tide.FlowFailed)
	e.nextMilli(bad.CreatedAt)
	held := tide.NewWorkflow("order-held").
		Add("gate", tide.NewTask("step", []byte("hold"))).
		Add("after", tide.NewTask("step", nil), tide.After("gate"))
	if _, err := e.c.EnqueueWorkflow(ctx, held, tide.Queue("flows")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the held step did not start")
	}

	// The list: newest first, states and counts.
	resp, body := e.get("/workflows")
	wantStatus(t, resp, body, http.StatusOK)
	var ids []string
	for _, m := range regexp.MustCompile(`<tr data-workflow="([^"]+)" data-state="([^"]+)">`).FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1]+":"+m[2])
	}
	if want := []string{"order-held:running", "order-bad:failed", "order-ok:succeeded"}; !slices.Equal(ids, want) {
		t.Errorf("workflow rows %v, want %v", ids, want)
	}
	for _, want := range []string{`href="/workflows/order-bad"`, `<span class="badge fl-failed">failed</span>`, `id="nav-workflows" class="current"`,
		`aria-label="2 succeeded, 1 failed, 1 cancelled, 0 pending of 4"`, `aria-label="0 succeeded, 0 failed, 2 pending of 2"`} {
		if !strings.Contains(body, want) {
			t.Errorf("workflows page lacks %s", want)
		}
	}
	_, body = e.get("/workflows?size=2")
	if n := strings.Count(body, "<tr data-workflow="); n != 2 || !strings.Contains(body, `href="/workflows?page=2&amp;size=2"`) {
		t.Errorf("page 1 of 2: %d rows, next link %v", n, strings.Contains(body, `rel="next"`))
	}
	_, body = e.get("/workflows?size=2&page=2")
	if n := strings.Count(body, "<tr data-workflow="); n != 1 || !strings.Contains(body, `data-workflow="order-ok"`) {
		t.Errorf("page 2 of 2: %d rows:\n%s", n, body)
	}

	// A workflow that succeeded: four green boxes, four edges.
	resp, body = e.get("/workflows/order-ok")
	wantStatus(t, resp, body, http.StatusOK)
	nodes, edges := graphOf(t, body)
	if want := map[string]string{"a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "succeeded"}; fmt.Sprint(nodes) != fmt.Sprint(want) {
		t.Errorf("order-ok boxes %v", nodes)
	}
	if !slices.Equal(edges, diamondEdges) {
		t.Errorf("order-ok edges %v, want %v", edges, diamondEdges)
	}
	for _, want := range []string{`id="workflow-state"><span class="badge fl-succeeded">succeeded</span>`, "4 succeeded · 0 failed · 0 cancelled · 0 to finish, of 4 steps",
		`<a href="/task?id=order-ok%2Fd&amp;q=flows">`} {
		if !strings.Contains(body, want) {
			t.Errorf("order-ok page lacks %s", want)
		}
	}
	if strings.Contains(body, `id="graph-capped"`) || strings.Contains(body, "cancel-workflow") {
		t.Error("order-ok page: a cap note or a cancel button")
	}

	// A workflow that failed: b red with its error escaped, d cancelled
	// (grey, no link), a and c green.
	resp, body = e.get("/workflows/order-bad")
	wantStatus(t, resp, body, http.StatusOK)
	nodes, edges = graphOf(t, body)
	if want := map[string]string{"a": "succeeded", "b": "failed", "c": "succeeded", "d": "cancelled"}; fmt.Sprint(nodes) != fmt.Sprint(want) {
		t.Errorf("order-bad boxes %v, want %v", nodes, want)
	}
	if !slices.Equal(edges, diamondEdges) {
		t.Errorf("order-bad edges %v", edges)
	}
	if got := rowStates(body); fmt.Sprint(got) != fmt.Sprint(map[string]string{"a": "succeeded", "b": "failed", "c": "succeeded", "d": "cancelled"}) {
		t.Errorf("order-bad table %v", got)
	}
	checkNoRaw(t, "order-bad page", body)
	for _, raw := range []string{`<script>alert("step")`, "<img src=x", "\u202e"} {
		if strings.Contains(body, raw) {
			t.Errorf("order-bad page contains the raw %q", raw)
		}
	}
	for _, want := range []string{`&lt;script&gt;alert(&#34;step&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(3)&gt;\u202e`, `<code>order-bad/b</code>`,
		`<span class="badge fl-failed">failed</span>`,
		`id="workflow-failed"><a href="/task?id=order-bad%2Fb&amp;q=flows"><code>order-bad/b</code></a></dd>`} {
		if !strings.Contains(body, want) {
			t.Errorf("order-bad page lacks %s", want)
		}
	}
	// The error is in b's row of the table (not only in its box's tooltip).
	row, _, _ := strings.Cut(body[max(strings.Index(body, `<tr data-step="b" data-state="failed">`), 0):], "</tr>")
	if !strings.Contains(row, `<div class="errtext">&lt;script&gt;alert(&#34;step&#34;)`) {
		t.Errorf("b's row lacks its escaped error: %s", row)
	}
	if strings.Contains(body, `href="/task?id=order-bad%2Fd`) {
		t.Error("the cancelled step, which never had a task, links to a task page")
	}

	// The held workflow: its gate running (as the task state says), the
	// step after it waiting. Visitors see no cancel button; an admin does.
	var gateLook string
	testwait.For(t, 20*time.Second, "the held workflow's gate to show active", func() bool {
		_, body = e.get("/workflows/order-held")
		nodes, _ = graphOf(t, body)
		gateLook = nodes["gate"]
		return gateLook == "active"
	})
	if gateLook != "active" || nodes["after"] != "waiting" {
		t.Errorf("order-held boxes %v, want gate active and after waiting", nodes)
	}
	if !strings.Contains(body, `data-state="enqueued · active"`) || strings.Contains(body, "cancel-workflow") {
		t.Errorf("order-held page for a visitor: no active label or a cancel button:\n%s", body)
	}
	session := e.login()
	csrf := e.csrf(session)
	_, body = e.get("/workflows/order-held", session)
	if !strings.Contains(body, `action="/workflows/order-held/cancel"`) || !strings.Contains(body, `id="cancel-workflow"`) {
		t.Fatalf("no cancel button for an admin:\n%s", body)
	}
	// Refused without the CSRF token, by GET, and for a batch's route.
	resp, body = e.post("/workflows/order-held/cancel", url.Values{}, session, "")
	wantStatus(t, resp, body, http.StatusForbidden)
	resp, body = e.get("/workflows/order-held/cancel", session)
	wantStatus(t, resp, body, http.StatusMethodNotAllowed)
	resp, body = e.post("/batches/order-held/cancel", url.Values{}, session, csrf)
	wantStatus(t, resp, body, http.StatusNotFound)
	resp, body = e.post("/workflows/order-held/explode", url.Values{}, session, csrf)
	wantStatus(t, resp, body, http.StatusNotFound)
	if f, _ := e.in.GetWorkflow(ctx, "order-held"); f == nil || f.State != tide.FlowRunning {
		t.Fatalf("a refused cancel changed the workflow: %+v", f)
	}
	resp, body = e.post("/workflows/order-held/cancel", url.Values{"return": {"/workflows/order-held"}}, session, csrf)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/workflows/order-held" {
		t.Errorf("after cancel: Location %q", loc)
	}
	e.waitFlowState("order-held", tide.FlowCanceled)
	_, body = e.get("/workflows/order-held", session, cookieNamed(resp, flashCookie))
	if !strings.Contains(body, "Workflow order-held was cancelled") || !strings.Contains(body, `<span class="badge fl-cancelled">cancelled</span>`) {
		t.Errorf("after cancel the page lacks the flash or the state:\n%s", body)
	}
	if strings.Contains(body, `id="cancel-workflow"`) {
		t.Error("a cancelled workflow still has a cancel button")
	}
	if nodes, _ := graphOf(t, body); nodes["after"] != "cancelled" {
		t.Errorf("after cancel: boxes %v", nodes)
	}
	// Cancelling an ended workflow is a conflict; an unknown one a 404.
	resp, body = e.post("/workflows/order-ok/cancel", url.Values{}, session, csrf)
	wantStatus(t, resp, body, http.StatusConflict)
	resp, body = e.do(http.MethodPost, "/workflows/nope/cancel", url.Values{}, map[string]string{"Authorization": "Bearer " + testToken})
	wantStatus(t, resp, body, http.StatusNotFound)
	if !strings.Contains(body, `"ok":false`) {
		t.Errorf("bearer 404: %s", body)
	}
}

// TestWorkflowCancelReadOnlyAndNoClient: a read-only dashboard shows no
// button and refuses the action; a dashboard without a Client shows no
// button and answers 501.
func TestWorkflowCancelReadOnlyAndNoClient(t *testing.T) {
	t.Parallel()
	wf := tide.NewWorkflow("idle-1").Add("only", tide.NewTask("step", nil, tide.Queue("nobody")))

	ro := newEnvOpts(t, Options{})
	ro.h.client = ro.c
	if _, err := ro.c.EnqueueWorkflow(ro.ctx(), wf); err != nil {
		t.Fatal(err)
	}
	_, body := ro.get("/workflows/idle-1")
	if strings.Contains(body, "cancel-workflow") || strings.Contains(body, `name="csrf"`) {
		t.Error("a read-only dashboard shows a cancel button")
	}
	resp, body := ro.do(http.MethodPost, "/workflows/idle-1/cancel", url.Values{}, ro.browser())
	wantStatus(t, resp, body, http.StatusForbidden)

	nc := newEnv(t, testToken) // no Client
	if _, err := nc.c.EnqueueWorkflow(nc.ctx(), wf); err != nil {
		t.Fatal(err)
	}
	session := nc.login()
	_, body = nc.get("/workflows/idle-1", session)
	if strings.Contains(body, `id="cancel-workflow"`) || !strings.Contains(body, `id="cancel-unavailable"`) {
		t.Errorf("without a Client: a cancel button, or no note:\n%s", body)
	}
	resp, body = nc.post("/workflows/idle-1/cancel", url.Values{}, session, nc.csrf(session))
	wantStatus(t, resp, body, http.StatusNotImplemented)
	for _, e := range []*env{ro, nc} {
		if f, err := e.in.GetWorkflow(e.ctx(), "idle-1"); err != nil || f.State != tide.FlowRunning {
			t.Errorf("refused cancel changed the workflow: %+v %v", f, err)
		}
	}
}

// TestLargeWorkflowGraphCapped: a workflow over maxGraphSteps steps draws
// the steps nearest the start, says so, and pages its step table.
func TestLargeWorkflowGraphCapped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	const n = maxGraphSteps + 10
	wf := tide.NewWorkflow("big-1").Add("root", tide.NewTask("step", nil))
	for i := range n {
		wf.Add(fmt.Sprintf("leaf-%03d", i), tide.NewTask("step", nil), tide.After("root"))
	}
	if _, err := e.c.EnqueueWorkflow(e.ctx(), wf, tide.Queue("nobody")); err != nil {
		t.Fatal(err)
	}
	resp, body := e.get("/workflows/big-1")
	wantStatus(t, resp, body, http.StatusOK)
	nodes, edges := graphOf(t, body)
	if len(nodes) != maxGraphSteps || len(edges) != maxGraphSteps-1 || nodes["root"] != "pending" {
		t.Errorf("%d boxes, %d edges, root %q; want %d, %d, pending", len(nodes), len(edges), nodes["root"], maxGraphSteps, maxGraphSteps-1)
	}
	if !strings.Contains(body, `id="graph-capped"`) || !strings.Contains(body, fmt.Sprintf("This workflow has %d steps: the graph draws the %d nearest the start", n+1, maxGraphSteps)) {
		t.Error("no note that the graph is capped")
	}
	rows := func(body string) int { return strings.Count(body, "<tr data-step=") }
	if got := rows(body); got != stepsPerPage {
		t.Errorf("step table page 1: %d rows", got)
	}
	if !strings.Contains(body, `href="/workflows/big-1?page=2#steps"`) {
		t.Error("no link to the step table's next page")
	}
	_, body = e.get("/workflows/big-1?page=4")
	if got := rows(body); got != n+1-3*stepsPerPage || !strings.Contains(body, `data-step="leaf-309"`) {
		t.Errorf("step table page 4: %d rows", got)
	}
	_, body = e.get("/workflows/big-1?page=999")
	if got := rows(body); got != n+1-3*stepsPerPage {
		t.Errorf("step table past the end: %d rows, want the last page", got)
	}
}

// TestBatchPages enqueues a batch with a failing task and a callback,
// serves it to the end, and checks the list and the batch page: counts,
// progress bar, callback link, failed task links, and cancelling a
// running batch.
func TestBatchPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.h.client = e.c
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	flowServer(t, e, release, nil)
	ctx := e.ctx()

	tasks := []*tide.Task{
		tide.NewTask("row", []byte("1")), tide.NewTask("row", []byte("fail")), tide.NewTask("row", []byte("2")),
		tide.NewTask("row", []byte("3")), tide.NewTask("row", []byte("fail")),
	}
	done, err := e.c.EnqueueBatch(ctx, tasks, tide.Queue("flows"), tide.OnBatchDone(tide.NewTask("report", nil)))
	if err != nil {
		t.Fatal(err)
	}
	e.waitFlowState(done.ID, tide.FlowFailed)
	b, err := e.in.GetBatch(ctx, done.ID)
	if err != nil || b.Succeeded != 3 || b.Failed != 2 || len(b.FailedIDs) != 2 || b.CallbackID == "" {
		t.Fatalf("batch: %+v %v", b, err)
	}
	e.nextMilli(done.CreatedAt)
	running, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("row", []byte("hold")), tide.NewTask("row", nil)}, tide.Queue("flows"))
	if err != nil {
		t.Fatal(err)
	}

	resp, body := e.get("/batches")
	wantStatus(t, resp, body, http.StatusOK)
	var rows []string
	for _, m := range regexp.MustCompile(`<tr data-batch="([^"]+)" data-state="([^"]+)">`).FindAllStringSubmatch(body, -1) {
		rows = append(rows, m[1]+":"+m[2])
	}
	if want := []string{running.ID + ":running", done.ID + ":failed"}; !slices.Equal(rows, want) {
		t.Errorf("batch rows %v, want %v", rows, want)
	}
	if !strings.Contains(body, `aria-label="3 succeeded, 2 failed, 0 pending of 5"`) || !strings.Contains(body, `id="nav-batches" class="current"`) {
		t.Errorf("batches page lacks the finished batch's bar or the current nav:\n%s", body)
	}

	resp, body = e.get("/batches/" + done.ID)
	wantStatus(t, resp, body, http.StatusOK)
	// href is a task page's link as the page writes it.
	href := func(id string) string {
		return `href="/task?` + strings.ReplaceAll(url.Values{"q": {"flows"}, "id": {id}}.Encode(), "&", "&amp;") + `"`
	}
	want := []string{
		`id="batch-state"><span class="badge fl-failed">failed</span>`,
		`id="batch-counts">3 succeeded, 2 failed, 0 pending of 5<`,
		`<rect class="ok" x="0" y="0" width="600" height="10">`,
		`<rect class="failed" x="600" y="0" width="400" height="10">`,
		`<a ` + href(b.CallbackID) + `><code>` + b.CallbackID + `</code></a> <span class="badge n-succeeded">succeeded</span>`,
	}
	for _, id := range b.FailedIDs {
		want = append(want, `<li data-task-id="`+id+`"><a `+href(id)+`>`)
	}
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("batch page lacks %s", w)
		}
	}
	if strings.Contains(body, "cancel-batch") {
		t.Error("a finished batch has a cancel button (and no one is logged in)")
	}
	// The failed task's page is there to follow.
	resp, body = e.get("/task?" + url.Values{"q": {"flows"}, "id": {b.FailedIDs[0]}}.Encode())
	wantStatus(t, resp, body, http.StatusOK)

	// Cancel the running batch from its page.
	session := e.login()
	csrf := e.csrf(session)
	_, body = e.get("/batches/"+running.ID, session)
	if !strings.Contains(body, `id="cancel-batch"`) || !strings.Contains(body, `id="batch-callback"><span class="muted">none</span>`) {
		t.Fatalf("running batch page: no cancel button or a callback:\n%s", body)
	}
	resp, body = e.post("/batches/"+running.ID+"/cancel", url.Values{}, session, csrf)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/batches/"+running.ID {
		t.Errorf("after cancel: Location %q", loc)
	}
	e.waitFlowState(running.ID, tide.FlowCanceled)
	_, body = e.get("/batches/"+running.ID, session, cookieNamed(resp, flashCookie))
	if !strings.Contains(body, "Batch "+running.ID+" was cancelled") || !strings.Contains(body, `<span class="badge fl-cancelled">cancelled</span>`) {
		t.Errorf("after cancel:\n%s", body)
	}
}

// TestFlowNotFound: unknown, malformed and wrong-kind IDs are 404 pages
// that show the ID escaped.
func TestFlowNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.h.client = e.c
	if _, err := e.c.EnqueueWorkflow(e.ctx(), tide.NewWorkflow("wf-1").Add("x", tide.NewTask("step", nil)), tide.Queue("nobody")); err != nil {
		t.Fatal(err)
	}
	b, err := e.c.EnqueueBatch(e.ctx(), []*tide.Task{tide.NewTask("row", nil)}, tide.Queue("nobody"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{"/workflows/nope", "Workflow not found"},
		{"/batches/nope", "Batch not found"},
		{"/workflows/" + b.ID, "is a batch, not a workflow"},
		{"/batches/wf-1", "is a workflow, not a batch"},
		{"/workflows/" + url.PathEscape(`<script>alert(1)</script>`), "Workflow not found"},
		{"/batches/" + url.PathEscape(`a/<b>`), "Batch not found"},
		{"/workflows/" + strings.Repeat("x", 200), "Workflow not found"},
	} {
		resp, body := e.get(c.path)
		wantStatus(t, resp, body, http.StatusNotFound)
		if !strings.Contains(body, c.want) {
			t.Errorf("%s: the 404 page lacks %q:\n%s", c.path, c.want, body)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<b>") {
			t.Errorf("%s: the 404 page shows the ID unescaped", c.path)
		}
	}
	session := e.login()
	resp, body := e.post("/batches/nope/cancel", url.Values{}, session, e.csrf(session))
	wantStatus(t, resp, body, http.StatusNotFound)
}

// TestFlowPagesEmptyAndDown: empty lists have an empty state; a broker
// that cannot be reached is a 503, as on the other pages.
func TestFlowPagesEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	for path, want := range map[string]string{"/workflows": "No workflows.", "/batches": "No batches.", "/workflows?page=3": "No workflows on this page."} {
		resp, body := e.get(path)
		wantStatus(t, resp, body, http.StatusOK)
		if !strings.Contains(body, want) {
			t.Errorf("%s lacks %q", path, want)
		}
	}
	_, body := e.get("/")
	if !strings.Contains(body, `href="/workflows"`) || !strings.Contains(body, `href="/batches"`) {
		t.Error("the navigation lacks the workflows and batches links")
	}
}

func TestNewKeepsClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	h, err := New(e.in, Options{Client: e.c})
	if err != nil {
		t.Fatal(err)
	}
	if h.(*handler).client != e.c {
		t.Error("New does not keep Options.Client")
	}
}
