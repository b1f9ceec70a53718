package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/gateway"
)

// sseStream is an open GET /v1/events.
type sseStream struct {
	t     *testing.T
	resp  *http.Response
	lines chan string
	close func() // ends the request and waits for the reading to end
}

// openEvents opens the event stream at path with the headers (pairs).
func (e *env) openEvents(path string, headers ...string) *sseStream {
	e.t.Helper()
	return e.openEventsAs(token, path, headers...)
}

// openEventsAs is openEvents with the bearer token tok.
func (e *env) openEventsAs(tok, path string, headers ...string) *sseStream {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.t.Context())
	req, err := http.NewRequestWithContext(ctx, "GET", e.srv.URL+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	s := &sseStream{t: e.t, resp: resp, lines: make(chan string, 1024)}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	var once sync.Once
	s.close = func() {
		once.Do(func() {
			cancel()
			resp.Body.Close()
			for range s.lines {
			}
		})
	}
	e.t.Cleanup(s.close)
	return s
}

// end waits for the stream to end and returns the lines it had left.
func (s *sseStream) end() []string {
	s.t.Helper()
	var rest []string
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				return rest
			}
			rest = append(rest, line)
		case <-deadline:
			s.t.Fatalf("the event stream did not end; it sent %d lines, the last %q", len(rest), rest[max(0, len(rest)-6):])
		}
	}
}

// comments reads comment lines until n have come (skipping other lines).
func (s *sseStream) comments(n int) {
	s.t.Helper()
	deadline := time.After(10 * time.Second)
	for n > 0 {
		select {
		case line, ok := <-s.lines:
			if !ok {
				s.t.Fatal("the event stream ended")
			}
			if strings.HasPrefix(line, ":") {
				n--
			}
		case <-deadline:
			s.t.Fatalf("%d comments short on the event stream", n)
		}
	}
}

// next returns the next event (id and data), skipping comments and retry
// lines; it records whether a comment came before it.
func (s *sseStream) next() (id string, ev gateway.Event, comments int) {
	s.t.Helper()
	deadline := time.After(10 * time.Second)
	var data string
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				s.t.Fatal("the event stream ended")
			}
			switch {
			case strings.HasPrefix(line, ":"):
				comments++
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			case line == "" && data != "":
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					s.t.Fatalf("data %q: %v", data, err)
				}
				return id, ev, comments
			}
		case <-deadline:
			s.t.Fatal("no event on the stream")
		}
	}
}

func TestEventsStream(t *testing.T) {
	e := setup(t, gateway.Config{EventsHeartbeat: 50 * time.Millisecond, AllowedQueues: []string{"orders", "emails", "secret"}})
	ctx := t.Context()
	if err := e.in.SetQueueEvents(ctx, "orders", true); err != nil {
		t.Fatal(err)
	}
	s := e.openEvents("/v1/events?queue=orders&queue=emails")
	if s.resp.StatusCode != http.StatusOK || !strings.HasPrefix(s.resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET /v1/events: %d %s", s.resp.StatusCode, s.resp.Header.Get("Content-Type"))
	}
	var ids []string
	for i := range 3 {
		info, err := e.c.Enqueue(ctx, tide.NewTask("order:ship", nil, tide.Queue("orders")))
		if err != nil {
			t.Fatal(err)
		}
		id, ev, _ := s.next()
		if ev.Kind != "enqueued" || ev.TaskID != info.ID || ev.Queue != "orders" || ev.Type != "order:ship" || ev.ID != id || id == "" {
			t.Fatalf("event %d: id %q %+v, want the enqueue of %s", i, id, ev, info.ID)
		}
		ids = append(ids, id)
	}
	// Quiet: heartbeats keep the stream open.
	time.Sleep(200 * time.Millisecond)
	if _, err := e.c.Enqueue(ctx, tide.NewTask("order:ship", nil, tide.Queue("orders"))); err != nil {
		t.Fatal(err)
	}
	if _, _, comments := s.next(); comments == 0 {
		t.Error("no heartbeat comment while the stream was quiet")
	}

	// Resume after the first event: the second and third come, once.
	for _, how := range []struct{ path, header string }{
		{"/v1/events?queue=orders&queue=emails", ids[0]},
		{"/v1/events?queue=emails&queue=orders&after=" + ids[0], ""},
	} {
		r := e.openEvents(how.path, "Last-Event-ID", how.header)
		for _, want := range ids[1:] {
			if id, _, _ := r.next(); id != want {
				t.Fatalf("resumed stream (%s): event %q, want %q", how.path, id, want)
			}
		}
	}

	for _, c := range []struct {
		path, header string
		status       int
		code, field  string
	}{
		{"/v1/events", "", 400, "invalid_request", "queue"},
		{"/v1/events?queue=bad%20name", "", 400, "invalid_request", "queue"},
		{"/v1/events?queue=other", "", 403, "queue_not_allowed", "queue"},
		{"/v1/events?queue=orders", "garbage", 400, "invalid_request", "Last-Event-ID"},
		{"/v1/events?queue=orders&after=garbage", "", 400, "invalid_request", "after"},
		{"/v1/events?queue=secret", ids[0], 400, "invalid_request", "Last-Event-ID"}, // a token of other queues
		{"/v1/events?queue=emails", "", 409, "events_off", "queue"},
	} {
		r := e.do("GET", c.path, "", "Last-Event-ID", c.header)
		if r.status != c.status {
			t.Errorf("GET %s (Last-Event-ID %q): %d %s, want %d", c.path, c.header, r.status, r.body, c.status)
			continue
		}
		if code, field, _ := r.errorBody(t); code != c.code || field != c.field {
			t.Errorf("GET %s: code %q field %q, want %q %q", c.path, code, field, c.code, c.field)
		}
	}
	if r := e.do("POST", "/v1/events?queue=orders", ""); r.status != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/events: %d", r.status)
	}
	req, _ := http.NewRequest("GET", e.srv.URL+"/v1/events?queue=orders", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/events without a token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}
