package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tidequeue/tide"
)

// Defaults of the Config fields about GET /v1/events.
const (
	DefaultEventsHeartbeat         = 15 * time.Second
	DefaultMaxEventStreams         = 100
	DefaultMaxEventStreamsPerToken = 20
	DefaultEventsWriteTimeout      = 10 * time.Second
	DefaultEventsMaxLifetime       = 30 * time.Minute
)

// eventsRetryAfter is the Retry-After of a 429 too_many_streams, in
// seconds.
const eventsRetryAfter = "10"

// eventLimits counts the open event streams, all together and per token.
type eventLimits struct {
	max, perToken int
	write, life   time.Duration

	mu      sync.Mutex
	open    int
	byToken map[int]int // index in Config.Tokens -> open streams

	noDeadline sync.Once // warned that writes cannot be bounded
}

// init reads the limits from cfg and returns what is wrong with them.
func (l *eventLimits) init(cfg Config) []error {
	var errs []error
	l.max, l.perToken, l.write, l.life = cfg.MaxEventStreams, cfg.MaxEventStreamsPerToken, cfg.EventsWriteTimeout, cfg.EventsMaxLifetime
	l.byToken = map[int]int{}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{{"MaxEventStreams", &l.max, DefaultMaxEventStreams}, {"MaxEventStreamsPerToken", &l.perToken, DefaultMaxEventStreamsPerToken}} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("%s %d is negative", f.name, *f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"EventsWriteTimeout", &l.write, DefaultEventsWriteTimeout}, {"EventsMaxLifetime", &l.life, DefaultEventsMaxLifetime}} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			errs = append(errs, fmt.Errorf("%s %v is negative", f.name, *f.v))
		}
	}
	return errs
}

// acquire counts a new stream of token tok, or refuses it with 429 when a
// cap is reached; release uncounts it.
func (l *eventLimits) acquire(tok int) (release func(), aerr *apiError) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.byToken[tok] >= l.perToken:
		return nil, &apiError{status: http.StatusTooManyRequests, code: "too_many_streams",
			message: fmt.Sprintf("this token has %d event streams open, the most one token may (Config.MaxEventStreamsPerToken); close one, or retry later", l.byToken[tok])}
	case l.open >= l.max:
		return nil, &apiError{status: http.StatusTooManyRequests, code: "too_many_streams",
			message: fmt.Sprintf("the gateway serves %d event streams, its most (Config.MaxEventStreams); retry later", l.open)}
	}
	l.open++
	l.byToken[tok]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if l.byToken[tok]--; l.byToken[tok] == 0 {
			delete(l.byToken, tok)
		}
	}, nil
}

// Event is one task event as GET /v1/events sends it, in the data line of
// a server-sent event whose id is the same resume token as "id".
type Event struct {
	ID     string    `json:"id"`
	Queue  string    `json:"queue"`
	TaskID string    `json:"task_id"`
	Type   string    `json:"type"`
	Kind   string    `json:"kind"`
	At     time.Time `json:"at"`
	Error  string    `json:"error,omitempty"`
}

