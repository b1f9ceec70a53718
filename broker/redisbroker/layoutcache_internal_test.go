package redisbroker

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
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
	hook := func(queue string) error {
		if once || queue != q {
			return nil
		}
		once = true
		// Another process records a new layout, and this one learns it
		// (as Repartition does) while the read above is under way.
		if err := rdb.HSet(ctx, prefix+":partitions", q, "3@1").Err(); err != nil {
			t.Error(err)
		}
		b.forgetLayout(q)
		return nil
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

// A forget that comes between a read's check for forgets and its store of
// what it read waits for the store and deletes it: the next call reads the
// recorded layout. (Before, the forget deleted nothing and the stale read
// stayed cached: under load a repartition's own next read got the old
// layout, and its next step was refused by the old partitions, "a
// partition records layout "6>3@1", not the one this process used".)
func TestLayoutForgottenBeforeTheStoreIsNotCached(t *testing.T) {
	// Not parallel: it sets the package's hook.
	rdb := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	b := New(rdb, WithPrefix(prefix), WithPartitions(2))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q = "cachestore"
	forgot := make(chan struct{})
	once := false
	hook := func(queue string) {
		if once || queue != q {
			return
		}
		once = true
		// Another process records a new layout, and this one learns it
		// just after the read checked that nothing was forgotten.
		if err := rdb.HSet(ctx, prefix+":partitions", q, "3@1").Err(); err != nil {
			t.Error(err)
		}
		go func() {
			b.forgetLayout(q)
			close(forgot)
		}()
		// The forget either ends now (nothing to make it wait) or waits
		// for the store; the read goes on either way.
		select {
		case <-forgot:
		case <-time.After(200 * time.Millisecond):
		}
	}
	beforeLayoutStore.Store(&hook)
	t.Cleanup(func() { beforeLayoutStore.Store(nil) })
	if l, err := b.layoutOf(ctx, q); err != nil || l.cur.n != 2 {
		t.Fatalf("the read under way: %+v, %v", l, err)
	}
	beforeLayoutStore.Store(nil)
	if !once {
		t.Fatal("the hook did not run")
	}
	<-forgot
	if l, err := b.layoutOf(ctx, q); err != nil || l.cur.n != 3 {
		t.Fatalf("the layout after a forget that came before the store: %v partitions (%v), want 3", l.cur.n, err)
	}
}

// straddle arms the package's hook so that the next read of queue q's
// layout reads the registry before a repartition of q from 6 partitions
// records its layout and the partitions' meta keys after it marked the old
// partitions. It returns, for afterHold, arm, which sets the hook (call it
// before the read is started: a read that ran first would straddle
// nothing), and wait, which lets the repartition go on once that read has
// begun; did reports whether it did.
func straddle(t *testing.T, b *Broker, q string) (arm func(), wait func(), did func() bool) {
	ctx := context.Background()
	marked := func() bool {
		for i := range 6 {
			m, err := b.rdb.Get(ctx, b.prefix+":{"+q+":"+strconv.Itoa(i)+"}:meta").Result()
			if err != nil || m != "6>3@1" {
				return false
			}
		}
		return true
	}
	reading := make(chan struct{})
	done := false
	read := func(queue string) error {
		if queue != q || done {
			return nil
		}
		done = true
		afterLayoutRead.Store(nil)
		close(reading)
		for deadline := time.Now().Add(10 * time.Second); !marked(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("the old partitions were not marked")
				break
			}
		}
		return nil
	}
	t.Cleanup(func() { afterLayoutRead.Store(nil) })
	return func() {
			afterLayoutRead.Store(&read)
		}, func() {
			select {
			case <-reading:
			case <-time.After(10 * time.Second):
				t.Error("no read of the layout began")
			}
		}, func() bool {
			return done
		}
}

