package tide_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/webhook"
)

// hit is one request a notifyRecorder got.
type hit struct {
	method, path, query, body, sig string
}

// notifyRecorder records every request; routes answers some paths
// (others get 204).
func notifyRecorder(t *testing.T, routes map[string]http.HandlerFunc) (*httptest.Server, func() []hit) {
	var mu sync.Mutex
	var hits []hit
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hits = append(hits, hit{r.Method, r.URL.Path, r.URL.RawQuery, string(b), r.Header.Get(webhook.SignatureHeader)})
		mu.Unlock()
		if h, ok := routes[r.URL.Path]; ok {
			h(w, r)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []hit {
		mu.Lock()
		defer mu.Unlock()
		return append([]hit(nil), hits...)
	}
}

// notifications returns the notification tasks of the default queue in
// state st.
func (e *env) notifications(st tide.TaskState) []*tide.TaskInfo {
	e.t.Helper()
	ts, err := tide.NewInspector(e.b).ListTasks(context.Background(), tide.DefaultQueue, st, 1, 100)
	if err != nil {
		e.t.Fatalf("ListTasks: %v", err)
	}
	var out []*tide.TaskInfo
	for _, ti := range ts {
		if ti.Type == tide.NotifyType {
			out = append(out, ti)
		}
	}
	return out
}

// notifyFailuresWait is a RetryDelayFunc that leaves a failed notification
// waiting (in state Retry) for the test to look at.
func notifyFailuresWait(_ int, _ error, t *tide.Task) time.Duration {
	if t.Type() == tide.NotifyType {
		return time.Hour
	}
	return 10 * time.Millisecond
}

func enqueueNotified(t *testing.T, e *env, notifyURL string) {
	t.Helper()
	if _, err := e.c.Enqueue(context.Background(), tide.NewTask("charge", nil), tide.NotifyURL(notifyURL)); err != nil {
		t.Fatal(err)
	}
}

var succeed = tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil })

// Without Config.NotifyAllowPrivate a notification never reaches a
// loopback address, given as such or as a name that resolves to one: it
// is archived at once with the reason, and the URL's query and
// credentials stay out of it.
func TestNotifyRefusesPrivateAddresses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv, hits := notifyRecorder(t, nil)
	e.server(tide.Config{NotifySecret: "notify-secret-0123456789", RetryDelayFunc: notifyFailuresWait}, succeed)
	byIP := srv.URL + "/hook?token=SECRET"
	byName := strings.Replace(srv.URL, "http://127.0.0.1", "http://user:pa55@localhost", 1) + "/hook?token=SECRET"
	enqueueNotified(t, e, byIP)
	enqueueNotified(t, e, byName)
	testwait.For(t, 20*time.Second, "both notifications archived, or one delivered", func() bool {
		return len(hits()) > 0 || len(e.notifications(tide.StateArchived)) == 2
	})
	if h := hits(); len(h) > 0 {
		t.Fatalf("a notification reached 127.0.0.1 without NotifyAllowPrivate: %+v", h)
	}
	for _, ti := range e.notifications(tide.StateArchived) {
		if ti.Retried != 0 || !strings.Contains(ti.LastErr, "is not public") || !strings.Contains(ti.LastErr, "set Config.NotifyAllowPrivate to allow it") ||
			!strings.HasPrefix(ti.LastErr, "tide: notification to http://") {
			t.Errorf("archived notification: retried %d, error %q; want 0 and the refusal", ti.Retried, ti.LastErr)
		}
		if strings.Contains(ti.LastErr, "SECRET") || strings.Contains(ti.LastErr, "pa55") {
			t.Errorf("the error holds the URL's query or credentials: %q", ti.LastErr)
		}
	}
}

