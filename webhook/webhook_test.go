package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

var testSecret = []byte("test-secret-0123456789abcdef")

// receiver is an httptest server that records requests and answers with
// the next status of its script (the last one repeats).
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	reqs     []recorded
	statuses []int
	delay    time.Duration
	header   http.Header
}

type recorded struct {
	method string
	path   string
	header http.Header
	body   []byte
	verify error
}

func newReceiver(t *testing.T, statuses ...int) *receiver {
	t.Helper()
	r := &receiver{statuses: statuses, header: http.Header{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.reqs = append(r.reqs, recorded{req.Method, req.URL.Path, req.Header.Clone(), body,
			Verify(testSecret, req.Header.Get(SignatureHeader), body, time.Minute)})
		st := http.StatusOK
		if len(r.statuses) > 0 {
			st = r.statuses[min(len(r.reqs), len(r.statuses))-1]
		}
		delay := r.delay
		for k, v := range r.header {
			w.Header()[k] = v
		}
		r.mu.Unlock()
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-req.Context().Done():
			}
		}
		w.WriteHeader(st)
		if st >= 300 {
			io.WriteString(w, "oops\nsomething broke")
		}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) requests() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.reqs...)
}

func (r *receiver) host() string {
	u, _ := url.Parse(r.URL)
	return u.Hostname()
}

func testHandler(t *testing.T, cfg Config) tide.Handler {
	t.Helper()
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	cfg.AllowPrivateNetworks = true // httptest servers listen on 127.0.0.1
	h, err := Handler(cfg)
	if err != nil {
		t.Fatalf("Handler: %v", err)
	}
	return h
}

func task(t *testing.T, p Payload) *tide.Task {
	t.Helper()
	tk, err := NewTask(p)
	if err != nil {
		t.Fatalf("NewTask: %v", err)
	}
	return tk
}

func TestSignedRequestVerifies(t *testing.T) {
	r := newReceiver(t)
	h := testHandler(t, Config{AllowedHosts: []string{r.host()}})
	body := []byte(`{"order":42,"status":"paid"}`)
	err := h.ProcessTask(context.Background(), task(t, Payload{
		URL: r.URL + "/hooks/orders?token=abc", Body: body,
		Headers: map[string]string{"X-Order": "42"},
	}))
	if err != nil {
		t.Fatalf("ProcessTask: %v", err)
	}
	reqs := r.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	got := reqs[0]
	if got.verify != nil {
		t.Errorf("receiver's Verify: %v", got.verify)
	}
	if got.method != "POST" || got.path != "/hooks/orders" || string(got.body) != string(body) {
		t.Errorf("request = %s %s %q", got.method, got.path, got.body)
	}
	for k, want := range map[string]string{"X-Order": "42", "Content-Type": "application/json", "User-Agent": "tide-webhook/1"} {
		if v := got.header.Get(k); v != want {
			t.Errorf("header %s = %q, want %q", k, v, want)
		}
	}
}

func TestMethodAndContentType(t *testing.T) {
	r := newReceiver(t)
	h := testHandler(t, Config{AllowedHosts: []string{r.host()}})
	err := h.ProcessTask(context.Background(), task(t, Payload{URL: r.URL, Method: "put", Body: []byte("plain text"),
		Headers: map[string]string{"content-type": "text/plain"}}))
	if err != nil {
		t.Fatal(err)
	}
	err = h.ProcessTask(context.Background(), task(t, Payload{URL: r.URL, Method: "DELETE"}))
	if err != nil {
		t.Fatal(err)
	}
	reqs := r.requests()
	if reqs[0].method != "PUT" || reqs[0].header.Get("Content-Type") != "text/plain" || reqs[0].verify != nil {
		t.Errorf("first request: %s %q verify=%v", reqs[0].method, reqs[0].header.Get("Content-Type"), reqs[0].verify)
	}
	if reqs[1].method != "DELETE" || len(reqs[1].body) != 0 || reqs[1].verify != nil {
		t.Errorf("second request: %s %q verify=%v", reqs[1].method, reqs[1].body, reqs[1].verify)
	}
}

