package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/outbound"
	"github.com/tidequeue/tide/webhook"
)

// enqueueSpec is a parsed POST /v1/tasks body.
type enqueueSpec struct {
	typ     string
	payload []byte
	headers map[string]string
	queue   string
	opts    []tide.Option
}

// task builds the tide task the spec describes.
func (s *enqueueSpec) task() *tide.Task {
	t := tide.NewTask(s.typ, s.payload, s.opts...)
	for k, v := range s.headers {
		t.Headers()[k] = v
	}
	return t
}

// apiError is an error response: {"error": {"code", "message", "field"}}.
type apiError struct {
	status  int
	code    string
	field   string
	message string
	cause   error // logged, never sent
}

func (e *apiError) Error() string { return e.message }

// badField is a 400 about one field; the message starts with the field name.
func badField(field, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: "invalid_request", field: field,
		message: fmt.Sprintf("%q: ", field) + fmt.Sprintf(format, a...)}
}

func badRequest(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: "invalid_request", message: fmt.Sprintf(format, a...)}
}

// The fields of an enqueue request, in the order they are checked.
var enqueueFields = []string{
	"type", "payload", "payload_base64", "queue", "task_id", "delay", "delay_seconds",
	"process_at", "max_retry", "timeout", "deadline", "retention", "unique", "headers",
	"group", "replace",
}

var knownField = func() map[string]bool {
	m := map[string]bool{}
	for _, f := range enqueueFields {
		m[f] = true
	}
	return m
}()

// parseEnqueue parses and checks a POST /v1/tasks body; now is the time
// relative to which process_at is checked. Every error names the field at
// fault and never repeats the payload.
func parseEnqueue(body []byte, now time.Time) (*enqueueSpec, *apiError) {
	fields, aerr := objectFields(body)
	if aerr != nil {
		return nil, aerr
	}
	p := &fieldParser{fields: fields}
	s := &enqueueSpec{}

	typ, ok, err := p.str("type")
	if err != nil {
		return nil, err
	}
	if !ok || typ == "" {
		return nil, badField("type", `is required: the task type that selects the handler, e.g. "email:send"`)
	}
	if err := checkName("type", typ); err != nil {
		return nil, err
	}
	s.typ = typ

	if err := p.payload(s); err != nil {
		return nil, err
	}
	if len(s.payload) > tide.MaxPayloadSize {
		return nil, badField("payload", "is %d bytes, over the %d-byte limit", len(s.payload), tide.MaxPayloadSize)
	}
	if s.typ == webhook.TaskType {
		if _, err := webhook.ParsePayload(s.payload); err != nil {
			return nil, badField("payload", "%s", strings.TrimPrefix(stripInvalid(err), "webhook payload: "))
		}
	}

	queue, ok, err := p.str("queue")
	if err != nil {
		return nil, err
	}
	switch {
	case ok:
		if verr := tide.ValidateQueueName(queue); verr != nil {
			return nil, badField("queue", "%s", stripInvalid(verr))
		}
	case s.typ == webhook.TaskType:
		queue = webhook.DefaultQueue
	default:
		queue = tide.DefaultQueue
	}
	s.queue = queue
	s.opts = append(s.opts, tide.Queue(queue))

	if id, ok, err := p.str("task_id"); err != nil {
		return nil, err
	} else if ok {
		if err := checkName("task_id", id); err != nil {
			return nil, err
		}
		s.opts = append(s.opts, tide.TaskID(id))
	}

	if err := p.when(s, now); err != nil {
		return nil, err
	}

	if n, ok, err := p.integer("max_retry"); err != nil {
		return nil, err
	} else if ok {
		if n < 0 || n > tide.MaxRetryLimit {
			return nil, badField("max_retry", "must be between 0 and %d, got %d", tide.MaxRetryLimit, n)
		}
		s.opts = append(s.opts, tide.MaxRetry(int(n)))
	}
	if d, ok, err := p.duration("timeout", 0); err != nil {
		return nil, err
	} else if ok {
		s.opts = append(s.opts, tide.Timeout(d))
	}
	if t, ok, err := p.time("deadline"); err != nil {
		return nil, err
	} else if ok {
		s.opts = append(s.opts, tide.Deadline(t))
	}
	if d, ok, err := p.duration("retention", 0); err != nil {
		return nil, err
	} else if ok {
		s.opts = append(s.opts, tide.Retention(d))
	}
	if d, ok, err := p.duration("unique", time.Second); err != nil {
		return nil, err
	} else if ok {
		s.opts = append(s.opts, tide.Unique(d))
	}
	if err := p.headers(s); err != nil {
		return nil, err
	}
	if g, ok, err := p.str("group"); err != nil {
		return nil, err
	} else if ok {
		if err := broker.CheckGroup(g); err != nil {
			return nil, badField("group", "%s", strings.TrimPrefix(err.Error(), broker.ErrInvalidTask.Error()+": "))
		}
		s.opts = append(s.opts, tide.Group(g))
	}
	if raw, ok := p.raw("replace"); ok {
		switch string(raw) {
		case "true":
			if _, has := p.raw("task_id"); !has {
				return nil, badField("replace", "needs task_id: it replaces the waiting task with that ID")
			}
			if _, has := p.raw("unique"); has {
				return nil, badField("replace", "cannot be combined with unique")
			}
			s.opts = append(s.opts, tide.Replace())
		case "false":
		default:
			return nil, badField("replace", "must be true or false, got %s", kind(raw))
		}
	}
	return s, nil
}

