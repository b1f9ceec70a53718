package dashboard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

const testToken = "s3cret-token-for-tests-0123456789"

// env is a dashboard on a real Redis with its own key prefix.
type env struct {
	t     *testing.T
	b     *redisbroker.Broker
	c     *tide.Client
	in    *tide.Inspector
	srv   *httptest.Server
	hc    *http.Client
	token string
	h     *handler // the dashboard, for white-box checks
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newEnv(t *testing.T, token string) *env {
	t.Helper()
	return newEnvOpts(t, Options{Token: token})
}

// remoteHeader is a test-only request header whose value the test server
// uses as the request's RemoteAddr, so that one test can speak from many
// addresses.
const remoteHeader = "X-Test-Remote-Addr"

// newEnvOpts is newEnv with options; e.token is opts.Token.
func newEnvOpts(t *testing.T, opts Options) *env {
	t.Helper()
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	e := &env{t: t, b: b, c: tide.NewClient(b), in: tide.NewInspector(b), token: opts.Token}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	h, err := New(e.in, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.h = h.(*handler)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get(remoteHeader); a != "" {
			r.RemoteAddr = a
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(e.srv.Close)
	e.hc = noRedirectClient()
	return e
}

func noRedirectClient() *http.Client {
	return &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

// enqueue enqueues a task and returns its info.
func (e *env) enqueue(typ string, payload []byte, opts ...tide.Option) *tide.TaskInfo {
	e.t.Helper()
	ti, err := e.c.Enqueue(e.ctx(), tide.NewTask(typ, payload), opts...)
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return ti
}

// do sends a request with cookies and headers and returns the response
// and its body.
func (e *env) do(method, path string, form url.Values, hdr map[string]string, cookies ...*http.Cookie) (*http.Response, string) {
	e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, e.srv.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	for _, c := range cookies {
		if c != nil {
			req.AddCookie(c)
		}
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, string(b)
}

func (e *env) get(path string, cookies ...*http.Cookie) (*http.Response, string) {
	e.t.Helper()
	return e.do(http.MethodGet, path, nil, nil, cookies...)
}

// browser returns the headers a same-origin browser form POST carries.
func (e *env) browser() map[string]string {
	return map[string]string{"Origin": e.srv.URL, "Sec-Fetch-Site": "same-origin", "Referer": e.srv.URL + "/"}
}

// login logs in with the token and returns the session cookie.
func (e *env) login() *http.Cookie {
	e.t.Helper()
	resp, body := e.do(http.MethodPost, "/login", url.Values{"token": {e.token}}, e.browser())
	if resp.StatusCode != http.StatusSeeOther {
		e.t.Fatalf("login: status %d, want 303:\n%s", resp.StatusCode, body)
	}
	c := cookieNamed(resp, sessionCookie)
	if c == nil {
		e.t.Fatal("login: no session cookie")
	}
	return c
}

var csrfMeta = regexp.MustCompile(`<meta name="csrf-token" content="([^"]+)">`)

// csrf returns the CSRF token the pages carry for the session.
func (e *env) csrf(session *http.Cookie) string {
	e.t.Helper()
	_, body := e.get("/servers", session)
	m := csrfMeta.FindStringSubmatch(body)
	if m == nil {
		e.t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return m[1]
}

// post sends a mutation like a logged-in browser form.
func (e *env) post(path string, form url.Values, session *http.Cookie, csrf string) (*http.Response, string) {
	e.t.Helper()
	if csrf != "" {
		form.Set("csrf", csrf)
	}
	return e.do(http.MethodPost, path, form, e.browser(), session)
}

func (e *env) state(queue, id string) tide.TaskState {
	e.t.Helper()
	ti, err := e.in.GetTaskInfo(e.ctx(), queue, id)
	if err != nil {
		e.t.Fatalf("GetTaskInfo %s: %v", id, err)
	}
	return ti.State
}

func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func wantStatus(t *testing.T, resp *http.Response, body string, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d; body:\n%s", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, want, body)
	}
}

func TestPagesEscapeTaskData(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	evilPayload := []byte(`<script>alert("payload")</script>`)
	evilID := `<img src=x onerror=alert(1)>`
	evilType := `<svg onload=alert(2)>`
	ti := e.enqueue(evilType, evilPayload, tide.ProcessIn(time.Hour), tide.TaskID(evilID))
	bin := e.enqueue("blob:store", []byte{0x00, 0x01, 0x02, 0xff, 'A'})

	raw := []string{"<script>alert", "<img src=x", "<svg onload"}
	checkEscaped := func(path, body string) {
		t.Helper()
		for _, r := range raw {
			if strings.Contains(body, r) {
				t.Errorf("%s contains unescaped %q", path, r)
			}
		}
	}

	resp, body := e.get("/")
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, `data-queue="default"`) {
		t.Errorf("overview does not list the default queue:\n%s", body)
	}
	if !strings.Contains(body, `<svg class="chart"`) {
		t.Error("overview has no chart")
	}
	checkEscaped("/", body)

	path := "/queue?q=default&state=scheduled"
	resp, body = e.get(path)
	wantStatus(t, resp, body, http.StatusOK)
	checkEscaped(path, body)
	for _, want := range []string{
		`&lt;script&gt;alert(&#34;payload&#34;)&lt;/script&gt;`,
		`&lt;img src=x onerror=alert(1)&gt;`,
		`&lt;svg onload=alert(2)&gt;`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("queue page lacks the escaped %s", want)
		}
	}
	// Not logged in: no buttons, a login link.
	if strings.Contains(body, `/task/run"`) || strings.Contains(body, `name="csrf"`) {
		t.Error("queue page shows action buttons to a visitor who has not logged in")
	}
	if !strings.Contains(body, `id="login-link"`) {
		t.Error("queue page has no login link")
	}

	path = "/task?" + url.Values{"q": {"default"}, "id": {ti.ID}}.Encode()
	resp, body = e.get(path)
	wantStatus(t, resp, body, http.StatusOK)
	checkEscaped(path, body)
	if !strings.Contains(body, `&lt;script&gt;alert(&#34;payload&#34;)&lt;/script&gt;`) {
		t.Errorf("task page lacks the escaped payload:\n%s", body)
	}

	// Binary payloads are shown as a hex dump and base64.
	resp, body = e.get("/task?q=default&id=" + url.QueryEscape(bin.ID))
	wantStatus(t, resp, body, http.StatusOK)
	for _, want := range []string{"00000000  00 01 02 ff 41", "|....A|", "AAEC/0E="} {
		if !strings.Contains(body, want) {
			t.Errorf("binary task page lacks %q:\n%s", want, body)
		}
	}
	_, body = e.get("/queue?q=default&state=pending")
	if !strings.Contains(body, "binary, 5 B: 00 01 02 ff 41") {
		t.Errorf("pending list lacks the binary preview:\n%s", body)
	}
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	for _, path := range []string{"/", "/servers", "/login", "/static/style.css", "/nope"} {
		resp, _ := e.get(path)
		h := resp.Header
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") ||
			!strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
		if got := h.Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("%s: X-Frame-Options %q", path, got)
		}
		if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s: X-Content-Type-Options %q", path, got)
		}
	}
	resp, _ := e.get("/")
	if got := resp.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("page Cache-Control %q, want no-store", got)
	}
	resp, body := e.get("/static/app.js")
	wantStatus(t, resp, body, http.StatusOK)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") {
		t.Errorf("app.js Content-Type %q", ct)
	}
}

func TestTaskActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	session := e.login()
	csrf := e.csrf(session)
	run := func(op, id string) (*http.Response, string) {
		return e.post("/task/"+op, url.Values{"q": {"default"}, "id": {id}}, session, csrf)
	}
	pending := e.enqueue("a", []byte("1"))
	sched := e.enqueue("b", []byte("2"), tide.ProcessIn(time.Hour))

	resp, body := run("archive", pending.ID)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if st := e.state("default", pending.ID); st != tide.StateArchived {
		t.Errorf("after archive: %v", st)
	}
	resp, body = run("run", pending.ID)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if st := e.state("default", pending.ID); st != tide.StatePending {
		t.Errorf("after run: %v", st)
	}
	resp, body = run("run", pending.ID) // pending cannot run
	wantStatus(t, resp, body, http.StatusConflict)
	resp, body = run("cancel", sched.ID) // not active
	wantStatus(t, resp, body, http.StatusConflict)
	resp, body = run("delete", sched.ID)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if _, err := e.in.GetTaskInfo(e.ctx(), "default", sched.ID); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Errorf("after delete: %v", err)
	}
	resp, body = run("run", sched.ID)
	wantStatus(t, resp, body, http.StatusNotFound)
	if !strings.Contains(body, "Task not found") {
		t.Error("404 page does not say the task was not found")
	}
	resp, body = e.post("/task/run", url.Values{"q": {"bad queue"}, "id": {"x"}}, session, csrf)
	wantStatus(t, resp, body, http.StatusBadRequest)
	resp, body = run("explode", pending.ID)
	wantStatus(t, resp, body, http.StatusNotFound)

	// Bulk operations.
	for i := range 3 {
		e.enqueue("c", []byte{byte(i)}, tide.ProcessIn(time.Hour))
	}
	bulk := func(op, state string) (*http.Response, string) {
		return e.post("/queue/"+op, url.Values{"q": {"default"}, "state": {state}}, session, csrf)
	}
	sizes := func() *tide.QueueInfo {
		qi, err := e.in.QueueInfo(e.ctx(), "default")
		if err != nil {
			t.Fatal(err)
		}
		return qi
	}
	resp, body = bulk("archive-all", "scheduled")
	wantStatus(t, resp, body, http.StatusSeeOther)
	if qi := sizes(); qi.Scheduled != 0 || qi.Archived != 3 {
		t.Errorf("after archive-all: scheduled %d archived %d", qi.Scheduled, qi.Archived)
	}
	_, body = e.get("/", session, cookieNamed(resp, flashCookie))
	if !strings.Contains(body, "3 scheduled tasks of queue default were archived.") {
		t.Error("no flash after archive-all")
	}
	resp, body = bulk("run-all", "archived")
	wantStatus(t, resp, body, http.StatusSeeOther)
	if qi := sizes(); qi.Archived != 0 || qi.Pending != 4 {
		t.Errorf("after run-all: archived %d pending %d", qi.Archived, qi.Pending)
	}
	resp, body = bulk("delete-all", "pending")
	wantStatus(t, resp, body, http.StatusSeeOther)
	if qi := sizes(); qi.Size != 0 {
		t.Errorf("after delete-all: size %d", qi.Size)
	}
	resp, body = bulk("delete-all", "active")
	wantStatus(t, resp, body, http.StatusBadRequest)
	resp, body = bulk("delete-all", "bogus")
	wantStatus(t, resp, body, http.StatusBadRequest)
}

