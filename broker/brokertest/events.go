package brokertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// eventTests cover broker.EventReader (each skipped by a broker that does
// not implement it): the events a task's life produces, resuming after the
// last event seen, and tokens that are refused.
var eventTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker)
}{
	{"EventsLifecycle", testEventsLifecycle},
	{"EventsResume", testEventsResume},
	{"EventsOldest", testEventsOldest},
	{"EventsBadToken", testEventsBadToken},
	{"EventsOff", testEventsOff},
}

// eventReader returns b's EventReader with events turned on for queues.
func eventReader(t *testing.T, b broker.Broker, queues ...string) broker.EventReader {
	t.Helper()
	r := b
	for _, q := range queues {
		err := r.SetEvents(t.Context(), q, true)
		needs(t, "EventReader", err)
		if err != nil {
			t.Fatalf("SetEvents(%s, true): %v", q, err)
		}
	}
	return r
}

// readEvents starts reading and ends the reading when the test ends,
// checking that the channel then closes.
func readEvents(t *testing.T, r broker.EventReader, queues []string, after string) (<-chan tidetype.TaskEvent, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := r.ReadEvents(ctx, queues, after)
	if err != nil {
		cancel()
		t.Fatalf("ReadEvents(%q, %q): %v", queues, after, err)
	}
	t.Cleanup(func() {
		cancel()
		drainClosed(t, ch)
	})
	return ch, cancel
}

// drainClosed reads ch until it closes, failing after waitLong.
func drainClosed(t *testing.T, ch <-chan tidetype.TaskEvent) {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Error("the events channel did not close after its context ended")
			return
		}
	}
}

// nextEvents reads n events, failing after waitLong.
func nextEvents(t *testing.T, ch <-chan tidetype.TaskEvent, n int) []tidetype.TaskEvent {
	t.Helper()
	var out []tidetype.TaskEvent
	deadline := time.After(waitLong)
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("the events channel closed after %d of %d events: %v", len(out), n, describeEvents(out))
			}
			out = append(out, ev)
		case <-deadline:
			t.Fatalf("got %d of %d events: %v", len(out), n, describeEvents(out))
		}
	}
	return out
}

// noMoreEvents checks that nothing arrives for a moment.
func noMoreEvents(t *testing.T, ch <-chan tidetype.TaskEvent) {
	t.Helper()
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %s", describeEvents([]tidetype.TaskEvent{ev}))
	case <-time.After(waitEvent):
	}
}

