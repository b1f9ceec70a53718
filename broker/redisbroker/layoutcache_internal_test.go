package redisbroker

import (
	"context"
	"testing"

	"github.com/tidequeue/tide/internal/redistest"
)

// A layout read while a repartition records the new one and forgets the
// cached one is not cached: the next call reads the new layout. (Cached, it
// answered for 30 s with the old span alone, and the repartition's own
// next step, run on that layout, was refused by the old partitions.)
func TestLayoutForgottenWhileReadIsNotCached(t *testing.T) {
	// Not parallel: it sets the package's hook.
	rdb := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	b := New(rdb, WithPrefix(prefix), WithPartitions(2))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q = "cache"
	if l, err := b.layoutOf(ctx, q); err != nil || l.cur.n != 2 {
		t.Fatalf("layout: %+v, %v", l, err)
	}
	b.forgetLayout(q)
	once := false
	hook := func(queue string) {
		if once || queue != q {
			return
		}
		once = true
		// Another process records a new layout, and this one learns it
		// (as Repartition does) while the read above is under way.
		if err := rdb.HSet(ctx, prefix+":partitions", q, "3@1").Err(); err != nil {
			t.Error(err)
		}
		b.forgetLayout(q)
	}
	afterLayoutRead.Store(&hook)
	t.Cleanup(func() { afterLayoutRead.Store(nil) })
	if l, err := b.layoutOf(ctx, q); err != nil || l.cur.n != 2 {
		t.Fatalf("the read under way: %+v, %v", l, err)
	}
	if !once {
		t.Fatal("the hook did not run")
	}
	if l, err := b.layoutOf(ctx, q); err != nil || l.cur.n != 3 {
		t.Fatalf("the layout after the read that met a forget: %v partitions (%v), want 3", l.cur.n, err)
	}
}
