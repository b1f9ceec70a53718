// Package outbound is tide's one sender of HTTP requests to URLs that task
// producers choose: webhook tasks (package webhook) and NotifyURL
// notifications (package tide). Those URLs may come from another system
// through the gateway, so every request is guarded:
//
//   - only http and https URLs, and only hosts in the allow-list when one
//     is given;
//   - unless the caller opts in, no connection to loopback, private,
//     link-local, shared or other non-public addresses, checked on the
//     address actually dialled after DNS resolution, for the first request
//     and every redirect;
//   - no proxy from the environment;
//   - only 307 and 308 redirects are followed (they keep the method and the
//     body), at most MaxRedirects, to allowed hosts only, each hop signed
//     again; 301, 302 and 303 are never followed, and a 3xx is returned as
//     the response, never as a success;
//   - the response body is read up to a bound, and the request bounded in
//     time;
//   - errors never hold a URL's query or credentials, nor control
//     characters, and are bounded in length.
//
// A signed request carries SignatureHeader, made by Sign alone and checked
// by VerifyAt.
package outbound

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxRedirects bounds the redirects (307 and 308) one request follows.
const MaxRedirects = 5

// Defaults of Config.
const (
	// DefaultTimeout is the default Config.Timeout.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxResponseBody is the default Config.MaxResponseBody (64 KiB).
	DefaultMaxResponseBody = 64 << 10
)

// Config configures a Sender.
type Config struct {
	// Secret signs every request, and every redirected one again, with
	// SignatureHeader. Empty: requests are not signed.
	Secret []byte

	// Hosts are the hosts requests and redirects may go to. Nil: any host.
	Hosts HostList

	// AllowPrivate lets requests connect to non-public addresses (see
	// IsPublic). It applies to the Sender's own transport: with a Client
	// that has a Transport, that transport dials and decides.
	AllowPrivate bool

	// Timeout bounds each Send, redirects and the response body included.
	// Default DefaultTimeout; negative is an error.
	Timeout time.Duration

	// MaxResponseBody is how much of a response body is read, in bytes.
	// Default DefaultMaxResponseBody; negative is an error.
	MaxResponseBody int64

	// Client sends the requests; it is copied. Default: a client with
	// NewTransport. Its CheckRedirect is called only for redirects the
	// Sender would follow, and may stop them.
	Client *http.Client

	// Now is the clock of signatures. Default time.Now.
	Now func() time.Time

	// Settings names the caller's settings in error messages.
	Settings Settings
}

// Settings are the names of the caller's settings, used in error messages
// so that they tell what to change.
type Settings struct {
	// Hosts names Config.Hosts: "host "x" is not in <Hosts>".
	Hosts string
	// Private names the opt-in of Config.AllowPrivate: "set <Private> to
	// allow it".
	Private string
	// Timeout names Config.Timeout: "no response within 10s (<Timeout>)";
	// empty leaves the parenthesis out.
	Timeout string
}

// Sender sends guarded requests (see the package documentation). It is
// safe for concurrent use.
type Sender struct {
	cfg    Config
	client *http.Client // CheckRedirect is set per request, see Send
	// userCheck is Config.Client's CheckRedirect, nil when none.
	userCheck func(req *http.Request, via []*http.Request) error
}

