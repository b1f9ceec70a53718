package webhook

//lint:file-ignore ST1005 config errors start with the Config field they name (Secret, Timeout, ...)

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/tidequeue/tide"
)

// Defaults and limits of Config.
const (
	// DefaultTimeout is the default Config.Timeout.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxResponseBody is the default Config.MaxResponseBody (64 KiB).
	DefaultMaxResponseBody = 64 << 10
	// MinSecretLength is the shortest Config.Secret accepted, in bytes.
	// Use 32 random bytes (openssl rand -hex 32).
	MinSecretLength = 16
	// maxRedirects bounds the redirects followed (307 and 308 to allowed
	// hosts only).
	maxRedirects = 5
	// maxRetryAfter bounds the Retry-After delay RetryDelayFunc honours.
	maxRetryAfter = 24 * time.Hour
	// snippetLen bounds the response body quoted in an error.
	snippetLen = 256
)

// Config configures the webhook handler.
type Config struct {
	// Secret signs every request (see Sign). Required, at least
	// MinSecretLength bytes; share it with the receivers.
	Secret []byte

	// AllowedHosts are the hosts requests may go to: "hooks.example.com"
	// (that host, any port), "hooks.example.com:8443" (that host and port),
	// or "*.example.com" (any subdomain of example.com, at any depth, but
	// not example.com itself). IP literals are allowed as hosts
	// ("127.0.0.1", "[::1]:8080"). Names are compared case-insensitively.
	// Required: a task whose URL's host is not allowed is archived.
	AllowedHosts []string

	// AllowPrivateNetworks lets requests connect to loopback, private,
	// link-local, shared (CGNAT) and other non-public addresses. By default
	// they are refused, on the address actually dialled, so that an allowed
	// name resolving to such an address (DNS rebinding) reaches nothing
	// inside the network. It applies to the handler's own transport: when
	// Client is set with a non-nil Transport, that transport dials and this
	// check is the caller's responsibility.
	AllowPrivateNetworks bool

	// Timeout bounds each attempt, from connecting to reading the response.
	// A request without a response in time fails and is retried. Default
	// DefaultTimeout (10s).
	Timeout time.Duration

	// Client sends the requests. Default: a client whose transport applies
	// the private-network rule and ignores proxy settings from the
	// environment. A given client is copied; its CheckRedirect is called
	// only for redirects the handler would follow (307 and 308 to an allowed
	// host, within the limit) and may stop them: returning
	// http.ErrUseLastResponse makes the redirect a retried failure, any
	// other error a retried network error.
	Client *http.Client

	// MaxResponseBody is how much of a response body is read, in bytes
	// (the rest is discarded and the connection closed). Default
	// DefaultMaxResponseBody (64 KiB).
	MaxResponseBody int64

	// RetryClientErrors retries every non-2xx response. By default 4xx
	// responses other than 408, 425 and 429 archive the task at once.
	RetryClientErrors bool
}

// StatusError is the error of an attempt that got a non-2xx response,
// including a 3xx redirect that was not followed. It wraps tide.SkipRetry
// when the status is not worth retrying, or the redirect's target is not
// allowed (see the package documentation), so the task is archived at once.
type StatusError struct {
	// Method and URL (without query, fragment or credentials) of the request.
	Method, URL string
	// StatusCode is the response status.
	StatusCode int
	// RetryAfter is the delay a 429 or 503 response asked for in its
	// Retry-After header, 0 when none (see RetryDelayFunc).
	RetryAfter time.Duration
	// Snippet is the start of the response body, with control characters
	// replaced.
	Snippet string
	// Permanent is true when the error wraps tide.SkipRetry.
	Permanent bool
	// Redirects is how many redirects (307 or 308) were followed before
	// this response; URL is still the task's URL.
	Redirects int
	// Location is, for a 3xx response, its Location header resolved
	// against the URL of the request it answered, without query, fragment
	// or credentials, with control and formatting characters replaced and
	// at most about 200 bytes; empty when the response had none.
	Location string
	// NotFollowed is, for a 3xx response with a Location, why the handler
	// did not follow it: not a 307 or 308, too many redirects, or a
	// target that is not allowed (then Permanent is true).
	NotFollowed string
}

