package gateway

//lint:file-ignore ST1005 config errors start with the Config field they name (Tokens, ...)

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

// DefaultMaxBodyBytes is the default limit on a request body (1 MiB).
const DefaultMaxBodyBytes = 1 << 20

// MinTokenLength is the shortest bearer token accepted, in bytes. Use 32
// random bytes (openssl rand -hex 32).
const MinTokenLength = 16

// Config configures the gateway.
type Config struct {
	// Tokens are the bearer tokens clients may present
	// ("Authorization: Bearer <token>"). Required: at least one, each at
	// least MinTokenLength bytes. Several allow rotation without downtime.
	Tokens []string

	// MaxBodyBytes limits a request body; a larger one gets 413. Default
	// DefaultMaxBodyBytes (1 MiB).
	MaxBodyBytes int64

	// AllowedQueues, when not empty, are the only queues clients may enqueue
	// to, read from or delete from; others get 403. A workflow or batch is
	// open to the gateway only when every step, and the callback, runs in
	// one of them; others answer 404 as if unknown (see the package
	// documentation).
	AllowedQueues []string

	// Logger receives one line per failed request (server errors at Error,
	// client errors at Debug). Payloads and tokens are never logged.
	// Default slog.Default().
	Logger *slog.Logger

	// EventsHeartbeat is how often GET /v1/events sends a comment line
	// while no event comes, so that proxies and clients keep the stream
	// open and notice a dead one. Default DefaultEventsHeartbeat (15s).
	EventsHeartbeat time.Duration

	// MaxEventStreams caps the GET /v1/events streams this handler serves
	// at once, all tokens together; one more is answered 429
	// too_many_streams with a Retry-After header. Each stream holds a
	// connection to Redis of its own. Default DefaultMaxEventStreams
	// (100).
	MaxEventStreams int

	// MaxEventStreamsPerToken caps the streams open at once with any one
	// of Tokens, so that one client cannot take them all. Default
	// DefaultMaxEventStreamsPerToken (20); at most MaxEventStreams counts.
	MaxEventStreamsPerToken int

	// EventsWriteTimeout bounds each write to an event stream: a client
	// that stops reading (its buffers full) is disconnected after it, and
	// its stream freed. Default DefaultEventsWriteTimeout (10s).
	EventsWriteTimeout time.Duration

	// EventsMaxLifetime is how long an event stream lasts at most: then
	// the gateway ends it and the client reconnects with its resume token
	// (an EventSource does by itself), so no stream holds its connections
	// forever. A stream that has no resume token yet (opened "from now",
	// and no event since) ends right after its next event instead. Default
	// DefaultEventsMaxLifetime (30m).
	EventsMaxLifetime time.Duration
}

type gateway struct {
	c       *tide.Client
	in      *tide.Inspector
	tokens  [][sha256.Size]byte
	maxBody int64
	queues  map[string]bool // nil: all
	log     *slog.Logger
	mux     *http.ServeMux
	now     func() time.Time
	beat    time.Duration // EventsHeartbeat
	events  eventLimits
}

