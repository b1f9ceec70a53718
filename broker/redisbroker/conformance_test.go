package redisbroker_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/brokertest"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// TestConformance runs the behavioural suite every broker must pass, on one
// redis-server with a key prefix per subtest, with one and with four
// partitions per queue.
func TestConformance(t *testing.T) {
	addr := redistest.Addr(t)
	calls := newBindingCalls()
	for name, parts := range map[string]int{"OnePartition": 1, "FourPartitions": 4} {
		t.Run(name, func(t *testing.T) {
			brokertest.Run(t, func(t *testing.T) broker.Broker {
				rdb := redistest.Client(t, addr)
				rdb.AddHook(calls)
				b := redisbroker.New(rdb,
					redisbroker.WithPrefix(redistest.Prefix(t)), redisbroker.WithPartitions(parts))
				t.Cleanup(func() { _ = b.Close() })
				return b
			})
		})
	}
	// Every call above went through calls; a repartition adds the scripts
	// the suite does not run. Each call must match its script's header.
	t.Run("ScriptBindings", func(t *testing.T) {
		rdb := redistest.Client(t, addr)
		rdb.AddHook(calls)
		b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
		t.Cleanup(func() { _ = b.Close() })
		ctx := t.Context()
		var msgs []*tidetype.TaskInfo
		for i := range 20 {
			m := &tidetype.TaskInfo{ID: fmt.Sprintf("bind-%d", i), Queue: "bind", Type: "t", MaxRetry: 1, State: tidetype.StatePending}
			if i%2 == 0 {
				m.Group = "g" + strconv.Itoa(i%3)
				m.ID += "{" + m.Group + "}"
			}
			msgs = append(msgs, m)
		}
		if _, err := b.Enqueue(ctx, msgs, broker.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{3, 1} {
			if err := b.Repartition(ctx, "bind", n, nil); err != nil {
				t.Fatal(err)
			}
		}
		calls.check(t, redisbroker.ScriptNames())
	})
}
