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
	"time"
)

const (
	sessionCookie = "tide_session"
	flashCookie   = "tide_flash"
	// sessionTTL is how long a login lasts.
	sessionTTL = 12 * time.Hour
)

// role is what a token or a session may do.
type role int

const (
	roleNone  role = iota
	roleRead       // the read token: see the pages
	roleAdmin      // the token: see the pages and change things
)

// auth holds what checking the tokens and sessions needs. Only the limiter
// changes after construction, under its own lock.
type auth struct {
	adminSum, readSum [sha256.Size]byte
	hasAdmin, hasRead bool
	// key signs session cookies and derives CSRF tokens. It is derived from
	// the tokens, so sessions survive restarts and are shared by replicas,
	// and changing either token ends them all.
	key []byte
	lim limiter
}

// newAuth returns the auth of the admin token and the read token; either
// may be empty, not both.
func newAuth(token, readToken string) *auth {
	a := &auth{
		adminSum: sha256.Sum256([]byte(token)), hasAdmin: token != "",
		readSum: sha256.Sum256([]byte(readToken)), hasRead: readToken != "",
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("tide dashboard session key v1"))
	if readToken != "" {
		// Without a read token the key is what it always was, so that
		// sessions survive an upgrade.
		m.Write([]byte("\x00read token\x00"))
		m.Write([]byte(readToken))
	}
	a.key = m.Sum(nil)
	return a
}