// New returns the gateway's HTTP handler (see the package documentation for
// the endpoints): it enqueues with c and reads and deletes tasks with in. It
// returns an error when c or in is nil or cfg is invalid.
func New(c *tide.Client, in *tide.Inspector, cfg Config) (http.Handler, error) {
	var errs []error
	if c == nil {
		errs = append(errs, errors.New("nil *tide.Client"))
	}
	if in == nil {
		errs = append(errs, errors.New("nil *tide.Inspector"))
	}
	if len(cfg.Tokens) == 0 {
		errs = append(errs, errors.New("no Tokens: clients authenticate with a bearer token; configure at least one (openssl rand -hex 32)"))
	}
	g := &gateway{c: c, in: in, maxBody: cfg.MaxBodyBytes, log: cfg.Logger, now: time.Now, beat: cfg.EventsHeartbeat}
	for i, tok := range cfg.Tokens {
		if len(tok) < MinTokenLength {
			errs = append(errs, fmt.Errorf("Tokens[%d] is %d bytes; at least %d are required", i, len(tok), MinTokenLength))
			continue
		}
		if strings.TrimSpace(tok) != tok || strings.ContainsAny(tok, " \t\r\n") {
			errs = append(errs, fmt.Errorf("Tokens[%d] contains white space", i))
			continue
		}
		g.tokens = append(g.tokens, sha256.Sum256([]byte(tok)))
	}
	switch {
	case g.maxBody == 0:
		g.maxBody = DefaultMaxBodyBytes
	case g.maxBody < 0:
		errs = append(errs, fmt.Errorf("MaxBodyBytes %d is negative", g.maxBody))
	}
	switch {
	case g.beat == 0:
		g.beat = DefaultEventsHeartbeat
	case g.beat < 0:
		errs = append(errs, fmt.Errorf("EventsHeartbeat %v is negative", g.beat))
	}
	errs = append(errs, g.events.init(cfg)...)
	if len(cfg.AllowedQueues) > 0 {
		g.queues = map[string]bool{}
		for _, q := range cfg.AllowedQueues {
			if err := tide.ValidateQueueName(q); err != nil {
				errs = append(errs, fmt.Errorf("AllowedQueues: %s", stripInvalid(err)))
				continue
			}
			g.queues[q] = true
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("tide: gateway: invalid config: %w", errors.Join(errs...))
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.mux = http.NewServeMux()
	g.mux.HandleFunc("/v1/tasks", g.handleTasks)
	g.mux.HandleFunc("/v1/queues/{queue}/tasks/{id}", g.handleTask)
	g.mux.HandleFunc("/v1/queues/{queue}/tasks/{id}/cancel", g.handleCancel)
	g.mux.HandleFunc("/v1/events", g.handleEvents)
	g.mux.HandleFunc("/v1/workflows", g.handleWorkflows)
	g.mux.HandleFunc("/v1/workflows/{id}", g.handleWorkflow)
	g.mux.HandleFunc("/v1/workflows/{id}/cancel", g.handleWorkflowCancel)
	g.mux.HandleFunc("/v1/batches", g.handleBatches)
	g.mux.HandleFunc("/v1/batches/{id}", g.handleBatch)
	g.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		g.fail(w, r, &apiError{status: http.StatusNotFound, code: "not_found",
			message: "no such endpoint; see POST /v1/tasks, GET and DELETE /v1/queues/{queue}/tasks/{id}, POST /v1/queues/{queue}/tasks/{id}/cancel, POST /v1/workflows, GET /v1/workflows/{id}, POST /v1/workflows/{id}/cancel, POST /v1/batches, GET /v1/batches/{id}, GET /v1/events"})
	})
	return g, nil
}

// ServeHTTP authenticates the request and routes it.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.URL.Path == "/healthz" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			g.methodNotAllowed(w, r, "GET, HEAD")
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	tok, aerr := g.authenticate(r)
	if aerr != nil {
		challenge := `Bearer realm="tide"`
		if aerr.code == "invalid_token" {
			challenge += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", challenge)
		g.fail(w, r, aerr)
		return
	}
	if r.URL.Path == "/v1/events" {
		r = r.WithContext(context.WithValue(r.Context(), tokenKey{}, tok))
	}
	g.mux.ServeHTTP(w, r)
}

// tokenKey is the request context key of the index in Config.Tokens of
// the request's token (set for GET /v1/events, whose streams are counted
// per token).
type tokenKey struct{}

// authenticate checks the bearer token in constant time against every
// configured token and returns its index in Config.Tokens.
func (g *gateway) authenticate(r *http.Request) (int, *apiError) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return 0, &apiError{status: http.StatusUnauthorized, code: "unauthorized",
			message: `missing credentials: send "Authorization: Bearer <token>"`}
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return 0, &apiError{status: http.StatusUnauthorized, code: "unauthorized",
			message: `the Authorization header must be "Bearer <token>"`}
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	match, idx := 0, 0
	for i := range g.tokens {
		eq := subtle.ConstantTimeCompare(sum[:], g.tokens[i][:])
		match |= eq
		idx = subtle.ConstantTimeSelect(eq, i, idx)
	}
	if match != 1 {
		return 0, &apiError{status: http.StatusUnauthorized, code: "invalid_token", message: "invalid token"}
	}
	return idx, nil
}

