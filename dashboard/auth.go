package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	sessionCookie = "tide_session"
	flashCookie   = "tide_flash"
	// sessionTTL is how long a login lasts.
	sessionTTL = 12 * time.Hour
	// loginFailures failed logins (or bearer tokens) per loginWindow are
	// allowed for the whole handler; then every attempt is refused until
	// the window ends.
	loginFailures = 10
	loginWindow   = time.Minute
)

// auth holds what checking the token and sessions needs. Only the limiter
// changes after construction, under its own lock.
type auth struct {
	tokenSum [sha256.Size]byte
	// key signs session cookies and derives CSRF tokens. It is derived from
	// the token, so sessions survive restarts and are shared by replicas,
	// and changing the token ends them all.
	key []byte
	lim limiter
}

func newAuth(token string) *auth {
	a := &auth{tokenSum: sha256.Sum256([]byte(token))}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("tide dashboard session key v1"))
	a.key = m.Sum(nil)
	return a
}

// checkToken compares s with the token in constant time (hashing both first
// so that the length does not leak either).
func (a *auth) checkToken(s string) bool {
	sum := sha256.Sum256([]byte(s))
	return subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) == 1
}

func (a *auth) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, a.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

var b64 = base64.RawURLEncoding

// session is a logged-in browser: a random nonce and an expiry, signed.
type session struct {
	nonce string
	exp   int64 // unix seconds
}

// newSession returns the cookie value of a new session.
func (a *auth) newSession(now time.Time) string {
	var n [18]byte
	_, _ = rand.Read(n[:])
	nonce := b64.EncodeToString(n[:])
	exp := strconv.FormatInt(now.Add(sessionTTL).Unix(), 10)
	return "v1." + exp + "." + nonce + "." + b64.EncodeToString(a.mac("session", exp, nonce))
}

// parseSession checks a cookie value's signature and expiry.
func (a *auth) parseSession(v string, now time.Time) (session, bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 4 || parts[0] != "v1" || len(v) > 200 {
		return session{}, false
	}
	sig, err := b64.DecodeString(parts[3])
	if err != nil || !hmac.Equal(sig, a.mac("session", parts[1], parts[2])) {
		return session{}, false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || now.Unix() >= exp {
		return session{}, false
	}
	return session{nonce: parts[2], exp: exp}, true
}

// csrfToken is the session's CSRF token: every form of the session carries
// it, and a mutation must send it back.
func (a *auth) csrfToken(s session) string {
	return b64.EncodeToString(a.mac("csrf", s.nonce))
}

func (a *auth) checkCSRF(s session, got string) bool {
	want := a.csrfToken(s)
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// limiter counts failed logins in fixed windows.
type limiter struct {
	mu    sync.Mutex
	start time.Time
	fails int
}

func (l *limiter) allow(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= loginWindow {
		l.start, l.fails = now, 0
	}
	return l.fails < loginFailures
}

func (l *limiter) fail(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= loginWindow {
		l.start, l.fails = now, 0
	}
	l.fails++
}

// session returns the request's valid session, if any.
func (h *handler) session(r *http.Request) (session, bool) {
	if h.auth == nil {
		return session{}, false
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false
	}
	return h.auth.parseSession(c.Value, h.now())
}

func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (h *handler) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: basePath(r) + "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r),
	})
}

// sameOrigin applies the cross-origin checks to a POST: Sec-Fetch-Site and
// Origin (http.CrossOriginProtection), then, for browsers that send neither,
// the Referer.
func (h *handler) sameOrigin(r *http.Request) error {
	if err := h.cop.Check(r); err != nil {
		return err
	}
	if r.Header.Get("Origin") == "" && r.Header.Get("Sec-Fetch-Site") == "" {
		if ref := r.Header.Get("Referer"); ref != "" {
			u, err := url.Parse(ref)
			if err != nil || u.Host != r.Host {
				return fmt.Errorf("cross-origin request: Referer %q does not match host %q", ref, r.Host)
			}
		}
	}
	return nil
}

// loginData is the data of the login page.
type loginData struct {
	Next  string
	Error string
}

