// Package dashboard is tide's web dashboard: an http.Handler that shows
// queues, tasks, workflows, batches, servers and a processed/failed history,
// and lets an operator run, archive, delete and cancel tasks, cancel
// workflows and batches, and pause queues.
//
// Besides the daily history, the overview and each queue's page have a live
// view of the last hour (processed and failed per second, pending tasks,
// current sizes) that the page's script polls from GET /api/live every five
// seconds, without reloading. A queue's page searches its tasks by ID, type,
// payload and error text and acts on selected rows; a task's page lists its
// recorded attempts and, while it runs, its server, start and lease. A queue
// with overdue scheduled or retry tasks and no live server to move them gets
// a warning. A queue with limits (Inspector.SetQueueLimits) or groups
// (tide.Group) has a "Groups" panel on its page: the five limits and the 20
// groups with the largest backlogs, with their tasks waiting and running and
// how long a throttled group is held back. The servers page shows the Redis server's version, memory and
// eviction policy (warning about any policy but noeviction) and each periodic
// task's latest runs.
//
// The Workflows page lists workflows (tide.NewWorkflow), newest first, with
// their state and how many steps succeeded, failed and were cancelled. A
// workflow's page draws it as a graph: a box per step in columns by depth
// (the longest path from a step without dependencies), an arrow from each
// step to each step that waits for it, every box coloured by its state
// (waiting; enqueued, with its task's state: pending, active, retry...;
// succeeded; failed; cancelled) and linking to its task. The graph is
// inline SVG laid out on the server; it draws at most 300 steps, those
// nearest the start, and says so. Below it a table lists every step, 100
// per page, with its dependencies and error. The Batches page lists
// batches (Client.EnqueueBatch); a batch's page shows a bar of its tasks
// succeeded, failed and pending, its state, its callback's task and the
// first 100 failed tasks. Both are kept tide.WorkflowRetention after they
// end; an unknown ID is a 404. With Options.Client, a running workflow or
// batch has a Cancel button (Client.CancelWorkflow).
//
// The pages are rendered on the server with html/template; a small script
// and a stylesheet are embedded in the binary, so the dashboard needs no
// build step and loads nothing from other origins. They follow the browser's
// dark mode and fit narrow screens.
//
// # Security model
//
// Without Options.ReadToken, reading is open to whoever can reach the
// handler: mount it on a trusted network or behind an authenticating proxy,
// since the pages show task payloads. With a read token, every page needs a
// login with the read token or the admin token (Options.Token), or either
// one as "Authorization: Bearer <token>"; a visitor who has neither gets
// the login form with 401. Only the login page and the static files (the
// stylesheet and the script) are open.
//
// Changes need Options.Token. Without a token the dashboard is read-only:
// no buttons are shown and every mutation returns 403, as it does for a
// session or a bearer of the read token.
//
// An operator logs in once by entering a token on the login page; the
// dashboard then sets an HttpOnly, SameSite=Strict session cookie (valid
// for 12 hours, signed with a key derived from the tokens, so it survives
// restarts and works across replicas, and every session ends when either
// token changes). The cookie records which token was used. Mutations are
// POST requests that need an admin session's cookie, a per-session CSRF
// token in the form (checked in constant time) and a same-origin request
// (Sec-Fetch-Site, Origin and Referer are checked). Scripts may instead send
// "Authorization: Bearer <token>" with a POST, which needs no cookie or
// CSRF token and gets a JSON answer.
//
// Wrong tokens are counted per client (its IP address; the /64 network for
// IPv6): after 10 in a minute, the client's further wrong tokens are
// answered 429 rather than 401 until the minute ends. A correct token is
// never refused, so an attacker cannot lock operators out, not even from
// the same address (behind a reverse proxy every client has the proxy's
// address). The limiter tracks at most 10,000 clients, forgetting the one
// that failed least recently. Since a correct guess always gets in, the
// limit does not bound how many tokens an attacker can try: the token's
// strength does, so use long random tokens (New warns below 16 bytes).
//
// To defeat DNS rebinding (a web page on an attacker's domain that resolves
// to the dashboard's address, so that the victim's browser reads the
// dashboard as a same-origin page), every request must name an allowed
// host in its Host header: "localhost", an IP address, or one of
// Options.AllowedHosts. Other requests get 421 Misdirected Request. A
// dashboard reached by a DNS name, directly or through a proxy that passes
// the Host header on, needs that name in AllowedHosts. HostCheck applies
// the same check to a handler served beside the dashboard that needs no
// login, such as /metrics.
//
// Every response carries a Content-Security-Policy that allows only the
// dashboard's own script and stylesheet, X-Frame-Options DENY and
// X-Content-Type-Options nosniff; pages are not cached.
//
// # Mounting
//
// The handler serves paths starting at "/". To mount it under a prefix,
// strip the prefix and keep the trailing slash:
//
//	mux.Handle("/tide/", http.StripPrefix("/tide", h))
//
// Links, redirects and the cookie path then follow the prefix.
//
// # Routes
//
//	GET  /                  queues, totals, live view, history chart (?days=7|30)
//	GET  /queue?q=Q         a queue's tasks by state (&state=&page=&size=);
//	                        with any of &id=&type=&payload=&err= (substrings,
//	                        at most 200 bytes each) a search, paged by &from=
//	GET  /task?q=Q&id=ID    one task: payload, headers, error, result,
//	                        attempts; for a running task its server and lease
//	GET  /servers           live servers, their active tasks, schedulers and
//	                        their latest runs, the Redis server's facts
//	GET  /cron?id=E[&s=S]   the latest 30 runs of a periodic entry
//	GET  /workflows         workflows, newest first (&page=&size=)
//	GET  /workflows/{id}    a workflow's graph and steps (&page= pages the
//	                        step table)
//	GET  /batches           batches, newest first (&page=&size=)
//	GET  /batches/{id}      a batch's progress, callback and failed tasks
//	GET  /api/live[?q=Q]    JSON: a queue's (or all queues') activity per
//	                        minute over the last hour and its sizes now
//	GET  /login             login form; POST /login logs in; POST /logout
//	POST /task/{run,archive,delete,cancel}     form fields q, id
//	POST /queue/{pause,unpause}                form field q
//	POST /queue/{run-all,archive-all,delete-all} form fields q, state
//	POST /selection/{run,archive,delete}       form fields q, id (repeated,
//	                                           at most 100 per request)
//	POST /workflows/{id}/cancel                cancel a running workflow
//	POST /batches/{id}/cancel                  cancel a running batch
//	GET  /static/...        the stylesheet and script
//
// GET /api/live answers {"queue":...,"now":...,"points":[{"t":ms,
// "processed":n,"failed":n,"pending":n},...],"sizes":{"pending":n,...},
// "processed_last_hour":n,"failed_last_hour":n,"processed_per_sec":x,
// "failed_per_sec":x,"queues":n}: one point per minute (the minute's start
// in Unix milliseconds; pending -1 when no server sampled it), and rates
// over the last minute or two. With q it also has the queue's "limits":
// {"concurrency":n,"rate":{"limit":n,"per_seconds":x},"group_concurrency":n,
// "group_rate":{...},"ordered":b} (0 and null for no limit) and its "groups":
// [{"group":...,"waiting":n,"running":n,"throttled_until":time},...], the 20
// largest backlogs first (throttled_until null when not held back). Errors are {"ok":false,"error":...} with the
// status the pages would have.
//
// With Options.ReadToken set, the GET routes but /login and /static/ answer
// 401 without a session or bearer token (the login form, or JSON for a
// bearer client). Every route answers 421 to a Host that is not allowed.
//
// The POST routes take form-encoded bodies. A browser form also sends csrf
// and return (the dashboard path to go back to, answered with 303 See
// Other); a bearer client gets {"ok":true,"message":...,"count":n} or
// {"ok":false,"error":...} with the status: 400 bad input, 401 wrong token,
// 403 read-only or refused, 404 no such task (or workflow or batch), 409
// the task's state does not allow it (or the workflow or batch has ended),
// 429 too many failed tokens, 501 cancelling without Options.Client, 503
// Redis unavailable.
// A selection action changes each task on its own and answers
// {"ok":...,"count":n,"failed":[{"id":...,"status":...,"error":...}]}, with
// 200 when at least one task was changed; a browser gets the failures
// listed on a page of their own.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configures the dashboard. The zero value is valid: a read-only
// dashboard titled "tide", open to whoever reaches it on localhost or an
// IP address, that logs to slog.Default().
type Options struct {
	// Token enables mutations: an operator must log in with it (or send it
	// as "Authorization: Bearer <token>"). Without a token the dashboard is
	// read-only. Use a long random string; it is compared in constant time.
	Token string
	// ReadToken, when set, is needed to see anything: every page needs a
	// login with ReadToken or Token, or either one as "Authorization:
	// Bearer <token>". A ReadToken login only shows; changes still need
	// Token. Default "": the pages are open to whoever reaches the handler.
	// It must differ from Token; use a long random string.
	ReadToken string
	// AllowedHosts lists the host names the dashboard answers to, besides
	// "localhost" and IP addresses, which are always allowed: a request
	// whose Host header names another host is refused with 421, which
	// defeats DNS rebinding. An entry is a name ("tide.example.com", any
	// port) or a name and a port ("tide.example.com:8443", only that
	// port); names are matched without regard to case or a trailing dot.
	// There are no wildcards. Default none: only localhost and IP
	// addresses. New returns an error for a malformed entry; it copies the
	// list, so changing the slice later has no effect.
	AllowedHosts []string
	// Title is shown in the header and the window title. Default "tide".
	Title string
	// Logger receives one line per change made through the dashboard (an
	// audit trail), failed logins and broker errors. Default slog.Default().
	Logger *slog.Logger
	// History, when set, returns the recorded attempts of a task, oldest
	// first, from a store that outlives Redis: e.g. hist.TaskAttempts from
	// the outbox module (outbox.History). The task page then shows them in
	// a "History (recorded)" panel, and a task no longer stored in Redis
	// (finished and deleted) gets a page with its recorded history instead
	// of a 404 when History returns at least one attempt. An error from
	// History is shown as a note on the page. It is called with the page's
	// request context (bounded to 15 seconds) and must be safe for
	// concurrent use. Default nil: no recorded history.
	History func(ctx context.Context, queue, id string) ([]tide.Attempt, error)
	// Client, when set, lets an operator cancel a running workflow or
	// batch from its page (Client.CancelWorkflow). It must use the broker
	// the Inspector reads. Default nil: the workflow and batch pages show
	// no Cancel button and their cancel routes answer 501.
	Client *tide.Client
}

