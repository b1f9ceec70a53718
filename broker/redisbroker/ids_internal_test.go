package redisbroker

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A task ID the broker chose is drawn again only when the script proves that
// the task holding it is another one; finding its own record (a request that
// ran before, whose answer was lost) counts as stored. A caller's ID is never
// drawn again.
func TestRedrawOnlyProvenCollisions(t *testing.T) {
	t.Parallel()
	b := New(redistest.Client(t, redistest.Addr(t)), WithPrefix(redistest.Prefix(t)))
	ctx := context.Background()
	task := func(id, payload string) *tidetype.TaskInfo {
		now := time.Now()
		return &tidetype.TaskInfo{ID: id, Queue: "q", Type: "t", Payload: []byte(payload), State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now}
	}
	enqueue := func(ts ...*tidetype.TaskInfo) []error {
		errs, err := b.Enqueue(ctx, ts, broker.EnqueueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return errs
	}
	if errs := enqueue(task("dup", "theirs")); errs[0] != nil {
		t.Fatal(errs[0])
	}

	// A drawn ID meets another task: drawn again, stored, the other untouched.
	draws := []string{"dup"}
	b.newID = func() string {
		if len(draws) > 0 {
			id := draws[0]
			draws = draws[1:]
			return id
		}
		return broker.NewID()
	}
	mine := task("", "mine")
	if errs := enqueue(mine); errs[0] != nil {
		t.Fatalf("a collision with another task reached the caller: %v", errs[0])
	}
	if mine.ID == "dup" || mine.ID == "" {
		t.Fatalf("drawn again to %q", mine.ID)
	}
	if got, err := b.GetTask(ctx, "q", "dup"); err != nil || string(got.Payload) != "theirs" {
		t.Fatalf("the other task: %+v, %v", got, err)
	}

	// The same record sent again (a second request carrying a task its
	// first run stored) is recognised as this task's own: no second task.
	it := item{t: mine, lay: layout{cur: span{n: 1}, tag: "1"}, own: true}
	errs, err := b.enqueueNow(ctx, []item{it}, broker.EnqueueOptions{})
	if err != nil || errs[0] != nil {
		t.Fatalf("sending a stored task again: %v, %v", errs, err)
	}
	if n := b.rdb.HLen(ctx, b.partAt("q", it.lay, 0).k("t")).Val(); n != 2 {
		t.Fatalf("%d records, want 2", n)
	}

	// A caller's ID that is taken is a conflict, never drawn again.
	if errs := enqueue(task("dup", "again")); !errors.Is(errs[0], broker.ErrTaskIDConflict) {
		t.Fatalf("caller's ID taken: %v", errs[0])
	}
}

// An idempotency key lives in the bucket of the window it was used in and is
// looked up in that bucket and the one before: a repeat one window later
// still finds it, a repeat two windows later stores a new task, and the
// bucket expires on its own after its second window.
func TestIdempotencyBuckets(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	b := New(rdb, WithPrefix(prefix), WithIdempotencyWindow(time.Hour))
	ctx := context.Background()
	enqueue := func() string {
		t.Helper()
		m := &tidetype.TaskInfo{Queue: "q", Type: "t", State: tidetype.StatePending, IdempotencyKey: "k", NextProcessAt: time.Now(), EnqueuedAt: time.Now()}
		errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{})
		if err != nil || errs[0] != nil {
			t.Fatalf("Enqueue: %v %v", err, errs)
		}
		return m.ID
	}
	first := enqueue()
	w := time.Hour.Milliseconds()
	n := b.Now().UnixMilli() / w
	bucket := func(n int64) string { return prefix + ":{q:0}:ik:" + strconv.FormatInt(n, 10) }
	if got, err := rdb.HGet(ctx, bucket(n), "k").Result(); err != nil || got != first {
		t.Fatalf("bucket %d holds %q, %v; want %q", n, got, err, first)
	}
	if exp, err := rdb.PExpireTime(ctx, bucket(n)).Result(); err != nil || exp.Milliseconds() != (n+2)*w {
		t.Fatalf("bucket expires at %v, %v; want %d ms", exp, err, (n+2)*w)
	}
	// One window later the key sits in the previous bucket: still found.
	if err := rdb.Rename(ctx, bucket(n), bucket(n-1)).Err(); err != nil {
		t.Fatal(err)
	}
	if id := enqueue(); id != first {
		t.Fatalf("key in the previous window: ID %q, want %q", id, first)
	}
	// Two windows later it is forgotten.
	if err := rdb.Rename(ctx, bucket(n-1), bucket(n-2)).Err(); err != nil {
		t.Fatal(err)
	}
	if id := enqueue(); id == first {
		t.Fatal("a key two windows old still answered")
	}
}