func TestStatusErrors(t *testing.T) {
	cases := []struct {
		status    int
		permanent bool
	}{
		{500, false}, {502, false}, {503, false}, {408, false}, {425, false}, {429, false},
		{400, true}, {401, true}, {404, true}, {410, true}, {422, true},
		{301, false}, // a redirect without Location is not followed; retried
	}
	for _, c := range cases {
		r := newReceiver(t, c.status)
		h := testHandler(t, Config{AllowedHosts: []string{r.host()}})
		err := h.ProcessTask(context.Background(), task(t, Payload{URL: r.URL + "/x?secret=s3cr3t", Body: []byte("{}")}))
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != c.status {
			t.Errorf("status %d: err = %v, want a *StatusError", c.status, err)
			continue
		}
		if errors.Is(err, tide.SkipRetry) != c.permanent {
			t.Errorf("status %d: SkipRetry = %v, want %v", c.status, !c.permanent, c.permanent)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "tide: webhook: POST http://") || !strings.Contains(msg, "/x: status") ||
			!strings.Contains(msg, `"oops something broke"`) || strings.Contains(msg, "s3cr3t") {
			t.Errorf("status %d: message %q", c.status, msg)
		}
	}

	// RetryClientErrors retries a 404.
	r := newReceiver(t, 404)
	h := testHandler(t, Config{AllowedHosts: []string{r.host()}, RetryClientErrors: true})
	if err := h.ProcessTask(context.Background(), task(t, Payload{URL: r.URL})); err == nil || errors.Is(err, tide.SkipRetry) {
		t.Errorf("RetryClientErrors: 404 gave %v, want a retried error", err)
	}
}

func TestRetryAfter(t *testing.T) {
	r := newReceiver(t, 429)
	r.header.Set("Retry-After", "120")
	h := testHandler(t, Config{AllowedHosts: []string{r.host()}})
	tk := task(t, Payload{URL: r.URL})
	err := h.ProcessTask(context.Background(), tk)
	var se *StatusError
	if !errors.As(err, &se) || se.RetryAfter != 2*time.Minute {
		t.Fatalf("err = %#v, want RetryAfter 2m", err)
	}
	delay := RetryDelayFunc(nil)
	if d := delay(1, err, tk); d != 2*time.Minute {
		t.Errorf("RetryDelayFunc with Retry-After = %v, want 2m", d)
	}
	if d := delay(1, errors.New("boom"), tk); d != 15*time.Second {
		t.Errorf("RetryDelayFunc for a webhook = %v, want 15s (NotificationRetryDelay)", d)
	}
	other := tide.NewTask("email:send", nil)
	if d := RetryDelayFunc(tide.RetrySchedule(time.Millisecond))(1, err, other); d != time.Millisecond {
		t.Errorf("RetryDelayFunc for another type = %v, want the fallback's 1ms", d)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"": 0, "0": 0, "-5": 0, "abc": 0, "86400000": 24 * time.Hour,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		now.Add(-time.Hour).Format(http.TimeFormat):       0,
	} {
		if got := retryAfter(v, now); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestDisallowedHostIsRefused(t *testing.T) {
	r := newReceiver(t)
	h := testHandler(t, Config{AllowedHosts: []string{"hooks.example.com"}})
	err := h.ProcessTask(context.Background(), task(t, Payload{URL: r.URL + "/x"}))
	if !errors.Is(err, tide.SkipRetry) || !strings.Contains(err.Error(), `host "`+strings.TrimPrefix(r.URL, "http://")+`" is not in AllowedHosts`) {
		t.Fatalf("err = %v, want SkipRetry naming the host", err)
	}
	if n := len(r.requests()); n != 0 {
		t.Fatalf("%d requests sent to a host not allowed", n)
	}
}

func TestTimeoutIsAFailure(t *testing.T) {
	r := newReceiver(t)
	r.delay = 5 * time.Second
	h := testHandler(t, Config{AllowedHosts: []string{r.host()}, Timeout: 100 * time.Millisecond})
	start := time.Now()
	err := h.ProcessTask(context.Background(), task(t, Payload{URL: r.URL}))
	if err == nil || errors.Is(err, tide.SkipRetry) || !strings.Contains(err.Error(), "no response within 100ms") {
		t.Fatalf("err = %v, want a retried timeout error", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}

	// The task's own context ending is reported as such.
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("shutting down"))
	err = h.ProcessTask(ctx, task(t, Payload{URL: r.URL}))
	if err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("cancelled context: err = %v", err)
	}
}

func TestPrivateNetworksRefusedByDefault(t *testing.T) {
	r := newReceiver(t)
	h, err := Handler(Config{Secret: testSecret, AllowedHosts: []string{r.host(), "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{r.URL, strings.Replace(r.URL, "127.0.0.1", "localhost", 1)} {
		err := h.ProcessTask(context.Background(), task(t, Payload{URL: u}))
		if !errors.Is(err, tide.SkipRetry) || !strings.Contains(err.Error(), "is not public") {
			t.Errorf("%s: err = %v, want SkipRetry for a loopback address", u, err)
		}
	}
	if n := len(r.requests()); n != 0 {
		t.Fatalf("%d requests reached a loopback address", n)
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{AllowedHosts: []string{"a.com"}}, "Secret is 0 bytes"},
		{Config{Secret: []byte("short"), AllowedHosts: []string{"a.com"}}, "Secret is 5 bytes"},
		{Config{Secret: testSecret}, "AllowedHosts is empty"},
		{Config{Secret: testSecret, AllowedHosts: []string{"https://a.com/"}}, `entry "https://a.com/": give a host name`},
		{Config{Secret: testSecret, AllowedHosts: []string{"*"}}, `entry "*"`},
		{Config{Secret: testSecret, AllowedHosts: []string{"*.com"}}, "at least two labels"},
		{Config{Secret: testSecret, AllowedHosts: []string{"a.*.com"}}, "only allowed as the first label"},
		{Config{Secret: testSecret, AllowedHosts: []string{"a.com:99999"}}, "invalid port"},
		{Config{Secret: testSecret, AllowedHosts: []string{""}}, "empty"},
		{Config{Secret: testSecret, AllowedHosts: []string{"a.com"}, Timeout: -1}, "Timeout -1ns is negative"},
	}
	for _, c := range cases {
		_, err := Handler(c.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "tide: webhook: invalid Config") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Handler(%+v) = %v, want an error mentioning %q", c.cfg, err, c.want)
		}
	}
}

func TestNewTaskValidates(t *testing.T) {
	cases := []struct {
		p    Payload
		want string
	}{
		{Payload{}, "empty URL"},
		{Payload{URL: "/relative"}, "not an absolute http or https URL"},
		{Payload{URL: "ftp://a.com/x"}, `scheme "ftp" is not allowed`},
		{Payload{URL: "file:///etc/passwd"}, `scheme "file" is not allowed`},
		{Payload{URL: "https:///nohost"}, "has no host"},
		{Payload{URL: "https://a.com/%zz"}, "does not parse"},
		{Payload{URL: "https://a.com", Method: "CONNECT"}, `method "CONNECT" is not allowed`},
		{Payload{URL: "https://a.com", Headers: map[string]string{"Bad Name": "x"}}, "not a valid HTTP header name"},
		{Payload{URL: "https://a.com", Headers: map[string]string{"host": "x"}}, `header "Host" is set by tide`},
		{Payload{URL: "https://a.com", Headers: map[string]string{"tide-signature": "x"}}, `header "Tide-Signature" is set by tide`},
		{Payload{URL: "https://a.com", Headers: map[string]string{"X-A": "a\r\nX-B: b"}}, "control character"},
		{Payload{URL: "https://" + strings.Repeat("a", MaxURLLength)}, "over the 8192-byte limit"},
	}
	for _, c := range cases {
		_, err := NewTask(c.p)
		if !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewTask(%.60v) = %v, want ErrInvalidTask mentioning %q", c.p, err, c.want)
		}
	}
	// Credentials never show up in messages.
	_, err := NewTask(Payload{URL: "gopher://user:pa55@a.com/"})
	if err == nil || strings.Contains(err.Error(), "pa55") {
		t.Errorf("err = %v", err)
	}
}

