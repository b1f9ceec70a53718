package webhook

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/outbound"
)

// TaskType is the type of webhook tasks.
const TaskType = "tide:webhook"

// DefaultQueue is the queue NewTask puts webhook tasks in unless a
// tide.Queue option says otherwise; a server sending webhooks must serve it.
const DefaultQueue = "webhooks"

// Headers that the handler sets on every request. A task may not set them.
const (
	// SignatureHeader carries "t=<unix seconds>,v1=<hex HMAC-SHA256>".
	SignatureHeader = outbound.SignatureHeader
	// DeliveryHeader carries the task ID, the same on every attempt.
	DeliveryHeader = "Tide-Delivery"
	// AttemptHeader carries the attempt number, 1 for the first.
	AttemptHeader = "Tide-Attempt"
)

// Limits on a payload.
const (
	// MaxURLLength is the longest URL accepted, in bytes.
	MaxURLLength = 8 << 10
	// MaxHeaders is the largest number of headers a task may set.
	MaxHeaders = 64
)

// Payload is the request a webhook task carries.
//
// In the task payload (and so in the gateway's "payload") it is the JSON
// object
//
//	{"url": "https://...", "method": "POST", "headers": {"X-Order": "42"}, "body": "..."}
//
// where "body" is the body as a string; a body that is not valid UTF-8 is
// given as "body_base64" (standard base64) instead. Only "url" is required.
// Unknown fields are rejected.
type Payload struct {
	// URL is the absolute http or https URL to call. Its host must be allowed
	// by the handler's Config.AllowedHosts.
	URL string
	// Method is GET, POST, PUT, PATCH or DELETE; empty means POST.
	Method string
	// Headers are sent with the request. Hop-by-hop headers, Host,
	// Content-Length and the Tide-* headers are refused.
	Headers map[string]string
	// Body is sent as the request body and signed.
	Body []byte
}

type wirePayload struct {
	URL        string            `json:"url"`
	Method     string            `json:"method,omitempty"`
	Headers    map[string]string `json:"headers,omitempty"`
	Body       *string           `json:"body,omitempty"`
	BodyBase64 *string           `json:"body_base64,omitempty"`
}

// MarshalJSON encodes p in the task payload format (see Payload).
func (p Payload) MarshalJSON() ([]byte, error) {
	w := wirePayload{URL: p.URL, Method: p.Method, Headers: p.Headers}
	if len(p.Body) > 0 {
		if utf8.Valid(p.Body) {
			s := string(p.Body)
			w.Body = &s
		} else {
			s := base64.StdEncoding.EncodeToString(p.Body)
			w.BodyBase64 = &s
		}
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the task payload format (see Payload). It does not
// validate the request; ParsePayload does both.
func (p *Payload) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var w wirePayload
	if err := dec.Decode(&w); err != nil {
		return fmt.Errorf("tide: webhook payload: %s", describeJSONError(err))
	}
	if dec.More() {
		return errors.New("tide: webhook payload: data after the JSON object")
	}
	*p = Payload{URL: w.URL, Method: w.Method, Headers: w.Headers}
	switch {
	case w.Body != nil && w.BodyBase64 != nil:
		return errors.New(`tide: webhook payload: give "body" or "body_base64", not both`)
	case w.Body != nil:
		p.Body = []byte(*w.Body)
	case w.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*w.BodyBase64)
		if err != nil {
			return fmt.Errorf(`tide: webhook payload: "body_base64": invalid base64: %v`, err)
		}
		p.Body = b
	}
	return nil
}

func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q: cannot use a JSON %s as %s", te.Field, te.Value, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, err)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// ParsePayload decodes a webhook task payload and validates it (see
// Payload.Validate). The error wraps tide.ErrInvalidTask.
func ParsePayload(data []byte) (Payload, error) {
	var p Payload
	if err := json.Unmarshal(data, &p); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return Payload{}, fmt.Errorf("%w: webhook payload: invalid JSON at byte %d: %v", tide.ErrInvalidTask, se.Offset, err)
		}
		return Payload{}, fmt.Errorf("%w: %s", tide.ErrInvalidTask, strings.TrimPrefix(err.Error(), "tide: "))
	}
	if err := p.Validate(); err != nil {
		return Payload{}, err
	}
	return p, nil
}

// Validate checks the URL (absolute, http or https, with a host), the method
// and the headers. It does not check the host against an allowlist: that is
// the handler's Config. The error wraps tide.ErrInvalidTask and names the
// problem; it never includes the URL's query or credentials.
func (p Payload) Validate() error {
	if _, err := parseURL(p.URL); err != nil {
		return err
	}
	if _, err := method(p.Method); err != nil {
		return err
	}
	if len(p.Headers) > MaxHeaders {
		return invalid("%d headers, over the limit of %d", len(p.Headers), MaxHeaders)
	}
	for k, v := range p.Headers {
		if !validHeaderName(k) {
			return invalid("header name %q is not a valid HTTP header name", outbound.Clip(k))
		}
		if reserved[http.CanonicalHeaderKey(k)] {
			return invalid("header %q is set by tide or the HTTP client and cannot be given", http.CanonicalHeaderKey(k))
		}
		if !validHeaderValue(v) {
			return invalid("header %q has a control character in its value", http.CanonicalHeaderKey(k))
		}
	}
	return nil
}

// NewTask returns a webhook task for p after validating it (see
// Payload.Validate). The task goes to DefaultQueue unless opts include a
// tide.Queue option; opts are otherwise the task's default options, as with
// tide.NewTask. The error wraps tide.ErrInvalidTask.
func NewTask(p Payload, opts ...tide.Option) (*tide.Task, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	data, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("tide: webhook: encode payload: %w", err)
	}
	return tide.NewTask(TaskType, data, append([]tide.Option{tide.Queue(DefaultQueue)}, opts...)...), nil
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: webhook: "+format, append([]any{tide.ErrInvalidTask}, a...)...)
}

// parseURL checks raw and returns the parsed URL.
func parseURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, invalid("empty URL")
	}
	if len(raw) > MaxURLLength {
		return nil, invalid("URL is %d bytes, over the %d-byte limit", len(raw), MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error repeats the URL, which may carry credentials.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, invalid("URL does not parse: %v", err)
	}
	if !u.IsAbs() || u.Opaque != "" {
		return nil, invalid("URL %q is not an absolute http or https URL", outbound.Redact(u))
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return nil, invalid("URL scheme %q is not allowed (only http and https)", outbound.Clip(u.Scheme))
	}
	if u.Hostname() == "" {
		return nil, invalid("URL %q has no host", outbound.Redact(u))
	}
	return u, nil
}

var methods = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true}

func method(m string) (string, error) {
	if m == "" {
		return http.MethodPost, nil
	}
	up := strings.ToUpper(m)
	if !methods[up] {
		return "", invalid("method %q is not allowed (GET, POST, PUT, PATCH or DELETE)", outbound.Clip(m))
	}
	return up, nil
}

// reserved headers cannot be set by a task.
var reserved = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Upgrade": true, "Te": true, "Trailer": true, "Proxy-Connection": true,
	"Proxy-Authorization": true, "Proxy-Authenticate": true, "Expect": true,
	SignatureHeader: true, DeliveryHeader: true, AttemptHeader: true,
}

func validHeaderName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
