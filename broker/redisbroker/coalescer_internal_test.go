package redisbroker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
)

// fakeWire stands in for Redis under a coalescer: each send records how many
// tasks it carries and blocks until the test releases it.
type fakeWire struct {
	mu    sync.Mutex
	sizes []int
	gates []chan struct{}
	sent  chan int // the index of each send, as it starts
}

func newFakeWire(bt *coalescer) *fakeWire {
	w := &fakeWire{sent: make(chan int, 100)}
	bt.send = func(_ context.Context, items []item, _ broker.EnqueueOptions) ([]error, error) {
		gate := make(chan struct{})
		w.mu.Lock()
		i := len(w.sizes)
		w.sizes = append(w.sizes, len(items))
		w.gates = append(w.gates, gate)
		w.mu.Unlock()
		w.sent <- i
		<-gate
		return make([]error, len(items)), nil
	}
	return w
}

// next waits for the next send to start and returns its index and size.
func (w *fakeWire) next(t *testing.T) (int, int) {
	t.Helper()
	select {
	case i := <-w.sent:
		w.mu.Lock()
		defer w.mu.Unlock()
		return i, w.sizes[i]
	case <-time.After(5 * time.Second):
		t.Fatal("no send within 5s")
		return 0, 0
	}
}

func (w *fakeWire) release(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.gates[i])
}

// noSend fails if a send starts within a moment.
func (w *fakeWire) noSend(t *testing.T, why string) {
	t.Helper()
	select {
	case i := <-w.sent:
		t.Fatalf("%s: send %d started", why, i)
	case <-time.After(50 * time.Millisecond):
	}
}

// queued waits until n callers are queued.
func queued(t *testing.T, bt *coalescer, n int) {
	t.Helper()
	testwait.Until(t, 5*time.Second, func() error {
		bt.mu.Lock()
		got := len(bt.queue)
		bt.mu.Unlock()
		if got != n {
			return fmt.Errorf("%d callers queued, want %d", got, n)
		}
		return nil
	})
}

// arrive starts one caller of one task; the returned channel gets its error.
func arrive(bt *coalescer) chan error {
	done := make(chan error, 1)
	go func() {
		errs, err := bt.enqueue(context.Background(), []item{{}})
		if err == nil && len(errs) != 1 {
			err = context.DeadlineExceeded // any error: the result is wrong
		}
		done <- err
	}()
	return done
}

func returned(t *testing.T, cs ...chan error) {
	t.Helper()
	for _, c := range cs {
		select {
		case err := <-c:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a caller did not return within 5s")
		}
	}
}

// onTheWire returns a coalescer that has seen peak concurrent callers
// lately, with one caller's round trip on the wire (send i0, held until
// released) and that caller's result channel.
func onTheWire(t *testing.T, peak float64) (bt *coalescer, w *fakeWire, first chan error, i0 int) {
	t.Helper()
	bt = &coalescer{peak: peak}
	w = newFakeWire(bt)
	first = arrive(bt)
	i0, _ = w.next(t)
	return bt, w, first, i0
}

func TestCoalescer(t *testing.T) {
	t.Parallel()
	t.Run("LoneCallerSendsAtOnce", func(t *testing.T) {
		t.Parallel()
		bt := &coalescer{}
		w := newFakeWire(bt)
		for range 3 {
			c := arrive(bt)
			i, n := w.next(t)
			if n != 1 {
				t.Fatalf("a lone caller's round trip carries %d tasks", n)
			}
			w.release(i)
			returned(t, c)
		}
	})
	// With eight callers lately, the second round trip waits for four of
	// them rather than leaving with the first arrival.
	t.Run("SecondRoundTripGathersHalfTheCallers", func(t *testing.T) {
		t.Parallel()
		bt, w, first, i0 := onTheWire(t, 8)
		var cs []chan error
		for k := 1; k <= 3; k++ {
			cs = append(cs, arrive(bt))
			queued(t, bt, k)
		}
		w.noSend(t, "three callers queued behind a round trip, target four")
		cs = append(cs, arrive(bt))
		i1, n := w.next(t)
		if n != 4 {
			t.Fatalf("the second round trip carries %d tasks, want the 4 queued", n)
		}
		w.release(i0)
		w.release(i1)
		returned(t, append(cs, first)...)
	})
	// Callers queued short of the target wait no longer than the round
	// trip on the wire: its leader hands them the slot.
	t.Run("QueuedCallersLeaveWhenTheRoundTripReturns", func(t *testing.T) {
		t.Parallel()
		bt, w, first, i0 := onTheWire(t, 8)
		a, b := arrive(bt), arrive(bt)
		queued(t, bt, 2)
		w.noSend(t, "two callers queued, target four")
		w.release(i0)
		i1, n := w.next(t)
		if n != 2 {
			t.Fatalf("the handed-over round trip carries %d tasks, want the 2 queued", n)
		}
		w.release(i1)
		returned(t, first, a, b)
	})
	// A returning round trip frees its slot while another is on the wire
	// and too few wait; the next arrival that reaches the target takes it.
	t.Run("FreedSlotWaitsForTheTarget", func(t *testing.T) {
		t.Parallel()
		bt, w, c0, i0 := onTheWire(t, 4)
		c1, c2 := arrive(bt), arrive(bt) // target 2: the second sends both
		i1, n := w.next(t)
		if n != 2 {
			t.Fatalf("second round trip: %d tasks, want 2", n)
		}
		c3 := arrive(bt)
		queued(t, bt, 1)
		w.release(i0) // one queued, target 2, another on the wire: slot freed
		returned(t, c0)
		w.noSend(t, "one caller queued, target two, a round trip on the wire")
		c4 := arrive(bt)
		i2, n := w.next(t)
		if n != 2 {
			t.Fatalf("third round trip: %d tasks, want 2", n)
		}
		w.release(i1)
		w.release(i2)
		returned(t, c1, c2, c3, c4)
	})
	t.Run("PeakDecays", func(t *testing.T) {
		t.Parallel()
		bt := &coalescer{peak: 100}
		w := newFakeWire(bt)
		for range 400 {
			c := arrive(bt)
			i, _ := w.next(t)
			w.release(i)
			returned(t, c)
		}
		bt.mu.Lock()
		defer bt.mu.Unlock()
		if bt.target() != 1 {
			t.Fatalf("after 400 lone calls the target is %d (peak %.1f), want 1", bt.target(), bt.peak)
		}
	})
}