// A 302 (or 301, 303) answer to a notification is not followed: the
// notification is not delivered but retried. A 307 to an allowed host is
// followed with the same POST, signed again.
func TestNotifyRedirects(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const secret = "notify-secret-0123456789"
	srv, hits := notifyRecorder(t, map[string]http.HandlerFunc{
		"/302": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/moved?sig=SECRET", http.StatusFound)
		},
		"/307": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/landed", http.StatusTemporaryRedirect)
		},
	})
	e.server(tide.Config{NotifySecret: secret, NotifyAllowPrivate: true, NotifyAllowedHosts: []string{"127.0.0.1"}, RetryDelayFunc: notifyFailuresWait}, succeed)
	enqueueNotified(t, e, srv.URL+"/302")
	enqueueNotified(t, e, srv.URL+"/307")
	paths := func() map[string][]hit {
		m := map[string][]hit{}
		for _, h := range hits() {
			m[h.path] = append(m[h.path], h)
		}
		return m
	}
	testwait.For(t, 20*time.Second, "the 302 retried and the 307 landed", func() bool {
		p := paths()
		return len(p["/moved"]) > 0 || len(e.notifications(tide.StateRetry)) == 1 && len(p["/landed"]) == 1
	})
	p := paths()
	if len(p["/moved"]) > 0 {
		t.Fatalf("the 302 was followed: %+v", p["/moved"])
	}
	retry := e.notifications(tide.StateRetry)
	if len(retry) != 1 || retry[0].Retried != 1 ||
		!strings.Contains(retry[0].LastErr, `status 302 Found to "`+srv.URL+`/moved", not followed: only 307 and 308`) ||
		strings.Contains(retry[0].LastErr, "SECRET") {
		t.Fatalf("notifications waiting to be retried: %+v; want the 302's, retried once", retry)
	}
	if len(p["/302"]) != 1 || len(p["/307"]) != 1 || len(p["/landed"]) != 1 {
		t.Fatalf("requests: %+v", p)
	}
	for _, h := range []hit{p["/307"][0], p["/landed"][0]} {
		if h.method != http.MethodPost || !strings.Contains(h.body, `"task_id"`) {
			t.Errorf("%s got %s %q, want the notification's POST", h.path, h.method, h.body)
		}
		if err := webhook.Verify([]byte(secret), h.sig, []byte(h.body), time.Minute); err != nil {
			t.Errorf("%s: the signature does not verify: %v", h.path, err)
		}
	}
}

// With Config.NotifyAllowedHosts a notification to another host is
// archived at once, and an invalid entry fails Start.
func TestNotifyAllowedHosts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv, hits := notifyRecorder(t, nil)
	e.server(tide.Config{NotifyAllowPrivate: true, NotifyAllowedHosts: []string{"hooks.example.test"}, RetryDelayFunc: notifyFailuresWait}, succeed)
	enqueueNotified(t, e, srv.URL+"/hook")
	testwait.For(t, 20*time.Second, "the notification archived, or delivered", func() bool {
		return len(hits()) > 0 || len(e.notifications(tide.StateArchived)) == 1
	})
	if h := hits(); len(h) > 0 {
		t.Fatalf("a notification reached a host outside NotifyAllowedHosts: %+v", h)
	}
	ti := e.notifications(tide.StateArchived)[0]
	if want := `host "` + strings.TrimPrefix(srv.URL, "http://") + `" is not in Config.NotifyAllowedHosts`; ti.Retried != 0 || !strings.Contains(ti.LastErr, want) {
		t.Errorf("retried %d, error %q; want 0 and %q", ti.Retried, ti.LastErr, want)
	}

	err := tide.NewServer(e.broker(), tide.Config{NotifyAllowedHosts: []string{"https://hooks.example.test/"}}).Start(succeed)
	if !errors.Is(err, tide.ErrInvalidConfig) || !strings.Contains(err.Error(), `NotifyAllowedHosts entry "https://hooks.example.test/"`) {
		t.Errorf("Start with a URL in NotifyAllowedHosts: %v, want ErrInvalidConfig naming the entry", err)
	}
}

// The error of a failed notification never holds the URL's query or
// credentials: not for a status, nor for a network error.
func TestNotifyErrorIsRedacted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv, _ := notifyRecorder(t, map[string]http.HandlerFunc{
		"/p": func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusInternalServerError) },
	})
	e.server(tide.Config{NotifyAllowPrivate: true, RetryDelayFunc: notifyFailuresWait}, succeed)
	host := strings.TrimPrefix(srv.URL, "http://")
	want := map[string]string{
		"http://user:pa55@" + host + "/p?token=SECRET": "tide: notification to http://" + host + "/p: status 500 Internal Server Error: \"down\"",
		// TLS to a plain-HTTP server: a network error.
		"https://user:pa55@" + host + "/p?token=SECRET": "tide: notification to https://" + host + "/p: ",
	}
	for u := range want {
		enqueueNotified(t, e, u)
	}
	testwait.For(t, 20*time.Second, "both notifications to fail", func() bool {
		return len(e.notifications(tide.StateRetry)) == 2
	})
	got := map[string]string{}
	for _, ti := range e.notifications(tide.StateRetry) {
		scheme, _, _ := strings.Cut(ti.LastErr[len("tide: notification to "):], ":")
		got[scheme] = ti.LastErr
		if strings.Contains(ti.LastErr, "SECRET") || strings.Contains(ti.LastErr, "pa55") {
			t.Errorf("the error holds the URL's query or credentials: %q", ti.LastErr)
		}
	}
	for u, w := range want {
		scheme, _, _ := strings.Cut(u, ":")
		if !strings.HasPrefix(got[scheme], w) {
			t.Errorf("error of the notification to %s: %q, want it to start with %q", scheme, got[scheme], w)
		}
	}
}
