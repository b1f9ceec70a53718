package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// indexAt is indexOf for the partitions of epoch ep (the span a
// repartition created; 0 is a queue's first).
func indexAt(t *testing.T, rdb *redis.Client, prefix, q string, n, ep int, id string) taskIndex {
	t.Helper()
	if ep == 0 {
		return indexOf(t, rdb, prefix, q, n, id)
	}
	var ix taskIndex
	for p := range n {
		v, err := rdb.HGet(context.Background(), prefix+":{"+q+":"+strconv.Itoa(p)+"@"+strconv.Itoa(ep)+"}:t", id).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(v, "\x00g"):
			ix.pointers = append(ix.pointers, strconv.Itoa(p)+":"+v[2:3]+":"+v[strings.LastIndexByte(v, 0)+1:])
		case len(v) > 0 && v[0] == 2:
			ix.records = append(ix.records, p)
		}
	}
	return ix
}

// freeIDIn returns an ID without a tag whose partition of n is p.
func freeIDIn(prefix string, n, p int) string {
	for i := 0; ; i++ {
		if id := prefix + strconv.Itoa(i); broker.Partition(id, n) == p {
			return id
		}
	}
}

// While a repartition runs, grouped tasks with the IDs their callers chose
// are taken (stored in the new span, with a pointer where their ID's
// partition is not their group's) rather than refused; an ID that a task
// of the old span holds is a conflict as any other time, and with Replace
// that task (waiting, not moved yet) is replaced; an ID whose task ended
// before the repartition, its pointer left behind in the old span, is free.
// Afterwards each is found by its ID, stored once, and runs once.
func TestFreeIDsDuringARepartition(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ from, to int }{{1, 6}, {6, 3}} {
		t.Run(fmt.Sprintf("%dto%d", c.from, c.to), func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(c.from))
			ctx := context.Background()
			q := fmt.Sprintf("freerep%d", c.from)
			// A task that ends before the repartition: on several
			// partitions its pointer stays behind.
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "dead:1", "shop-ended"))
			ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Dequeue: %v, %v", ds, err)
			}
			if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil || errs[0] != nil {
				t.Fatalf("Settle: %v %v", errs, err)
			}
			// Enough tasks for the move to take several steps.
			var want []string
			for i := range 250 {
				m := groupMsg(q, fmt.Sprintf("t%03d", i), "shop-9")
				mustEnqueue(t, e.b, broker.EnqueueOptions{}, m)
				want = append(want, m.ID)
			}
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:43", "shop-8"), freeMsg(q, "order-cancel:44", "shop-8"))
			want = append(want, "order-cancel:43", "order-cancel:44")
			news := map[string]string{
				"order-cancel:42": "shop-7", // a pointer in the new span
				freeIDIn("here:", c.to, broker.Partition("shop-7", c.to)): "shop-7", // none
				"dead:1": "shop-8",
			}
			replaced := freeMsg(q, "order-cancel:44", "shop-8")
			replaced.Payload = []byte("replaced")
			steps := 0
			err = e.b.Repartition(ctx, q, c.to, func(moved, left int) {
				if left == 0 || steps > 0 {
					return
				}
				steps++
				for id, g := range news {
					errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{freeMsg(q, id, g)}, broker.EnqueueOptions{})
					if err == nil {
						err = errs[0]
					}
					if err != nil {
						t.Errorf("Enqueue(%s, %s) while a repartition runs: %v", id, g, err)
					}
				}
				errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{freeMsg(q, "order-cancel:43", "shop-7")}, broker.EnqueueOptions{})
				if err == nil {
					err = errs[0]
				}
				if !errors.Is(err, broker.ErrTaskIDConflict) {
					t.Errorf("Enqueue of an ID a task of the old span holds: %v, want ErrTaskIDConflict", err)
				}
				errs, err = e.b.Enqueue(ctx, []*tidetype.TaskInfo{replaced}, broker.EnqueueOptions{Replace: true})
				if err == nil {
					err = errs[0]
				}
				if err != nil {
					t.Errorf("Replace of a waiting task while a repartition runs: %v", err)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if steps == 0 {
				t.Fatal("no step of the move left tasks to move")
			}
			if t.Failed() {
				t.FailNow()
			}
			ep := 1
			for id, g := range news {
				got, err := e.b.GetTask(ctx, q, id)
				if err != nil || got.Group != g {
					t.Fatalf("GetTask(%s): %+v, %v; want group %s", id, got, err, g)
				}
				ix := indexAt(t, e.rdb, e.prefix, q, c.to, ep, id)
				gp, ip := broker.Partition(g, c.to), broker.Partition(id, c.to)
				wantPtr := []string(nil)
				if gp != ip && c.to > 1 {
					wantPtr = []string{strconv.Itoa(ip) + ":k:" + g}
				}
				if len(ix.records) != 1 || ix.records[0] != gp || !slices.Equal(ix.pointers, wantPtr) {
					t.Fatalf("%s: records %v, pointers %v; want one record in %d and pointers %v", id, ix.records, ix.pointers, gp, wantPtr)
				}
				want = append(want, id)
			}
			if got, err := e.b.GetTask(ctx, q, "order-cancel:44"); err != nil || string(got.Payload) != "replaced" {
				t.Fatalf("GetTask(order-cancel:44) after Replace: %+v, %v", got, err)
			}
			ran := runOneByOne(t, e.b, q)
			slices.Sort(ran)
			slices.Sort(want)
			if !slices.Equal(ran, want) {
				t.Fatalf("ran %s", orderDiff(ran, want))
			}
		})
	}
}

// An enqueue of a grouped task with a free ID that meets a repartition's
// hold (set before the new layout is recorded) waits for the new layout
// and is sent again, rather than refused. Not parallel: it sets the
// package's hooks.
func TestFreeIDEnqueueWaitsOutAHold(t *testing.T) {
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "freewait"
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "first", "shop-7"))
	claimed := make(chan struct{}, 1)
	redisbroker.SetAfterClaim(func(id string) error {
		if id == "order-cancel:42" {
			select {
			case claimed <- struct{}{}:
			default:
			}
		}
		return nil
	})
	t.Cleanup(func() { redisbroker.SetAfterClaim(nil) })
	done := make(chan error, 1)
	redisbroker.SetAfterHold(func(queue string) {
		if queue != q {
			return
		}
		go func() {
			errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{freeMsg(q, "order-cancel:42", "shop-7")}, broker.EnqueueOptions{})
			if err == nil {
				err = errs[0]
			}
			done <- err
		}()
		<-claimed
		// Its store meets the hold, which releases its claim.
		testwait.For(t, 10*time.Second, "the held store to be refused", func() bool {
			return len(indexOf(t, e.rdb, e.prefix, q, 6, "order-cancel:42").pointers) == 0
		})
	})
	t.Cleanup(func() { redisbroker.SetAfterHold(nil) })
	if err := e.b.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Enqueue that met a repartition's hold: %v", err)
	}
	if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}
}
