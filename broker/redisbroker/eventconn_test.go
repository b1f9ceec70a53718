package redisbroker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// Readings of events block in XREAD on connections of their own: with more
// readings than the broker's client has pooled connections, the other calls
// still get one at once, and each reading ends when its context does.
func TestEventReadersKeepOffThePool(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	name := strings.ReplaceAll(redistest.Prefix(t), ":", "-") // names this test's connections in CLIENT LIST
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2, ClientName: name})
	t.Cleanup(func() { _ = rdb.Close() })
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)), redisbroker.WithEvents(true))
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	const readers = 8
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chans := make([]<-chan tidetype.TaskEvent, readers)
	for i := range chans {
		ch, err := b.ReadEvents(rctx, []string{"q"}, "")
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	}
	admin := redistest.Client(t, addr)
	blocked := func() int {
		list, err := admin.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for line := range strings.SplitSeq(list, "\n") {
			if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " cmd=xread") {
				n++
			}
		}
		return n
	}
	testwait.For(t, 10*time.Second, "the readers to block in XREAD", func() bool { return blocked() >= 2 })

	// Enqueue (and the event it records) while every reader blocks.
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	for i := range 5 {
		m := &tidetype.TaskInfo{ID: "t" + string(rune('0'+i)), Queue: "q", Type: "t", State: tidetype.StatePending, NextProcessAt: time.Now()}
		if errs, err := b.Enqueue(cctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
			t.Fatalf("Enqueue %d with %d readers on a pool of 2: %v %v", i, readers, err, errs)
		}
	}
	for i, ch := range chans {
		select {
		case ev := <-ch:
			if ev.TaskID != "t0" || ev.Kind != tidetype.EventEnqueued {
				t.Errorf("reader %d: first event %+v, want the enqueue of t0", i, ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("reader %d got no event", i)
		}
	}
	testwait.For(t, 10*time.Second, "every reader to read on a connection of its own", func() bool { return blocked() == readers })

	cancel()
	for _, ch := range chans {
		for range ch {
		}
	}
	testwait.For(t, 10*time.Second, "the readers' connections to close", func() bool { return blocked() == 0 })
}