// New returns a Sender with cfg. It returns an error when Timeout or
// MaxResponseBody is negative.
func New(cfg Config) (*Sender, error) {
	var errs []error
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("outbound: timeout %v is negative", cfg.Timeout))
	}
	if cfg.MaxResponseBody < 0 {
		errs = append(errs, fmt.Errorf("outbound: response body limit %d is negative", cfg.MaxResponseBody))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxResponseBody == 0 {
		cfg.MaxResponseBody = DefaultMaxResponseBody
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Settings.Hosts == "" {
		cfg.Settings.Hosts = "the allowed hosts"
	}
	if cfg.Settings.Private == "" {
		cfg.Settings.Private = "the private-network opt-in"
	}
	cfg.Secret = bytes.Clone(cfg.Secret)
	cfg.Hosts = slices.Clone(cfg.Hosts)
	s := &Sender{cfg: cfg}
	var c http.Client
	if cfg.Client != nil {
		c = *cfg.Client
	}
	if c.Transport == nil {
		c.Transport = NewTransport(cfg.AllowPrivate, cfg.Settings.Private)
	}
	s.userCheck, c.CheckRedirect = c.CheckRedirect, nil
	s.client = &c
	return s, nil
}

// CloseIdleConnections closes the idle connections of the Sender's client,
// so that none of their goroutines outlive their user.
func (s *Sender) CloseIdleConnections() { s.client.CloseIdleConnections() }

// Request is one request to send.
type Request struct {
	// Method is the HTTP method.
	Method string
	// URL is the absolute URL to call.
	URL *url.URL
	// Header is sent with the request (copied); SignatureHeader is set by
	// Send when the Sender has a secret.
	Header http.Header
	// Body is sent, and signed; redirects send it again.
	Body []byte
}

// Response is the final response of a Send, after the redirects it
// followed. A 3xx is a redirect that was not followed.
type Response struct {
	// StatusCode and Header are the response's.
	StatusCode int
	Header     http.Header
	// Body is the start of the response body, at most
	// Config.MaxResponseBody bytes.
	Body []byte
	// BodyTimedOut is true when reading Body was cut off by Config.Timeout.
	BodyTimedOut bool
	// Redirects is how many redirects (307 or 308) were followed.
	Redirects int
	// Location is, for a 3xx, its Location header resolved and redacted
	// (see Location); empty when the response had none.
	Location string
	// NotFollowed is, for a 3xx with a Location, why it was not followed.
	NotFollowed string
	// Refused is true when that 3xx was not followed because its target
	// is not allowed (scheme or host): a request to give up on.
	Refused bool
}

// Error is a Send that got no response. Its message holds no query,
// credentials or control characters.
type Error struct {
	// Msg describes the failure.
	Msg string
	// Permanent is true when the request was refused (scheme, host, a
	// non-public address, also after a redirect) or cannot be built: to
	// give up on rather than retry.
	Permanent bool
	// Redirects is how many redirects were followed before the failure;
	// Last is where the last one went, redacted.
	Redirects int
	Last      string
	// cause is why the caller's context ended, when it did.
	cause error
}

// Error returns Msg.
func (e *Error) Error() string { return e.Msg }

// Unwrap returns the cause of the caller's context when that context
// ending failed the Send, else nil.
func (e *Error) Unwrap() error { return e.cause }

// After describes the redirects followed before the failure, for a
// message: "" when none, else " after 1 redirect, to http://host/path".
func (e *Error) After() string {
	if e.Redirects == 0 {
		return ""
	}
	return fmt.Sprintf(" after %s, to %s", Plural(e.Redirects, "redirect"), e.Last)
}

// Plural returns "1 redirect" or "2 redirects".
func Plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// Send sends r within Config.Timeout (and ctx), following only allowed
// 307 and 308 redirects, and reads the start of the response body. A
// response of any status is returned as such; an error is an *Error.
func (s *Sender) Send(ctx context.Context, r Request) (*Response, error) {
	if err := s.check(r.URL); err != nil {
		return nil, &Error{Msg: err.Msg, Permanent: true}
	}
	actx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var body io.Reader
	if len(r.Body) > 0 {
		body = bytes.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(actx, r.Method, r.URL.String(), body)
	if err != nil {
		return nil, &Error{Msg: "build request: " + Snippet([]byte(unwrapURL(err).Error())), Permanent: true}
	}
	for k, v := range r.Header {
		req.Header[k] = slices.Clone(v)
	}
	if len(s.cfg.Secret) > 0 {
		req.Header.Set(SignatureHeader, Sign(s.cfg.Secret, s.cfg.Now(), r.Body))
	}
	rs := &redirects{}
	c := *s.client
	c.CheckRedirect = s.checkRedirect(rs, r.Body)
	resp, err := c.Do(req)
	if err != nil {
		// A response that comes with an error (a failed CheckRedirect) has
		// its body closed already.
		return nil, s.transportError(ctx, actx, rs, err)
	}
	defer resp.Body.Close()
	data, rerr := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxResponseBody))
	out := &Response{
		StatusCode: resp.StatusCode, Header: resp.Header, Body: data,
		BodyTimedOut: rerr != nil && ctx.Err() == nil && actx.Err() != nil,
		Redirects:    rs.hops,
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		out.Location, out.NotFollowed, out.Refused = Location(resp), rs.notFollowed, rs.refused
	}
	return out, nil
}

