package gateway_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

const token = "test-token-0123456789abcdef"

type env struct {
	t   *testing.T
	b   *redisbroker.Broker
	c   *tide.Client
	in  *tide.Inspector
	srv *httptest.Server
}

// setup starts a gateway on a Redis broker with its own key prefix.
func setup(t *testing.T, cfg gateway.Config) *env {
	t.Helper()
	return setupOn(t, redistest.Client(t, redistest.Addr(t)), nil, cfg)
}

// setupOn is setup with a broker on rdb; srv, when not nil, is an
// unstarted server to serve the gateway with.
func setupOn(t *testing.T, rdb *redis.Client, srv *httptest.Server, cfg gateway.Config) *env {
	t.Helper()
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	e := &env{t: t, b: b, c: tide.NewClient(b), in: tide.NewInspector(b)}
	if cfg.Tokens == nil {
		cfg.Tokens = []string{token}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h, err := gateway.New(e.c, e.in, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if srv == nil {
		srv = httptest.NewUnstartedServer(nil)
	}
	srv.Config.Handler = h
	srv.Start()
	e.srv = srv
	t.Cleanup(e.srv.Close)
	return e
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response %d is not JSON: %v\n%s", r.status, err, r.body)
	}
	return m
}

func (r response) errorBody(t *testing.T) (code, field, message string) {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %s", r.body)
	}
	f, _ := e["field"].(string)
	return e["code"].(string), f, e["message"].(string)
}

// do sends a request; headers are pairs, and an empty body sends none.
func (e *env) do(method, path, body string, headers ...string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, data}
}

func TestEnqueueGetDelete(t *testing.T) {
	e := setup(t, gateway.Config{})
	r := e.do("POST", "/v1/tasks", `{"type":"order:cancel","payload":{"order_id":42},"queue":"orders",
		"task_id":"order-cancel:42","delay":"15m","max_retry":3,"headers":{"traceparent":"00-abc"}}`)
	if r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	if loc := r.header.Get("Location"); loc != "/v1/queues/orders/tasks/order-cancel:42" {
		t.Errorf("Location = %q", loc)
	}
	var created gateway.Task
	if err := json.Unmarshal(r.body, &created); err != nil {
		t.Fatal(err)
	}
	if created.ID != "order-cancel:42" || created.Queue != "orders" || created.Type != "order:cancel" ||
		created.State != "scheduled" || created.MaxRetry != 3 || created.NextProcessAt == nil ||
		created.Payload != nil || created.PayloadBase64 != nil {
		t.Errorf("created = %s", r.body)
	}
	if d := time.Until(*created.NextProcessAt); d < 14*time.Minute || d > 16*time.Minute {
		t.Errorf("next_process_at in %v, want 15m", d)
	}

	// The task is really there.
	ti, err := e.in.GetTaskInfo(context.Background(), "orders", "order-cancel:42")
	if err != nil || string(ti.Payload) != `{"order_id":42}` || ti.Headers["traceparent"] != "00-abc" {
		t.Fatalf("stored task: %+v, %v", ti, err)
	}

	// GET, with the ID escaped or not.
	for _, path := range []string{"/v1/queues/orders/tasks/order-cancel:42", "/v1/queues/orders/tasks/order-cancel%3A42"} {
		r = e.do("GET", path, "")
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		m := r.json(t)
		if m["id"] != "order-cancel:42" || m["state"] != "scheduled" ||
			m["payload_base64"] != base64.StdEncoding.EncodeToString([]byte(`{"order_id":42}`)) ||
			m["payload"].(map[string]any)["order_id"] != 42.0 || m["retried"] != 0.0 {
			t.Errorf("GET %s = %s", path, r.body)
		}
	}

	// A second POST with the same task_id is a conflict.
	r = e.do("POST", "/v1/tasks", `{"type":"order:cancel","queue":"orders","task_id":"order-cancel:42"}`)
	if code, field, _ := r.errorBody(t); r.status != http.StatusConflict || code != "task_id_conflict" || field != "task_id" {
		t.Errorf("duplicate task_id: %d %s", r.status, r.body)
	}

	// DELETE (the order was paid), then it is gone.
	if r = e.do("DELETE", "/v1/queues/orders/tasks/order-cancel:42", ""); r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	r = e.do("GET", "/v1/queues/orders/tasks/order-cancel:42", "")
	if code, _, _ := r.errorBody(t); r.status != http.StatusNotFound || code != "task_not_found" {
		t.Errorf("GET after DELETE: %d %s", r.status, r.body)
	}
	r = e.do("DELETE", "/v1/queues/orders/tasks/order-cancel:42", "")
	if code, _, _ := r.errorBody(t); r.status != http.StatusNotFound || code != "task_not_found" {
		t.Errorf("second DELETE: %d %s", r.status, r.body)
	}
}

