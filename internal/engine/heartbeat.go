package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// heartbeatEvery is how often a server refreshes its registry record; the
// record lives three times as long, so a dead server disappears within 15 s.
const heartbeatEvery = 5 * time.Second

// heartbeat keeps the server's record in the broker's registry (when the
// broker implements broker.Registry), with the tasks it is running, and
// removes it on a clean stop.
type heartbeat struct {
	cfg    Config
	log    *slog.Logger
	reg    broker.Registry
	active func() []tidetype.ActiveTask
	done   chan struct{}
	g      sync.WaitGroup
}

func newHeartbeat(cfg Config, active func() []tidetype.ActiveTask) *heartbeat {
	return &heartbeat{cfg: cfg, log: cfg.Logger, reg: cfg.Broker, active: active, done: make(chan struct{})}
}

func (h *heartbeat) start() { h.g.Go(h.loop) }

func (h *heartbeat) stop() {
	close(h.done)
	h.g.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := h.reg.UnregisterServer(ctx, h.cfg.ServerID); err != nil && !errors.Is(err, broker.ErrNotSupported) {
		h.log.Debug("tide: could not remove the server record; it expires by itself", "err", err)
	}
}

// loop refreshes the server's record until stopped; on a broker without a
// registry it ends at once.
func (h *heartbeat) loop() {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		info := h.cfg.Info
		info.ID = h.cfg.ServerID
		info.Active = h.active()
		ctx, cancel := context.WithTimeout(context.Background(), heartbeatEvery)
		err := h.reg.RegisterServer(ctx, info, 3*heartbeatEvery)
		cancel()
		switch {
		case errors.Is(err, broker.ErrNotSupported):
			h.log.Debug("tide: the broker has no registry; this server is not listed")
			return
		case err != nil:
			h.log.Debug("tide: server heartbeat failed", "err", err)
		}
		select {
		case <-h.done:
			return
		case <-t.C:
		}
	}
}