// Limits on what one request may cost.
const (
	defaultPageSize = 20
	// maxPageSize caps the page size a request may ask for.
	maxPageSize = 100
	// maxPage caps the page number, so offsets stay small enough.
	maxPage = 100000
	// maxQueues caps how many queues the overview shows (and sums for its
	// chart); the rest are counted.
	maxQueues = 200
	// maxFormBytes caps a POST body.
	maxFormBytes = 64 << 10
	// readTimeout bounds the broker calls of one page; bulkTimeout those of
	// a bulk operation (below the usual one-minute server WriteTimeout, so
	// a bulk operation that stops part way still gets its answer out).
	readTimeout = 15 * time.Second
	bulkTimeout = 45 * time.Second
)

// handler is the dashboard. It is immutable after New except for the login
// limiter, which has its own lock, so it is safe for concurrent use.
type handler struct {
	in      *tide.Inspector
	title   string
	log     *slog.Logger
	auth    *auth // nil when neither token is set
	hosts   hostSet
	pages   map[string]*template.Template
	mux     *http.ServeMux
	cop     *http.CrossOriginProtection
	static  http.Handler
	nowFunc func() time.Time
	history func(ctx context.Context, queue, id string) ([]tide.Attempt, error) // nil when unset
	client  *tide.Client                                                        // nil when unset
}