func TestOddTaskIDs(t *testing.T) {
	e := setup(t, gateway.Config{})
	for _, id := range []string{"a/b", "with space", "100%", "x?y#z", "ünï", ".."} {
		body, _ := json.Marshal(map[string]string{"type": "t", "task_id": id})
		r := e.do("POST", "/v1/tasks", string(body))
		if r.status != http.StatusCreated {
			t.Fatalf("POST %q: %d %s", id, r.status, r.body)
		}
		loc := r.header.Get("Location")
		r = e.do("GET", loc, "")
		if r.status != http.StatusOK || r.json(t)["id"] != id {
			t.Errorf("GET %s: %d %s", loc, r.status, r.body)
		}
		if r = e.do("DELETE", loc, ""); r.status != http.StatusNoContent {
			t.Errorf("DELETE %s: %d %s", loc, r.status, r.body)
		}
	}
}

func TestUniqueIsAConflict(t *testing.T) {
	e := setup(t, gateway.Config{})
	body := `{"type":"report","payload":{"day":"2030-01-01"},"unique":"1h"}`
	if r := e.do("POST", "/v1/tasks", body); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	r := e.do("POST", "/v1/tasks", body)
	if code, field, _ := r.errorBody(t); r.status != http.StatusConflict || code != "duplicate_task" || field != "unique" {
		t.Errorf("second: %d %s", r.status, r.body)
	}
}

