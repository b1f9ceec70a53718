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
