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

	mu    sync.Mutex
	down  bool
	since time.Time
	fails int
}

func newHealth(log *slog.Logger) *health { return &health{log: log} }

// fail records a failed broker call by component.
func (h *health) fail(component string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
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
	if !h.down {
		return
	}
	h.log.Info("tide: broker reachable again; resuming", "after", time.Since(h.since).Round(time.Millisecond), "failed_calls", h.fails)
	h.down, h.fails = false, 0
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
