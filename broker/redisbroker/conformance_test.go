package redisbroker_test

import (
	"testing"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/brokertest"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

// TestConformance runs the behavioural suite every broker must pass, on one
// redis-server with a key prefix per subtest, with one and with four
// partitions per queue.
func TestConformance(t *testing.T) {
	addr := redistest.Addr(t)
	for name, parts := range map[string]int{"OnePartition": 1, "FourPartitions": 4} {
		t.Run(name, func(t *testing.T) {
			brokertest.Run(t, func(t *testing.T) broker.Broker {
				b := redisbroker.New(redistest.Client(t, addr),
					redisbroker.WithPrefix(redistest.Prefix(t)), redisbroker.WithPartitions(parts))
				t.Cleanup(func() { _ = b.Close() })
				return b
			})
		})
	}
}