// objectFields splits a JSON object into its fields, refusing anything but
// one object, unknown fields and repeated fields.
func objectFields(body []byte) (map[string]json.RawMessage, *apiError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest(`the request body is empty; send a JSON object such as {"type": "email:send", "payload": {"to": "ann@example.com"}}`)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // a huge top-level number is "not an object", not a range error
	tok, err := dec.Token()
	if err != nil {
		return nil, syntaxError(dec, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, badRequest("the request body must be a JSON object, not %s", kindOfToken(tok))
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxError(dec, err)
		}
		key, _ := tok.(string) // inside an object the decoder only yields string keys
		if !knownField[key] {
			msg := fmt.Sprintf("unknown field %q", clip(key, 64))
			if s := suggest(key); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return nil, &apiError{status: http.StatusBadRequest, code: "invalid_request", field: clip(key, 64),
				message: msg + "; known fields: " + strings.Join(enqueueFields, ", ")}
		}
		if _, dup := fields[key]; dup {
			return nil, badField(key, "appears more than once")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, syntaxError(dec, err)
		}
		fields[key] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, syntaxError(dec, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badRequest("the request body must hold one JSON object; found more data after it")
	}
	return fields, nil
}

func syntaxError(dec *json.Decoder, err error) *apiError {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return badRequest("invalid JSON: the body ends in the middle of the object")
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return badRequest("invalid JSON at byte %d: %s", se.Offset, clip(strings.TrimPrefix(se.Error(), "json: "), 120))
	}
	// Messages of other decoding errors may quote the input: say less.
	return badRequest("invalid JSON at byte %d", dec.InputOffset())
}

func kindOfToken(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return "an array"
		}
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "that"
}

