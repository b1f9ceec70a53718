package outbound

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func newSender(t *testing.T, cfg Config) *Sender {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.CloseIdleConnections)
	return s
}

// Without a secret nothing is signed; without a host list any host is
// allowed (here a private one, with the opt-in).
func TestSendUnsignedToAnyHost(t *testing.T) {
	t.Parallel()
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	s := newSender(t, Config{AllowPrivate: true})
	resp, err := s.Send(context.Background(), Request{Method: http.MethodPost, URL: mustURL(t, srv.URL+"/x"), Header: http.Header{"X-A": {"1"}}, Body: []byte("b")})
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("Send = %+v, %v", resp, err)
	}
	h := <-got
	if h.Get(SignatureHeader) != "" || h.Get("X-A") != "1" {
		t.Errorf("headers %v: want X-A and no signature", h)
	}
}

// The private-address refusal names the caller's opt-in, and the hosts
// refusal the caller's list.
func TestSendRefusals(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a refused request arrived: %s %s", r.Method, r.URL)
	}))
	t.Cleanup(srv.Close)
	hosts, err := ParseHosts("Hosts", []string{"hooks.example.test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg  Config
		url  string
		want string
	}{
		{Config{Settings: Settings{Private: "Config.Opt"}}, srv.URL, "is not public (loopback, private, link-local or reserved); set Config.Opt to allow it"},
		{Config{Settings: Settings{Private: "Config.Opt"}}, strings.Replace(srv.URL, "127.0.0.1", "localhost", 1), "is not public"},
		{Config{AllowPrivate: true, Hosts: hosts, Settings: Settings{Hosts: "Config.List"}}, srv.URL, `host "127.0.0.1:`},
		{Config{AllowPrivate: true}, "ftp://127.0.0.1/x", `scheme "ftp" is not allowed`},
	} {
		s := newSender(t, c.cfg)
		_, err := s.Send(context.Background(), Request{Method: http.MethodPost, URL: mustURL(t, c.url)})
		var oe *Error
		if !errors.As(err, &oe) || !oe.Permanent || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Send(%s) = %v, want a permanent *Error containing %q", c.url, err, c.want)
		}
	}
}

// No error holds the URL's query or credentials, nor a redirect's.
func TestSendErrorsAreRedacted(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	badLoc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Location"] = []string{"http://[bad/x?token=SECRET-2"}
		w.WriteHeader(http.StatusTemporaryRedirect)
	}))
	t.Cleanup(badLoc.Close)
	stop := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(stop) })
	// The timeout case has its own short timeout; the others a long one,
	// so that a loaded machine (a refused dial is immediate, but the
	// process may not run for a while) does not turn them into timeouts.
	short := newSender(t, Config{AllowPrivate: true, Timeout: 200 * time.Millisecond, Settings: Settings{Timeout: "T"}})
	long := newSender(t, Config{AllowPrivate: true, Timeout: time.Minute, Settings: Settings{Timeout: "T"}})
	for raw, tc := range map[string]struct {
		s    *Sender
		want string
	}{
		"http://user:pa55@" + closed + "/p?token=SECRET-1": {long, "connection refused"},
		badLoc.URL + "/p?token=SECRET-1":                   {long, "the Location header of a redirect does not parse"},
		slow.URL + "/p?token=SECRET-1":                     {short, "no response within 200ms (T)"},
	} {
		s, want := tc.s, tc.want
		_, err := s.Send(context.Background(), Request{Method: http.MethodPost, URL: mustURL(t, raw), Body: []byte("x")})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Send(%s) = %v, want an error containing %q", raw, err, want)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "SECRET") || strings.Contains(msg, "pa55") {
			t.Errorf("Send(%s): error %q holds a secret", raw, msg)
		}
	}
}

// A 307 is followed with the method and body and signed again; a 302 is
// returned as it is, with its Location redacted.
func TestSendRedirects(t *testing.T) {
	t.Parallel()
	type hit struct {
		method, path, body, sig string
	}
	hits := make(chan hit, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hits <- hit{r.Method, r.URL.Path, string(b), r.Header.Get(SignatureHeader)}
		switch r.URL.Path {
		case "/307":
			w.Header().Set("Location", "/landed")
			w.WriteHeader(http.StatusTemporaryRedirect)
		case "/302":
			w.Header().Set("Location", "/moved?sig=SECRET")
			w.WriteHeader(http.StatusFound)
		}
	}))
	t.Cleanup(srv.Close)
	secret := []byte("0123456789abcdef")
	clock := time.Unix(1_700_000_000, 0)
	s := newSender(t, Config{AllowPrivate: true, Secret: secret, Now: func() time.Time { clock = clock.Add(time.Second); return clock }})

	resp, err := s.Send(context.Background(), Request{Method: http.MethodPut, URL: mustURL(t, srv.URL+"/307"), Body: []byte("body")})
	if err != nil || resp.StatusCode != http.StatusOK || resp.Redirects != 1 {
		t.Fatalf("Send(307) = %+v, %v", resp, err)
	}
	first, second := <-hits, <-hits
	if second.method != http.MethodPut || second.path != "/landed" || second.body != "body" || first.sig == second.sig {
		t.Errorf("hops %+v, %+v: want the PUT and its body again, signed again", first, second)
	}
	for _, h := range []hit{first, second} {
		if err := VerifyAt(secret, h.sig, []byte(h.body), time.Minute, clock); err != nil {
			t.Errorf("hop %s: %v", h.path, err)
		}
	}

	resp, err = s.Send(context.Background(), Request{Method: http.MethodPost, URL: mustURL(t, srv.URL+"/302"), Body: []byte("body")})
	if err != nil || resp.StatusCode != http.StatusFound || resp.Redirects != 0 ||
		resp.Location != srv.URL+"/moved" || !strings.Contains(resp.NotFollowed, "only 307 and 308") || resp.Refused {
		t.Fatalf("Send(302) = %+v, %v", resp, err)
	}
	if h := <-hits; h.path != "/302" || len(hits) != 0 {
		t.Errorf("the 302 was followed: %+v, %d more", h, len(hits))
	}
}
