package webhook

//lint:file-ignore ST1005 config errors start with the Config field they name (Secret, Timeout, ...)

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/outbound"
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
	// maxRetryAfter bounds the Retry-After delay RetryDelayFunc honours.
	maxRetryAfter = 24 * time.Hour
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
		fmt.Fprintf(&b, " after %s", outbound.Plural(e.Redirects, "redirect"))
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
	out               *outbound.Sender
	retryClientErrors bool // Config.RetryClientErrors
}

// Handler returns the handler of TaskType tasks with cfg. It returns an error
// when Secret is shorter than MinSecretLength, AllowedHosts is empty or holds
// an invalid entry, or Timeout or MaxResponseBody is negative.
func Handler(cfg Config) (tide.Handler, error) {
	h, err := newHandler(cfg, time.Now)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// newHandler is Handler with the clock that signs requests.
func newHandler(cfg Config, now func() time.Time) (*handler, error) {
	var errs []error
	if len(cfg.Secret) < MinSecretLength {
		errs = append(errs, fmt.Errorf("Secret is %d bytes; at least %d are required (use 32 random bytes, e.g. openssl rand -hex 32)", len(cfg.Secret), MinSecretLength))
	}
	if len(cfg.AllowedHosts) == 0 {
		errs = append(errs, errors.New("AllowedHosts is empty; name the hosts webhooks may call (\"hooks.example.com\", \"*.example.com\")"))
	}
	hosts, err := outbound.ParseHosts("AllowedHosts", cfg.AllowedHosts)
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
	out, err := outbound.New(outbound.Config{
		Secret: cfg.Secret, Hosts: hosts, AllowPrivate: cfg.AllowPrivateNetworks,
		Timeout: cfg.Timeout, MaxResponseBody: cfg.MaxResponseBody, Client: cfg.Client, Now: now,
		Settings: outbound.Settings{Hosts: "AllowedHosts", Private: "AllowPrivateNetworks", Timeout: "Config.Timeout"},
	})
	if err != nil {
		return nil, fmt.Errorf("tide: webhook: invalid Config: %w", err)
	}
	return &handler{out: out, retryClientErrors: cfg.RetryClientErrors}, nil
}

// ProcessTask sends the request t carries; see the package documentation
// for what counts as a failure and what is retried.
func (h *handler) ProcessTask(ctx context.Context, t *tide.Task) error {
	if t.Type() != TaskType {
		return fmt.Errorf("tide: webhook: handler got a task of type %q, not %q: %w", outbound.Clip(t.Type()), TaskType, tide.SkipRetry)
	}
	p, err := ParsePayload(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, tide.SkipRetry)
	}
	u, _ := parseURL(p.URL) // validated
	m, _ := method(p.Method)
	where := m + " " + outbound.Redact(u)

	hdr := make(http.Header, len(p.Headers)+4)
	for k, v := range p.Headers {
		hdr.Set(k, v)
	}
	if hdr.Get("Content-Type") == "" && len(p.Body) > 0 {
		if json.Valid(p.Body) {
			hdr.Set("Content-Type", "application/json")
		} else {
			hdr.Set("Content-Type", "application/octet-stream")
		}
	}
	if hdr.Get("User-Agent") == "" {
		hdr.Set("User-Agent", "tide-webhook/1")
	}
	if id, ok := tide.GetTaskID(ctx); ok {
		hdr.Set(DeliveryHeader, id)
	}
	if n, ok := tide.GetRetryCount(ctx); ok {
		hdr.Set(AttemptHeader, strconv.Itoa(n+1))
	}

	resp, err := h.out.Send(ctx, outbound.Request{Method: m, URL: u, Header: hdr, Body: p.Body})
	if err != nil {
		return sendError(where, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil // the response status is what counts, even if its body broke off
	}
	data := resp.Body
	if resp.BodyTimedOut {
		data = append(data, "…(body timed out)"...)
	}
	se := &StatusError{Method: m, URL: outbound.Redact(u), StatusCode: resp.StatusCode, Snippet: outbound.Snippet(data), Redirects: resp.Redirects}
	switch c := resp.StatusCode; {
	case c >= 300 && c < 400:
		// A redirect that was not followed: retried like a 5xx, unless its
		// target is refused (host or scheme not allowed).
		se.Location = resp.Location
		se.NotFollowed = resp.NotFollowed
		se.Permanent = resp.Refused
	case c == http.StatusTooManyRequests || c == http.StatusServiceUnavailable:
		se.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	case c >= 400 && c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooEarly && !h.retryClientErrors:
		se.Permanent = true
	}
	return se
}

// sendError describes a request that got no response: refused ones (a host
// or scheme not allowed, a non-public address, also after a redirect)
// archive the task; the rest are retried.
func sendError(where string, err error) error {
	var oe *outbound.Error
	if !errors.As(err, &oe) {
		return fmt.Errorf("tide: webhook: %s: %w", where, err) // not reached: Send returns an *outbound.Error
	}
	if oe.Permanent {
		return fmt.Errorf("tide: webhook: %s%s: %s: %w", where, oe.After(), oe.Msg, tide.SkipRetry)
	}
	return fmt.Errorf("tide: webhook: %s%s: %w", where, oe.After(), oe)
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
