package dashboard

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
)

const testReadToken = "read-token-for-tests-9876543210"

// newBrokerlessInspector returns an Inspector of a Redis that is not
// there, for tests that never reach the broker.
func newBrokerlessInspector(t *testing.T) *tide.Inspector {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return tide.NewInspector(redisbroker.New(rdb))
}

func TestClientKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.1:1234", "192.0.2.1"},
		{"192.0.2.1:9", "192.0.2.1"},
		{"[::ffff:192.0.2.1]:1234", "192.0.2.1"},
		// One IPv6 host usually has a whole /64: it is one client.
		{"[2001:db8:1:2::1]:5", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff:ffff:ffff:ffff]:6", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:5", "2001:db8:1:3::/64"},
		{"[fe80::1%eth0]:80", "fe80::/64"},
		{"[::1]:80", "::/64"},
		{"192.0.2.1", "192.0.2.1"}, // no port
		{"@", "@"},                 // a unix socket
		{"", ""},
		{strings.Repeat("x", 500), strings.Repeat("x", maxClientKey)},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.remote
		if got := clientKey(r); got != tc.want {
			t.Errorf("clientKey(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}

// TestLimiter checks the windows, the expiry and the eviction order of the
// limiter on a fake clock.
func TestLimiter(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		client string
		at     time.Duration // after t0
		fails  int           // want
		reset  time.Duration // want, after t0
	}
	for _, tc := range []struct {
		name    string
		max     int
		steps   []step
		clients int // tracked at the end
	}{
		{"counts per client", 0, []step{
			{"a", 0, 1, loginWindow}, {"a", time.Second, 2, loginWindow},
			{"b", 2 * time.Second, 1, 2*time.Second + loginWindow}, {"a", 3 * time.Second, 3, loginWindow},
		}, 2},
		{"a new window starts over", 0, []step{
			{"a", 0, 1, loginWindow}, {"a", loginWindow - 1, 2, loginWindow},
			{"a", loginWindow, 1, 2 * loginWindow},
		}, 1},
		{"the count stops just past the budget", 0, func() []step {
			var s []step
			for i := range loginFailures + 5 {
				s = append(s, step{"a", time.Duration(i), min(i+1, loginFailures+2), loginWindow})
			}
			return s
		}(), 1},
		{"ended windows are forgotten", 0, []step{
			{"a", 0, 1, loginWindow}, {"b", 2 * time.Second, 1, 2*time.Second + loginWindow},
			{"c", time.Second + loginWindow, 1, time.Second + 2*loginWindow},
		}, 2}, // b and c: a's window has ended
		{"the least recently failed is evicted", 2, []step{
			{"a", 0, 1, loginWindow}, {"b", 1, 1, loginWindow + 1},
			{"a", 2, 2, loginWindow},     // a is now the most recent
			{"c", 3, 1, loginWindow + 3}, // evicts b
			{"a", 4, 3, loginWindow},     // a was kept
			{"b", 5, 1, loginWindow + 5}, // b starts over; evicts c
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := &limiter{max: tc.max}
			for i, s := range tc.steps {
				fails, reset := l.fail(s.client, t0.Add(s.at))
				if fails != s.fails || !reset.Equal(t0.Add(s.reset)) {
					t.Errorf("step %d (%s at %v): fails %d, reset +%v; want %d, +%v",
						i, s.client, s.at, fails, reset.Sub(t0), s.fails, s.reset)
				}
			}
			if n := l.clients(); n != tc.clients {
				t.Errorf("%d clients tracked, want %d", n, tc.clients)
			}
		})
	}
}

// TestLimiterMemoryBounded sends one wrong bearer token from each of
// 100,000 addresses: the limiter never tracks more than maxClients of them,
// still limits a new attacker, and the operator still gets in.
func TestLimiterMemoryBounded(t *testing.T) {
	t.Parallel()
	// The requests are refused before the broker is asked, and a logger
	// that drops everything keeps 100,000 warnings cheap.
	hh, err := New(newBrokerlessInspector(t), Options{Token: testToken, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := hh.(*handler)
	const attackers = 100_000
	addr := func(i int) string { return fmt.Sprintf("10.%d.%d.%d:4321", i>>16&255, i>>8&255, i&255) }
	send := func(remote, hdr, val, method, path, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(hdr, val)
		req.Host = "localhost"
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	guess := func(remote string) int {
		return send(remote, "Authorization", "Bearer wrong-guess", http.MethodPost, "/queue/pause", "q=default")
	}

	const workers = 4
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		most    int
		badCode int
	)
	for w := range workers {
		wg.Go(func() {
			localMost := 0
			for i := w; i < attackers; i += workers {
				if code := guess(addr(i)); code != http.StatusUnauthorized {
					mu.Lock()
					badCode = code
					mu.Unlock()
				}
				localMost = max(localMost, h.auth.lim.clients())
			}
			mu.Lock()
			most = max(most, localMost)
			mu.Unlock()
		})
	}
	wg.Wait()
	if badCode != 0 {
		t.Errorf("a first wrong token from a fresh address got %d, want 401", badCode)
	}
	if most != maxClients {
		t.Errorf("the limiter tracked up to %d clients, want to fill up to its cap of %d and no more", most, maxClients)
	}
	if n := h.auth.lim.clients(); n > maxClients {
		t.Errorf("the limiter tracks %d clients, want at most %d", n, maxClients)
	}
	// With the limiter full, a new attacker is still counted: its budget
	// runs out.
	const late = "192.0.2.100:1"
	for i := range loginFailures {
		if code := guess(late); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d within the budget: %d, want 401", i+1, code)
		}
	}
	if code := guess(late); code != http.StatusTooManyRequests {
		t.Errorf("wrong token past the budget: %d, want 429", code)
	}
	if n := h.auth.lim.clients(); n > maxClients {
		t.Errorf("the limiter tracks %d clients, want at most %d", n, maxClients)
	}
	// Neither that address nor a fresh one is locked out.
	form := "token=" + url.QueryEscape(testToken)
	for _, remote := range []string{late, "192.0.2.200:1"} {
		if code := send(remote, "Sec-Fetch-Site", "same-origin", http.MethodPost, "/login", form); code != http.StatusSeeOther {
			t.Errorf("login from %s with the right token: %d, want 303", remote, code)
		}
	}
}

// TestLoginLimitPerClient: an attacker who exhausts the budget of its
// address locks out neither another address nor its own address's right
// token, whichever way it guesses.
func TestLoginLimitPerClient(t *testing.T) {
	t.Parallel()
	const (
		attacker = "203.0.113.7:40000"
		other    = "198.51.100.9:50000"
	)
	loginForm := func(e *env, remote, tok string) (*http.Response, string) {
		hdr := e.browser()
		hdr[remoteHeader] = remote
		return e.do(http.MethodPost, "/login", url.Values{"token": {tok}}, hdr)
	}
	for _, tc := range []struct {
		name  string
		try   func(e *env, remote, tok string) (*http.Response, string)
		right string // the token that gets in
		ok    int    // its status
	}{
		{"login form, admin token", loginForm, testToken, http.StatusSeeOther},
		{"login form, read token", loginForm, testReadToken, http.StatusSeeOther},
		{"bearer change", func(e *env, remote, tok string) (*http.Response, string) {
			return e.do(http.MethodPost, "/queue/pause", url.Values{"q": {"default"}},
				map[string]string{"Authorization": "Bearer " + tok, remoteHeader: remote})
		}, testToken, http.StatusOK},
		{"bearer read", func(e *env, remote, tok string) (*http.Response, string) {
			return e.do(http.MethodGet, "/servers", nil, map[string]string{"Authorization": "Bearer " + tok, remoteHeader: remote})
		}, testReadToken, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvOpts(t, Options{Token: testToken, ReadToken: testReadToken})
			for i := range loginFailures {
				resp, body := tc.try(e, attacker, fmt.Sprint("guess-", i))
				wantStatus(t, resp, body, http.StatusUnauthorized)
			}
			steps := []struct {
				what, remote, tok string
				want              int
			}{
				{"the attacker's next guess", attacker, "guess-again", http.StatusTooManyRequests},
				{"the right token from another address", other, tc.right, tc.ok},
				{"a wrong token from another address", other, "typo", http.StatusUnauthorized},
				{"the right token from the attacker's address", attacker, tc.right, tc.ok},
				{"the attacker's guess after that", attacker, "guess-more", http.StatusTooManyRequests},
			}
			for _, s := range steps {
				resp, body := tc.try(e, s.remote, s.tok)
				if resp.StatusCode != s.want {
					t.Errorf("%s: status %d, want %d; body:\n%s", s.what, resp.StatusCode, s.want, body)
				}
			}
		})
	}
}
