package redisbroker

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A step of a repartition that acts on what it read of an old partition
// (peek) after a Replace moved the task ahead leaves alone what the new
// span made of the ID since: a Replace into another group of the same
// partition keeps its pointer; a task deleted and enqueued again into a
// group of another partition keeps its pointer (with the step's over it, a
// later enqueue of the ID found no task and stored a second one); one
// enqueued again into the ID's own partition is no conflict that stops the
// repartition. Each ID then has one record and, away from its partition,
// one pointer naming its group.
func TestStaleRepartitionStepKeepsTheNewSpans(t *testing.T) {
	t.Parallel()
	const id = "order-cancel:42"
	// group returns a group whose partitions fit ok.
	group := func(ok func(p6, p3 int) bool, not ...string) string {
		for i := 0; ; i++ {
			g := "shop-" + strconv.Itoa(i)
			for _, n := range not {
				if g == n {
					g = ""
				}
			}
			if g != "" && ok(broker.Partition(g, 6), broker.Partition(g, 3)) {
				return g
			}
		}
	}
	in6, in3 := broker.Partition(id, 6), broker.Partition(id, 3)
	// from: away from the ID's partition in both spans.
	from := group(func(p6, p3 int) bool { return p6 != in6 && p3 != in3 })
	fp := broker.Partition(from, 3)
	other := group(func(_, p3 int) bool { return p3 == fp }, from)               // from's new partition
	away := group(func(_, p3 int) bool { return p3 != fp && p3 != in3 })         // a third one
	home := group(func(_, p3 int) bool { return p3 == in3 })                     // the ID's
	later := group(func(_, p3 int) bool { return p3 != in3 }, from, other, away) // for the enqueue after
	for _, c := range []struct {
		name string
		into string // the group of the ID's task after what the new span did
		// meanwhile, after the step's peek: what the new span does
		meanwhile []string // groups: Replace into the first, then Delete and Enqueue into the second
	}{
		{"ReplacedIntoAnotherGroup", other, []string{other}},
		{"DeletedAndStoredElsewhere", away, []string{from, away}},
		{"DeletedAndStoredInTheIDsPartition", home, []string{from, home}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const q = "stale"
			ctx := context.Background()
			b, l, enqueue := repartitionStarted(t, q, id, from)
			o, _ := b.oldPartOf(q, l, from)
			peek, err := b.moveCall(ctx, o, "peek", moveBatch).Slice()
			if err != nil || len(peek) != 3 {
				t.Fatalf("peek: %v, %v", peek, err)
			}
			// The Replace moves the task ahead.
			if err := enqueue(c.meanwhile[0], "replaced", true); err != nil {
				t.Fatalf("Replace: %v", err)
			}
			if len(c.meanwhile) > 1 {
				if err := b.Delete(ctx, q, id); err != nil {
					t.Fatalf("Delete: %v", err)
				}
				if err := enqueue(c.meanwhile[1], "again", false); err != nil {
					t.Fatalf("Enqueue again: %v", err)
				}
			}
			// The step goes on with what it peeked.
			ms, err := b.reserveAndTake(ctx, l, o, peek)
			if err != nil || len(ms) != 0 {
				t.Fatalf("the step after the Replace took %v (%v)", ms, err)
			}
			check := func(when string) {
				t.Helper()
				recs, ptrs := newSpanIndex(t, b, l, q, id)
				gp := broker.Partition(c.into, 3)
				if len(recs) != 1 || recs[0] != gp {
					t.Fatalf("%s: records in %v, want one in %d", when, recs, gp)
				}
				if gp == in3 && len(ptrs) != 0 || gp != in3 && (len(ptrs) != 1 || ptrs[0].p != in3 || ptrs[0].state != 'k' || ptrs[0].group != c.into) {
					t.Fatalf("%s: pointers %+v, want one naming %s", when, ptrs, c.into)
				}
				if got, err := b.GetTask(ctx, q, id); err != nil || got.Group != c.into {
					t.Fatalf("%s: GetTask: %+v, %v", when, got, err)
				}
			}
			check("after the step")
			if err := b.Repartition(ctx, q, 3, nil); err != nil {
				t.Fatal(err)
			}
			check("after the repartition")
			if err := enqueue(later, "later", false); !errors.Is(err, broker.ErrTaskIDConflict) {
				t.Fatalf("Enqueue of the ID into %s after the repartition: %v, want ErrTaskIDConflict", later, err)
			}
			check("after a later enqueue")
		})
	}
}

// placedPointer is a pointer and the partition that holds it.
type placedPointer struct {
	pointer
	p int
}

// newSpanIndex returns the partitions of l's new span that hold a record of
// task id, and the pointers they hold for it.
func newSpanIndex(t *testing.T, b *Broker, l layout, q, id string) (recs []int, ptrs []placedPointer) {
	t.Helper()
	for p := range l.cur.n {
		v, err := b.rdb.HGet(context.Background(), b.partAt(q, l, p).k("t"), id).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if ptr, ok := parsePointer(v); ok {
			ptrs = append(ptrs, placedPointer{ptr, p})
		} else {
			recs = append(recs, p)
		}
	}
	return recs, ptrs
}

// enqueueOne enqueues a pending task with ID id into group g of queue q of
// b, carrying payload, with or without Replace, and returns its outcome.
func enqueueOne(ctx context.Context, b *Broker, q, id, g, payload string, replace bool) error {
	now := time.Now()
	m := &tidetype.TaskInfo{ID: id, Queue: q, Type: "t", Payload: []byte(payload), State: tidetype.StatePending, MaxRetry: 3, NextProcessAt: now, EnqueuedAt: now, Group: g}
	errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{Replace: replace})
	if err == nil {
		err = errs[0]
	}
	return err
}

// repartitionStarted makes a broker of queues of 6 partitions, stores task
// id of queue q in group from (payload "first") and starts a repartition
// to 3 partitions, whose layout it returns; enqueue stores id again (in
// group g, with Replace when replace is set).
func repartitionStarted(t *testing.T, q, id, from string) (b *Broker, l layout, enqueue func(g, payload string, replace bool) error) {
	t.Helper()
	b = New(redistest.Client(t, redistest.Addr(t)), WithPrefix(redistest.Prefix(t)), WithPartitions(6))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	enqueue = func(g, payload string, replace bool) error { return enqueueOne(ctx, b, q, id, g, payload, replace) }
	if err := enqueue(from, "first", false); err != nil {
		t.Fatal(err)
	}
	l, err := b.startRepartition(ctx, q, 3)
	if err != nil || l.old == nil {
		t.Fatalf("startRepartition: %+v, %v", l, err)
	}
	return b, l, enqueue
}