func TestPauseUnpause(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.enqueue("a", []byte("1"), tide.Queue("mail"))
	session := e.login()
	csrf := e.csrf(session)
	paused := func() bool {
		qi, err := e.in.QueueInfo(e.ctx(), "mail")
		if err != nil {
			t.Fatal(err)
		}
		return qi.Paused
	}

	_, body := e.get("/queue?q=mail", session)
	if !strings.Contains(body, `data-action="pause"`) {
		t.Fatal("queue page has no pause button")
	}
	resp, body := e.post("/queue/pause", url.Values{"q": {"mail"}, "return": {"/queue?q=mail"}}, session, csrf)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if !paused() {
		t.Fatal("queue not paused")
	}
	_, body = e.get("/queue?q=mail", session)
	if !strings.Contains(body, `id="queue-status">paused<`) || !strings.Contains(body, `data-action="unpause"`) {
		t.Errorf("page does not show the queue paused with a resume button:\n%s", body)
	}
	_, body = e.get("/", session)
	if !strings.Contains(body, `<span class="badge paused">paused</span>`) {
		t.Error("overview does not show the queue paused")
	}
	resp, body = e.post("/queue/unpause", url.Values{"q": {"mail"}}, session, csrf)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if paused() {
		t.Fatal("queue still paused")
	}
	// Without CSRF token: refused.
	resp, body = e.post("/queue/pause", url.Values{"q": {"mail"}}, session, "")
	wantStatus(t, resp, body, http.StatusForbidden)
	if paused() {
		t.Fatal("paused without a CSRF token")
	}
}

func TestPaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	ts := make([]*tide.Task, 120)
	for i := range ts {
		ts[i] = tide.NewTask("bulk", []byte(fmt.Sprint(i)))
	}
	if _, err := e.c.EnqueueMany(e.ctx(), ts); err != nil {
		t.Fatal(err)
	}
	rows := func(body string) int { return strings.Count(body, "<tr data-task-id=") }

	_, body := e.get("/queue?q=default")
	if n := rows(body); n != defaultPageSize {
		t.Errorf("default page: %d rows, want %d", n, defaultPageSize)
	}
	if !strings.Contains(body, `rel="next"`) || strings.Contains(body, `rel="prev"`) {
		t.Error("first page: want a next link and no previous link")
	}
	_, body = e.get("/queue?q=default&size=50&page=3")
	if n := rows(body); n != 20 {
		t.Errorf("page 3 of 50: %d rows, want 20", n)
	}
	if strings.Contains(body, `rel="next"`) || !strings.Contains(body, `rel="prev"`) {
		t.Error("last page: want a previous link and no next link")
	}
	_, body = e.get("/queue?q=default&size=100000")
	if n := rows(body); n != maxPageSize {
		t.Errorf("huge page size: %d rows, want the cap %d", n, maxPageSize)
	}
	resp, body := e.get("/queue?q=default&page=-4&size=abc")
	wantStatus(t, resp, body, http.StatusOK)
	if n := rows(body); n != defaultPageSize {
		t.Errorf("bad paging parameters: %d rows", n)
	}
	resp, body = e.get("/queue?q=default&page=99999999999")
	wantStatus(t, resp, body, http.StatusOK)
	if n := rows(body); n != 0 {
		t.Errorf("far page: %d rows", n)
	}
}

func TestNotFoundAndBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	resp, body := e.get("/task?q=default&id=nope")
	wantStatus(t, resp, body, http.StatusNotFound)
	if !strings.Contains(body, "Task not found") {
		t.Error("404 page does not say the task was not found")
	}
	resp, body = e.get("/no/such/page")
	wantStatus(t, resp, body, http.StatusNotFound)
	resp, body = e.get("/queue?q=" + url.QueryEscape("bad queue<"))
	wantStatus(t, resp, body, http.StatusBadRequest)
	if strings.Contains(body, "bad queue<") {
		t.Error("error page echoes the queue name unescaped")
	}
	resp, body = e.get("/queue?q=default&state=bogus")
	wantStatus(t, resp, body, http.StatusBadRequest)
	resp, body = e.get("/task")
	wantStatus(t, resp, body, http.StatusBadRequest)
}

