package engine

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// RepairEvery is how often a server looks for flows whose creator died
// before it released their ready steps (Config.Repair), give or take a
// fifth at random so that servers spread their looks.
const RepairEvery = 10 * time.Second

// repairer runs Config.Repair every RepairEvery (jittered) until stopped.
// A look that fails is logged and tried again at the next tick.
type repairer struct {
	fn     func(ctx context.Context) (int, error)
	every  time.Duration
	log    *slog.Logger
	ctx    context.Context // done when stopped
	cancel context.CancelFunc
	g      sync.WaitGroup
}

func newRepairer(cfg Config) *repairer {
	every := cfg.RepairEvery
	if every <= 0 {
		every = RepairEvery
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &repairer{fn: cfg.Repair, every: every, log: cfg.Logger, ctx: ctx, cancel: cancel}
}

func (r *repairer) start() {
	if r.fn == nil {
		return
	}
	r.g.Go(r.loop)
}

func (r *repairer) stop() {
	r.cancel()
	r.g.Wait()
}

func (r *repairer) loop() {
	for {
		d := r.every + time.Duration((rand.Float64()-0.5)*0.4*float64(r.every))
		t := time.NewTimer(d)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(r.ctx, brokerCallTimeout)
		n, err := r.fn(ctx)
		cancel()
		switch {
		case err != nil && r.ctx.Err() == nil:
			r.log.Warn("tide: repairing workflows and batches whose creator stopped halfway failed; trying again later", "err", err)
		case n > 0:
			r.log.Info("tide: repaired workflows or batches whose creator stopped halfway", "flows", n)
		}
	}
}