// checkToken returns the role of token s, comparing it with both tokens in
// constant time (hashing it first so that the length does not leak).
func (a *auth) checkToken(s string) role {
	sum := sha256.Sum256([]byte(s))
	admin := subtle.ConstantTimeCompare(sum[:], a.adminSum[:]) == 1
	read := subtle.ConstantTimeCompare(sum[:], a.readSum[:]) == 1
	switch {
	case admin && a.hasAdmin:
		return roleAdmin
	case read && a.hasRead:
		return roleRead
	}
	return roleNone
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

// session is a logged-in browser: a role, a random nonce and an expiry,
// signed.
type session struct {
	role  role
	nonce string
	exp   int64 // unix seconds
}

// Session cookies are "<version>.<exp>.<nonce>.<signature>"; the version
// names the role and is signed with the rest.
const (
	adminSessionVersion = "v1"
	readSessionVersion  = "r1"
)

// newSession returns the cookie value of a new session of role ro.
func (a *auth) newSession(ro role, now time.Time) string {
	var n [18]byte
	_, _ = rand.Read(n[:])
	nonce := b64.EncodeToString(n[:])
	exp := strconv.FormatInt(now.Add(sessionTTL).Unix(), 10)
	ver, kind := adminSessionVersion, "session"
	if ro == roleRead {
		ver, kind = readSessionVersion, "read session"
	}
	return ver + "." + exp + "." + nonce + "." + b64.EncodeToString(a.mac(kind, exp, nonce))
}

// parseSession checks a cookie value's signature and expiry.
func (a *auth) parseSession(v string, now time.Time) (session, bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 4 || len(v) > 200 {
		return session{}, false
	}
	var ro role
	var kind string
	switch parts[0] {
	case adminSessionVersion:
		ro, kind = roleAdmin, "session"
	case readSessionVersion:
		ro, kind = roleRead, "read session"
	default:
		return session{}, false
	}
	if (ro == roleAdmin && !a.hasAdmin) || (ro == roleRead && !a.hasRead) {
		return session{}, false
	}
	sig, err := b64.DecodeString(parts[3])
	if err != nil || !hmac.Equal(sig, a.mac(kind, parts[1], parts[2])) {
		return session{}, false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || now.Unix() >= exp {
		return session{}, false
	}
	return session{role: ro, nonce: parts[2], exp: exp}, true
}

// csrfToken is the session's CSRF token: every form of an admin session
// carries it, and a mutation must send it back.
func (a *auth) csrfToken(s session) string {
	return b64.EncodeToString(a.mac("csrf", s.nonce))
}

func (a *auth) checkCSRF(s session, got string) bool {
	want := a.csrfToken(s)
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// wrongToken records a wrong token from r's client and reports whether
// the client is over its budget, in which case the answer is 429 (with
// Retry-After set) rather than 401. It logs the first loginFailures wrong
// tokens of a window and the one that goes over, not the rest.
func (h *handler) wrongToken(w http.ResponseWriter, r *http.Request, what string) (limited bool) {
	client := clientKey(r)
	fails, reset := h.auth.lim.fail(client, h.now())
	switch {
	case fails <= loginFailures:
		h.log.Warn("tide dashboard: "+what, "remote", r.RemoteAddr)
	case fails == loginFailures+1:
		h.log.Warn("tide dashboard: "+what+"; too many from this client, answering 429 until the window ends",
			"remote", r.RemoteAddr, "client", client, "until", reset)
	}
	if fails <= loginFailures {
		return false
	}
	secs := int(reset.Sub(h.now()).Seconds()) + 1
	w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	return true
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
	// The token is checked first: a correct token always logs in, however
	// many wrong ones came from the same address.
	ro := h.auth.checkToken(r.PostFormValue("token"))
	if ro == roleNone {
		status, msg := http.StatusUnauthorized, "Wrong token."
		if h.wrongToken(w, r, "failed login") {
			status, msg = http.StatusTooManyRequests, "Wrong token, and too many failed attempts from your address. Wait a minute and try again."
		}
		v := h.newView(w, r, "login", "Log in", &loginData{Next: next, Error: msg})
		h.render(w, status, "login", v)
		return
	}
	h.setCookie(w, r, sessionCookie, h.auth.newSession(ro, h.now()), int(sessionTTL/time.Second))
	f := &flash{Kind: "login"}
	if ro == roleRead {
		f.Kind = "login-read"
	}
	h.log.Info("tide dashboard: login", "remote", r.RemoteAddr, "read_only", ro == roleRead)
	h.redirect(w, r, next, f)
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request) {
	if err := h.sameOrigin(r); err != nil {
		h.failWith(w, r, http.StatusForbidden, "Cross-origin request refused", err.Error())
		return
	}
	h.setCookie(w, r, sessionCookie, "", -1)
	h.redirect(w, r, "/", &flash{Kind: "logout"})
}

// readable wraps a page. With a read token configured, the request needs a
// session or a bearer token, of either token; otherwise it gets the login
// form with 401 (a bearer client a JSON 401, or 429 past its budget of
// wrong tokens). Without a read token every page is open.
func (h *handler) readable(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.auth == nil || !h.auth.hasRead {
			f(w, r)
			return
		}
		if tok, isBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); isBearer {
			if h.auth.checkToken(tok) != roleNone {
				f(w, r)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="tide"`)
			if h.wrongToken(w, r, "wrong bearer token") {
				h.refuse(w, r, true, http.StatusTooManyRequests, "Too many failed attempts", "Wait a minute and try again.")
				return
			}
			h.refuse(w, r, true, http.StatusUnauthorized, "Wrong token", "The bearer token is neither the dashboard's token nor its read token.")
			return
		}
		if _, ok := h.session(r); ok {
			f(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="tide"`)
		v := h.newView(w, r, "login", "Log in", nil)
		v.Data = &loginData{Next: nextPath(v.Return)}
		h.render(w, http.StatusUnauthorized, "login", v)
	}
}

// authorize checks a mutation: a configured token, then either a valid
// bearer token, or a same-origin request with an admin session and its CSRF
// token. It parses the form. On failure it has answered and returns ok
// false.
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) (bearer, ok bool) {
	if h.auth == nil || !h.auth.hasAdmin {
		h.refuse(w, r, false, http.StatusForbidden, "Read-only dashboard", "No token is configured, so the dashboard cannot change anything.")
		return false, false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		h.refuse(w, r, false, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return false, false
	}
	if hdr := r.Header.Get("Authorization"); hdr != "" {
		ro := roleNone
		if tok, isBearer := strings.CutPrefix(hdr, "Bearer "); isBearer {
			ro = h.auth.checkToken(tok)
		}
		switch ro {
		case roleAdmin:
			return true, true
		case roleRead:
			h.refuse(w, r, true, http.StatusForbidden, "Read-only token", "The read token only shows the dashboard; changes need the dashboard's token.")
			return true, false
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="tide"`)
		if h.wrongToken(w, r, "wrong bearer token") {
			h.refuse(w, r, true, http.StatusTooManyRequests, "Too many failed attempts", "Wait a minute and try again.")
			return true, false
		}
		h.refuse(w, r, true, http.StatusUnauthorized, "Wrong token", "The bearer token is not the dashboard's token.")
		return true, false
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
	if s.role != roleAdmin {
		h.refuse(w, r, false, http.StatusForbidden, "Logged in read-only", "You logged in with the read token, which only shows the dashboard. Log in with the dashboard's token to make changes.")
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
	case "sel-run":
		return fmt.Sprintf("%d selected tasks of queue %s are now pending.", f.N, f.Queue)
	case "sel-archive":
		return fmt.Sprintf("%d selected tasks of queue %s were archived.", f.N, f.Queue)
	case "sel-delete":
		return fmt.Sprintf("%d selected tasks of queue %s were deleted.", f.N, f.Queue)
	case "workflow-cancel":
		return fmt.Sprintf("Workflow %s was cancelled: its steps that had not started never will.", f.ID)
	case "batch-cancel":
		return fmt.Sprintf("Batch %s was cancelled: its tasks that had not finished were cancelled.", f.ID)
	case "login":
		return "Logged in: you can now change tasks and queues."
	case "login-read":
		return "Logged in read-only."
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
