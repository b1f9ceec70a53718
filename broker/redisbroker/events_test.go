package redisbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// TestEventsAgeTrim: Maintain trims the events older than the retention's
// age, and a token from before them reports the gap.
func TestEventsAgeTrim(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	prefix := redistest.Prefix(t)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix), redisbroker.WithEvents(true), redisbroker.WithEventRetention(1000, 300*time.Millisecond))
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	const q = "ev-age"
	enq := func(id string) { enqueueNow(t, b, q, id) }
	rctx, cancel := context.WithCancel(ctx)
	ch, err := b.ReadEvents(rctx, []string{q}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"old1", "old2", "old3"} {
		enq(id)
	}
	first := <-ch
	cancel()
	for range ch {
	}
	time.Sleep(400 * time.Millisecond)
	enq("new")
	if _, err := b.Maintain(ctx, broker.MaintainRequest{Queue: q, Owner: "o", OwnerTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	key := prefix + ":{" + q + ":0}:events"
	if n, err := rdb.XLen(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("after Maintain the stream holds %d entries (%v), want the 1 recent one", n, err)
	}
	if _, err := b.ReadEvents(ctx, nil, first.ID); !errors.Is(err, broker.ErrEventGap) {
		t.Fatalf("resume after trimmed events: %v, want ErrEventGap", err)
	}
	rctx, cancel = context.WithCancel(ctx)
	defer cancel()
	ch, err = b.ReadEvents(rctx, []string{q}, broker.EventsOldest)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-ch; ev.TaskID != "new" || ev.Kind != tidetype.EventEnqueued {
		t.Fatalf("oldest kept event %+v, want new's enqueue", ev)
	}
	cancel()
	for range ch {
	}
}

// TestEventsSlowReaderEnds: a reader overtaken by trimming stops instead
// of skipping events silently.
func TestEventsSlowReaderEnds(t *testing.T) {
	addr := redistest.Addr(t)
	b := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(redistest.Prefix(t)), redisbroker.WithEvents(true), redisbroker.WithEventRetention(1, 0))
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	const q = "ev-slow"
	ch, err := b.ReadEvents(ctx, []string{q}, "")
	if err != nil {
		t.Fatal(err)
	}
	for range 350 { // more than one stream node (100 entries): trimmed while nobody reads
		m := &tidetype.TaskInfo{Queue: q, Type: "t", State: tidetype.StatePending, NextProcessAt: time.Now()}
		if _, err := b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				if n >= 350 {
					t.Fatalf("the reader got all %d events although most were trimmed", n)
				}
				return
			}
			n++
		case <-deadline:
			t.Fatalf("the reader did not end after %d events", n)
		}
	}
}

// TestEventsGapAfterRepartition: a token from before a repartition names
// the old layout's streams. Once the retired partitions' streams are gone
// (kept for the events' age, then expired), resuming from it reports the
// gap instead of skipping what they held after the token; while they are
// kept, it resumes with their events.
func TestEventsGapAfterRepartition(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	prefix := redistest.Prefix(t)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix), redisbroker.WithEvents(true))
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	const q = "ev-repart"
	enq := func(id string) { enqueueNow(t, b, q, id) }
	rctx, cancel := context.WithCancel(ctx)
	ch, err := b.ReadEvents(rctx, []string{q}, "")
	if err != nil {
		t.Fatal(err)
	}
	enq("before")
	first := <-ch
	cancel()
	for range ch {
	}
	enq("after") // in the old layout's stream, after the token
	if err := b.Repartition(ctx, q, 2, nil); err != nil {
		t.Fatal(err)
	}
	// Kept: the token resumes with the event after it.
	rctx, cancel = context.WithCancel(ctx)
	ch, err = b.ReadEvents(rctx, []string{q}, first.ID)
	if err != nil {
		t.Fatalf("resume while the retired stream is kept: %v", err)
	}
	if ev := <-ch; ev.TaskID != "after" {
		t.Fatalf("resumed with %+v, want after's enqueue", ev)
	}
	cancel()
	for range ch {
	}
	// Expired: the gap is reported.
	if err := rdb.Del(ctx, prefix+":{"+q+":0}:events").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadEvents(ctx, []string{q}, first.ID); !errors.Is(err, broker.ErrEventGap) {
		t.Fatalf("resume after the retired stream expired: %v, want ErrEventGap", err)
	}
}

// enqueueNow stores a pending task id in queue q.
func enqueueNow(t *testing.T, b *redisbroker.Broker, q, id string) {
	t.Helper()
	m := &tidetype.TaskInfo{ID: id, Queue: q, Type: "t", State: tidetype.StatePending, NextProcessAt: time.Now()}
	if errs, err := b.Enqueue(t.Context(), []*tidetype.TaskInfo{m}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatalf("Enqueue: %v %v", err, errs)
	}
}
