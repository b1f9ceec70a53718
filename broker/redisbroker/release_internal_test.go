package redisbroker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A repartition releases an old partition's rate tokens while rebalances
// elsewhere move tokens too: one may give the old partition a token to
// back its starts between two reads of releaseSlots, as each hook here
// does (the token comes from the bank, as a completed transfer would). The
// release must wait for them to settle rather than give up after three
// reads back to back (the flow-control model, seed 95: "the slots of an
// old partition would not move" in 44 ms), and must not retire a partition
// that got a token after it gave its own away: that token would be lost
// to the queue for good.
func TestReleaseSlotsWhileRebalancesGiveTokens(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// give reports whether the hook gives the old partition a token
		// after the attempt-th read, which found it holding r tokens.
		give func(attempt int, r int64) bool
	}{
		{"each of the first four reads", func(attempt int, _ int64) bool { return attempt < 4 }},
		{"once it holds none", func(_ int, r int64) bool { return r == 0 }},
	} {
		t.Run(c.name, func(t *testing.T) { // not parallel: one hook
			addr, prefix := redistest.Addr(t), redistest.Prefix(t)
			b := slotBroker(t, addr, prefix, 2)
			ctx := context.Background()
			q := "release-" + c.name[:4]
			if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Rate: tidetype.Rate{Limit: 6, Per: time.Minute}}); err != nil {
				t.Fatal(err)
			}
			fillQueue(t, b, q, append(idsIn("a", 0, 2, 2), idsIn("b", 1, 2, 2)...))
			if n := leaseSettle(t, b, q, 3); n != 4 {
				t.Fatalf("leased %d tasks under 6 per minute, want 4", n)
			}
			var mu sync.Mutex
			given := map[string]int{}
			h := func(o part, attempt int) {
				if o.queue != q {
					return
				}
				r, err := b.rdb.HGet(ctx, o.k("lim"), "r").Int64()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if given[o.base] >= 4 || !c.give(attempt, r) {
					return
				}
				given[o.base]++
				pipe := b.rdb.TxPipeline()
				pipe.HIncrBy(ctx, b.bankKey(q), "r", -1)
				pipe.HIncrBy(ctx, o.k("lim"), "r", 1)
				if _, err := pipe.Exec(ctx); err != nil {
					t.Error(err)
				}
			}
			releaseRead.Store(&h)
			err := b.Repartition(ctx, q, 3, nil)
			releaseRead.Store(nil)
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			if len(given) == 0 {
				t.Fatal("no old partition was given a token while it was released")
			}
			mu.Unlock()
			if _, r := slotTotals(t, b, q); r != 6 {
				t.Fatalf("after the repartition the queue's nodes hold %d rate tokens, want 6", r)
			}
			// The 4 starts still count in the new span: 2 more start.
			fillQueue(t, b, q, idsIn("c", 0, 3, 6))
			if n := leaseAll(t, b, q, 3); n != 2 {
				t.Fatalf("%d tasks started after the repartition with 4 starts in the minute under 6 per minute, want 2", n)
			}
		})
	}
}