func TestPayloadJSON(t *testing.T) {
	for _, body := range [][]byte{nil, []byte(`{"a":1}`), {0xff, 0x00, 0x80}} {
		p := Payload{URL: "https://a.com/x", Method: "PUT", Headers: map[string]string{"X-A": "1"}, Body: body}
		data, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if (len(body) > 0 && body[0] == 0xff) != strings.Contains(string(data), `"body_base64"`) {
			t.Errorf("encoding of %q: %s", body, data)
		}
		got, err := ParsePayload(data)
		if err != nil {
			t.Fatalf("ParsePayload(%s): %v", data, err)
		}
		if got.URL != p.URL || got.Method != p.Method || got.Headers["X-A"] != "1" || string(got.Body) != string(body) {
			t.Errorf("round trip of %+v gave %+v", p, got)
		}
	}
	for data, want := range map[string]string{
		`{"url":"https://a.com","bdy":"x"}`:                   `unknown field "bdy"`,
		`{"url":"https://a.com","body":"x","body_base64":""}`: `not both`,
		`{"url":"https://a.com","body_base64":"%%%"}`:         `"body_base64": invalid base64`,
		`{"url":42}`:                 `field "url": cannot use a JSON number`,
		`{"url":"https://a.com"} {}`: `after top-level value`,
		`{"url":`:                    `unexpected end of JSON input`,
		`nope`:                       `invalid JSON at byte 2`,
	} {
		_, err := ParsePayload([]byte(data))
		if !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePayload(%s) = %v, want ErrInvalidTask mentioning %q", data, err, want)
		}
	}
}

func TestHandlerRefusesBadTasks(t *testing.T) {
	h := testHandler(t, Config{AllowedHosts: []string{"a.com"}})
	for _, tk := range []*tide.Task{
		tide.NewTask("other", nil),
		tide.NewTask(TaskType, []byte("not json")),
		tide.NewTask(TaskType, []byte(`{"url":"ftp://a.com"}`)),
	} {
		if err := h.ProcessTask(context.Background(), tk); !errors.Is(err, tide.SkipRetry) {
			t.Errorf("ProcessTask(%s %q) = %v, want SkipRetry", tk.Type(), tk.Payload(), err)
		}
	}
}