// New returns the dashboard of in. The handler is safe for concurrent use.
// It returns an error when in is nil; see the package documentation for the
// routes and the security model.
func New(in *tide.Inspector, opts Options) (http.Handler, error) {
	if in == nil {
		return nil, errors.New("tide/dashboard: nil Inspector")
	}
	h := &handler{
		in:      in,
		title:   opts.Title,
		log:     opts.Logger,
		cop:     http.NewCrossOriginProtection(),
		nowFunc: time.Now,
		history: opts.History,
		client:  opts.Client,
	}
	if h.title == "" {
		h.title = "tide"
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	if opts.ReadToken != "" && opts.ReadToken == opts.Token {
		return nil, errors.New("tide/dashboard: ReadToken is the same as Token; use a different read token, or none")
	}
	if opts.Token != "" || opts.ReadToken != "" {
		h.auth = newAuth(opts.Token, opts.ReadToken)
	}
	if opts.Token != "" && len(opts.Token) < 16 {
		h.log.Warn("tide dashboard: the token is shorter than 16 bytes; use a long random token")
	}
	if opts.ReadToken != "" && len(opts.ReadToken) < 16 {
		h.log.Warn("tide dashboard: the read token is shorter than 16 bytes; use a long random token")
	}
	var err error
	if h.hosts, err = newHostSet(opts.AllowedHosts); err != nil {
		return nil, err
	}
	if h.pages, err = parsePages(); err != nil {
		return nil, fmt.Errorf("tide/dashboard: templates: %w", err)
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("tide/dashboard: static files: %w", err)
	}
	h.static = http.StripPrefix("/static/", http.FileServer(http.FS(sub)))

	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", h.readable(h.overview))
	m.HandleFunc("GET /queue", h.readable(h.queuePage))
	m.HandleFunc("GET /task", h.readable(h.taskPage))
	m.HandleFunc("GET /servers", h.readable(h.serversPage))
	m.HandleFunc("GET /cron", h.readable(h.cronPage))
	m.HandleFunc("GET /workflows", h.readable(h.workflowsPage))
	m.HandleFunc("GET /workflows/{id}", h.readable(h.workflowPage))
	m.HandleFunc("GET /batches", h.readable(h.batchesPage))
	m.HandleFunc("GET /batches/{id}", h.readable(h.batchPage))
	m.HandleFunc("GET /api/live", h.readable(h.liveAPI))
	m.HandleFunc("GET /login", h.loginPage)
	m.HandleFunc("POST /login", h.login)
	// Mutations are POST only. These patterns take every method so that a
	// GET gets 405 rather than the catch-all's 404.
	m.HandleFunc("/logout", postOnly(h.logout))
	m.HandleFunc("/task/{op}", postOnly(h.taskAction))
	m.HandleFunc("/queue/{op}", postOnly(h.queueAction))
	m.HandleFunc("/selection/{op}", postOnly(h.selectionAction))
	m.HandleFunc("/workflows/{id}/{op}", postOnly(h.flowAction("workflow")))
	m.HandleFunc("/batches/{id}/{op}", postOnly(h.flowAction("batch")))
	m.HandleFunc("GET /static/", h.serveStatic)
	m.HandleFunc("/", h.readable(h.notFound))
	h.mux = m
	return h, nil
}

// ServeHTTP sets the security headers, refuses requests for hosts that are
// not allowed, and dispatches.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
	if !h.hosts.allows(r.Host) {
		refuseHost(w, r.Host, "this dashboard", "Options.AllowedHosts")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// postOnly answers 405 to every method but POST.
func postOnly(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "405 method not allowed: changes are made with POST", http.StatusMethodNotAllowed)
			return
		}
		f(w, r)
	}
}

