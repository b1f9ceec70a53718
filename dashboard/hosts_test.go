package dashboard

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestHostCheck sends requests with forged Host headers, as a browser
// does after DNS rebinding: only localhost, IP addresses and the allowed
// hosts are served.
func TestHostCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		allowed []string
		ok      []string // Host headers served
		refused []string // Host headers answered 421
	}{
		{"default", nil,
			[]string{"localhost", "localhost:8080", "LocalHost.:8080", "127.0.0.1", "127.0.0.1:8080", "10.1.2.3:80",
				"[::1]:8080", "[::1]", "[2001:db8::7]:443"},
			[]string{"attacker.example", "attacker.example:8080", "rebind.attacker.example:8080",
				"localhost.attacker.example", "127.0.0.1.nip.io:8080", "tide.example.com", "localhost:abc",
				"localhost:0", "[::1", "[nope]:80", "127.0.0.1:99999"}},
		{"allowed hosts", []string{"tide.example.com", "Ops.Example.:8443"},
			[]string{"tide.example.com", "tide.example.com:8080", "TIDE.Example.COM.", "ops.example:8443",
				"localhost:8080", "127.0.0.1:8080", "[::1]:8080"},
			[]string{"ops.example", "ops.example:8444", "evil.example", "sub.tide.example.com",
				"tide.example.com.evil.example", "example.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvOpts(t, Options{Token: testToken, AllowedHosts: tc.allowed})
			get := func(host, path string) (*http.Response, string) {
				return e.do(http.MethodGet, path, nil, map[string]string{"Host": host})
			}
			for _, host := range tc.ok {
				for _, path := range []string{"/", "/login", "/static/style.css"} {
					resp, body := get(host, path)
					if resp.StatusCode != http.StatusOK {
						t.Errorf("Host %q, GET %s: status %d, want 200; body:\n%s", host, path, resp.StatusCode, body)
					}
				}
			}
			for _, host := range tc.refused {
				for _, path := range []string{"/", "/queue?q=default", "/login", "/static/app.js", "/no/such/page"} {
					resp, body := get(host, path)
					if resp.StatusCode != http.StatusMisdirectedRequest {
						t.Errorf("Host %q, GET %s: status %d, want 421; body:\n%s", host, path, resp.StatusCode, body)
						continue
					}
					if !strings.Contains(body, "does not answer to host") || !strings.Contains(body, "AllowedHosts") {
						t.Errorf("Host %q: 421 without a clear message:\n%s", host, body)
					}
					if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
						t.Errorf("Host %q: 421 Content-Type %q, want text/plain", host, ct)
					}
				}
				// Not even the token gets a change through.
				resp, body := e.do(http.MethodPost, "/queue/pause", url.Values{"q": {"default"}},
					map[string]string{"Host": host, "Authorization": "Bearer " + testToken})
				if resp.StatusCode != http.StatusMisdirectedRequest {
					t.Errorf("Host %q, bearer pause: status %d, want 421; body:\n%s", host, resp.StatusCode, body)
				}
				resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {testToken}},
					map[string]string{"Host": host, "Sec-Fetch-Site": "same-origin"})
				if resp.StatusCode != http.StatusMisdirectedRequest || cookieNamed(resp, sessionCookie) != nil {
					t.Errorf("Host %q, login: status %d (cookie %v), want 421 and no cookie; body:\n%s",
						host, resp.StatusCode, cookieNamed(resp, sessionCookie), body)
				}
			}
			qi, err := e.in.QueueInfo(e.ctx(), "default")
			if err == nil && qi.Paused {
				t.Error("a request for a refused host paused the queue")
			}
		})
	}
}

func TestHostSetAllows(t *testing.T) {
	t.Parallel()
	s, err := newHostSet([]string{"tide.example.com", "ops.example:8443", "[2001:db8::1]:80", "internal_name"})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"":                      true, // HTTP/1.0 without Host
		"localhost":             true,
		"127.0.0.1":             true,
		"::1":                   true, // an IPv6 literal without brackets has no port
		"[::1]:1":               true,
		"[::ffff:127.0.0.1]:80": true,
		"tide.example.com:1":    true,
		"tide.example.com.":     true,
		"ops.example:8443":      true,
		"internal_name:80":      true,
		"ops.example:08443":     true,
		"ops.example":           false,
		"ops.example:443":       false,
		"tide.example.com:":     false,
		"tide.example.com:x":    false,
		"attacker.example":      false,
		"localhost.":            true,
		".":                     false,
		"[::1]x":                false,
		"[::1]:":                false,
		"a:b:c":                 false,
		"127.0.0.1:65536":       false,
	} {
		if got := s.allows(host); got != want {
			t.Errorf("allows(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestAllowedHostsInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hosts []string
		ok    bool
	}{
		{[]string{"tide.example.com", "tide.example.com:8443", "Upper.Example.", "10.0.0.1", "[::1]:80", "a-b_c.d"}, true},
		{[]string{""}, false},
		{[]string{"*"}, false},
		{[]string{"*.example.com"}, false},
		{[]string{"http://tide.example.com"}, false},
		{[]string{"tide.example.com/"}, false},
		{[]string{"tide example"}, false},
		{[]string{" tide.example.com"}, false},
		{[]string{"tide.example.com:0"}, false},
		{[]string{"tide.example.com:99999"}, false},
		{[]string{"tide.example.com:https"}, false},
		{[]string{"[::1"}, false},
		{[]string{"a..b"}, false},
		{[]string{"täst.example"}, false},
		{[]string{"user@tide.example.com"}, false},
		{[]string{"ok.example", "bad/one"}, false},
	} {
		_, err := New(newBrokerlessInspector(t), Options{AllowedHosts: tc.hosts, Logger: testLogger(t)})
		if (err == nil) != tc.ok {
			t.Errorf("New(AllowedHosts %q): error %v, want ok %v", tc.hosts, err, tc.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "tide/dashboard: AllowedHosts: ") {
			t.Errorf("error %q lacks the prefix", err)
		}
	}
}

// HostCheck guards another handler with the dashboard's check.
func TestHostCheckHandler(t *testing.T) {
	t.Parallel()
	h, err := HostCheck([]string{"tide.example.com:9090"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("metrics"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]int{
		"":                           http.StatusOK,
		"localhost:9090":             http.StatusOK,
		"127.0.0.1:9090":             http.StatusOK,
		"[::1]:9090":                 http.StatusOK,
		"tide.example.com:9090":      http.StatusOK,
		"tide.example.com:9091":      http.StatusMisdirectedRequest,
		"attacker.example:9090":      http.StatusMisdirectedRequest,
		"localhost.attacker.example": http.StatusMisdirectedRequest,
	} {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Host %q: %d, want %d", host, w.Code, want)
		}
		if body := w.Body.String(); want == http.StatusOK && body != "metrics" ||
			want != http.StatusOK && (!strings.Contains(body, "does not answer to host") || strings.Contains(body, "metrics")) {
			t.Errorf("Host %q: body %q", host, body)
		}
	}
	if _, err := HostCheck([]string{"bad host"}, http.NotFoundHandler()); err == nil || !strings.Contains(err.Error(), `"bad host"`) {
		t.Errorf("a bad entry: %v", err)
	}
}