// check refuses schemes other than http(s) and hosts not allowed.
func (s *Sender) check(u *url.URL) *RefusedError {
	if sc := strings.ToLower(u.Scheme); sc != "http" && sc != "https" {
		return &RefusedError{Msg: fmt.Sprintf("scheme %q is not allowed (only http and https)", Clip(Sanitize(u.Scheme)))}
	}
	if u.Hostname() == "" {
		return &RefusedError{Msg: "the URL has no host"}
	}
	if s.cfg.Hosts != nil && !s.cfg.Hosts.Allows(u) {
		return &RefusedError{Msg: fmt.Sprintf("host %q is not in %s", Clip(Sanitize(u.Host)), s.cfg.Settings.Hosts)}
	}
	return nil
}

// redirects is what happened to the redirects of one request.
type redirects struct {
	hops        int      // redirects followed
	last        *url.URL // where the last one went
	notFollowed string   // why the last 3xx was not followed
	refused     bool     // its target is not allowed
}

// checkRedirect follows only 307 and 308 redirects (which keep the method
// and body) to allowed hosts, at most MaxRedirects of them, signing each
// followed request again over the same body at the time it is sent. A
// redirect that is not followed is returned as the 3xx response, with the
// reason recorded in rs.
func (s *Sender) checkRedirect(rs *redirects, body []byte) func(*http.Request, []*http.Request) error {
	return func(next *http.Request, via []*http.Request) error {
		// Returning exactly http.ErrUseLastResponse hands the 3xx response
		// back to Send.
		switch code := next.Response.StatusCode; {
		case code != http.StatusTemporaryRedirect && code != http.StatusPermanentRedirect:
			// 301, 302 and 303 would turn the request into a GET without a
			// body (keeping the Tide-* headers): never follow them.
			rs.notFollowed = "only 307 and 308 redirects are followed (they keep the method and body)"
			return http.ErrUseLastResponse
		case len(via) > MaxRedirects:
			rs.notFollowed = fmt.Sprintf("stopped after %d redirects", MaxRedirects)
			return http.ErrUseLastResponse
		}
		if err := s.check(next.URL); err != nil {
			rs.notFollowed, rs.refused = err.Msg, true
			return http.ErrUseLastResponse
		}
		if s.userCheck != nil {
			if err := s.userCheck(next, via); err != nil {
				if errors.Is(err, http.ErrUseLastResponse) {
					rs.notFollowed = "stopped by Config.Client's CheckRedirect"
					return http.ErrUseLastResponse
				}
				return err
			}
		}
		// net/http copied the first request's headers, the signature
		// included, and set a Referer holding the previous URL with its
		// query, which may carry a secret: keep only a Referer the caller
		// set itself.
		next.Header.Del("Referer")
		if ref := via[0].Header.Get("Referer"); ref != "" {
			next.Header.Set("Referer", ref)
		}
		if len(s.cfg.Secret) > 0 {
			next.Header.Set(SignatureHeader, Sign(s.cfg.Secret, s.cfg.Now(), body))
		}
		rs.hops, rs.last = len(via), next.URL
		return nil
	}
}

// transportError describes a request that got no response.
func (s *Sender) transportError(ctx, actx context.Context, rs *redirects, err error) *Error {
	e := &Error{Redirects: rs.hops}
	if rs.last != nil {
		e.Last = Redact(rs.last)
	}
	var refused *RefusedError
	switch {
	case errors.As(err, &refused):
		e.Msg, e.Permanent = refused.Msg, true
	case ctx.Err() != nil:
		// The caller's context ended (shutdown, task timeout, cancel):
		// report that rather than a network error.
		e.cause = context.Cause(ctx)
		e.Msg = e.cause.Error()
	case actx.Err() != nil:
		e.Msg = fmt.Sprintf("no response within %v", s.cfg.Timeout)
		if s.cfg.Settings.Timeout != "" {
			e.Msg += " (" + s.cfg.Settings.Timeout + ")"
		}
	default:
		msg := unwrapURL(err).Error()
		if strings.HasPrefix(msg, "failed to parse Location header") {
			// net/http quotes the whole Location, query included.
			msg = "the Location header of a redirect does not parse"
		}
		// Bounded: a network error may quote what the other side sent.
		e.Msg = Snippet([]byte(msg))
	}
	return e
}

// unwrapURL returns the error inside a *url.Error, which repeats the full
// URL (query and credentials included).
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
