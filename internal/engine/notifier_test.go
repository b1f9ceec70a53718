package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
)

// scriptedEvents is a broker whose subscriptions deliver events the test
// sends, and which records every subscription.
type scriptedEvents struct {
	broker.Broker
	mu   sync.Mutex
	subs []chan broker.Event
}

// Subscribe returns a channel fed from one the test sends to and closes;
// it also closes when ctx ends, as a real subscription does.
func (s *scriptedEvents) Subscribe(ctx context.Context, _ []string) (<-chan broker.Event, error) {
	in := make(chan broker.Event, 8)
	out := make(chan broker.Event)
	s.mu.Lock()
	s.subs = append(s.subs, in)
	s.mu.Unlock()
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

func (s *scriptedEvents) last() chan broker.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.subs) == 0 {
		return nil
	}
	return s.subs[len(s.subs)-1]
}

func TestNotifier(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	sb := &scriptedEvents{Broker: bd.b}
	bd.cfg.Broker = sb
	got := make(chan string, 16)
	n := newNotifier(bd.cfg, []string{"q"},
		func() { got <- "wake" },
		func(q, id string) { got <- "cancel " + q + "/" + id },
		func(ev broker.Event) { got <- "partition " + ev.Kind.String() },
		func(q string) { got <- "relayout " + q },
		func() { got <- "poke" })
	n.start()
	defer n.stop()
	testwait.For(t, 10*time.Second, "a subscription", func() bool { return sb.last() != nil })
	expect := func(want string) {
		t.Helper()
		select {
		case g := <-got:
			if g != want {
				t.Fatalf("got %q, want %q", g, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %q", want)
		}
	}
	// Events sent before the subscription was made are lost: the
	// processor looks once it is made.
	expect("wake")
	first := sb.last()
	first <- broker.Event{Kind: broker.EventPending, Queue: "q"}
	expect("wake")
	first <- broker.Event{Kind: broker.EventCancel, Queue: "q", ID: "x"}
	expect("cancel q/x")
	first <- broker.Event{Kind: broker.EventScheduled, Queue: "q", At: time.Now()}
	expect("partition scheduled")
	first <- broker.Event{Kind: broker.EventReleased, Queue: "q"}
	expect("partition released")
	first <- broker.Event{Kind: broker.EventLayout, Queue: "q"}
	expect("relayout q")
	// A broken subscription is replaced, and since events may have been
	// missed meanwhile everyone looks again.
	close(first)
	expect("wake")
	expect("poke")
	if sb.last() == first {
		t.Fatal("no new subscription")
	}
}

// A pending event that says when room opens under a rate limit wakes the
// processor then, not at once; each announced instant gets its wake-up, and
// stop disarms those still waiting.
func TestNotifierTimedWake(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	sb := &scriptedEvents{Broker: bd.b}
	bd.cfg.Broker = sb
	var mu sync.Mutex
	var wakes []time.Time
	n := newNotifier(bd.cfg, []string{"q"},
		func() { mu.Lock(); wakes = append(wakes, time.Now()); mu.Unlock() },
		func(string, string) {}, func(broker.Event) {}, func(string) {}, func() {})
	n.start()
	testwait.For(t, 10*time.Second, "a subscription and the wake-up that follows it", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sb.last() != nil && len(wakes) == 1
	})
	mu.Lock()
	wakes = nil
	mu.Unlock()
	sent := time.Now()
	const after = 150 * time.Millisecond
	sb.last() <- broker.Event{Kind: broker.EventPending, Queue: "q", At: bd.cfg.Now().Add(after)}
	sb.last() <- broker.Event{Kind: broker.EventPending, Queue: "q", At: bd.cfg.Now().Add(2 * after)}
	sb.last() <- broker.Event{Kind: broker.EventPending, Queue: "q", At: bd.cfg.Now().Add(time.Hour)}
	testwait.For(t, 10*time.Second, "two timed wake-ups", func() bool { mu.Lock(); defer mu.Unlock(); return len(wakes) >= 2 })
	mu.Lock()
	first := wakes[0]
	mu.Unlock()
	if first.Sub(sent) < after {
		t.Fatalf("woken %v after an event announcing room in %v", first.Sub(sent), after)
	}
	n.stop()
	n.mu.Lock()
	left := len(n.timers)
	n.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d wake-ups still armed after stop", left)
	}
}