// handleTasks serves POST /v1/tasks.
func (g *gateway) handleTasks(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		g.methodNotAllowed(w, r, "POST")
		return
	}
	if aerr := checkJSONContentType(r); aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	if r.ContentLength > g.maxBody {
		g.fail(w, r, g.tooLarge())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			g.fail(w, r, g.tooLarge())
			return
		}
		g.fail(w, r, badRequest("could not read the request body: %v", err))
		return
	}
	spec, aerr := parseEnqueue(body, g.now())
	if aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	if aerr := g.allowQueue(spec.queue); aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	info, err := g.c.Enqueue(r.Context(), spec.task())
	if err != nil {
		g.fail(w, r, g.taskError(err, spec.queue, ""))
		return
	}
	out := TaskFromInfo(info)
	out.Payload, out.PayloadBase64 = nil, nil // the caller has it
	w.Header().Set("Location", taskPath(info.Queue, info.ID))
	writeJSON(w, http.StatusCreated, out)
}

// handleTask serves GET and DELETE /v1/queues/{queue}/tasks/{id}.
func (g *gateway) handleTask(w http.ResponseWriter, r *http.Request) {
	queue, id, aerr := g.target(r)
	if aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if info, aerr := g.waitFor(r, queue, id); aerr != nil {
			g.fail(w, r, aerr)
			return
		} else if info != nil {
			writeJSON(w, http.StatusOK, TaskFromInfo(info))
			return
		}
		info, err := g.in.GetTaskInfo(r.Context(), queue, id)
		if err != nil {
			g.fail(w, r, g.taskError(err, queue, id))
			return
		}
		writeJSON(w, http.StatusOK, TaskFromInfo(info))
	case http.MethodDelete:
		if err := g.c.Delete(r.Context(), queue, id); err != nil {
			g.fail(w, r, g.taskError(err, queue, id))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		g.methodNotAllowed(w, r, "GET, HEAD, DELETE")
	}
}

// MaxWait is the longest ?wait= a GET of a task accepts.
const MaxWait = time.Minute

// waitFor serves the ?wait=<duration> of a GET: it waits (without polling)
// until the task is completed or archived and returns it; nil when there is
// no wait or the wait ran out (the caller then answers with the task as it
// is).
func (g *gateway) waitFor(r *http.Request, queue, id string) (*tide.TaskInfo, *apiError) {
	ws := r.URL.Query().Get("wait")
	if ws == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(ws)
	if err != nil || d < 0 || d > MaxWait {
		return nil, badField("wait", "must be a duration from 0s to %v such as \"30s\", got %q", MaxWait, clip(ws, 64))
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	defer cancel()
	info, err := g.c.Wait(ctx, queue, id)
	switch {
	case err == nil:
		return info, nil
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		return nil, nil
	}
	return nil, g.taskError(err, queue, id)
}

// handleCancel serves POST /v1/queues/{queue}/tasks/{id}/cancel.
func (g *gateway) handleCancel(w http.ResponseWriter, r *http.Request) {
	queue, id, aerr := g.target(r)
	if aerr != nil {
		g.fail(w, r, aerr)
		return
	}
	if r.Method != http.MethodPost {
		g.methodNotAllowed(w, r, "POST")
		return
	}
	info, err := g.in.GetTaskInfo(r.Context(), queue, id)
	if err != nil {
		g.fail(w, r, g.taskError(err, queue, id))
		return
	}
	if info.State != tide.StateActive {
		g.fail(w, r, &apiError{status: http.StatusConflict, code: "task_not_active",
			message: fmt.Sprintf("the task is %s, not active; only a running task can be cancelled (delete it instead)", info.State)})
		return
	}
	if err := g.in.CancelProcessing(r.Context(), queue, id); err != nil {
		g.fail(w, r, g.taskError(err, queue, id))
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "cancel requested"})
}

// target reads and checks the queue and task ID of a task URL.
func (g *gateway) target(r *http.Request) (queue, id string, aerr *apiError) {
	queue, id = r.PathValue("queue"), r.PathValue("id")
	if err := tide.ValidateQueueName(queue); err != nil {
		return "", "", badField("queue", "%s", stripInvalid(err))
	}
	if aerr := checkName("task_id", id); aerr != nil {
		return "", "", aerr
	}
	if aerr := g.allowQueue(queue); aerr != nil {
		return "", "", aerr
	}
	return queue, id, nil
}