// kind names the JSON type of raw for messages.
func kind(raw json.RawMessage) string {
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// fieldParser reads typed fields. A field given as null counts as absent.
type fieldParser struct {
	fields map[string]json.RawMessage
}

func (p *fieldParser) raw(name string) (json.RawMessage, bool) {
	raw, ok := p.fields[name]
	if !ok {
		return nil, false
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, false
	}
	return raw, true
}

func (p *fieldParser) str(name string) (string, bool, *apiError) {
	raw, ok := p.raw(name)
	if !ok {
		return "", false, nil
	}
	if raw[0] != '"' {
		return "", false, badField(name, "must be a string, got %s", kind(raw))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, badField(name, "invalid string: %v", err)
	}
	return s, true, nil
}

func (p *fieldParser) number(name string) (float64, bool, *apiError) {
	raw, ok := p.raw(name)
	if !ok {
		return 0, false, nil
	}
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, false, badField(name, "must be a number, got %s", kind(raw))
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, false, badField(name, "number %s is out of range", clip(string(raw), 32))
	}
	return f, true, nil
}

func (p *fieldParser) integer(name string) (int64, bool, *apiError) {
	f, ok, err := p.number(name)
	if err != nil || !ok {
		return 0, ok, err
	}
	if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false, badField(name, "must be a whole number, got %s", clip(string(p.fields[name]), 32))
	}
	return int64(f), true, nil
}

// duration reads a Go duration string ("90s", "15m", "1h30m") of at least
// lo.
func (p *fieldParser) duration(name string, lo time.Duration) (time.Duration, bool, *apiError) {
	raw, ok := p.raw(name)
	if !ok {
		return 0, false, nil
	}
	if raw[0] != '"' {
		return 0, false, badField(name, `must be a duration string such as "90s", "15m" or "1h30m", got %s`, kind(raw))
	}
	s, _, err := p.str(name)
	if err != nil {
		return 0, false, err
	}
	d, perr := time.ParseDuration(s)
	if perr != nil {
		return 0, false, badField(name, `invalid duration %q: use Go syntax such as "90s", "15m" or "1h30m" (units ns, us, ms, s, m, h)`, clip(s, 64))
	}
	if d < 0 {
		return 0, false, badField(name, "must not be negative, got %q", clip(s, 64))
	}
	if d < lo {
		return 0, false, badField(name, "must be at least %v, got %q", lo, clip(s, 64))
	}
	return d, true, nil
}

// time reads an RFC 3339 time ("2030-01-02T15:04:05Z").
func (p *fieldParser) time(name string) (time.Time, bool, *apiError) {
	s, ok, err := p.str(name)
	if err != nil || !ok {
		return time.Time{}, false, err
	}
	t, perr := time.Parse(time.RFC3339Nano, s)
	if perr != nil {
		return time.Time{}, false, badField(name, `invalid time %q: use RFC 3339 with a zone, e.g. "2030-01-02T15:04:05Z" or "2030-01-02T16:04:05+01:00"`, clip(s, 64))
	}
	if t.IsZero() {
		return time.Time{}, false, badField(name, "must not be the zero time")
	}
	return t, true, nil
}

// payload reads "payload" (any JSON, stored compacted) or "payload_base64".
func (p *fieldParser) payload(s *enqueueSpec) *apiError {
	raw, hasJSON := p.raw("payload")
	b64, hasB64, err := p.str("payload_base64")
	if err != nil {
		return err
	}
	switch {
	case hasJSON && hasB64:
		return badRequest(`give either "payload" (JSON) or "payload_base64" (bytes), not both`)
	case hasJSON:
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return badField("payload", "invalid JSON: %v", err)
		}
		s.payload = buf.Bytes()
	case hasB64:
		data, err := decodeBase64(b64)
		if err != nil {
			return badField("payload_base64", "invalid base64 (standard alphabet, with or without padding): %v", err)
		}
		s.payload = data
	}
	return nil
}

func decodeBase64(s string) ([]byte, error) {
	if data, err := base64.StdEncoding.DecodeString(s); err == nil {
		return data, nil
	}
	if data, err := base64.RawStdEncoding.DecodeString(s); err == nil {
		return data, nil
	}
	if data, err := base64.URLEncoding.DecodeString(s); err == nil {
		return data, nil
	}
	return base64.RawURLEncoding.DecodeString(s)
}