// A read of the layout that straddles a repartition recording its own
// (the registry read before, the partitions' meta keys after they were
// marked) reads again and answers the new layout, rather than the old
// partitions' refusal.
func TestLayoutReadAcrossARepartitionsRecording(t *testing.T) {
	// Not parallel: it sets the package's hooks.
	rdb := redistest.Client(t, redistest.Addr(t))
	b := New(rdb, WithPrefix(redistest.Prefix(t)), WithPartitions(6))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q = "straddle"
	now := time.Now()
	if errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{{ID: "a", Queue: q, Type: "t", State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now}}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
		t.Fatalf("Enqueue: %v %v", errs, err)
	}
	arm, wait, did := straddle(t, b, q)
	got := make(chan error, 1)
	afterHold = func(queue string) {
		if queue != q {
			return
		}
		arm()
		go func() {
			b.forgetLayout(q)
			_, err := b.layoutOf(ctx, q)
			got <- err
		}()
		wait()
	}
	t.Cleanup(func() { afterHold = nil })
	if err := b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a read of the layout across the repartition's recording: %v", err)
	}
	if !did() {
		t.Fatal("the read did not straddle the recording")
	}
}

// An operator's single-task call from a process whose cached layout a
// repartition (by another process) has made stale succeeds: the call the
// retired partition refused runs again with the layout read afresh. (The
// flow-control model, seed 80: a DeleteTask right after a repartition
// failed with ErrUnavailable.)
func TestSingleTaskCallsWithALayoutARepartitionMadeStale(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	other := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "stale-layout-ops"
	calls := map[string]func(ctx context.Context, queue, id string) error{
		"delete": b.Delete, "cancel": b.Cancel, "archive": b.ArchiveTask, "run": b.RunTask,
	}
	var ids []string
	for name := range calls {
		ids = append(ids, name)
	}
	fillQueue(t, b, q, ids) // b caches the layout of 2 partitions
	if err := b.ArchiveTask(ctx, q, "run"); err != nil {
		t.Fatal(err) // RunTask needs a task that is not pending
	}
	stale, err := b.layoutOf(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			b.layouts.Store(q, cachedLayout{l: stale, at: time.Now()}) // as cached before
			if err := call(ctx, q, name); err != nil {
				t.Fatalf("%s after a repartition with the layout cached before it: %v", name, err)
			}
		})
	}
}

// An operator's single-task call during a repartition, for an ID whose old
// partition the repartition has retired already (it moved that
// partition's tasks, maybe just after the call looked in the new one),
// looks again and answers as for any task: ErrTaskNotFound for one that is
// not there, never ErrUnavailable. (The flow-control model, seed 80: a
// DeleteTask of a task moved during the lookup failed so.)
func TestSingleTaskCallsSkipARetiredOldPartition(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	b := slotBroker(t, addr, prefix, 2)
	ctx := context.Background()
	const q = "retired-old-ops"
	// A task running in old partition 1 holds the repartition there, after
	// old partition 0 is drained and retired.
	hold := idsIn("hold", 1, 2, 1)
	fillQueue(t, b, q, hold)
	held, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
	if err != nil || len(held) != 1 {
		t.Fatalf("leased %d tasks (%v), want the one that holds the repartition", len(held), err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Repartition(ctx, q, 3, nil) }()
	var l layout
	testwait.For(t, 10*time.Second, "old partition 0 to be retired", func() bool {
		b.forgetLayout(q)
		l, err = b.freshLayout(ctx, q)
		return err == nil && l.old != nil && b.retired(ctx, b.partAt(q, l, l.cur.n))
	})
	missing := idsIn("gone", 0, 2, 1)[0]
	calls := map[string]func(ctx context.Context, queue, id string) error{
		"delete": b.Delete, "cancel": b.Cancel, "archive": b.ArchiveTask, "run": b.RunTask,
	}
	for name, call := range calls {
		if err := call(ctx, q, missing); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Errorf("%s of a missing task of a retired old partition during a repartition: %v, want ErrTaskNotFound", name, err)
		}
	}
	settleAll(t, b, held)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
