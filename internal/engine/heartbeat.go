package engine

import (
	"context"
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
	admin  broker.Registry
	active func() []tidetype.ActiveTask
	done   chan struct{}
	g      sync.WaitGroup
}

func newHeartbeat(cfg Config, active func() []tidetype.ActiveTask) *heartbeat {
	a, _ := cfg.Broker.(broker.Registry)
	return &heartbeat{cfg: cfg, log: cfg.Logger, admin: a, active: active, done: make(chan struct{})}
}

func (h *heartbeat) start() {
	if h.admin == nil {
		return
	}
	h.g.Go(h.loop)
}

func (h *heartbeat) stop() {
	close(h.done)
	h.g.Wait()
	if h.admin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := h.admin.UnregisterServer(ctx, h.cfg.ServerID); err != nil {
		h.log.Debug("tide: could not remove the server record; it expires by itself", "err", err)
	}
}

func (h *heartbeat) loop() {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		info := h.cfg.Info
		info.ID = h.cfg.ServerID
		info.Active = h.active()
		ctx, cancel := context.WithTimeout(context.Background(), heartbeatEvery)
		err := h.admin.RegisterServer(ctx, info, 3*heartbeatEvery)
		cancel()
		if err != nil {
			h.log.Debug("tide: server heartbeat failed", "err", err)
		}
		select {
		case <-h.done:
			return
		case <-t.C:
		}
	}
}