// Error returns "tide: webhook: POST https://host/path: status 500 Internal
// Server Error: <snippet>"; for a redirect that was not followed,
// "tide: webhook: POST https://host/path: status 302 Found to
// "https://host/new", not followed: <why>: <snippet>".
func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tide: webhook: %s %s: status %d %s", e.Method, e.URL, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Redirects > 0 {
		fmt.Fprintf(&b, " after %s", plural(e.Redirects, "redirect"))
	}
	if e.StatusCode >= 300 && e.StatusCode < 400 {
		if e.Location == "" {
			b.WriteString(" without a Location header")
		} else {
			fmt.Fprintf(&b, " to %q", e.Location)
		}
		if e.NotFollowed != "" {
			fmt.Fprintf(&b, ", not followed: %s", e.NotFollowed)
		}
	}
	if e.Permanent {
		b.WriteString(" (not retried)")
	}
	if e.Snippet != "" {
		fmt.Fprintf(&b, ": %q", e.Snippet)
	}
	return b.String()
}

// Unwrap returns tide.SkipRetry for a permanent failure and nil otherwise.
func (e *StatusError) Unwrap() error {
	if e.Permanent {
		return tide.SkipRetry
	}
	return nil
}

// handler sends webhook tasks.
type handler struct {
	cfg     Config
	hosts   hostList
	client  *http.Client // CheckRedirect is set per request, see do
	maxBody int64
	// userCheck is Config.Client's CheckRedirect, nil when none.
	userCheck func(req *http.Request, via []*http.Request) error
	// now signs requests; time.Now but in tests.
	now func() time.Time
}

// Handler returns the handler of TaskType tasks with cfg. It returns an error
// when Secret is shorter than MinSecretLength, AllowedHosts is empty or holds
// an invalid entry, or Timeout or MaxResponseBody is negative.
func Handler(cfg Config) (tide.Handler, error) {
	var errs []error
	if len(cfg.Secret) < MinSecretLength {
		errs = append(errs, fmt.Errorf("Secret is %d bytes; at least %d are required (use 32 random bytes, e.g. openssl rand -hex 32)", len(cfg.Secret), MinSecretLength))
	}
	hosts, err := parseHosts(cfg.AllowedHosts)
	if err != nil {
		errs = append(errs, err)
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout %v is negative", cfg.Timeout))
	}
	if cfg.MaxResponseBody < 0 {
		errs = append(errs, fmt.Errorf("MaxResponseBody %d is negative", cfg.MaxResponseBody))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("tide: webhook: invalid Config: %w", errors.Join(errs...))
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxResponseBody == 0 {
		cfg.MaxResponseBody = DefaultMaxResponseBody
	}
	cfg.Secret = bytes.Clone(cfg.Secret)
	h := &handler{cfg: cfg, hosts: hosts, maxBody: cfg.MaxResponseBody, now: time.Now}
	var c http.Client
	if cfg.Client != nil {
		c = *cfg.Client
	}
	if c.Transport == nil {
		c.Transport = newTransport(cfg.AllowPrivateNetworks)
	}
	h.userCheck, c.CheckRedirect = c.CheckRedirect, nil
	h.client = &c
	return h, nil
}

// refusedError is a request the handler refuses to make (a dial to a
// non-public address); the task is archived.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// checkURL refuses schemes other than http(s) and hosts not allowed.
func (h *handler) checkURL(u *url.URL) error {
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return &refusedError{msg: fmt.Sprintf("scheme %q is not allowed (only http and https)", clip(u.Scheme))}
	}
	if !h.hosts.allows(u) {
		return &refusedError{msg: fmt.Sprintf("host %q is not in AllowedHosts", clip(u.Host))}
	}
	return nil
}

