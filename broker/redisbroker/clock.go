package redisbroker

import (
	"context"
	"sync"
	"time"
)

// clockSyncEvery is how often the broker measures the offset between the
// local clock and Redis's.
const clockSyncEvery = 30 * time.Second

// A kept sample whose round trip is over clockGoodRTT (its offset may be off
// by half of it: a busy machine or network can make that a hundred
// milliseconds and more, which due times would then carry) is measured again
// after clockRetryEvery instead of clockSyncEvery, the wait doubling with
// each poor sample (a Redis that is always that far away is not asked
// every second), until one is good.
const (
	clockGoodRTT    = 5 * time.Millisecond
	clockRetryEvery = time.Second
)

// clock tells Redis time without asking Redis each time: the local clock plus
// the offset measured with TIME, from the sample with the shortest round
// trip among the recent ones (its error is at most half that round trip).
type clock struct {
	local func() time.Time

	mu     sync.Mutex
	offset time.Duration
	rtt    time.Duration // of the sample the offset comes from
	kept   time.Time     // local time of that sample
	synced time.Time     // local time of the last measurement; zero: never
	retry  time.Duration // wait before measuring a poor kept sample again
	tried  time.Time     // local time of the last attempt before the first success
}

// Now implements broker.Clock: the Redis server's time, as well as the broker
// knows it (before the first call that reaches Redis, the local time). On
// Redis Cluster it is the time of the node the broker measured; every script
// decides with its own node's clock.
//
// The first call measures the offset if no call has yet (waiting at most
// half a second, and trying again at most once a second while Redis cannot
// be reached), so that a client's first due time is already on Redis time.
func (b *Broker) Now() time.Time {
	c := &b.clock
	c.mu.Lock()
	first := c.synced.IsZero() && c.local().Sub(c.tried) >= time.Second
	if first {
		c.tried = c.local()
	}
	c.mu.Unlock()
	if first && b.check() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		b.syncClock(ctx)
		cancel()
	}
	c.mu.Lock()
	off := c.offset
	c.mu.Unlock()
	return c.local().Add(off)
}

// syncClock measures the offset when the last measurement is older than
// clockSyncEvery. Errors are left to the call that follows.
func (b *Broker) syncClock(ctx context.Context) {
	c := &b.clock
	c.mu.Lock()
	since := c.local().Sub(c.synced)
	due := c.synced.IsZero() || since >= clockSyncEvery || (c.rtt > clockGoodRTT && since >= c.retry)
	c.mu.Unlock()
	if !due {
		return
	}
	sent := c.local()
	t, err := b.rdb.Time(ctx).Result()
	recv := c.local()
	if err != nil {
		return
	}
	c.observe(t, sent, recv)
}

// observe takes a Redis time read between sent and recv on the local clock.
// A sample replaces the kept one when it is the first, its round trip is no
// longer, or the kept one is over two minutes old.
func (c *clock) observe(redisTime, sent, recv time.Time) {
	rtt := recv.Sub(sent)
	off := redisTime.Sub(sent.Add(rtt / 2))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.synced.IsZero() || rtt <= c.rtt || recv.Sub(c.kept) >= 4*clockSyncEvery {
		c.offset, c.rtt, c.kept = off, rtt, recv
	}
	switch {
	case c.rtt <= clockGoodRTT:
		c.retry = clockRetryEvery
	case c.synced.IsZero():
		c.retry = clockRetryEvery
	default:
		c.retry = min(2*c.retry, clockSyncEvery)
	}
	c.synced = recv
}
