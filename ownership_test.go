package tide_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestPartitionOwnershipMovesWhenTheOwnerStops: each partition is maintained
// by one server; when it stops, another takes the partition over and the
// scheduled tasks still run.
func TestPartitionOwnershipMovesWhenTheOwnerStops(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(2))
	ctx := context.Background()
	var ranOnA, ranOnB atomic.Int32
	handler := func(n *atomic.Int32) tide.Handler {
		return tide.HandlerFunc(func(context.Context, *tide.Task) error { n.Add(1); return nil })
	}
	a := e.server(tide.Config{ServerID: "A", LeaseDuration: time.Second}, handler(&ranOnA))
	owner := func(p int) string {
		return e.rdb.Get(ctx, fmt.Sprintf("%s:{default:%d}:owner", e.prefix, p)).Val()
	}
	testwait.For(t, 10*time.Second, "A to own both partitions", func() bool { return owner(0) == "A" && owner(1) == "A" })
	e.server(tide.Config{ServerID: "B", LeaseDuration: time.Second}, handler(&ranOnB))
	time.Sleep(200 * time.Millisecond)
	if owner(0) != "A" || owner(1) != "A" {
		t.Fatalf("B took a partition from a live owner: %q %q", owner(0), owner(1))
	}

	a.Shutdown()
	const n = 20
	for i := range n {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("later", []byte{byte(i)}), tide.ProcessIn(500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 15*time.Second, "B to take over both partitions", func() bool { return owner(0) == "B" && owner(1) == "B" })
	testwait.For(t, 15*time.Second, "B to run every scheduled task", func() bool { return ranOnB.Load() == n })
	if ranOnA.Load() != 0 {
		t.Fatalf("stopped server ran %d tasks", ranOnA.Load())
	}
}

// A clean shutdown gives up the server's partition claims at once, so that
// during a rolling deploy another server maintains them without waiting for
// the claims to expire.
func TestShutdownReleasesPartitionClaims(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(3))
	ctx := context.Background()
	s := tide.NewServer(e.broker(), tide.Config{LeaseDuration: 30 * time.Second, ServerID: "leaving", Logger: testLogger(t)})
	if err := s.Start(tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	owners := func() []string {
		var out []string
		for p := range 3 {
			if v, err := e.rdb.Get(ctx, fmt.Sprintf("%s:{default:%d}:owner", e.prefix, p)).Result(); err == nil {
				out = append(out, v)
			}
		}
		return out
	}
	testwait.For(t, 10*time.Second, "the server to claim every partition", func() bool { return len(owners()) == 3 })
	s.Shutdown()
	if o := owners(); len(o) != 0 {
		t.Fatalf("claims left after a clean shutdown: %v (they would block other servers for up to 10s)", o)
	}
}
