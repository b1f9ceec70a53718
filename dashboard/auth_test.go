package dashboard

import (
	"encoding/json"
	"fmt"
	"html/template"
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
	// The search form is a GET form; no form may change anything.
	if strings.Contains(body, `method="post"`) || strings.Contains(body, `name="csrf"`) || strings.Contains(body, `class="sel-box"`) {
		t.Errorf("read-only page has forms:\n%s", body)
	}
	if !strings.Contains(body, "read-only") || strings.Contains(body, `id="login-link"`) {
		t.Error("read-only page should say so and offer no login")
	}
	_, body = e.get("/")
	if strings.Contains(body, `method="post"`) {
		t.Error("read-only overview has forms")
	}

	form := url.Values{"q": {"default"}, "id": {ti.ID}}
	for _, path := range []string{"/task/run", "/task/archive", "/task/delete", "/queue/pause", "/selection/archive"} {
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

// TestLoginRateLimit: past its budget, a client's wrong tokens get 429
// (login form and bearer alike), but its right token still gets in.
func TestLoginRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	for i := range loginFailures {
		resp, body := e.do(http.MethodPost, "/login", url.Values{"token": {fmt.Sprint("guess", i)}}, e.browser())
		wantStatus(t, resp, body, http.StatusUnauthorized)
	}
	resp, body := e.do(http.MethodPost, "/login", url.Values{"token": {"one-more-guess"}}, e.browser())
	wantStatus(t, resp, body, http.StatusTooManyRequests)
	if ra := resp.Header.Get("Retry-After"); ra == "" {
		t.Error("429 without Retry-After")
	}
	resp, body = e.do(http.MethodPost, "/task/run", url.Values{"q": {"default"}, "id": {"x"}},
		map[string]string{"Authorization": "Bearer one-more-guess"})
	wantStatus(t, resp, body, http.StatusTooManyRequests)

	// The right token is never refused: it logs in, and a bearer gets as
	// far as the broker (which has no task x).
	resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {testToken}}, e.browser())
	wantStatus(t, resp, body, http.StatusSeeOther)
	if cookieNamed(resp, sessionCookie) == nil {
		t.Error("the right token got no session cookie")
	}
	resp, body = e.do(http.MethodPost, "/task/run", url.Values{"q": {"default"}, "id": {"x"}},
		map[string]string{"Authorization": "Bearer " + testToken})
	wantStatus(t, resp, body, http.StatusNotFound)
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

// loginWith logs in with tok through the login form and returns the
// session cookie.
func (e *env) loginWith(tok string) *http.Cookie {
	e.t.Helper()
	resp, body := e.do(http.MethodPost, "/login", url.Values{"token": {tok}}, e.browser())
	wantStatus(e.t, resp, body, http.StatusSeeOther)
	c := cookieNamed(resp, sessionCookie)
	if c == nil {
		e.t.Fatal("login: no session cookie")
	}
	return c
}

