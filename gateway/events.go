package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

// DefaultEventsHeartbeat is the default Config.EventsHeartbeat.
const DefaultEventsHeartbeat = 15 * time.Second

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
	_ = rc.SetWriteDeadline(time.Time{}) // a stream outlives the server's WriteTimeout
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	// retry: how long an EventSource waits before it reconnects (with
	// Last-Event-ID, so nothing is missed).
	if _, err := fmt.Fprint(w, "retry: 2000\n: tide events\n\n"); err != nil || rc.Flush() != nil {
		return
	}
	beat := time.NewTicker(g.beat)
	defer beat.Stop()
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
			if _, err := w.Write(buf.Bytes()); err != nil || rc.Flush() != nil {
				return
			}
			beat.Reset(g.beat)
		case <-beat.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
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
