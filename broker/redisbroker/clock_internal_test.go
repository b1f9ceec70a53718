package redisbroker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/redistest"
)

// clockBroker returns a broker whose local clock stands still until pass
// moves it (so a TIME call takes no time on it).
func clockBroker(t *testing.T) (b *Broker, pass func(time.Duration)) {
	t.Helper()
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	local := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	b = New(redistest.Client(t, redistest.Addr(t)), WithPrefix(redistest.Prefix(t)), WithLocalClock(local))
	t.Cleanup(func() { _ = b.Close() })
	return b, func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

// poorSample hands b's clock a sample with a 300 ms round trip (an offset
// that may be off by 150 ms), as a busy machine measures.
func poorSample(b *Broker) {
	sent := b.clock.local()
	b.clock.observe(sent.Add(time.Hour), sent, sent.Add(300*time.Millisecond))
}

// kept returns the round trip of b's kept sample and when it last measured.
func kept(b *Broker) (time.Duration, time.Time) {
	b.clock.mu.Lock()
	defer b.clock.mu.Unlock()
	return b.clock.rtt, b.clock.synced
}

// A clock sample taken on a busy machine is measured again within seconds,
// not after clockSyncEvery, and the better sample is kept; poor samples in
// a row wait twice as long each time; a good sample is not measured again
// before clockSyncEvery.
func TestClockRemeasuresAPoorSample(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("Poor", func(t *testing.T) {
		t.Parallel()
		b, pass := clockBroker(t)
		poorSample(b)
		pass(clockRetryEvery + 300*time.Millisecond)
		b.syncClock(ctx)
		if rtt, _ := kept(b); rtt != 0 {
			t.Fatalf("after %v the kept sample's round trip is %v; want the poor one measured again", clockRetryEvery, rtt)
		}
		_, at := kept(b)
		pass(clockSyncEvery - time.Second)
		b.syncClock(ctx)
		if _, now := kept(b); now != at {
			t.Fatal("a good sample was measured again before clockSyncEvery")
		}
	})
	t.Run("PoorTwice", func(t *testing.T) {
		t.Parallel()
		b, pass := clockBroker(t)
		poorSample(b)
		poorSample(b)
		_, at := kept(b)
		pass(clockRetryEvery + 300*time.Millisecond)
		b.syncClock(ctx)
		if _, now := kept(b); now != at {
			t.Fatalf("the second poor sample in a row was measured again after %v; want the wait doubled", clockRetryEvery)
		}
		pass(clockRetryEvery)
		b.syncClock(ctx)
		if rtt, _ := kept(b); rtt != 0 {
			t.Fatalf("a poor sample was not measured again after twice %v", clockRetryEvery)
		}
	})
}
