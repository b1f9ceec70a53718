package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
)

// health turns the failures of the engine's many loops into one log line when
// the broker becomes unreachable and one when it is back, instead of a line
// per loop and attempt. Loops report every outcome; only transitions log.
type health struct {
	log *slog.Logger

	mu     sync.Mutex
	down   bool
	since  time.Time
	fails  int
	lastOK time.Time     // when a call last succeeded
	back   chan struct{} // closed when the current outage ends
}

func newHealth(log *slog.Logger) *health { return &health{log: log, back: make(chan struct{})} }

// recovered returns a channel closed when the broker is next seen reachable
// after an outage, so that loops backing off can try again at once.
func (h *health) recovered() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.back
}

// fail records a failed broker call by component that began at start. A
// call begun before the last success carries no news (it was stuck on a
// connection the outage had already broken), so it does not open an outage:
// otherwise every recovery could log a second outage a moment later.
func (h *health) fail(component string, err error, start time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down && start.Before(h.lastOK) {
		return
	}
	h.fails++
	if h.down {
		return
	}
	h.down, h.since = true, time.Now()
	h.log.Error("tide: broker unreachable; retrying with back-off, in-flight settlements are kept while their leases last",
		"component", component, "err", err)
}

// ok records a successful broker call.
func (h *health) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastOK = time.Now()
	if !h.down {
		return
	}
	h.log.Info("tide: broker reachable again; resuming", "after", time.Since(h.since).Round(time.Millisecond), "failed_calls", h.fails)
	h.down, h.fails = false, 0
	close(h.back)
	h.back = make(chan struct{})
}

// unavailable reports whether err means the broker could not be reached (as
// opposed to an error it returned on purpose, such as a misconfiguration).
func unavailable(err error) bool {
	return errors.Is(err, broker.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// wait waits d, or less when the broker is seen back after an outage; it
// reports false when done closes first.
func (h *health) wait(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-h.recovered():
		return true
	case <-t.C:
		return true
	}
}