// handleEvents serves GET /v1/events?queue=a&queue=b: the queues' task
// events as server-sent events (text/event-stream), from now, or after the
// event named by the Last-Event-ID header or the after parameter
// (tide.EventsOldest, "0", for the oldest kept).
func (g *gateway) handleEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		g.methodNotAllowed(w, r, "GET")
		return
	}
	qs := r.URL.Query()
	queues := qs["queue"]
	if len(queues) == 0 {
		g.fail(w, r, badField("queue", "name at least one queue: /v1/events?queue=orders&queue=emails"))
		return
	}
	for _, q := range queues {
		if err := tide.ValidateQueueName(q); err != nil {
			g.fail(w, r, badField("queue", "%s", stripInvalid(err)))
			return
		}
		if aerr := g.allowQueue(q); aerr != nil {
			g.fail(w, r, aerr)
			return
		}
	}
	after, field := r.Header.Get("Last-Event-ID"), "Last-Event-ID"
	if a, ok := qs["after"]; ok && after == "" {
		if len(a) != 1 {
			g.fail(w, r, badField("after", "give it once"))
			return
		}
		after, field = a[0], "after"
	}
	tok, _ := r.Context().Value(tokenKey{}).(int)
	release, aerr := g.events.acquire(tok)
	if aerr != nil {
		w.Header().Set("Retry-After", eventsRetryAfter)
		g.fail(w, r, aerr)
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, err := g.in.Events(ctx, tide.EventsFrom{Queues: queues, After: after})
	if err != nil {
		g.fail(w, r, eventsError(err, field))
		return
	}
	defer func() {
		cancel()
		for range ch { // wait for the reading to end
		}
	}()
	rc := http.NewResponseController(w)
	send := func(b []byte) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(g.events.write)); err != nil {
			g.events.noDeadline.Do(func() {
				g.log.Warn("tide: gateway: the ResponseWriter does not support write deadlines: an event stream whose client stops reading is not dropped (serve the gateway with net/http, or wrap the ResponseWriter with an Unwrap method)", "err", err)
			})
		}
		_, err := w.Write(b)
		return err == nil && rc.Flush() == nil
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	// retry: how long an EventSource waits before it reconnects (with
	// Last-Event-ID, so nothing is missed).
	if !send([]byte("retry: 2000\n: tide events\n\n")) {
		return
	}
	beat := time.NewTicker(g.beat)
	defer beat.Stop()
	life := time.NewTimer(g.events.life)
	defer life.Stop()
	// The client can resume without a gap once it holds a resume token:
	// the one it came with, or the id of an event sent since.
	resumable, expired := after != "", false
	const reconnect = ": the stream reached its lifetime (Config.EventsMaxLifetime); reconnect with Last-Event-ID\n\n"
	var buf bytes.Buffer
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return // ctx ended, or the reading could not go on: the client reconnects and learns why
			}
			buf.Reset()
			writeEvent(&buf, ev)
			// Send what else is ready with it, in one write.
			for more := true; more && buf.Len() < 64<<10; {
				select {
				case ev, ok := <-ch:
					if !ok {
						more = false
						break
					}
					writeEvent(&buf, ev)
				default:
					more = false
				}
			}
			if expired {
				buf.WriteString(reconnect)
			}
			if !send(buf.Bytes()) || expired {
				return
			}
			resumable = true
			beat.Reset(g.beat)
		case <-beat.C:
			if !send([]byte(": keep-alive\n\n")) {
				return
			}
		case <-life.C:
			if resumable {
				send([]byte(reconnect))
				return
			}
			expired = true // end after the next event, which gives the client a token
		case <-ctx.Done():
			return
		}
	}
}

// writeEvent appends ev as a server-sent event: its token as id, the Event
// as JSON data.
func writeEvent(buf *bytes.Buffer, ev tide.TaskEvent) {
	data, _ := json.Marshal(Event{ID: ev.ID, Queue: ev.Queue, TaskID: ev.TaskID, Type: ev.Type, Kind: ev.Kind.String(), At: ev.At.UTC(), Error: ev.Err})
	buf.WriteString("id: ")
	buf.WriteString(ev.ID)
	buf.WriteString("\ndata: ")
	buf.Write(data) // JSON has no raw newline
	buf.WriteString("\n\n")
}

// eventsError maps an error of Inspector.Events to a response; field is
// where the resume token came from.
func eventsError(err error, field string) *apiError {
	switch {
	case errors.Is(err, tide.ErrBadEventToken):
		return badField(field, "%s", strings.TrimPrefix(err.Error(), "tide: "))
	case errors.Is(err, tide.ErrEventGap):
		return &apiError{status: http.StatusGone, code: "events_gap", field: field,
			message: strings.TrimPrefix(err.Error(), "tide: ") + `; reconnect without Last-Event-ID (from now) or with after=0 (the oldest kept)`}
	case errors.Is(err, tide.ErrEventsOff):
		return &apiError{status: http.StatusConflict, code: "events_off", field: "queue",
			message: "none of the queues records events; an operator turns them on (Inspector.SetQueueEvents)"}
	case errors.Is(err, tide.ErrNotSupported):
		return &apiError{status: http.StatusNotImplemented, code: "not_supported", message: "the task store keeps no events", cause: err}
	case errors.Is(err, tide.ErrInvalidTask):
		return badRequest("%s", stripInvalid(err))
	case errors.Is(err, context.Canceled):
		return &apiError{status: http.StatusServiceUnavailable, code: "canceled", message: "the request was cancelled"}
	}
	return &apiError{status: http.StatusServiceUnavailable, code: "unavailable",
		message: "the task store is unavailable; retry later", cause: err}
}
