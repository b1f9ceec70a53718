package tide_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

// eventLog collects what a consumer received, over its readings.
type eventLog struct {
	mu  sync.Mutex
	evs []tide.TaskEvent
}

func (l *eventLog) add(ev tide.TaskEvent) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *eventLog) snapshot() []tide.TaskEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.evs)
}

// read consumes ch into l until it has n events in all or ch closes; it
// reports whether n were reached.
func (l *eventLog) read(t *testing.T, ch <-chan tide.TaskEvent, n int) bool {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for len(l.snapshot()) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				return false
			}
			l.add(ev)
		case <-deadline:
			t.Fatalf("got %d of %d events", len(l.snapshot()), n)
		}
	}
	return true
}

// byTask returns each task's event kinds, in the order received.
func byTask(evs []tide.TaskEvent) map[string][]tide.TaskEventKind {
	m := map[string][]tide.TaskEventKind{}
	for _, ev := range evs {
		m[ev.TaskID] = append(m[ev.TaskID], ev.Kind)
	}
	return m
}

// TestEventsResumeUnderLoad: while servers process tasks (some fail once
// and are retried), a consumer reads the events, disconnects twice and
// resumes each time after the last event it received. Every step of every
// task reaches it exactly once and in order: no gap, no repeat, across
// the partitions of the queue.
func TestEventsResumeUnderLoad(t *testing.T) {
	e := setup(t, redisbroker.WithPartitions(4))
	ctx := t.Context()
	in := tide.NewInspector(e.b)
	const q = "ev-load"
	if err := in.SetQueueEvents(ctx, q, true); err != nil {
		t.Fatal(err)
	}
	var failed sync.Map
	h := tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		i, _ := strconv.Atoi(string(task.Payload()))
		if _, again := failed.LoadOrStore(i, true); i%4 == 0 && !again {
			return errors.New("first attempt fails")
		}
		return nil
	})
	cfg := tide.Config{Concurrency: 20, Queues: map[string]int{q: 1},
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 5 * time.Millisecond }}
	rctx, cancel := context.WithCancel(ctx)
	ch, err := in.Events(rctx, tide.EventsFrom{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	e.server(cfg, h)
	e.server(cfg, h)

	const n = 300
	ids := map[string]int{}
	var idsMu sync.Mutex
	go func() {
		for i := range n {
			info, err := e.c.Enqueue(ctx, tide.NewTask("ev:load", []byte(strconv.Itoa(i))), tide.Queue(q))
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("Enqueue: %v", err)
				}
				return
			}
			idsMu.Lock()
			ids[info.ID] = i
			idsMu.Unlock()
		}
	}()
	want := n*3 + (n/4)*3 // enqueued, started, succeeded; plus failed, retrying, started
	var got eventLog
	for i, upTo := range []int{want / 3, 2 * want / 3} {
		if !got.read(t, ch, upTo) {
			t.Fatalf("reading %d ended early", i)
		}
		// Disconnect while processing goes on; what was already on its
		// way until the channel closed was received too.
		cancel()
		for ev := range ch {
			got.add(ev)
		}
		evs := got.snapshot()
		rctx, cancel = context.WithCancel(ctx)
		if ch, err = in.Events(rctx, tide.EventsFrom{After: evs[len(evs)-1].ID}); err != nil {
			t.Fatalf("resume after %d events: %v", len(evs), err)
		}
	}
	if !got.read(t, ch, want) {
		t.Fatal("the last reading ended early")
	}
	// Nothing more than expected comes.
	select {
	case ev := <-ch:
		t.Fatalf("an event beyond the %d expected: %+v", want, ev)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	for range ch {
	}

	idsMu.Lock()
	defer idsMu.Unlock()
	evs := got.snapshot()
	seen := map[string]bool{}
	for _, ev := range evs {
		if seen[ev.ID] {
			t.Fatalf("event token %q delivered twice", ev.ID)
		}
		seen[ev.ID] = true
	}
	E, S, D, F, R := tide.EventEnqueued, tide.EventStarted, tide.EventSucceeded, tide.EventFailed, tide.EventRetrying
	kinds := byTask(evs)
	if len(kinds) != n {
		t.Fatalf("events of %d tasks, want %d", len(kinds), n)
	}
	for id, ks := range kinds {
		i, ok := ids[id]
		if !ok {
			t.Fatalf("events of unknown task %s", id)
		}
		w := []tide.TaskEventKind{E, S, D}
		if i%4 == 0 {
			w = []tide.TaskEventKind{E, S, F, R, S, D}
		}
		if !slices.Equal(ks, w) {
			t.Errorf("task %d (%s): events %v, want %v", i, id, ks, w)
		}
	}
}

