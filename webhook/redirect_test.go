package webhook

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/outbound"
)

// redirector is a receiver that answers every request with status and, when
// loc is not empty, a Location header.
func redirector(t *testing.T, status int, loc string) *receiver {
	t.Helper()
	r := newReceiver(t, status)
	if loc != "" {
		r.header.Set("Location", loc)
	}
	return r
}

// tickClock is a fake clock for signatures: each reading is one second
// after the previous one.
type tickClock struct {
	mu   sync.Mutex
	next time.Time
}

func (c *tickClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.next
	c.next = c.next.Add(time.Second)
	return t
}

// signedAt returns the t= of a Tide-Signature header, -1 when there is none.
func signedAt(header string) int64 {
	for part := range strings.SplitSeq(header, ",") {
		if v, ok := strings.CutPrefix(part, "t="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// onlyPOSTs fails the test if any receiver got something else than the
// task's POST (net/http turns a POST into a GET on 301, 302 and 303).
func onlyPOSTs(t *testing.T, rs ...*receiver) {
	t.Helper()
	for _, r := range rs {
		for _, req := range r.requests() {
			if req.method != http.MethodPost {
				t.Errorf("%s got a %s %s (signature header %q)", r.URL, req.method, req.path, req.header.Get(SignatureHeader))
			}
		}
	}
}

func TestRedirectNotFollowedIsRetried(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status   int
		location bool
		want     []string
	}{
		{http.StatusMovedPermanently, true, []string{"status 301 Moved Permanently to ", "only 307 and 308 redirects are followed"}},
		{http.StatusFound, true, []string{"status 302 Found to ", "only 307 and 308 redirects are followed"}},
		{http.StatusSeeOther, true, []string{"status 303 See Other to ", "only 307 and 308 redirects are followed"}},
		{http.StatusTemporaryRedirect, false, []string{"status 307 Temporary Redirect without a Location header"}},
		{http.StatusPermanentRedirect, false, []string{"status 308 Permanent Redirect without a Location header"}},
	}
	for _, c := range cases {
		t.Run(strconv.Itoa(c.status), func(t *testing.T) {
			t.Parallel()
			target := newReceiver(t)
			var loc, wantLoc string
			if c.location {
				loc = target.URL + "/landed?token=s3cr3t"
				wantLoc = target.URL + "/landed"
			}
			redir := redirector(t, c.status, loc)
			h := testHandler(t, Config{AllowedHosts: []string{"127.0.0.1"}})
			body := []byte(`{"order":42}`)
			err := h.ProcessTask(context.Background(), task(t, Payload{URL: redir.URL + "/hook", Body: body}))

			var se *StatusError
			if !errors.As(err, &se) || se.StatusCode != c.status {
				t.Fatalf("err = %v, want a *StatusError with status %d", err, c.status)
			}
			if errors.Is(err, tide.SkipRetry) || se.Permanent {
				t.Errorf("err = %v wraps SkipRetry; a redirect that is not followed must be retried", err)
			}
			if se.Location != wantLoc {
				t.Errorf("Location = %q, want %q", se.Location, wantLoc)
			}
			msg := err.Error()
			want := c.want
			if wantLoc != "" {
				want = append(want, strconv.Quote(wantLoc))
			}
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			if strings.Contains(msg, "s3cr3t") {
				t.Errorf("message %q shows the Location's query", msg)
			}
			if n := len(target.requests()); n != 0 {
				t.Errorf("the redirect target got %d requests, want none", n)
			}
			reqs := redir.requests()
			if len(reqs) != 1 || string(reqs[0].body) != string(body) || reqs[0].verify != nil {
				t.Errorf("the receiver got %+v, want the one signed POST", reqs)
			}
			onlyPOSTs(t, redir, target)
		})
	}
}

func TestRedirect307And308AreFollowed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		status  int
		headers map[string]string
		referer string // what the target must see
	}{
		{"307", http.StatusTemporaryRedirect, nil, ""},
		{"308", http.StatusPermanentRedirect, nil, ""},
		{"307 with the task's Referer", http.StatusTemporaryRedirect, map[string]string{"Referer": "https://app.example/"}, "https://app.example/"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			target := newReceiver(t)
			redir := redirector(t, c.status, target.URL+"/landed")
			clock := &tickClock{next: time.Unix(1_700_000_000, 0)}
			h, err := newHandler(Config{Secret: testSecret, AllowedHosts: []string{"127.0.0.1"}, AllowPrivateNetworks: true}, clock.now)
			if err != nil {
				t.Fatal(err)
			}
			body := []byte(`{"order":42,"status":"paid"}`)
			err = h.ProcessTask(context.Background(), task(t, Payload{
				URL: redir.URL + "/hook?token=s3cr3t", Body: body, Headers: c.headers,
			}))
			if err != nil {
				t.Fatalf("ProcessTask: %v", err)
			}
			first, landed := redir.requests(), target.requests()
			if len(first) != 1 || len(landed) != 1 {
				t.Fatalf("requests: %d to the redirector, %d to the target; want 1 and 1", len(first), len(landed))
			}
			got := landed[0]
			if got.method != http.MethodPost || got.path != "/landed" || string(got.body) != string(body) ||
				got.header.Get("Content-Type") != "application/json" {
				t.Errorf("target got %s %s %q (Content-Type %q), want the POST and its body", got.method, got.path, got.body, got.header.Get("Content-Type"))
			}
			// Each request is signed when it is sent: the first at the
			// clock's first reading, the redirected one at its second.
			sig0, sig1 := first[0].header.Get(SignatureHeader), got.header.Get(SignatureHeader)
			if at := signedAt(sig0); at != 1_700_000_000 {
				t.Errorf("first request signed at %d, want 1700000000", at)
			}
			if at := signedAt(sig1); at != 1_700_000_001 {
				t.Errorf("redirected request signed at %d, want 1700000001 (signed again when sent)", at)
			}
			if err := verifyAt(testSecret, sig1, got.body, time.Minute, time.Unix(1_700_000_001, 0)); err != nil {
				t.Errorf("redirected request's signature: %v", err)
			}
			if ref := got.header.Get("Referer"); ref != c.referer {
				t.Errorf("target got Referer %q, want %q", ref, c.referer)
			}
			for k, v := range got.header {
				if strings.Contains(strings.Join(v, ","), "s3cr3t") {
					t.Errorf("the task URL's query reached the target in %s: %q", k, v)
				}
			}
			onlyPOSTs(t, redir, target)
		})
	}
}