func (h *handler) loginPage(w http.ResponseWriter, r *http.Request) {
	v := h.newView(w, r, "login", "Log in", &loginData{Next: nextPath(r.URL.Query().Get("next"))})
	h.render(w, http.StatusOK, "login", v)
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	if h.auth == nil {
		h.failWith(w, r, http.StatusForbidden, "Read-only dashboard", "No token is configured, so there is nothing to log in to: this dashboard only shows.")
		return
	}
	if err := h.sameOrigin(r); err != nil {
		h.failWith(w, r, http.StatusForbidden, "Cross-origin request refused", err.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		h.failWith(w, r, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return
	}
	next := nextPath(r.PostFormValue("next"))
	now := h.now()
	if !h.auth.lim.allow(now) {
		h.log.Warn("tide dashboard: login refused: too many failed attempts", "remote", r.RemoteAddr)
		v := h.newView(w, r, "login", "Log in", &loginData{Next: next, Error: "Too many failed attempts. Wait a minute and try again."})
		h.render(w, http.StatusTooManyRequests, "login", v)
		return
	}
	if !h.auth.checkToken(r.PostFormValue("token")) {
		h.auth.lim.fail(now)
		h.log.Warn("tide dashboard: failed login", "remote", r.RemoteAddr)
		v := h.newView(w, r, "login", "Log in", &loginData{Next: next, Error: "Wrong token."})
		h.render(w, http.StatusUnauthorized, "login", v)
		return
	}
	h.setCookie(w, r, sessionCookie, h.auth.newSession(now), int(sessionTTL/time.Second))
	h.log.Info("tide dashboard: login", "remote", r.RemoteAddr)
	h.redirect(w, r, next, &flash{Kind: "login"})
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request) {
	if err := h.sameOrigin(r); err != nil {
		h.failWith(w, r, http.StatusForbidden, "Cross-origin request refused", err.Error())
		return
	}
	h.setCookie(w, r, sessionCookie, "", -1)
	h.redirect(w, r, "/", &flash{Kind: "logout"})
}

// authorize checks a mutation: a configured token, then either a valid
// bearer token, or a same-origin request with a session and its CSRF token.
// It parses the form. On failure it has answered and returns ok false.
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) (bearer, ok bool) {
	if h.auth == nil {
		h.refuse(w, r, false, http.StatusForbidden, "Read-only dashboard", "No token is configured, so the dashboard cannot change anything.")
		return false, false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		h.refuse(w, r, false, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return false, false
	}
	if hdr := r.Header.Get("Authorization"); hdr != "" {
		now := h.now()
		tok, isBearer := strings.CutPrefix(hdr, "Bearer ")
		switch {
		case !h.auth.lim.allow(now):
			h.refuse(w, r, true, http.StatusTooManyRequests, "Too many failed attempts", "Wait a minute and try again.")
			return true, false
		case !isBearer || !h.auth.checkToken(tok):
			h.auth.lim.fail(now)
			h.log.Warn("tide dashboard: wrong bearer token", "remote", r.RemoteAddr)
			w.Header().Set("WWW-Authenticate", `Bearer realm="tide"`)
			h.refuse(w, r, true, http.StatusUnauthorized, "Wrong token", "The bearer token is not the dashboard's token.")
			return true, false
		}
		return true, true
	}
	if err := h.sameOrigin(r); err != nil {
		h.refuse(w, r, false, http.StatusForbidden, "Cross-origin request refused", err.Error())
		return false, false
	}
	s, ok := h.session(r)
	if !ok {
		h.refuse(w, r, false, http.StatusForbidden, "Not logged in", "Log in with the dashboard's token to make changes.")
		return false, false
	}
	if !h.auth.checkCSRF(s, r.PostFormValue("csrf")) {
		h.refuse(w, r, false, http.StatusForbidden, "Missing or wrong CSRF token", "Reload the page and try again.")
		return false, false
	}
	return false, true
}

// refuse answers a refused or failed mutation: JSON for bearer clients, the
// error page for browsers.
func (h *handler) refuse(w http.ResponseWriter, r *http.Request, bearer bool, status int, heading, msg string) {
	if bearer {
		writeJSON(w, status, map[string]any{"ok": false, "error": heading + ": " + msg})
		return
	}
	h.failWith(w, r, status, heading, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// localPath returns p when it is a path on this dashboard (relative to the
// mount prefix, starting with a single "/"), otherwise "/". It keeps
// redirects on the dashboard.
func localPath(p string) string {
	if p == "" || p[0] != '/' || len(p) > 2048 || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\") {
		return "/"
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f {
			return "/"
		}
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return "/"
	}
	return p
}

// nextPath is where to go after logging in: p when it is a local path
// other than the login page, otherwise the overview.
func nextPath(p string) string {
	p = localPath(p)
	if p == "/login" || strings.HasPrefix(p, "/login?") {
		return "/"
	}
	return p
}

// redirect answers with 303 to the dashboard path p, leaving f to show on
// the next page.
func (h *handler) redirect(w http.ResponseWriter, r *http.Request, p string, f *flash) {
	if f != nil {
		if b, err := json.Marshal(f); err == nil {
			h.setCookie(w, r, flashCookie, b64.EncodeToString(b), 60)
		}
	}
	w.Header().Set("Location", basePath(r)+localPath(p))
	w.WriteHeader(http.StatusSeeOther)
}

// flash is the outcome of a change, shown once on the next page. Only the
// dashboard sets it; its text comes from a fixed set of messages.
type flash struct {
	Kind  string `json:"k"`
	Queue string `json:"q,omitempty"`
	ID    string `json:"i,omitempty"`
	State string `json:"s,omitempty"`
	N     int    `json:"n,omitempty"`
}

// Message returns the text shown for f.
func (f *flash) Message() string {
	switch f.Kind {
	case "run":
		return fmt.Sprintf("Task %s is now pending.", f.ID)
	case "archive":
		return fmt.Sprintf("Task %s was archived.", f.ID)
	case "delete":
		return fmt.Sprintf("Task %s was deleted.", f.ID)
	case "cancel":
		return fmt.Sprintf("Cancellation of task %s was requested.", f.ID)
	case "pause":
		return fmt.Sprintf("Queue %s is paused.", f.Queue)
	case "unpause":
		return fmt.Sprintf("Queue %s is running again.", f.Queue)
	case "run-all":
		return fmt.Sprintf("%d %s tasks of queue %s are now pending.", f.N, f.State, f.Queue)
	case "archive-all":
		return fmt.Sprintf("%d %s tasks of queue %s were archived.", f.N, f.State, f.Queue)
	case "delete-all":
		return fmt.Sprintf("%d %s tasks of queue %s were deleted.", f.N, f.State, f.Queue)
	case "login":
		return "Logged in: you can now change tasks and queues."
	case "logout":
		return "Logged out."
	}
	return ""
}

// takeFlash returns the pending flash and clears it.
func takeFlash(w http.ResponseWriter, r *http.Request) *flash {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", Path: basePath(r) + "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	b, err := b64.DecodeString(c.Value)
	if err != nil || len(b) > 2048 {
		return nil
	}
	var f flash
	if json.Unmarshal(b, &f) != nil || f.Message() == "" {
		return nil
	}
	return &f
}