func TestActiveTaskCannotBeDeleted(t *testing.T) {
	e := setup(t, gateway.Config{})
	started := make(chan struct{})
	srv := tide.NewServer(e.b, tide.Config{ShutdownTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	err := srv.Start(tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		close(started)
		<-ctx.Done()
		return context.Cause(ctx)
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if r := e.do("POST", "/v1/tasks", `{"type":"slow","task_id":"slow-1","max_retry":0}`); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not start")
	}
	r := e.do("DELETE", "/v1/queues/default/tasks/slow-1", "")
	code, _, msg := r.errorBody(t)
	if r.status != http.StatusConflict || code != "task_active" || !strings.Contains(msg, "POST /v1/queues/default/tasks/slow-1/cancel") {
		t.Fatalf("DELETE of an active task: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/v1/queues/default/tasks/slow-1/cancel", ""); r.status != http.StatusAccepted {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	testwait.Until(t, 10*time.Second, func() error {
		ti, err := e.in.GetTaskInfo(context.Background(), "default", "slow-1")
		if err == nil && ti.State == tide.StateArchived {
			return nil
		}
		return fmt.Errorf("the cancelled task was not archived: %+v %v", ti, err)
	})
	r = e.do("POST", "/v1/queues/default/tasks/slow-1/cancel", "")
	if code, _, _ := r.errorBody(t); r.status != http.StatusConflict || code != "task_not_active" {
		t.Errorf("cancel of an archived task: %d %s", r.status, r.body)
	}
}

func TestAuthentication(t *testing.T) {
	e := setup(t, gateway.Config{Tokens: []string{"another-token-0123456789", token}})
	cases := []struct {
		auth, code string
	}{
		{"", "unauthorized"},
		{"Basic dXNlcjpwYXNz", "unauthorized"},
		{"Bearer", "unauthorized"},
		{"Bearer wrong-token-0123456789abc", "invalid_token"},
		{"Bearer " + token + "x", "invalid_token"},
		{"Bearer " + token[:len(token)-1], "invalid_token"},
	}
	for _, c := range cases {
		for _, path := range []string{"/v1/tasks", "/v1/queues/default/tasks/x", "/nowhere"} {
			r := e.do("POST", path, `{"type":"a"}`, "Authorization", c.auth)
			code, _, msg := r.errorBody(t)
			if r.status != http.StatusUnauthorized || code != c.code || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), `Bearer realm="tide"`) {
				t.Errorf("%q %s: %d %s (WWW-Authenticate %q)", c.auth, path, r.status, r.body, r.header.Get("WWW-Authenticate"))
			}
			if strings.Contains(msg, "wrong-token") || strings.Contains(msg, token) {
				t.Errorf("the message echoes the token: %s", msg)
			}
		}
	}
	if r := e.do("POST", "/v1/tasks", `{"type":"a"}`, "Authorization", "bearer another-token-0123456789"); r.status != http.StatusCreated {
		t.Errorf("second token, lower-case scheme: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/healthz", "", "Authorization", ""); r.status != http.StatusOK {
		t.Errorf("healthz: %d %s", r.status, r.body)
	}
}

func TestHTTPErrors(t *testing.T) {
	e := setup(t, gateway.Config{MaxBodyBytes: 200, AllowedQueues: []string{"default", "orders"}})
	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, field, want        string
	}{
		{"wrong method", "GET", "/v1/tasks", "", nil, 405, "method_not_allowed", "", "use POST"},
		{"wrong method on a task", "PUT", "/v1/queues/orders/tasks/x", `{}`, nil, 405, "method_not_allowed", "", "use GET, HEAD, DELETE"},
		{"no content type", "POST", "/v1/tasks", `{"type":"a"}`, []string{"Content-Type", ""}, 415, "unsupported_media_type", "", "no Content-Type"},
		{"form", "POST", "/v1/tasks", `type=a`, []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "unsupported_media_type", "", `"application/x-www-form-urlencoded" is not supported`},
		{"latin1", "POST", "/v1/tasks", `{"type":"a"}`, []string{"Content-Type", "application/json; charset=iso-8859-1"}, 415, "unsupported_media_type", "", "only utf-8"},
		{"too large", "POST", "/v1/tasks", `{"type":"a","payload":"` + strings.Repeat("x", 300) + `"}`, nil, 413, "request_too_large", "", "over the 200-byte limit"},
		{"bad json", "POST", "/v1/tasks", `{"type":`, nil, 400, "invalid_request", "", "invalid JSON"},
		{"bad delay", "POST", "/v1/tasks", `{"type":"a","delay":"15 minutes"}`, nil, 400, "invalid_request", "delay", `"delay": invalid duration "15 minutes"`},
		{"unknown field", "POST", "/v1/tasks", `{"type":"a","queu":"x"}`, nil, 400, "invalid_request", "queu", `unknown field "queu" (did you mean "queue"?)`},
		{"queue not allowed", "POST", "/v1/tasks", `{"type":"a","queue":"secret"}`, nil, 403, "queue_not_allowed", "queue", `queue "secret" is not open`},
		{"get queue not allowed", "GET", "/v1/queues/secret/tasks/x", "", nil, 403, "queue_not_allowed", "queue", `queue "secret" is not open`},
		{"bad queue in path", "GET", "/v1/queues/a%20b/tasks/x", "", nil, 400, "invalid_request", "queue", `invalid character ' '`},
		{"control char id", "GET", "/v1/queues/orders/tasks/a%01b", "", nil, 400, "invalid_request", "task_id", "control character"},
		{"no such endpoint", "GET", "/v2/tasks", "", nil, 404, "not_found", "", "no such endpoint"},
		{"no such task", "GET", "/v1/queues/orders/tasks/nope", "", nil, 404, "task_not_found", "", `no task "nope" in queue "orders"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.method, c.path, c.body, c.headers...)
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			code, field, msg := r.errorBody(t)
			if code != c.code || field != c.field || !strings.Contains(msg, c.want) {
				t.Errorf("got code %q field %q message %q; want %q %q ~%q", code, field, msg, c.code, c.field, c.want)
			}
			if c.status == 405 && r.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
}

func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer rdb.Close()
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	h, err := gateway.New(tide.NewClient(b), tide.NewInspector(b), gateway.Config{Tokens: []string{token}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	req := httptest.NewRequest("POST", "/v1/tasks", strings.NewReader(`{"type":"a"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), `"unavailable"`) || strings.Contains(w.Body.String(), "refused") {
		t.Errorf("with Redis down: %d %s", w.Code, w.Body)
	}
}

func TestConfigErrors(t *testing.T) {
	b := redisbroker.New(redistest.Client(t, "127.0.0.1:1"))
	c, in := tide.NewClient(b), tide.NewInspector(b)
	for _, tc := range []struct {
		cfg  gateway.Config
		want string
	}{
		{gateway.Config{}, "no Tokens"},
		{gateway.Config{Tokens: []string{"short"}}, "Tokens[0] is 5 bytes"},
		{gateway.Config{Tokens: []string{"has space 0123456789abcdef"}}, "white space"},
		{gateway.Config{Tokens: []string{token}, MaxBodyBytes: -1}, "MaxBodyBytes -1 is negative"},
		{gateway.Config{Tokens: []string{token}, AllowedQueues: []string{"a b"}}, "AllowedQueues"},
	} {
		_, err := gateway.New(c, in, tc.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "tide: gateway: invalid config") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := gateway.New(nil, nil, gateway.Config{Tokens: []string{token}}); err == nil || !strings.Contains(err.Error(), "nil *tide.Client") {
		t.Errorf("New(nil, nil) = %v", err)
	}
}

// GET with ?wait= answers when the task ends (a server finishes it while
// the request waits), answers with the task as it is when the time runs
// out, and refuses a bad duration naming the parameter; the task's JSON
// carries its group and progress.
func TestGetTaskWaits(t *testing.T) {
	e := setup(t, gateway.Config{})
	ctx := context.Background()
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	srv := tide.NewServer(e.b, tide.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		if err := tide.ReportProgress(ctx, 30, "warming up"); err != nil {
			return err
		}
		<-release
		return tide.WriteResult(ctx, []byte(`{"url":"https://cdn/x.png"}`))
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	r := e.do("POST", "/v1/tasks", `{"type":"image:resize","retention":"10m","group":"acme"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	loc := r.header.Get("Location")
	id, _ := r.json(t)["id"].(string)
	testwait.Until(t, 10*time.Second, func() error {
		ti, err := e.in.GetTaskInfo(ctx, "default", id)
		if err == nil && ti.Progress.Percent == 30 {
			return nil
		}
		return fmt.Errorf("the task never reported progress: %+v %v", ti, err)
	})
	r = e.do("GET", loc+"?wait=100ms", "")
	m := r.json(t)
	if r.status != http.StatusOK || m["state"] != "active" || m["group"] != "acme" || m["progress"].(map[string]any)["percent"] != 30.0 {
		t.Fatalf("GET ?wait=100ms while it runs: %d %s", r.status, r.body)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		free()
	}()
	r = e.do("GET", loc+"?wait=30s", "")
	m = r.json(t)
	if r.status != http.StatusOK || m["state"] != "completed" || m["result"].(map[string]any)["url"] != "https://cdn/x.png" {
		t.Fatalf("GET ?wait=30s: %d %s", r.status, r.body)
	}
	for _, bad := range []string{"soon", "-1s", "2h"} {
		r = e.do("GET", loc+"?wait="+bad, "")
		if code, field, _ := r.errorBody(t); r.status != http.StatusBadRequest || code != "invalid_request" || field != "wait" {
			t.Fatalf("?wait=%s: %d %s", bad, r.status, r.body)
		}
	}
}

// A grouped task keeps the task_id it was given, without the group's tag,
// on a queue of one partition and of several: it is read, refused again in
// another group (409) and deleted by that ID; the tagged form is taken too.
func TestGroupedTaskWithFreeID(t *testing.T) {
	e := setup(t, gateway.Config{})
	r := e.do("POST", "/v1/tasks", `{"type":"order:cancel","queue":"orders","group":"shop-7","task_id":"order-cancel:42","delay":"15m"}`)
	if r.status != http.StatusCreated || r.header.Get("Location") != "/v1/queues/orders/tasks/order-cancel:42" {
		t.Fatalf("POST: %d %s %v", r.status, r.body, r.header)
	}
	r = e.do("GET", "/v1/queues/orders/tasks/order-cancel:42", "")
	if m := r.json(t); r.status != http.StatusOK || m["id"] != "order-cancel:42" || m["group"] != "shop-7" {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
	r = e.do("POST", "/v1/tasks", `{"type":"order:cancel","queue":"orders","group":"shop-8","task_id":"order-cancel:42"}`)
	if r.status != http.StatusConflict {
		t.Fatalf("POST of the ID in another group: %d %s, want 409", r.status, r.body)
	}
	if r = e.do("DELETE", "/v1/queues/orders/tasks/order-cancel:42", ""); r.status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	if err := e.in.Repartition(context.Background(), "parted", 4, nil); err != nil {
		t.Fatal(err)
	}
	r = e.do("POST", "/v1/tasks", `{"type":"a","queue":"parted","group":"acme","task_id":"o-1"}`)
	if r.status != http.StatusCreated || r.header.Get("Location") != "/v1/queues/parted/tasks/o-1" {
		t.Fatalf("POST of a free grouped ID on 4 partitions: %d %s", r.status, r.body)
	}
	r = e.do("GET", "/v1/queues/parted/tasks/o-1", "")
	if m := r.json(t); r.status != http.StatusOK || m["id"] != "o-1" || m["group"] != "acme" {
		t.Fatalf("GET on 4 partitions: %d %s", r.status, r.body)
	}
	if r = e.do("POST", "/v1/tasks", `{"type":"a","queue":"parted","group":"other","task_id":"o-1"}`); r.status != http.StatusConflict {
		t.Fatalf("POST of the ID in another group on 4 partitions: %d %s, want 409", r.status, r.body)
	}
	if r = e.do("DELETE", "/v1/queues/parted/tasks/o-1", ""); r.status != http.StatusNoContent {
		t.Fatalf("DELETE on 4 partitions: %d %s", r.status, r.body)
	}
	if r = e.do("POST", "/v1/tasks", `{"type":"a","queue":"parted","group":"acme","task_id":"o-1{acme}"}`); r.status != http.StatusCreated {
		t.Fatalf("POST of a tagged ID on 4 partitions: %d %s", r.status, r.body)
	}
}