// exceptFor returns a transport that refuses non-public addresses, as the
// handler's own does, except the one address allowed (so that the first
// request reaches an httptest server on 127.0.0.1).
func exceptFor(allowed string) *http.Transport {
	tr := outbound.NewTransport(false, "AllowPrivateNetworks")
	guard := outbound.Guard("AllowPrivateNetworks")
	d := &net.Dialer{Timeout: 10 * time.Second, Control: func(network, address string, c syscall.RawConn) error {
		if address == allowed {
			return nil
		}
		return guard(network, address, c)
	}}
	tr.DialContext = d.DialContext
	return tr
}

func TestRedirectRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// to is where the redirect goes, given the target's port.
		to      func(port string) string
		allowed []string
		guard   bool // refuse non-public addresses but the redirector's
		status  int  // the redirect's status
		// statusErr: the error is a *StatusError for the redirect (the
		// handler refused it); else a refused dial.
		statusErr bool
		want      []string
	}{
		{
			name:      "host not allowed",
			to:        func(port string) string { return "http://localhost:" + port + "/landed" },
			allowed:   []string{"127.0.0.1"},
			status:    http.StatusTemporaryRedirect,
			statusErr: true,
			want:      []string{`status 307 Temporary Redirect to "http://localhost:`, `not followed: host "localhost:`, "is not in AllowedHosts"},
		},
		{
			name:      "scheme not allowed",
			to:        func(string) string { return "ftp://127.0.0.1/landed" },
			allowed:   []string{"127.0.0.1"},
			status:    http.StatusPermanentRedirect,
			statusErr: true,
			want:      []string{`status 308 Permanent Redirect to "ftp://127.0.0.1/landed"`, `scheme "ftp" is not allowed`},
		},
		{
			name:    "private address",
			to:      func(port string) string { return "http://127.0.0.1:" + port + "/landed" },
			allowed: []string{"127.0.0.1"},
			guard:   true,
			status:  http.StatusTemporaryRedirect,
			want:    []string{"after 1 redirect, to http://127.0.0.1:", "address 127.0.0.1 is not public"},
		},
		{
			name:    "allowed name resolving to a private address",
			to:      func(port string) string { return "http://localhost:" + port + "/landed" },
			allowed: []string{"127.0.0.1", "localhost"},
			guard:   true,
			status:  http.StatusPermanentRedirect,
			want:    []string{"after 1 redirect, to http://localhost:", "is not public"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			target := newReceiver(t)
			_, port, _ := net.SplitHostPort(strings.TrimPrefix(target.URL, "http://"))
			redir := redirector(t, c.status, c.to(port))
			cfg := Config{AllowedHosts: c.allowed}
			if c.guard {
				cfg.Client = &http.Client{Transport: exceptFor(strings.TrimPrefix(redir.URL, "http://"))}
			}
			h := testHandler(t, cfg)
			err := h.ProcessTask(context.Background(), task(t, Payload{URL: redir.URL + "/hook", Body: []byte("x")}))
			if !errors.Is(err, tide.SkipRetry) {
				t.Fatalf("err = %v, want SkipRetry (the task is archived)", err)
			}
			var se *StatusError
			if got := errors.As(err, &se); got != c.statusErr || (got && (se.StatusCode != c.status || !se.Permanent)) {
				t.Errorf("err = %#v; want a permanent *StatusError with status %d: %v", err, c.status, c.statusErr)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
			if n := len(redir.requests()); n != 1 {
				t.Errorf("the redirector got %d requests, want 1", n)
			}
			if n := len(target.requests()); n != 0 {
				t.Errorf("the refused target got %d requests", n)
			}
		})
	}
}

