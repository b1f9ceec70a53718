package tide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Handler processes tasks. ProcessTask returns nil on success; any error
// fails the attempt, which is retried unless it wraps SkipRetry or the task
// has no retries left. ProcessTask must honour ctx: it is cancelled on the
// task's timeout or deadline, on Inspector.CancelProcessing, when the lease
// is lost, and when the server shuts down.
type Handler interface {
	ProcessTask(ctx context.Context, t *Task) error
}

// HandlerFunc adapts an ordinary function to the Handler interface.
type HandlerFunc func(ctx context.Context, t *Task) error

// ProcessTask calls f(ctx, t).
func (f HandlerFunc) ProcessTask(ctx context.Context, t *Task) error { return f(ctx, t) }

// MiddlewareFunc wraps a Handler with behaviour of its own (logging, tracing,
// recovery, ...).
type MiddlewareFunc func(Handler) Handler

// ServeMux routes tasks to handlers by type: an exact match first, then the
// longest registered pattern that ends in ':' and prefixes the type
// ("order:" matches "order:cancel"). Middleware registered with Use wraps
// every handler; the chain is built once, on the first ProcessTask, after
// which Handle and Use panic. A ServeMux is safe for concurrent use.
type ServeMux struct {
	mu       sync.RWMutex
	exact    map[string]Handler
	prefixes []muxEntry // sorted by pattern length, longest first
	mws      []MiddlewareFunc
	built    Handler
	once     sync.Once
}

type muxEntry struct {
	pattern string
	h       Handler
}

// NewServeMux returns an empty ServeMux.
func NewServeMux() *ServeMux {
	return &ServeMux{exact: make(map[string]Handler)}
}

// Handle registers h for pattern. A pattern that ends in ':' also matches
// every type it prefixes. Handle panics if pattern is empty, h is nil, the
// pattern is already registered, or the mux has started serving.
func (m *ServeMux) Handle(pattern string, h Handler) {
	if pattern == "" {
		panic("tide: ServeMux.Handle: empty pattern")
	}
	if h == nil {
		panic("tide: ServeMux.Handle: nil handler for " + pattern)
	}
	if f, ok := h.(HandlerFunc); ok && f == nil {
		panic("tide: ServeMux.Handle: nil handler for " + pattern)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.built != nil {
		panic("tide: ServeMux.Handle(" + pattern + ") after the mux started serving")
	}
	if _, dup := m.exact[pattern]; dup {
		panic("tide: ServeMux.Handle: duplicate pattern " + pattern)
	}
	m.exact[pattern] = h
	if strings.HasSuffix(pattern, ":") {
		m.prefixes = append(m.prefixes, muxEntry{pattern, h})
		sort.SliceStable(m.prefixes, func(i, j int) bool { return len(m.prefixes[i].pattern) > len(m.prefixes[j].pattern) })
	}
}

// HandleFunc registers fn for pattern; see Handle.
func (m *ServeMux) HandleFunc(pattern string, fn func(ctx context.Context, t *Task) error) {
	if fn == nil {
		panic("tide: ServeMux.HandleFunc: nil handler for " + pattern)
	}
	m.Handle(pattern, HandlerFunc(fn))
}

// Use appends middleware to the chain; the first registered is outermost.
// Use panics on nil middleware or after the mux started serving.
func (m *ServeMux) Use(mws ...MiddlewareFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.built != nil {
		panic("tide: ServeMux.Use after the mux started serving")
	}
	for _, mw := range mws {
		if mw == nil {
			panic("tide: ServeMux.Use: nil middleware")
		}
		m.mws = append(m.mws, mw)
	}
}

// Handler returns the handler registered for t's type and the pattern that
// matched. For an unknown type it returns a handler that fails with an error
// wrapping ErrHandlerNotFound, and an empty pattern. The returned handler is
// not wrapped in middleware.
func (m *ServeMux) Handler(t *Task) (h Handler, pattern string) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	typ := t.Type()
	if h, ok := m.exact[typ]; ok {
		return h, typ
	}
	for _, e := range m.prefixes {
		if strings.HasPrefix(typ, e.pattern) {
			return e.h, e.pattern
		}
	}
	return notFound, ""
}

var notFound = HandlerFunc(func(_ context.Context, t *Task) error {
	return fmt.Errorf("%w: %q", ErrHandlerNotFound, t.Type())
})

// ProcessTask dispatches t through the middleware chain to its handler.
func (m *ServeMux) ProcessTask(ctx context.Context, t *Task) error {
	m.once.Do(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		var h Handler = HandlerFunc(func(ctx context.Context, t *Task) error {
			h, _ := m.Handler(t)
			return h.ProcessTask(ctx, t)
		})
		for i := len(m.mws) - 1; i >= 0; i-- {
			h = m.mws[i](h)
		}
		m.built = h
	})
	return m.built.ProcessTask(ctx, t)
}

// HandleArgs registers fn for the task type of T on m. The payload is decoded
// from JSON into a T; a payload that does not decode fails with an error that
// wraps SkipRetry and names the type and the problem, so a poison message is
// archived instead of retried. HandleArgs panics like Handle.
func HandleArgs[T TaskArgs](m *ServeMux, fn func(ctx context.Context, args T) error) {
	if fn == nil {
		panic("tide: HandleArgs: nil function")
	}
	var zero T
	typ := zero.TaskType()
	m.Handle(typ, HandlerFunc(func(ctx context.Context, t *Task) error {
		var args T
		if err := json.Unmarshal(t.Payload(), &args); err != nil {
			return fmt.Errorf("tide: decode %s payload: %s: %w", typ, describeJSONError(err), SkipRetry)
		}
		return fn(ctx, args)
	}))
}

func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "(top level)"
		}
		return fmt.Sprintf("field %s: cannot use JSON %s as %s", field, te.Value, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, err)
	}
	return err.Error()
}