// TestReadAccess: which credentials see the pages, with and without a read
// token.
func TestReadAccess(t *testing.T) {
	t.Parallel()
	const secret = "payload-only-readers-may-see"
	type cred struct {
		name  string
		auth  string // the Authorization header
		login string // log in with this token first
		forge bool   // relabel the read session as an admin one
		json  bool   // refused with a JSON 401 rather than the login form
	}
	var (
		none        = cred{name: "nothing"}
		wrongBearer = cred{name: "wrong bearer", auth: "Bearer not-a-token", json: true}
		readBearer  = cred{name: "read bearer", auth: "Bearer " + testReadToken}
		adminBearer = cred{name: "admin bearer", auth: "Bearer " + testToken}
		// Only bearer tokens count; an empty one is none.
		basic       = cred{name: "basic auth", auth: "Basic " + testReadToken}
		emptyBearer = cred{name: "empty bearer", auth: "Bearer "}
		readLogin   = cred{name: "read session", login: testReadToken}
		adminLogin  = cred{name: "admin session", login: testToken}
		forged      = cred{name: "read session relabelled admin", login: testReadToken, forge: true}
	)
	for _, tc := range []struct {
		name    string
		opts    Options
		allowed []cred
		denied  []cred
	}{
		{"no read token", Options{Token: testToken},
			[]cred{none, {name: "garbage bearer", auth: "Bearer nope"}, adminBearer, adminLogin}, nil},
		{"read token", Options{Token: testToken, ReadToken: testReadToken},
			[]cred{readBearer, adminBearer, readLogin, adminLogin}, []cred{none, wrongBearer, basic, emptyBearer, forged}},
		{"read token only", Options{ReadToken: testReadToken},
			[]cred{readBearer, readLogin}, []cred{none, wrongBearer, emptyBearer, forged}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvOpts(t, tc.opts)
			ti := e.enqueue("report:secret", []byte(secret), tide.ProcessIn(time.Hour))
			taskPath := "/task?" + url.Values{"q": {"default"}, "id": {ti.ID}}.Encode()
			paths := []string{"/", "/queue?q=default&state=scheduled", taskPath, "/servers", "/no/such/page"}
			get := func(c cred, path string) (*http.Response, string) {
				t.Helper()
				var hdr map[string]string
				if c.auth != "" {
					hdr = map[string]string{"Authorization": c.auth}
				}
				var cookie *http.Cookie
				if c.login != "" {
					cookie = e.loginWith(c.login)
					if c.forge {
						v, ok := strings.CutPrefix(cookie.Value, readSessionVersion+".")
						if !ok {
							t.Fatalf("read session cookie %q", cookie.Value)
						}
						cookie.Value = adminSessionVersion + "." + v
					}
				}
				return e.do(http.MethodGet, path, nil, hdr, cookie)
			}
			for _, c := range tc.allowed {
				for _, path := range paths {
					resp, body := get(c, path)
					want := http.StatusOK
					if path == "/no/such/page" {
						want = http.StatusNotFound
					}
					if resp.StatusCode != want {
						t.Errorf("%s, GET %s: status %d, want %d; body:\n%s", c.name, path, resp.StatusCode, want, body)
					}
					if path == taskPath && !strings.Contains(body, secret) {
						t.Errorf("%s: the task page lacks the payload", c.name)
					}
				}
			}
			for _, c := range tc.denied {
				for _, path := range paths {
					resp, body := get(c, path)
					if resp.StatusCode != http.StatusUnauthorized {
						t.Errorf("%s, GET %s: status %d, want 401; body:\n%s", c.name, path, resp.StatusCode, body)
					}
					if strings.Contains(body, secret) || strings.Contains(body, "report:secret") {
						t.Errorf("%s, GET %s: a refused page shows the task", c.name, path)
					}
					if resp.Header.Get("WWW-Authenticate") == "" {
						t.Errorf("%s, GET %s: 401 without WWW-Authenticate", c.name, path)
					}
					if c.json {
						if !strings.Contains(body, `"ok":false`) {
							t.Errorf("%s, GET %s: a bearer client's 401 is not JSON: %s", c.name, path, body)
						}
					} else if !strings.Contains(body, `id="login-form"`) ||
						!strings.Contains(body, `name="next" value="`+template.HTMLEscapeString(path)+`"`) {
						t.Errorf("%s, GET %s: the 401 page is not a login form that returns to the page:\n%s", c.name, path, body)
					}
				}
			}
			// The login page and the static files are open to all.
			for _, path := range []string{"/login", "/static/style.css", "/static/app.js"} {
				resp, body := e.get(path)
				wantStatus(t, resp, body, http.StatusOK)
			}
		})
	}
}

// TestReadSession: a read-token session or bearer sees the pages but
// changes nothing; an admin login on the same dashboard does.
func TestReadSession(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opts    Options
		upgrade bool // an admin login is possible
	}{
		{"with an admin token", Options{Token: testToken, ReadToken: testReadToken}, true},
		{"read token only", Options{ReadToken: testReadToken}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvOpts(t, tc.opts)
			ti := e.enqueue("a", []byte("1"), tide.ProcessIn(time.Hour))
			form := func() url.Values { return url.Values{"q": {"default"}, "id": {ti.ID}} }

			resp, body := e.do(http.MethodPost, "/login", url.Values{"token": {testReadToken}}, e.browser())
			wantStatus(t, resp, body, http.StatusSeeOther)
			reader := cookieNamed(resp, sessionCookie)
			if reader == nil {
				t.Fatal("no session cookie")
			}
			_, body = e.get("/queue?q=default&state=scheduled", reader, cookieNamed(resp, flashCookie))
			if !strings.Contains(body, "Logged in read-only.") {
				t.Error("no flash after a read login")
			}
			if csrfMeta.MatchString(body) || strings.Contains(body, `data-action=`) {
				t.Error("a read session gets a CSRF token or action buttons")
			}
			if !strings.Contains(body, `id="logout-btn"`) || !strings.Contains(body, "read-only") {
				t.Error("a read session's page lacks the logout button or the read-only badge")
			}
			if got := strings.Contains(body, `id="login-link"`); got != tc.upgrade {
				t.Errorf("login link shown: %v, want %v", got, tc.upgrade)
			}

			// Changes are refused, whichever way the read token comes; a
			// read session is refused even with its CSRF token, which its
			// pages do not show.
			rs, ok := e.h.auth.parseSession(reader.Value, time.Now())
			if !ok || rs.role != roleRead {
				t.Fatalf("read session %+v %v", rs, ok)
			}
			f := form()
			f.Set("csrf", e.h.auth.csrfToken(rs))
			resp, body = e.do(http.MethodPost, "/task/run", f, e.browser(), reader)
			wantStatus(t, resp, body, http.StatusForbidden)
			why := "Read-only dashboard"
			if tc.upgrade {
				why = "Logged in read-only"
			}
			if !strings.Contains(body, why) {
				t.Errorf("the refusal does not say %q:\n%s", why, body)
			}
			resp, body = e.do(http.MethodPost, "/task/run", form(), map[string]string{"Authorization": "Bearer " + testReadToken})
			wantStatus(t, resp, body, http.StatusForbidden)
			resp, body = e.do(http.MethodPost, "/queue/pause", url.Values{"q": {"default"}}, map[string]string{"Authorization": "Bearer " + testReadToken})
			wantStatus(t, resp, body, http.StatusForbidden)
			if st := e.state("default", ti.ID); st != tide.StateScheduled {
				t.Fatalf("state %v after refused changes, want scheduled", st)
			}
			if qi, err := e.in.QueueInfo(e.ctx(), "default"); err != nil || qi.Paused {
				t.Fatalf("queue paused by a read token: %+v %v", qi, err)
			}

			// Logging in with the admin token, where there is one, allows
			// changes.
			resp, body = e.do(http.MethodPost, "/login", url.Values{"token": {testToken}}, e.browser(), reader)
			if !tc.upgrade {
				wantStatus(t, resp, body, http.StatusUnauthorized)
				return
			}
			wantStatus(t, resp, body, http.StatusSeeOther)
			admin := cookieNamed(resp, sessionCookie)
			resp, body = e.post("/task/run", form(), admin, e.csrf(admin))
			wantStatus(t, resp, body, http.StatusSeeOther)
			if st := e.state("default", ti.ID); st != tide.StatePending {
				t.Errorf("state %v after an admin run, want pending", st)
			}
		})
	}
}

func TestReadTokenOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts Options
		ok   bool
	}{
		{"both", Options{Token: testToken, ReadToken: testReadToken}, true},
		{"read only", Options{ReadToken: testReadToken}, true},
		{"the same token twice", Options{Token: testToken, ReadToken: testToken}, false},
	} {
		_, err := New(newBrokerlessInspector(t), Options{Token: tc.opts.Token, ReadToken: tc.opts.ReadToken, Logger: testLogger(t)})
		if (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "tide/dashboard: ") {
			t.Errorf("%s: error %q lacks the prefix", tc.name, err)
		}
	}
}

// TestSessionRoles checks the signing of read and admin sessions: a role
// cannot be changed, a session needs its token to be configured, and
// changing the read token ends every session while an admin session of a
// dashboard without a read token stays as it was.
func TestSessionRoles(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	both := newAuth("admin-token", "read-token")
	for _, tc := range []struct {
		name   string
		issuer *auth
		role   role
		parser *auth
		want   role // roleNone: refused
	}{
		{"admin session", both, roleAdmin, both, roleAdmin},
		{"read session", both, roleRead, both, roleRead},
		{"read session, read token changed", both, roleRead, newAuth("admin-token", "read-token-2"), roleNone},
		{"admin session, read token changed", both, roleAdmin, newAuth("admin-token", "read-token-2"), roleNone},
		{"admin session, read token removed", both, roleAdmin, newAuth("admin-token", ""), roleNone},
		{"admin session without read token", newAuth("admin-token", ""), roleAdmin, newAuth("admin-token", ""), roleAdmin},
		{"read session, admin token removed", both, roleRead, newAuth("", "read-token"), roleNone},
		{"read session on a read-only dashboard", newAuth("", "read-token"), roleRead, newAuth("", "read-token"), roleRead},
		{"read session where there is no read token", newAuth("admin-token", ""), roleRead, newAuth("admin-token", ""), roleNone},
		{"admin session where there is no admin token", newAuth("", "read-token"), roleAdmin, newAuth("", "read-token"), roleNone},
	} {
		v := tc.issuer.newSession(tc.role, now)
		s, ok := tc.parser.parseSession(v, now)
		got := roleNone
		if ok {
			got = s.role
		}
		if got != tc.want {
			t.Errorf("%s: parsed as role %d, want %d", tc.name, got, tc.want)
		}
		// Relabelling the session as the other role breaks its signature.
		ver, rest, _ := strings.Cut(v, ".")
		other := adminSessionVersion
		if ver == adminSessionVersion {
			other = readSessionVersion
		}
		if _, ok := tc.parser.parseSession(other+"."+rest, now); ok {
			t.Errorf("%s: relabelled session accepted", tc.name)
		}
	}
	for tok, want := range map[string]role{"admin-token": roleAdmin, "read-token": roleRead, "": roleNone, "read-toke": roleNone} {
		if got := both.checkToken(tok); got != want {
			t.Errorf("checkToken(%q) = %d, want %d", tok, got, want)
		}
	}
	// An empty token matches nothing, also where a token is not set.
	for _, a := range []*auth{newAuth("admin-token", ""), newAuth("", "read-token")} {
		if got := a.checkToken(""); got != roleNone {
			t.Errorf("checkToken(\"\") = %d on a dashboard with one token", got)
		}
	}
}