func TestRedirectLoopIsBounded(t *testing.T) {
	t.Parallel()
	loop := newReceiver(t, http.StatusTemporaryRedirect)
	loop.header.Set("Location", loop.URL+"/again")
	h := testHandler(t, Config{AllowedHosts: []string{"127.0.0.1"}})
	err := h.ProcessTask(context.Background(), task(t, Payload{URL: loop.URL + "/hook", Body: []byte("x")}))
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("err = %v, want a *StatusError with status 307", err)
	}
	if errors.Is(err, tide.SkipRetry) {
		t.Errorf("err = %v wraps SkipRetry; a redirect loop is retried", err)
	}
	if se.Redirects != outbound.MaxRedirects || se.Location != loop.URL+"/again" {
		t.Errorf("Redirects = %d, Location = %q; want %d and %q", se.Redirects, se.Location, outbound.MaxRedirects, loop.URL+"/again")
	}
	for _, w := range []string{"after 5 redirects to \"" + loop.URL + "/again\"", "not followed: stopped after 5 redirects"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q lacks %q", err, w)
		}
	}
	reqs := loop.requests()
	if len(reqs) != 1+outbound.MaxRedirects {
		t.Errorf("%d requests, want %d (the first and %d redirects)", len(reqs), 1+outbound.MaxRedirects, outbound.MaxRedirects)
	}
	for i, r := range reqs {
		if r.method != http.MethodPost || string(r.body) != "x" || r.verify != nil {
			t.Errorf("request %d: %s %q verify=%v", i, r.method, r.body, r.verify)
		}
	}
}
