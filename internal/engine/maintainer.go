package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tidequeue/tide/broker"
)

// maxOwnerTTL caps how long a partition claim lasts; a dead owner's
// partitions are taken over within this long (or within the lease duration
// when it is shorter).
const maxOwnerTTL = 10 * time.Second

// trimEvery is how often an owner has the archive and completed tasks
// trimmed; retention is therefore honoured within this much.
const trimEvery = 5 * time.Second

// maintainer keeps one queue partition moving: it claims the partition,
// forwards due tasks at their due time (a Go timer, not a poll), recovers
// expired leases as they expire, and wakes the local processor when work is
// pending. Only the owner changes anything; the others retry the claim and
// use the pending count as a slow fallback for lost events.
type maintainer struct {
	cfg       Config
	log       *slog.Logger
	queue     string
	partition int
	ownerTTL  time.Duration
	wake      func()

	hints chan time.Time // an earlier due time (zero: re-check now)
	done  chan struct{}
	g     group
}

func newMaintainer(cfg Config, queue string, partition int, wake func()) *maintainer {
	ttl := min(max(cfg.Lease, time.Second), maxOwnerTTL)
	return &maintainer{
		cfg: cfg, log: cfg.Logger, queue: queue, partition: partition,
		ownerTTL: ttl, wake: wake,
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
	var lastTrim time.Time
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
				if d := time.Until(h); d > 0 {
					target = h
					resetTimer(timer, d)
					continue
				}
			}
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
		now := m.cfg.Now()
		trim := time.Since(lastTrim) >= trimEvery
		res, err := m.cfg.Broker.Maintain(ctx, broker.MaintainRequest{
			Queue: m.queue, Partition: m.partition,
			Owner: m.cfg.Owner, OwnerTTL: m.ownerTTL, Now: now, NoTrim: !trim,
		})
		if err == nil && res.Owned && trim {
			lastTrim = time.Now()
		}
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) || isTransport(err) {
				m.cfg.health.fail("maintenance", err, start)
			} else {
				// Not a connectivity problem (a misconfiguration such as a
				// partition-count mismatch): say so every time.
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
		if res.Owned {
			if !res.NextDue.IsZero() {
				wait = min(wait, max(res.NextDue.Sub(now), 0))
			}
			if res.NextLeaseIn > 0 {
				// Recover just after the lease runs out.
				wait = min(wait, res.NextLeaseIn+time.Millisecond)
			}
		} else if res.RetryIn > 0 {
			wait = min(wait, res.RetryIn)
		}
		target = time.Now().Add(wait)
		resetTimer(timer, wait)
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(d)
}