// ProcessTask sends the request t carries; see the package documentation
// for what counts as a failure and what is retried.
func (h *handler) ProcessTask(ctx context.Context, t *tide.Task) error {
	if t.Type() != TaskType {
		return fmt.Errorf("tide: webhook: handler got a task of type %q, not %q: %w", clip(t.Type()), TaskType, tide.SkipRetry)
	}
	p, err := ParsePayload(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, tide.SkipRetry)
	}
	u, _ := parseURL(p.URL) // validated
	m, _ := method(p.Method)
	where := m + " " + redact(u)
	if err := h.checkURL(u); err != nil {
		return fmt.Errorf("tide: webhook: %s: %w: %w", where, err, tide.SkipRetry)
	}

	actx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	var body io.Reader
	if len(p.Body) > 0 {
		body = bytes.NewReader(p.Body)
	}
	req, err := http.NewRequestWithContext(actx, m, u.String(), body)
	if err != nil {
		return fmt.Errorf("tide: webhook: %s: build request: %v: %w", where, err, tide.SkipRetry)
	}
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	if req.Header.Get("Content-Type") == "" && len(p.Body) > 0 {
		if json.Valid(p.Body) {
			req.Header.Set("Content-Type", "application/json")
		} else {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "tide-webhook/1")
	}
	if id, ok := tide.GetTaskID(ctx); ok {
		req.Header.Set(DeliveryHeader, id)
	}
	if n, ok := tide.GetRetryCount(ctx); ok {
		req.Header.Set(AttemptHeader, strconv.Itoa(n+1))
	}
	req.Header.Set(SignatureHeader, Sign(h.cfg.Secret, h.now(), p.Body))

	resp, rs, err := h.do(req, p.Body)
	if err != nil {
		return h.transportError(ctx, actx, where+rs.note(), err)
	}
	defer resp.Body.Close()
	data, rerr := io.ReadAll(io.LimitReader(resp.Body, h.maxBody))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil // the response status is what counts, even if its body broke off
	}
	if rerr != nil && ctx.Err() == nil && actx.Err() != nil {
		data = append(data, "…(body timed out)"...)
	}
	se := &StatusError{Method: m, URL: redact(u), StatusCode: resp.StatusCode, Snippet: snippet(data), Redirects: rs.hops}
	switch c := resp.StatusCode; {
	case c >= 300 && c < 400:
		// A redirect that was not followed: retried like a 5xx, unless its
		// target is refused (host or scheme not allowed).
		se.Location = location(resp)
		se.NotFollowed = rs.notFollowed
		se.Permanent = rs.refused
	case c == http.StatusTooManyRequests || c == http.StatusServiceUnavailable:
		se.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	case c >= 400 && c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooEarly && !h.cfg.RetryClientErrors:
		se.Permanent = true
	}
	return se
}

// redirects is what happened to the redirects of one request.
type redirects struct {
	hops        int      // redirects followed
	last        *url.URL // where the last one went
	notFollowed string   // why the last 3xx was not followed
	refused     bool     // its target is not allowed: archive the task
}

// note describes the redirects followed, for an error message: "" when
// none, else " after 1 redirect, to http://host/path".
func (r *redirects) note() string {
	if r.hops == 0 {
		return ""
	}
	return fmt.Sprintf(" after %s, to %s", plural(r.hops, "redirect"), redact(r.last))
}

// do sends req, following only 307 and 308 redirects (which keep the
// method and body) to allowed hosts, at most maxRedirects of them. Each
// followed request is signed again over the same body at the time it is
// sent. A redirect that is not followed is returned as the 3xx response,
// with the reason in the returned redirects.
func (h *handler) do(req *http.Request, body []byte) (*http.Response, *redirects, error) {
	rs := &redirects{}
	c := *h.client
	c.CheckRedirect = func(next *http.Request, via []*http.Request) error {
		// Returning exactly http.ErrUseLastResponse hands the 3xx response
		// back to ProcessTask, which fails the attempt with it.
		switch code := next.Response.StatusCode; {
		case code != http.StatusTemporaryRedirect && code != http.StatusPermanentRedirect:
			// 301, 302 and 303 would turn the request into a GET without a
			// body (keeping the Tide-* headers): never follow them.
			rs.notFollowed = "only 307 and 308 redirects are followed (they keep the method and body)"
			return http.ErrUseLastResponse
		case len(via) > maxRedirects:
			rs.notFollowed = fmt.Sprintf("stopped after %d redirects", maxRedirects)
			return http.ErrUseLastResponse
		}
		if err := h.checkURL(next.URL); err != nil {
			rs.notFollowed, rs.refused = err.Error(), true
			return http.ErrUseLastResponse
		}
		if h.userCheck != nil {
			if err := h.userCheck(next, via); err != nil {
				if errors.Is(err, http.ErrUseLastResponse) {
					rs.notFollowed = "stopped by Config.Client's CheckRedirect"
					return http.ErrUseLastResponse
				}
				return err
			}
		}
		// net/http copied the first request's headers, Tide-* included, and
		// set a Referer holding the previous URL with its query, which may
		// carry a secret: keep only a Referer the task set itself.
		next.Header.Del("Referer")
		if ref := via[0].Header.Get("Referer"); ref != "" {
			next.Header.Set("Referer", ref)
		}
		next.Header.Set(SignatureHeader, Sign(h.cfg.Secret, h.now(), body))
		rs.hops, rs.last = len(via), next.URL
		return nil
	}
	resp, err := c.Do(req)
	if err != nil {
		// A response that comes with an error (a failed CheckRedirect) has
		// its body closed already.
		return nil, rs, err
	}
	return resp, rs, nil
}

// location returns resp's Location header for an error message: resolved
// against the request's URL, without query, fragment or credentials, and
// sanitised; "" when there is none.
func location(resp *http.Response) string {
	loc := resp.Header.Get("Location")
	if loc == "" {
		return ""
	}
	base := &url.URL{}
	if resp.Request != nil && resp.Request.URL != nil {
		base = resp.Request.URL
	}
	u, err := base.Parse(loc)
	if err != nil {
		return "(a Location that does not parse)"
	}
	return sanitize(redact(u))
}