// when reads at most one of delay, delay_seconds and process_at.
func (p *fieldParser) when(s *enqueueSpec, now time.Time) *apiError {
	var given []string
	for _, f := range []string{"delay", "delay_seconds", "process_at"} {
		if _, ok := p.raw(f); ok {
			given = append(given, fmt.Sprintf("%q", f))
		}
	}
	if len(given) > 1 {
		return badRequest(`give at most one of "delay", "delay_seconds" and "process_at"; got %s`, strings.Join(given, " and "))
	}
	if d, ok, err := p.duration("delay", 0); err != nil {
		if raw, _ := p.raw("delay"); raw[0] != '"' {
			err.message += `; or give "delay_seconds" as a number`
		}
		return err
	} else if ok {
		if d > tide.MaxDelay {
			return badField("delay", "is over the %v limit", tide.MaxDelay)
		}
		s.opts = append(s.opts, tide.ProcessIn(d))
	}
	if f, ok, err := p.number("delay_seconds"); err != nil {
		return err
	} else if ok {
		if f < 0 {
			return badField("delay_seconds", "must not be negative")
		}
		if f > tide.MaxDelay.Seconds() {
			return badField("delay_seconds", "is over the %v limit (%.0f seconds)", tide.MaxDelay, tide.MaxDelay.Seconds())
		}
		s.opts = append(s.opts, tide.ProcessIn(time.Duration(f*float64(time.Second))))
	}
	if t, ok, err := p.time("process_at"); err != nil {
		return err
	} else if ok {
		if t.Sub(now) > tide.MaxDelay {
			return badField("process_at", "is more than %v ahead", tide.MaxDelay)
		}
		s.opts = append(s.opts, tide.ProcessAt(t))
	}
	return nil
}

// headers reads "headers", an object of strings.
func (p *fieldParser) headers(s *enqueueSpec) *apiError {
	raw, ok := p.raw("headers")
	if !ok {
		return nil
	}
	if raw[0] != '{' {
		return badField("headers", "must be an object of strings, got %s", kind(raw))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return badField("headers", "must be an object of strings: %v", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	size := 0
	s.headers = make(map[string]string, len(m))
	for _, k := range keys {
		v := bytes.TrimSpace(m[k])
		if len(v) == 0 || v[0] != '"' {
			return badField("headers", "the value of %q must be a string, got %s", clip(k, 64), kind(v))
		}
		var str string
		if err := json.Unmarshal(v, &str); err != nil {
			return badField("headers", "the value of %q: %v", clip(k, 64), err)
		}
		if k == "" {
			return badField("headers", "a header name is empty")
		}
		size += len(k) + len(str)
		s.headers[k] = str
	}
	if size > tide.MaxHeadersSize {
		return badField("headers", "are %d bytes, over the %d-byte limit", size, tide.MaxHeadersSize)
	}
	return nil
}

// checkName applies tide's rule for task types and IDs, naming the field.
func checkName(field, s string) *apiError {
	if s == "" {
		return badField(field, "must not be empty")
	}
	if len(s) > tide.MaxIDLength {
		return badField(field, "is %d bytes, over the %d-byte limit", len(s), tide.MaxIDLength)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return badField(field, "has a control character at byte %d", i)
		}
	}
	return nil
}

// stripInvalid returns err's message without the "tide: invalid task: "
// prefix of tide's validation errors.
func stripInvalid(err error) string {
	return strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": ")
}

// suggest returns the known field closest to an unknown one, if close.
func suggest(s string) string {
	if len(s) > 64 {
		return ""
	}
	low := strings.ToLower(strings.ReplaceAll(s, "-", "_"))
	best, bestD := "", 3
	for _, f := range enqueueFields {
		if low == f {
			return f
		}
		if d := editDistance(low, f); d < bestD {
			best, bestD = f, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// clip bounds a client-supplied string quoted in a message.
func clip(s string, n int) string { return outbound.ClipTo(s, n) }
