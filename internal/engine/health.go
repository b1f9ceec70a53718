package engine

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
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
	h.log.Error("tide: broker unreachable; retrying with back-off, in-flight outcomes are kept while their leases last",
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

// isTransport reports whether err looks like a network failure rather than
// an error the broker returned on purpose.
func isTransport(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	s := err.Error()
	for _, frag := range []string{"connection refused", "connection reset", "broken pipe", "EOF", "i/o timeout", "no such host", "LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "pool timeout", "client is closed"} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	return false
}