// plural returns "1 redirect" or "2 redirects".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// transportError describes a failed request: refused ones (a non-public
// address, also after a redirect) archive the task; the rest are retried.
func (h *handler) transportError(ctx, actx context.Context, where string, err error) error {
	var refused *refusedError
	if errors.As(err, &refused) {
		return fmt.Errorf("tide: webhook: %s: %s: %w", where, refused.msg, tide.SkipRetry)
	}
	if ctx.Err() != nil {
		// The task's own context ended (shutdown, task timeout, cancel):
		// report that rather than a network error.
		return fmt.Errorf("tide: webhook: %s: %w", where, context.Cause(ctx))
	}
	if actx.Err() != nil {
		return fmt.Errorf("tide: webhook: %s: no response within %v (Config.Timeout)", where, h.cfg.Timeout)
	}
	// *url.Error repeats the full URL, which may carry a query with secrets.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	// Bounded: net/http quotes a receiver's unparsable Location in full.
	return fmt.Errorf("tide: webhook: %s: %s", where, snippet([]byte(err.Error())))
}

// sanitize replaces control and formatting characters (such as
// bidirectional overrides) with spaces.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, s)
}

// snippet returns the start of a response body fit for an error message.
func snippet(data []byte) string {
	s := sanitize(strings.TrimSpace(string(bytes.ToValidUTF8(data, []byte("�")))))
	if len(s) > snippetLen {
		cut := snippetLen
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		d = time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return max(min(d, maxRetryAfter), 0)
}

// RetryDelayFunc returns a tide.RetryDelayFunc for a server that sends
// webhooks: webhook tasks wait as a 429 or 503 response's Retry-After header
// asked (up to 24h), or else follow tide.NotificationRetryDelay; other tasks
// use fallback (tide.DefaultRetryDelay when nil).
func RetryDelayFunc(fallback tide.RetryDelayFunc) tide.RetryDelayFunc {
	if fallback == nil {
		fallback = tide.DefaultRetryDelay
	}
	return func(n int, err error, t *tide.Task) time.Duration {
		if t == nil || t.Type() != TaskType {
			return fallback(n, err, t)
		}
		var se *StatusError
		if errors.As(err, &se) && se.RetryAfter > 0 {
			return se.RetryAfter
		}
		return tide.NotificationRetryDelay(n, err, t)
	}
}

// hostList is a parsed AllowedHosts.
type hostList []hostRule

type hostRule struct {
	host     string // lower case; for a wildcard, the suffix with its dot (".example.com")
	port     string // empty: any
	wildcard bool
}

func parseHosts(entries []string) (hostList, error) {
	if len(entries) == 0 {
		return nil, errors.New("AllowedHosts is empty; name the hosts webhooks may call (\"hooks.example.com\", \"*.example.com\")")
	}
	var out hostList
	var errs []error
	for _, e := range entries {
		r, err := parseHost(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

func parseHost(e string) (hostRule, error) {
	s := strings.ToLower(strings.TrimSpace(e))
	bad := func(why string) (hostRule, error) {
		return hostRule{}, fmt.Errorf("AllowedHosts entry %q: %s", clip(e), why)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.Contains(s, "://") || strings.ContainsAny(s, "/?#@ ") {
		return bad(`give a host name ("hooks.example.com"), optionally with a port, not a URL`)
	}
	var r hostRule
	host := s
	if h, p, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad("invalid port")
		}
		host, r.port = h, p
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		if rest == "" || strings.Contains(rest, "*") || !strings.Contains(rest, ".") {
			return bad(`a wildcard must be "*." followed by a domain with at least two labels ("*.example.com")`)
		}
		r.wildcard, r.host = true, "."+rest
		return r, nil
	}
	if host == "" || strings.Contains(host, "*") {
		return bad(`"*" is only allowed as the first label ("*.example.com")`)
	}
	r.host = strings.TrimSuffix(host, ".")
	return r, nil
}

// allows reports whether u's host (and port) is allowed.
func (l hostList) allows(u *url.URL) bool {
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "" {
		return false
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if strings.EqualFold(u.Scheme, "https") {
			port = "443"
		}
	}
	for _, r := range l {
		if r.port != "" && r.port != port {
			continue
		}
		if r.wildcard {
			if len(host) > len(r.host) && strings.HasSuffix(host, r.host) {
				return true
			}
			continue
		}
		if host == r.host {
			return true
		}
	}
	return false
}