func TestBrokerDown(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	in := tide.NewInspector(redisbroker.New(rdb))
	h, err := New(in, Options{Token: testToken, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	e := &env{t: t, srv: srv, hc: noRedirectClient(), token: testToken}

	for _, path := range []string{"/", "/queue?q=default", "/task?q=default&id=x", "/servers"} {
		resp, body := e.get(path)
		wantStatus(t, resp, body, http.StatusServiceUnavailable)
		if !strings.Contains(body, "unavailable") {
			t.Errorf("%s: 503 page without a readable message:\n%s", path, body)
		}
	}
	resp, body := e.do(http.MethodPost, "/queue/pause", url.Values{"q": {"default"}}, map[string]string{"Authorization": "Bearer " + testToken})
	wantStatus(t, resp, body, http.StatusServiceUnavailable)
	// Login needs no broker.
	c := e.login()
	resp, body = e.post("/task/run", url.Values{"q": {"default"}, "id": {"x"}}, c, e.csrfFromLogin(c))
	wantStatus(t, resp, body, http.StatusServiceUnavailable)
}

// csrfFromLogin reads the CSRF token from the login page, which needs no
// broker.
func (e *env) csrfFromLogin(session *http.Cookie) string {
	e.t.Helper()
	_, body := e.get("/login", session)
	m := csrfMeta.FindStringSubmatch(body)
	if m == nil {
		e.t.Fatalf("no CSRF token on the login page:\n%s", body)
	}
	return m[1]
}

func TestMountedUnderPrefix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.enqueue("a", []byte("1"), tide.ProcessIn(time.Hour))
	h := e.srv.Config.Handler
	mux := http.NewServeMux()
	mux.Handle("/admin/tide/", http.StripPrefix("/admin/tide", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	e.srv = srv

	resp, body := e.get("/admin/tide/")
	wantStatus(t, resp, body, http.StatusOK)
	for _, want := range []string{`href="/admin/tide/static/style.css"`, `href="/admin/tide/queue?q=default`, `href="/admin/tide/servers"`} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	resp, body = e.do(http.MethodPost, "/admin/tide/login", url.Values{"token": {testToken}, "next": {"/servers"}}, e.browser())
	wantStatus(t, resp, body, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/admin/tide/servers" {
		t.Errorf("Location %q", loc)
	}
	if c := cookieNamed(resp, sessionCookie); c == nil || c.Path != "/admin/tide/" {
		t.Errorf("cookie %+v, want Path /admin/tide/", c)
	}
}

func TestServersPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	started := make(chan struct{}, 1)
	srv := tide.NewServer(e.b, tide.Config{Concurrency: 2, Queues: map[string]int{"critical": 3, "default": 1}, Logger: testLogger(t)})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		started <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ti := e.enqueue("slow:job", []byte("{}"), tide.Queue("critical"))
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("the task did not start")
	}
	session := e.login()
	csrf := e.csrf(session)
	// The heartbeat that lists the active task may lag.
	testwait.Until(t, 15*time.Second, func() error {
		_, body := e.get("/servers", session)
		if !strings.Contains(body, "critical (3), default (1)") || !strings.Contains(body, ti.ID) {
			return fmt.Errorf("servers page does not show the server and its task:\n%s", body)
		}
		if !strings.Contains(body, `data-action="cancel"`) {
			t.Error("active task without a cancel button")
		}
		return nil
	})
	_, body := e.get("/queue?q=critical&state=active", session)
	if !strings.Contains(body, `data-task-id="`+ti.ID+`"`) {
		t.Errorf("active tab lacks the task:\n%s", body)
	}
	resp, body := e.post("/task/cancel", url.Values{"q": {"critical"}, "id": {ti.ID}}, session, csrf)
	wantStatus(t, resp, body, http.StatusSeeOther)
	testwait.Until(t, 15*time.Second, func() error {
		if st := e.state("critical", ti.ID); st != tide.StateArchived {
			return fmt.Errorf("cancelled task is %v, want archived", st)
		}
		return nil
	})
}

func TestNewNilInspector(t *testing.T) {
	t.Parallel()
	if _, err := New(nil, Options{}); err == nil {
		t.Fatal("New(nil) did not fail")
	}
}

// A grouped task with the ID its caller chose (no group tag) is shown,
// archived, run and deleted by that ID.
func TestGroupedTaskFreeIDActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	session := e.login()
	csrf := e.csrf(session)
	const id = "order-cancel:42"
	e.enqueue("order:cancel", []byte("{}"), tide.Group("shop-7"), tide.TaskID(id), tide.ProcessIn(time.Hour))
	resp, body := e.get("/task?"+url.Values{"q": {"default"}, "id": {id}}.Encode(), session)
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, id) || !strings.Contains(body, "shop-7") {
		t.Errorf("task page lacks the ID or the group")
	}
	for _, op := range []string{"archive", "run", "delete"} {
		resp, body := e.post("/task/"+op, url.Values{"q": {"default"}, "id": {id}}, session, csrf)
		wantStatus(t, resp, body, http.StatusSeeOther)
	}
	if _, err := e.in.GetTaskInfo(e.ctx(), "default", id); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Errorf("after delete: %v", err)
	}
}
