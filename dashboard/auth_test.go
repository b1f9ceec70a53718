package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

func TestReadOnlyRefusesMutations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ti := e.enqueue("email:send", []byte("hi"), tide.ProcessIn(time.Hour))

	resp, body := e.get("/queue?q=default&state=scheduled")
	wantStatus(t, resp, body, http.StatusOK)
	if strings.Contains(body, "<form") || strings.Contains(body, `name="csrf"`) {
		t.Errorf("read-only page has forms:\n%s", body)
	}
	if !strings.Contains(body, "read-only") || strings.Contains(body, `id="login-link"`) {
		t.Error("read-only page should say so and offer no login")
	}
	_, body = e.get("/")
	if strings.Contains(body, "<form") {
		t.Error("read-only overview has forms")
	}

	form := url.Values{"q": {"default"}, "id": {ti.ID}}
	for _, path := range []string{"/task/run", "/task/archive", "/task/delete", "/queue/pause"} {
		resp, body := e.do(http.MethodPost, path, form, e.browser())
		wantStatus(t, resp, body, http.StatusForbidden)
		// Even a bearer "token" cannot change anything.
		resp, body = e.do(http.MethodPost, path, form, map[string]string{"Authorization": "Bearer "})
		wantStatus(t, resp, body, http.StatusForbidden)
	}
	resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {""}}, e.browser())
	wantStatus(t, resp, body, http.StatusForbidden)
	if cookieNamed(resp, sessionCookie) != nil {
		t.Error("read-only login set a session cookie")
	}
	if st := e.state("default", ti.ID); st != tide.StateScheduled {
		t.Errorf("state %v after refused mutations, want scheduled", st)
	}
	qi, err := e.in.QueueInfo(e.ctx(), "default")
	if err != nil || qi.Paused {
		t.Errorf("queue paused by a read-only dashboard: %+v %v", qi, err)
	}
}

func TestLogin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)

	resp, body := e.get("/login")
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, `id="token"`) {
		t.Error("login page has no token field")
	}

	resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {"wrong"}}, e.browser())
	wantStatus(t, resp, body, http.StatusUnauthorized)
	if cookieNamed(resp, sessionCookie) != nil {
		t.Error("wrong token got a session cookie")
	}
	if !strings.Contains(body, "Wrong token") {
		t.Error("wrong token: no message")
	}
	// A prefix of the token is wrong too.
	resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {testToken[:10]}}, e.browser())
	wantStatus(t, resp, body, http.StatusUnauthorized)

	// A cross-origin login form is refused.
	resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {testToken}},
		map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
	wantStatus(t, resp, body, http.StatusForbidden)

	resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {testToken}, "next": {"/servers"}}, e.browser())
	wantStatus(t, resp, body, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/servers" {
		t.Errorf("Location %q, want /servers", loc)
	}
	c := cookieNamed(resp, sessionCookie)
	if c == nil || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.MaxAge <= 0 {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/", c)
	}
	if strings.Contains(c.Value, testToken) {
		t.Error("the session cookie contains the token")
	}
	// Open redirects are not followed.
	for _, next := range []string{"//evil.example/", "https://evil.example/", "/\\evil.example"} {
		resp, _ := e.do(http.MethodPost, "/login", url.Values{"token": {testToken}, "next": {next}}, e.browser())
		if loc := resp.Header.Get("Location"); loc != "/" {
			t.Errorf("next %q: Location %q, want /", next, loc)
		}
	}

	// Logged in: the page shows a CSRF token and a logout button.
	resp, body = e.get("/servers", c)
	wantStatus(t, resp, body, http.StatusOK)
	if !csrfMeta.MatchString(body) || !strings.Contains(body, `id="logout-btn"`) {
		t.Error("logged-in page has no CSRF token or logout button")
	}
	// A tampered cookie is no session.
	bad := *c
	bad.Value = c.Value[:len(c.Value)-2] + "AA"
	_, body = e.get("/servers", &bad)
	if csrfMeta.MatchString(body) {
		t.Error("a tampered session cookie was accepted")
	}
	// Logging out clears the cookie.
	resp, body = e.do(http.MethodPost, "/logout", url.Values{}, e.browser(), c)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if lc := cookieNamed(resp, sessionCookie); lc == nil || lc.MaxAge >= 0 {
		t.Errorf("logout cookie %+v, want deletion", lc)
	}
}

func TestLoginRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	for i := range loginFailures {
		resp, body := e.do(http.MethodPost, "/login", url.Values{"token": {fmt.Sprint("guess", i)}}, e.browser())
		wantStatus(t, resp, body, http.StatusUnauthorized)
	}
	resp, body := e.do(http.MethodPost, "/login", url.Values{"token": {testToken}}, e.browser())
	wantStatus(t, resp, body, http.StatusTooManyRequests)
	resp, body = e.do(http.MethodPost, "/task/run", url.Values{"q": {"default"}, "id": {"x"}},
		map[string]string{"Authorization": "Bearer " + testToken})
	wantStatus(t, resp, body, http.StatusTooManyRequests)
}

func TestMutationNeedsCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	ti := e.enqueue("email:send", []byte("hi"), tide.ProcessIn(time.Hour))
	form := func() url.Values { return url.Values{"q": {"default"}, "id": {ti.ID}} }
	session := e.login()
	csrf := e.csrf(session)

	// No session at all.
	resp, body := e.post("/task/run", form(), nil, csrf)
	wantStatus(t, resp, body, http.StatusForbidden)
	// No CSRF token.
	resp, body = e.post("/task/run", form(), session, "")
	wantStatus(t, resp, body, http.StatusForbidden)
	// A wrong one.
	resp, body = e.post("/task/run", form(), session, "AAAA"+csrf[4:])
	wantStatus(t, resp, body, http.StatusForbidden)
	// Another session's token.
	other := e.login()
	resp, body = e.post("/task/run", form(), session, e.csrf(other))
	wantStatus(t, resp, body, http.StatusForbidden)
	// The right token from another origin.
	f := form()
	f.Set("csrf", csrf)
	for _, hdr := range []map[string]string{
		{"Origin": "http://evil.example"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Referer": "http://evil.example/page"},
	} {
		resp, body = e.do(http.MethodPost, "/task/run", f, hdr, session)
		wantStatus(t, resp, body, http.StatusForbidden)
	}
	// Mutations are POST only.
	resp, body = e.get("/task/run?q=default&id="+url.QueryEscape(ti.ID)+"&csrf="+url.QueryEscape(csrf), session)
	wantStatus(t, resp, body, http.StatusMethodNotAllowed)
	if st := e.state("default", ti.ID); st != tide.StateScheduled {
		t.Fatalf("state %v after refused requests, want scheduled", st)
	}

	// With the token it works, and the page says so.
	f = form()
	f.Set("return", "/queue?q=default&state=scheduled")
	resp, body = e.post("/task/run", f, session, csrf)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/queue?q=default&state=scheduled" {
		t.Errorf("Location %q", loc)
	}
	if st := e.state("default", ti.ID); st != tide.StatePending {
		t.Errorf("state %v after run, want pending", st)
	}
	_, body = e.get("/queue?q=default&state=scheduled", session, cookieNamed(resp, flashCookie))
	if want := "Task " + ti.ID + " is now pending."; !strings.Contains(body, want) {
		t.Errorf("page lacks the flash %q", want)
	}
}

func TestBearer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	ti := e.enqueue("a", []byte("1"))
	form := url.Values{"q": {"default"}, "id": {ti.ID}}

	resp, body := e.do(http.MethodPost, "/task/archive", form, map[string]string{"Authorization": "Bearer nope"})
	wantStatus(t, resp, body, http.StatusUnauthorized)
	if resp.Header.Get("WWW-Authenticate") == "" {
		t.Error("401 without WWW-Authenticate")
	}
	resp, body = e.do(http.MethodPost, "/task/archive", form, map[string]string{"Authorization": "Basic " + testToken})
	wantStatus(t, resp, body, http.StatusUnauthorized)

	resp, body = e.do(http.MethodPost, "/task/archive", form, map[string]string{"Authorization": "Bearer " + testToken})
	wantStatus(t, resp, body, http.StatusOK)
	var out struct {
		OK      bool
		Message string
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || !out.OK {
		t.Fatalf("bearer answer %q: %v", body, err)
	}
	if st := e.state("default", ti.ID); st != tide.StateArchived {
		t.Errorf("state %v, want archived", st)
	}
	resp, body = e.do(http.MethodPost, "/task/archive", form, map[string]string{"Authorization": "Bearer " + testToken})
	wantStatus(t, resp, body, http.StatusConflict)
	if !strings.Contains(body, `"ok":false`) {
		t.Errorf("bearer error answer %q", body)
	}
}