func (h *handler) serveStatic(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "public, max-age=3600")
	h.static.ServeHTTP(w, r)
}

func (h *handler) now() time.Time { return h.nowFunc() }

// basePath returns the prefix the handler is mounted under ("" at the
// root): the part of the request URI that http.StripPrefix removed. It is
// used for links, redirects and the cookie path, so it is accepted only when
// it is a plain absolute path.
func basePath(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return ""
	}
	orig, cur := u.EscapedPath(), r.URL.EscapedPath()
	if !strings.HasSuffix(orig, cur) {
		return ""
	}
	base := strings.TrimSuffix(orig[:len(orig)-len(cur)], "/")
	if base == "" || base[0] != '/' || strings.HasPrefix(base, "//") ||
		strings.ContainsAny(base, "\\\"'<> ?#") {
		return ""
	}
	return base
}

// view is what every page template gets.
type view struct {
	Title    string // the dashboard title
	Page     string // the page title
	Nav      string // which nav entry is current
	Base     string // mount prefix, "" at the root
	ReadOnly bool   // no admin token configured
	LoggedIn bool   // an admin session: mutations allowed (buttons shown)
	Reader   bool   // a read-token session
	CanLogIn bool   // a login would give more than this visitor has
	ReadGate bool   // a read token is configured: reading needs a login
	CSRF     string // the admin session's CSRF token
	Return   string // this page's path and query, for forms' return field
	Flash    *flash
	Now      time.Time
	Data     any
}

