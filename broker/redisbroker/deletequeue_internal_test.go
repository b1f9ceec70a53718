package redisbroker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/redistest"
)

// A queue deleted after a repartition and created again works: its
// repartition retired partitions whose meta keys say so for good, and the
// queue created again used to be recorded on those very keys (the
// configured count, epoch 0), so that every call on it failed with
// "partition 0 records layout retired". It now keeps its layout, as a
// queue with limits does, each time it is deleted and created again.
func TestQueueCreatedAgainAfterARepartition(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	ctx := context.Background()
	const q = "again"
	for round := range 3 {
		b := slotBroker(t, addr, prefix, 2)
		ids := idsIn(fmt.Sprint("r", round, "-"), 0, 1, 4)
		fillQueue(t, b, q, ids)
		if err := b.Repartition(ctx, q, 3+round, nil); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil || len(ds) != len(ids) {
			t.Fatalf("round %d: %d of %d tasks leased after the repartition: %v", round, len(ds), len(ids), err)
		}
		settleAll(t, b, ds)
		if err := b.DeleteQueue(ctx, q); err != nil {
			t.Fatalf("round %d: DeleteQueue: %v", round, err)
		}
		again := slotBroker(t, addr, prefix, 2) // a process started after the deletion
		fillQueue(t, again, q, []string{"x", "y", "z"})
		ds, err = again.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil || len(ds) != 3 {
			t.Fatalf("round %d: the queue created again leased %d of 3 tasks: %v", round, len(ds), err)
		}
		settleAll(t, again, ds)
		l, err := again.layoutOf(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if l.cur.n != 3+round {
			t.Fatalf("round %d: the queue created again has %d partitions, want the %d it was repartitioned to", round, l.cur.n, 3+round)
		}
	}
}
