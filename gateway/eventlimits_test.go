package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// eventsOn turns the recording of queue's events on.
func (e *env) eventsOn(queue string) {
	e.t.Helper()
	if err := e.in.SetQueueEvents(e.t.Context(), queue, true); err != nil {
		e.t.Fatal(err)
	}
}

// Open event streams do not hold the connections of the broker's pool:
// with more streams than the pool has connections, an enqueue through the
// gateway still gets one at once.
func TestEventStreamsLeaveThePoolFree(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), PoolSize: 2})
	t.Cleanup(func() { _ = rdb.Close() })
	e := setupOn(t, rdb, nil, gateway.Config{})
	e.eventsOn("q")
	const streams = 12
	var ss []*sseStream
	for range streams {
		s := e.openEvents("/v1/events?queue=q")
		if s.resp.StatusCode != http.StatusOK {
			t.Fatalf("stream: %d", s.resp.StatusCode)
		}
		ss = append(ss, s)
	}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/tasks", strings.NewReader(`{"type":"t","queue":"q"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("POST /v1/tasks %d with %d event streams open on a pool of 2: %v", i, streams, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST /v1/tasks %d with %d event streams open on a pool of 2: %d %s", i, streams, resp.StatusCode, body)
		}
	}
	for i, s := range ss {
		if _, ev, _ := s.next(); ev.Kind != "enqueued" {
			t.Errorf("stream %d: %+v", i, ev)
		}
	}
}

// Event streams are capped per token and in all; one more is 429 with
// Retry-After, and closing a stream frees its place.
func TestEventStreamCaps(t *testing.T) {
	t.Parallel()
	const token2 = "second-token-0123456789abcdef"
	e := setup(t, gateway.Config{Tokens: []string{token, token2}, MaxEventStreams: 3, MaxEventStreamsPerToken: 2})
	e.eventsOn("q")
	open := func(tok string, want int, msg string) *sseStream {
		t.Helper()
		s := e.openEventsAs(tok, "/v1/events?queue=q")
		if s.resp.StatusCode != want {
			t.Fatalf("stream: %d, want %d", s.resp.StatusCode, want)
		}
		if want == http.StatusTooManyRequests {
			body := strings.Join(s.end(), "\n")
			r := response{s.resp.StatusCode, s.resp.Header, []byte(body)}
			code, _, m := r.errorBody(t)
			if code != "too_many_streams" || !strings.Contains(m, msg) || s.resp.Header.Get("Retry-After") == "" {
				t.Errorf("429: code %q, Retry-After %q, message %q (want it to name %s)", code, s.resp.Header.Get("Retry-After"), m, msg)
			}
		}
		return s
	}
	a1 := open(token, http.StatusOK, "")
	open(token, http.StatusOK, "")
	open(token, http.StatusTooManyRequests, "MaxEventStreamsPerToken")
	open(token2, http.StatusOK, "")
	open(token2, http.StatusTooManyRequests, "MaxEventStreams)")

	// Closing a stream frees its place (once the gateway sees it go).
	a1.close()
	testwait.For(t, 10*time.Second, "a closed stream's place to be freed", func() bool {
		s := e.openEventsAs(token, "/v1/events?queue=q")
		if s.resp.StatusCode == http.StatusOK {
			return true
		}
		s.close()
		return false
	})

	for _, c := range []struct {
		cfg  gateway.Config
		want string
	}{
		{gateway.Config{MaxEventStreams: -1}, "MaxEventStreams -1 is negative"},
		{gateway.Config{MaxEventStreamsPerToken: -2}, "MaxEventStreamsPerToken -2 is negative"},
		{gateway.Config{EventsWriteTimeout: -time.Second}, "EventsWriteTimeout -1s is negative"},
		{gateway.Config{EventsMaxLifetime: -time.Minute}, "EventsMaxLifetime -1m0s is negative"},
	} {
		c.cfg.Tokens = []string{token}
		if _, err := gateway.New(e.c, e.in, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
}

// smallBuffers is a listener whose connections have a small send buffer, so
// that a client that stops reading blocks the server's writes soon.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// A client that stops reading its event stream is disconnected once a
// write has waited EventsWriteTimeout, and its place is freed.
func TestEventStreamDropsStalledClient(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(nil)
	srv.Listener = smallBuffers{srv.Listener}
	e := setupOn(t, redistest.Client(t, redistest.Addr(t)), srv, gateway.Config{MaxEventStreams: 1, EventsWriteTimeout: 100 * time.Millisecond})
	e.eventsOn("q")

	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	if _, err := io.WriteString(conn, "GET /v1/events?queue=q HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+token+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(conn, 16)
	status, err := br.ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("stream: %q %v", status, err)
	}
	// The client reads no more. Events fill the buffers until the
	// gateway gives up; a new stream (the cap is 1) then gets in.
	typ, id := strings.Repeat("t", tide.MaxIDLength), strings.Repeat("i", tide.MaxIDLength-10)
	deadline := time.Now().Add(20 * time.Second)
	for n := 0; ; {
		tasks := make([]*tide.Task, 100)
		for i := range tasks {
			n++
			tasks[i] = tide.NewTask(typ, nil, tide.Queue("q"), tide.TaskID(fmt.Sprintf("%s%d", id, n)))
		}
		if _, err := e.c.EnqueueMany(t.Context(), tasks); err != nil {
			t.Fatal(err)
		}
		s := e.openEvents("/v1/events?queue=q")
		if s.resp.StatusCode == http.StatusOK {
			s.close()
			break
		}
		s.close()
		if time.Now().After(deadline) {
			t.Fatal("the stalled stream still holds its place")
		}
	}
	// The stalled connection was closed: reading it now comes to its end.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the stalled connection is still open")
	}
}

// A stream that holds a resume token ends at EventsMaxLifetime with a
// comment that says to reconnect; one opened "from now" that has seen no
// event stays until its next event, then ends.
func TestEventStreamLifetime(t *testing.T) {
	t.Parallel()
	e := setup(t, gateway.Config{EventsMaxLifetime: 200 * time.Millisecond, EventsHeartbeat: 20 * time.Millisecond})
	e.eventsOn("q")
	ctx := t.Context()
	if _, err := e.c.Enqueue(ctx, tide.NewTask("t", nil, tide.Queue("q"))); err != nil {
		t.Fatal(err)
	}
	first, _, _ := e.openEvents("/v1/events?queue=q&after=0").next()

	for _, c := range []struct{ path, header string }{
		{"/v1/events?queue=q", first},
		{"/v1/events?queue=q&after=" + first, ""},
	} {
		s := e.openEvents(c.path, "Last-Event-ID", c.header)
		rest := s.end()
		if len(rest) < 2 || !strings.Contains(rest[len(rest)-2], "reconnect with Last-Event-ID") {
			t.Errorf("%s: the stream ended without saying to reconnect: %q", c.path, rest)
		}
	}

	// From now, no token yet: 20 heartbeats (at least 400ms, past the
	// lifetime) and the stream is still open; an event comes, and then it
	// ends.
	s := e.openEvents("/v1/events?queue=q")
	s.comments(20)
	info, err := e.c.Enqueue(ctx, tide.NewTask("t", nil, tide.Queue("q")))
	if err != nil {
		t.Fatal(err)
	}
	if _, ev, _ := s.next(); ev.TaskID != info.ID {
		t.Fatalf("event %+v, want the enqueue of %s", ev, info.ID)
	}
	if rest := s.end(); len(rest) < 2 || !strings.Contains(rest[len(rest)-2], "reconnect") {
		t.Errorf("the stream did not end after the event: %q", rest)
	}
}
