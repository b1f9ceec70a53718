package tide_test

import (
	"context"
	"testing"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

// BenchmarkEnqueue is a single Enqueue as a new user writes it: the
// default broker on go-redis's default options, one plain task a call, one
// goroutine. Its allocations a call are the client side of the bench's
// enq1 row (go test -bench Enqueue -benchmem -run XXX).
func BenchmarkEnqueue(b *testing.B) {
	addr := redistest.Addr(b)
	rdb := redistest.Client(b, addr)
	br := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(b)))
	b.Cleanup(func() { _ = br.Close() })
	c := tide.NewClient(br)
	ctx := context.Background()
	p := make([]byte, 64)
	if _, err := c.Enqueue(ctx, tide.NewTask("bench", p)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Enqueue(ctx, tide.NewTask("bench", p)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEnqueueAllocs holds a single Enqueue's allocations (the client side
// of the bench's enq1 row) at the count the enqueue path was trimmed to:
// a new allocation a call shows here before it shows in the bench.
func TestEnqueueAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates on its own")
	}
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	br := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	t.Cleanup(func() { _ = br.Close() })
	c := tide.NewClient(br)
	ctx := context.Background()
	p := make([]byte, 64)
	enqueue := func() {
		if _, err := c.Enqueue(ctx, tide.NewTask("bench", p)); err != nil {
			t.Fatal(err)
		}
	}
	enqueue()
	// 15 on go-redis v9.23 (4 of them go-redis's: its command and the
	// reply's reading); the reply slot's key is made anew once a second,
	// hence the average's slack.
	if n := testing.AllocsPerRun(500, enqueue); n > 15.5 {
		t.Errorf("a single Enqueue allocates %.1f times, want at most 15", n)
	}
}
