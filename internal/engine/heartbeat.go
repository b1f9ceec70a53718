package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/tidequeue/tide/broker"
)

// heartbeatEvery is how often a server refreshes its registry record; the
// record lives three times as long, so a dead server disappears within 15 s.
const heartbeatEvery = 5 * time.Second

// heartbeat keeps the server's record in the broker's server registry (when
// the broker implements broker.Admin), with the tasks it is running, and
// removes it on a clean stop.
type heartbeat struct {
	cfg    Config
	log    *slog.Logger
	admin  broker.Admin
	active func() []broker.ActiveTask
	done   chan struct{}
	g      group
}

func newHeartbeat(cfg Config, active func() []broker.ActiveTask) *heartbeat {
	a, _ := cfg.Broker.(broker.Admin)
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
	if err := h.admin.UnregisterServer(ctx, h.cfg.Owner); err != nil {
		h.log.Debug("tide: could not remove the server record; it expires by itself", "err", err)
	}
}

func (h *heartbeat) loop() {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		info := h.cfg.Info
		info.ID = h.cfg.Owner
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