// TestEventsRepartition: a queue repartitioned while it is read keeps
// delivering every task's events, from the old partitions and the new
// ones, and a token taken after the repartition resumes.
func TestEventsRepartition(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	in := tide.NewInspector(e.b)
	const q = "ev-repart"
	if err := in.SetQueueEvents(ctx, q, true); err != nil {
		t.Fatal(err)
	}
	ch, err := in.Events(ctx, tide.EventsFrom{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	enqueueN := func(from, n int) {
		for i := from; i < from+n; i++ {
			if _, err := e.c.Enqueue(ctx, tide.NewTask("ev:r", nil), tide.Queue(q), tide.TaskID(fmt.Sprint("t", i)), tide.ProcessIn(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
	}
	enqueueN(0, 20)
	var got eventLog
	got.read(t, ch, 20)
	if err := in.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatalf("Repartition: %v", err)
	}
	enqueueN(20, 30) // into the new partitions
	got.read(t, ch, 50)
	tok := got.snapshot()[49].ID
	enqueueN(50, 10)
	ch2, err := in.Events(ctx, tide.EventsFrom{Queues: []string{q}, After: tok})
	if err != nil {
		t.Fatalf("resume after the repartition: %v", err)
	}
	got.read(t, ch2, 60)
	seen := map[string]int{}
	for _, ev := range got.snapshot() {
		if ev.Kind != tide.EventEnqueued {
			t.Errorf("unexpected event %+v (moving a task is no event)", ev)
		}
		seen[ev.TaskID]++
	}
	for i := range 60 {
		if id := fmt.Sprint("t", i); seen[id] != 1 {
			t.Errorf("task %s: %d enqueued events, want 1", id, seen[id])
		}
	}
}

// TestEventsErrors: bad tokens, queues without events and a token whose
// next events were trimmed are refused with errors that say so.
func TestEventsErrors(t *testing.T) {
	e := setup(t, redisbroker.WithEventRetention(5, 0))
	ctx := t.Context()
	in := tide.NewInspector(e.b)
	if _, err := in.Events(ctx, tide.EventsFrom{Queues: []string{"ev-none"}}); !errors.Is(err, tide.ErrEventsOff) {
		t.Errorf("Events of a queue without events: %v, want ErrEventsOff", err)
	}
	if _, err := in.Events(ctx, tide.EventsFrom{}); !errors.Is(err, tide.ErrInvalidTask) {
		t.Errorf("Events without queues: %v, want ErrInvalidTask", err)
	}
	for _, bad := range []string{"x", "e1", "e1AAAA", "e2AAAAAAA"} {
		_, err := in.Events(ctx, tide.EventsFrom{Queues: []string{"q"}, After: bad})
		if !errors.Is(err, tide.ErrBadEventToken) || !strings.HasPrefix(err.Error(), "tide: ") {
			t.Errorf("token %q: %v, want ErrBadEventToken", bad, err)
		}
	}
	const q = "ev-trim"
	if err := in.SetQueueEvents(ctx, q, true); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	ch, err := in.Events(rctx, tide.EventsFrom{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("ev:t", nil), tide.Queue(q)); err != nil {
		t.Fatal(err)
	}
	var got eventLog
	got.read(t, ch, 1)
	cancel()
	for range ch {
	}
	// Far more entries than kept (MAXLEN ~ trims whole nodes of 100).
	for range 400 {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("ev:t", nil), tide.Queue(q)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.Events(ctx, tide.EventsFrom{After: got.snapshot()[0].ID}); !errors.Is(err, tide.ErrEventGap) {
		t.Errorf("resume after trimmed events: %v, want ErrEventGap", err)
	}
	rctx, cancel = context.WithCancel(ctx)
	defer cancel()
	ch, err = in.Events(rctx, tide.EventsFrom{Queues: []string{q}, After: tide.EventsOldest})
	if err != nil {
		t.Fatalf("Events from the oldest kept after a trim: %v", err)
	}
	if got.read(t, ch, 2); got.snapshot()[1].Kind != tide.EventEnqueued {
		t.Errorf("the oldest kept event: %+v", got.snapshot()[1])
	}
	cancel()
	for range ch {
	}
}

// TestEventsCluster: on Redis Cluster the partitions' streams live on
// different masters; all are read, and a consumer resumes without a gap.
func TestEventsCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	rdb := c.Client(t)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)), redisbroker.WithPartitions(6), redisbroker.WithEvents(true))
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	in, cl := tide.NewInspector(b), tide.NewClient(b)
	const q = "ev-cluster"
	ch, err := in.Events(ctx, tide.EventsFrom{Queues: []string{q}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	tasks := make([]*tide.Task, n)
	for i := range tasks {
		tasks[i] = tide.NewTask("ev:c", nil)
	}
	if _, err := cl.EnqueueMany(ctx, tasks[:n/2], tide.Queue(q)); err != nil {
		t.Fatal(err)
	}
	var got eventLog
	got.read(t, ch, n/3)
	tok := got.snapshot()[n/3-1].ID
	if _, err := cl.EnqueueMany(ctx, tasks[n/2:], tide.Queue(q)); err != nil {
		t.Fatal(err)
	}
	ch2, err := in.Events(ctx, tide.EventsFrom{After: tok})
	if err != nil {
		t.Fatal(err)
	}
	got.read(t, ch2, n)
	seen := map[string]bool{}
	for _, ev := range got.snapshot() {
		if seen[ev.TaskID] || ev.Kind != tide.EventEnqueued {
			t.Fatalf("event %+v repeated or unexpected", ev)
		}
		seen[ev.TaskID] = true
	}
	if len(seen) != n {
		t.Fatalf("%d tasks' events, want %d", len(seen), n)
	}
	// The tokens name every partition: six streams.
	ps, err := broker.DecodeEventToken(tok)
	if err != nil || len(ps) != 6 {
		t.Fatalf("token holds %d positions (%v), want 6", len(ps), err)
	}
}