func (g *gateway) allowQueue(queue string) *apiError {
	if g.queues == nil || g.queues[queue] {
		return nil
	}
	return &apiError{status: http.StatusForbidden, code: "queue_not_allowed", field: "queue",
		message: fmt.Sprintf("queue %q is not open to the gateway (Config.AllowedQueues)", queue)}
}

// taskError maps an error of the Client or Inspector to a response.
func (g *gateway) taskError(err error, queue, id string) *apiError {
	switch {
	case errors.Is(err, tide.ErrTaskIDConflict):
		return &apiError{status: http.StatusConflict, code: "task_id_conflict", field: "task_id",
			message: fmt.Sprintf("queue %q already has a task with this task_id; it is unfinished or retained (delete it, or use another ID)", queue)}
	case errors.Is(err, tide.ErrDuplicateTask):
		return &apiError{status: http.StatusConflict, code: "duplicate_task", field: "unique",
			message: "an unfinished task with the same queue, type and payload exists and the unique lock is held"}
	case errors.Is(err, tide.ErrTaskNotFound):
		return &apiError{status: http.StatusNotFound, code: "task_not_found",
			message: fmt.Sprintf("no task %q in queue %q (it may have finished and been deleted)", clip(id, 64), queue)}
	case errors.Is(err, tide.ErrTaskActive):
		return &apiError{status: http.StatusConflict, code: "task_active",
			message: "the task is being processed and cannot be deleted; cancel it first with POST " + taskPath(queue, id) + "/cancel"}
	case errors.Is(err, tide.ErrInvalidTask):
		return badRequest("%s", stripInvalid(err))
	case errors.Is(err, context.Canceled):
		return &apiError{status: http.StatusServiceUnavailable, code: "canceled", message: "the request was cancelled"}
	}
	return &apiError{status: http.StatusServiceUnavailable, code: "unavailable",
		message: "the task store is unavailable; retry later", cause: err}
}

func (g *gateway) tooLarge() *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
		message: fmt.Sprintf("the request body is over the %d-byte limit", g.maxBody)}
}

func (g *gateway) methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	g.fail(w, r, &apiError{status: http.StatusMethodNotAllowed, code: "method_not_allowed",
		message: fmt.Sprintf("%s is not allowed here; use %s", clip(r.Method, 16), allow)})
}

// checkJSONContentType requires application/json (charset, when given,
// utf-8).
func checkJSONContentType(r *http.Request) *apiError {
	ct := r.Header.Get("Content-Type")
	unsupported := func(why string) *apiError {
		return &apiError{status: http.StatusUnsupportedMediaType, code: "unsupported_media_type",
			message: why + `; send the body as JSON with "Content-Type: application/json"`}
	}
	if ct == "" {
		return unsupported("no Content-Type")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return unsupported("the Content-Type does not parse")
	}
	if mt != "application/json" {
		return unsupported(fmt.Sprintf("Content-Type %q is not supported", clip(mt, 64)))
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return unsupported(fmt.Sprintf("charset %q is not supported (only utf-8)", clip(cs, 32)))
	}
	return nil
}

func taskPath(queue, id string) string {
	return "/v1/queues/" + url.PathEscape(queue) + "/tasks/" + pathSegment(id)
}

// pathSegment escapes s as one path segment; "." and ".." are escaped too,
// or they would be read as relative path steps.
func pathSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

// fail writes aerr as {"error": {...}} and logs it.
func (g *gateway) fail(w http.ResponseWriter, r *http.Request, aerr *apiError) {
	attrs := []any{"method", r.Method, "path", r.URL.Path, "status", aerr.status, "code", aerr.code}
	if aerr.status >= 500 && aerr.code != "canceled" {
		if aerr.cause != nil {
			attrs = append(attrs, "err", aerr.cause.Error())
		}
		g.log.Error("tide: gateway: request failed", attrs...)
	} else {
		g.log.Debug("tide: gateway: request refused", append(attrs, "message", aerr.message)...)
	}
	body := map[string]string{"code": aerr.code, "message": aerr.message}
	if aerr.field != "" {
		body["field"] = aerr.field
	}
	writeJSON(w, aerr.status, map[string]any{"error": body})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		http.Error(w, `{"error":{"code":"internal","message":"encoding the response failed"}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}
