package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
)

// maxOwnerTTL caps how long a partition claim lasts; a dead owner's
// partitions are taken over within this long (or within the lease duration
// when it is shorter). A clean shutdown releases its claims at once.
const maxOwnerTTL = 10 * time.Second

// maintainer keeps one queue partition moving: it claims the partition,
// forwards due tasks at their due time (a Go timer on the broker's clock, not
// a poll), recovers expired leases as they expire, trims what is past its
// retention, and wakes the local processor when work is pending. Only the
// owner changes anything; the others retry the claim (at once when the owner
// releases it) and use the pending count as a slow fallback for lost events.
type maintainer struct {
	cfg       Config
	log       *slog.Logger
	queue     string
	partition int
	ownerTTL  time.Duration
	wake      func()
	relayout  func(queue string)

	hints chan time.Time // an earlier due time (zero: re-check now)
	done  chan struct{}
	g     sync.WaitGroup
}

func newMaintainer(cfg Config, queue string, partition int, wake func(), relayout func(string)) *maintainer {
	ttl := min(max(cfg.LeaseDuration, time.Second), maxOwnerTTL)
	return &maintainer{
		cfg: cfg, log: cfg.Logger, queue: queue, partition: partition,
		ownerTTL: ttl, wake: wake, relayout: relayout,
		hints: make(chan time.Time, 1),
		done:  make(chan struct{}),
	}
}

// hint reports a task due at t (the zero time: something changed, check now).
// It never blocks; when a hint is already waiting the earlier one is kept.
func (m *maintainer) hint(t time.Time) {
	for {
		select {
		case m.hints <- t:
			return
		default:
		}
		select {
		case old := <-m.hints:
			if !old.IsZero() && (t.IsZero() || old.Before(t)) {
				t = old
			}
		default:
		}
	}
}

func (m *maintainer) start() { m.g.Go(m.loop) }

func (m *maintainer) stop() {
	close(m.done)
	m.g.Wait()
}

func (m *maintainer) loop() {
	renew := m.ownerTTL / 3
	bo := backoff{min: 100 * time.Millisecond, max: 5 * time.Second}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var target time.Time // when the timer fires
	owned := false
	defer func() {
		if owned {
			m.release()
		}
	}()
	for {
		select {
		case <-m.done:
			return
		case <-timer.C:
		case h := <-m.hints:
			if !h.IsZero() && (!owned || !h.Before(target)) {
				continue // not ours, or the timer already fires early enough
			}
			if !h.IsZero() {
				if d := h.Sub(m.cfg.Now()); d > 0 {
					target = time.Now().Add(d)
					resetTimer(timer, d)
					continue
				}
			}
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
		res, err := m.cfg.Broker.Maintain(ctx, broker.MaintainRequest{
			Queue: m.queue, Partition: m.partition,
			Owner: m.cfg.ServerID, OwnerTTL: m.ownerTTL, RecoverBackoff: m.cfg.LeaseDuration,
		})
		cancel()
		if err != nil {
			switch {
			case unavailable(err):
				m.cfg.health.fail("maintenance", err, start)
			case errors.Is(err, broker.ErrLayout):
				m.log.Error("tide: queue maintenance refused; reading the queue's layout again", "queue", m.queue, "partition", m.partition, "err", err)
				m.relayout(m.queue)
			default:
				m.log.Error("tide: queue maintenance failed", "queue", m.queue, "partition", m.partition, "err", err)
			}
			d := bo.next()
			target = time.Now().Add(d)
			resetTimer(timer, d)
			continue
		}
		m.cfg.health.ok()
		bo.reset()
		owned = res.Owned
		if res.Pending > 0 {
			m.wake()
		}
		wait := renew
		switch {
		case res.Owned && res.More:
			wait = 0 // a step stopped at its limit
		case res.Owned:
			if !res.NextDue.IsZero() {
				wait = min(wait, max(res.NextDue.Sub(m.cfg.Now()), 0))
			}
			if res.NextLeaseIn > 0 {
				// Recover just after the lease runs out.
				wait = min(wait, res.NextLeaseIn+time.Millisecond)
			}
		case res.RetryIn > 0:
			wait = min(wait, res.RetryIn)
		}
		target = time.Now().Add(wait)
		resetTimer(timer, wait)
	}
}

// release gives up the partition claim so that another server takes the
// partition over at once instead of when the claim expires.
func (m *maintainer) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := m.cfg.Broker.Maintain(ctx, broker.MaintainRequest{
		Queue: m.queue, Partition: m.partition, Owner: m.cfg.ServerID, OwnerTTL: m.ownerTTL, Release: true,
	})
	if err != nil {
		m.log.Debug("tide: could not release the partition claim; it expires by itself", "queue", m.queue, "partition", m.partition, "err", err)
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(d)
}