func describeEvents(evs []tidetype.TaskEvent) string {
	s := make([]string, len(evs))
	for i, ev := range evs {
		s[i] = ev.Queue + "/" + ev.TaskID + ":" + ev.Kind.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// kindsByTask groups events by task, in the order they came.
func kindsByTask(evs []tidetype.TaskEvent) map[string][]tidetype.TaskEventKind {
	m := map[string][]tidetype.TaskEventKind{}
	for _, ev := range evs {
		m[ev.TaskID] = append(m[ev.TaskID], ev.Kind)
	}
	return m
}

// testEventsLifecycle: each step of a task's life is one event, with the
// task's queue, ID and type, the broker's time and, on failure, the error;
// the events of one task come in order.
func testEventsLifecycle(t *testing.T, b broker.Broker) {
	const q = "events"
	r := eventReader(t, b, q)
	before := time.Now().Add(-time.Second)
	ch, _ := readEvents(t, r, []string{q}, "")

	// succeeded
	enqueue(t, b, newMsg(q, "ok"))
	settleOK(t, b, outcomeOf(dequeueOne(t, b, q, time.Minute), broker.SettleDone))
	// failed, retried, failed for good
	enqueue(t, b, newMsg(q, "bad"))
	d := dequeueOne(t, b, q, time.Minute)
	settleOK(t, b, retryOf(d, time.Now(), "boom 1"))
	d = redeliver(t, b, q, time.Minute)
	s := outcomeOf(d, broker.SettleArchive)
	s.Err = "boom 2"
	settleOK(t, b, s)
	// deleted, cancelled while waiting, cancelled while running
	enqueue(t, b, newMsg(q, "del"), newMsg(q, "can"))
	if err := b.Delete(t.Context(), q, "del"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := b.Cancel(t.Context(), q, "can"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	enqueue(t, b, newMsg(q, "run"))
	d = dequeueOne(t, b, q, time.Minute)
	if err := b.Cancel(t.Context(), q, "run"); err != nil {
		t.Fatalf("Cancel of the running task: %v", err)
	}
	settleOK(t, b, retryOf(d, time.Now(), "stopped"))

	E, S, D, F, R, A, X, C := tidetype.EventEnqueued, tidetype.EventStarted, tidetype.EventSucceeded, tidetype.EventFailed,
		tidetype.EventRetrying, tidetype.EventArchived, tidetype.EventDeleted, tidetype.EventCancelled
	want := map[string][]tidetype.TaskEventKind{
		"ok":  {E, S, D},
		"bad": {E, S, F, R, S, F, A},
		"del": {E, X},
		"can": {E, C},
		"run": {E, S, C, F, A},
	}
	n := 0
	for _, ks := range want {
		n += len(ks)
	}
	evs := nextEvents(t, ch, n)
	noMoreEvents(t, ch)
	got := kindsByTask(evs)
	for id, ks := range want {
		if !slices.Equal(got[id], ks) {
			t.Errorf("events of task %s: %v, want %v (all: %s)", id, got[id], ks, describeEvents(evs))
		}
	}
	ids := map[string]bool{}
	for _, ev := range evs {
		if ev.Queue != q || ev.Type != taskType {
			t.Errorf("event %s: queue %q type %q, want %q %q", describeEvents([]tidetype.TaskEvent{ev}), ev.Queue, ev.Type, q, taskType)
		}
		if ev.At.Before(before) || ev.At.After(time.Now().Add(time.Second)) {
			t.Errorf("event %s: At %v is not the time it happened", describeEvents([]tidetype.TaskEvent{ev}), ev.At)
		}
		if ev.ID == "" || ids[ev.ID] {
			t.Errorf("event %s: ID %q is empty or repeated", describeEvents([]tidetype.TaskEvent{ev}), ev.ID)
		}
		ids[ev.ID] = true
	}
	var errs []string
	for _, ev := range evs {
		if ev.TaskID == "bad" && ev.Kind == F {
			errs = append(errs, ev.Err)
		}
	}
	if !slices.Equal(errs, []string{"boom 1", "boom 2"}) {
		t.Errorf("errors of the failed events: %q, want [boom 1 boom 2]", errs)
	}
	for _, ev := range evs {
		if ev.TaskID == "run" && ev.Kind == A && !strings.Contains(ev.Err, "cancel") {
			t.Errorf("the cancelled task's archived event says %q, not that it was cancelled", ev.Err)
		}
	}
}

// testEventsResume: a reader that stops and reads again after the last
// event it got continues with the next one: nothing missed, nothing twice,
// also for events recorded while nobody read, and over several queues.
func testEventsResume(t *testing.T, b broker.Broker) {
	queues := []string{"ev-a", "ev-b"}
	r := eventReader(t, b, queues...)
	ch, cancel := readEvents(t, r, queues, "")
	var want []string
	add := func(n int, from int) {
		var ms []*tidetype.TaskInfo
		for i := range n {
			q := queues[(from+i)%2]
			id := fmt.Sprintf("t%d", from+i)
			ms = append(ms, newMsg(q, id))
			want = append(want, q+"/"+id+":enqueued")
		}
		enqueue(t, b, ms...)
	}
	add(10, 0)
	first := nextEvents(t, ch, 4)
	cancel()
	drainClosed(t, ch)
	add(10, 10) // while nobody reads

	ch2, _ := readEvents(t, r, nil, first[len(first)-1].ID) // the token's queues
	rest := nextEvents(t, ch2, 16)
	add(4, 20)
	rest = append(rest, nextEvents(t, ch2, 4)...)
	noMoreEvents(t, ch2)
	got := append(first, rest...)
	gotS := strings.Fields(strings.Trim(describeEvents(got), "[]"))
	slices.Sort(gotS)
	slices.Sort(want)
	if !slices.Equal(gotS, want) {
		t.Fatalf("events over a resume: %v, want each of %v once", gotS, want)
	}
	// The same queues, named explicitly and in another order, resume too.
	ch3, _ := readEvents(t, r, []string{"ev-b", "ev-a", "ev-a"}, rest[len(rest)-1].ID)
	noMoreEvents(t, ch3)
}

// testEventsOldest: reading from the oldest event gets what was recorded
// before the reading started.
func testEventsOldest(t *testing.T, b broker.Broker) {
	const q = "ev-old"
	r := eventReader(t, b, q)
	enqueue(t, b, newMsg(q, "a"), newMsg(q, "b"))
	ch, _ := readEvents(t, r, []string{q}, broker.EventsOldest)
	evs := nextEvents(t, ch, 2)
	got := kindsByTask(evs)
	if len(got["a"]) != 1 || len(got["b"]) != 1 {
		t.Fatalf("events from the oldest: %s, want a and b enqueued", describeEvents(evs))
	}
	noMoreEvents(t, ch)
}

// testEventsBadToken: a token that is not one, was altered, or is of other
// queues is refused with an error that says so.
func testEventsBadToken(t *testing.T, b broker.Broker) {
	const q = "ev-tok"
	r := eventReader(t, b, q, "other")
	ch, _ := readEvents(t, r, []string{q}, "")
	enqueue(t, b, newMsg(q, "a"))
	tok := nextEvents(t, ch, 1)[0].ID
	altered := []byte(tok)
	altered[len(altered)-3] ^= 1
	for name, bad := range map[string]string{
		"garbage":   "not-a-token",
		"truncated": tok[:len(tok)-4],
		"altered":   string(altered),
		"version":   "e9" + tok[2:],
	} {
		ctx, cancel := context.WithCancel(t.Context())
		ch, err := r.ReadEvents(ctx, []string{q}, bad)
		if err == nil {
			cancel()
			drainClosed(t, ch)
			t.Errorf("%s token %q: no error", name, bad)
			continue
		}
		cancel()
		if !errors.Is(err, broker.ErrBadEventToken) || !strings.HasPrefix(err.Error(), "tide: ") {
			t.Errorf("%s token: error %q does not wrap ErrBadEventToken", name, err)
		}
	}
	_, err := r.ReadEvents(t.Context(), []string{"other"}, tok)
	if !errors.Is(err, broker.ErrBadEventToken) || !strings.Contains(err.Error(), "other") {
		t.Errorf("a token of queue %q read for queue \"other\": error %v, want one wrapping ErrBadEventToken that names the queues", q, err)
	}
}

// testEventsOff: a queue records events only once turned on, and stops
// when turned off; reading only queues that record none is an error.
func testEventsOff(t *testing.T, b broker.Broker) {
	r := eventReader(t, b)
	if _, err := r.ReadEvents(t.Context(), []string{"ev-off"}, ""); !errors.Is(err, broker.ErrEventsOff) {
		t.Fatalf("ReadEvents of a queue without events: %v, want ErrEventsOff", err)
	}
	eventReader(t, b, "ev-on")
	ch, _ := readEvents(t, r, []string{"ev-off", "ev-on"}, "")
	enqueue(t, b, newMsg("ev-off", "quiet"), newMsg("ev-on", "loud"))
	if evs := nextEvents(t, ch, 1); evs[0].TaskID != "loud" {
		t.Fatalf("first event %s, want the one of the queue that records events", describeEvents(evs))
	}
	if err := r.SetEvents(t.Context(), "ev-on", false); err != nil {
		t.Fatal(err)
	}
	// A Redis broker may take a moment to see the change in another
	// process; this one changed it itself.
	enqueue(t, b, newMsg("ev-on", "after"))
	noMoreEvents(t, ch)
}