func (h *handler) newView(w http.ResponseWriter, r *http.Request, nav, page string, data any) *view {
	v := &view{
		Title: h.title, Page: page, Nav: nav, Base: basePath(r),
		ReadOnly: h.auth == nil || !h.auth.hasAdmin, Now: h.now(), Data: data,
		Return: r.URL.Path,
	}
	if r.URL.RawQuery != "" {
		v.Return += "?" + r.URL.RawQuery
	}
	if s, ok := h.session(r); ok {
		if s.role == roleAdmin {
			v.LoggedIn = true
			v.CSRF = h.auth.csrfToken(s)
		} else {
			v.Reader = true
		}
	}
	if h.auth != nil {
		v.ReadGate = h.auth.hasRead
		v.CanLogIn = !v.LoggedIn && (h.auth.hasAdmin || (h.auth.hasRead && !v.Reader))
	}
	v.Flash = takeFlash(w, r)
	return v
}

// render executes page into a buffer, so a template error becomes a clean
// 500 rather than half a page, and writes it with status.
func (h *handler) render(w http.ResponseWriter, status int, page string, v *view) {
	t, ok := h.pages[page]
	if !ok {
		h.log.Error("tide dashboard: unknown page template", "page", page)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		h.log.Error("tide dashboard: render", "page", page, "err", err)
		http.Error(w, "internal error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorData is the data of the error page.
type errorData struct {
	Status  int
	Heading string
	Message string
	Back    string
}

// fail renders the error page for err, classified by classify.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error, mutation bool) {
	status, heading := classify(err, mutation)
	if status >= 500 {
		h.log.Error("tide dashboard: broker error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	h.failWith(w, r, status, heading, err.Error())
}

func (h *handler) failWith(w http.ResponseWriter, r *http.Request, status int, heading, msg string) {
	v := h.newView(w, r, "", heading, &errorData{Status: status, Heading: heading, Message: msg, Back: basePath(r) + "/"})
	h.render(w, status, "error", v)
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.failWith(w, r, http.StatusNotFound, "Page not found", "There is no page at "+r.URL.Path+".")
}

// classify maps an Inspector error to an HTTP status and a heading.
func classify(err error, mutation bool) (int, string) {
	switch {
	case errors.Is(err, tide.ErrTaskNotFound):
		return http.StatusNotFound, "Task not found"
	case errors.Is(err, tide.ErrWorkflowNotFound):
		return http.StatusNotFound, "Workflow or batch not found"
	case errors.Is(err, tide.ErrInvalidTask):
		return http.StatusBadRequest, "Bad request"
	case errors.Is(err, tide.ErrTaskActive):
		return http.StatusConflict, "The task is running"
	case errors.Is(err, tide.ErrNotSupported):
		return http.StatusNotImplemented, "Not supported by this broker"
	case unavailable(err):
		return http.StatusServiceUnavailable, "The broker (Redis) is unavailable"
	case mutation:
		// The brokers report "cannot run a task that is pending" and the
		// like without a sentinel.
		return http.StatusConflict, "The change was refused"
	}
	return http.StatusInternalServerError, "Internal error"
}

// unavailable reports whether err means the broker could not be reached in
// time (network error, timeout, closed broker).
func unavailable(err error) bool {
	return errors.Is(err, tide.ErrUnavailable) || errors.Is(err, tide.ErrClosed) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
