package redisbroker_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// A Replace that moves a task out of its ID's own partition into a group of
// another one, and meets a Delete of the task after it left: the Delete
// deletes the task that left, the ID stays taken for the one the Replace
// stores (one record, its pointer naming its group), as a Delete during any
// move. Not parallel: it sets the package's hooks.
func TestFreeIDMoveOutMeetsADelete(t *testing.T) {
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "moveoutdel"
	home := freeIDIn("shop-", 6, 2) // order-cancel:42's partition
	for _, from := range []string{"", home} {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", from))
		var deleted error = errors.New("no Delete")
		redisbroker.SetAfterMove(func(id, step string) error {
			if step == "left" {
				deleted = e.b.Delete(ctx, q, id)
			}
			return nil
		})
		m := freeMsg(q, "order-cancel:42", "shop-7")
		m.Payload = []byte("moved")
		err := replaceOne(e.b, m)
		redisbroker.SetAfterMove(nil)
		if err != nil || deleted != nil {
			t.Fatalf("Replace out of group %q: %v; the Delete during it: %v", from, err, deleted)
		}
		wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
		if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-7" || string(got.Payload) != "moved" {
			t.Fatalf("GetTask: %+v, %v", got, err)
		}
		if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
			t.Fatalf("ran %v", ran)
		}
	}
}

// A client that dies in the middle of a move out of the ID's own partition
// leaves its task flagged as moving there (found by its ID, leased by
// nobody); the maintainer of that partition settles it once it is older
// than a store may be, and so does a repartition that begins: a task not
// stored in the new group goes back, one stored there stays and the
// record's field becomes its pointer. Not parallel: it sets the package's
// hooks.
func TestFreeIDMoveOutOfADeadClient(t *testing.T) {
	defer redisbroker.SetClockSlack(redisbroker.SetClockSlack(0))
	died := errors.New("the client died")
	for _, c := range []struct {
		name        string
		settle      string // "maintainer" or "repartition"
		at          string // the step the client dies after
		group, data string // the task's group and payload after the settling
	}{
		{"LeftMaintainer", "maintainer", "left", "", "payload of order-cancel:42"},
		{"StoredMaintainer", "maintainer", "stored", "shop-7", "moved"},
		{"LeftRepartition", "repartition", "left", "", "payload of order-cancel:42"},
		{"StoredRepartition", "repartition", "stored", "shop-7", "moved"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t, redisbroker.WithPartitions(6), redisbroker.WithReplayWindow(time.Second))
			ctx := context.Background()
			const q = "moveoutdead"
			var dieAt atomic.Value
			dieAt.Store(c.at)
			redisbroker.SetAfterMove(func(id, step string) error {
				if s, _ := dieAt.Load().(string); s == step {
					return died
				}
				return nil
			})
			t.Cleanup(func() { redisbroker.SetAfterMove(nil) })
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", ""))
			m := freeMsg(q, "order-cancel:42", "shop-7")
			m.Payload = []byte("moved")
			if err := replaceOne(e.b, m); !errors.Is(err, died) {
				t.Fatalf("Replace dying after %s: %v", c.at, err)
			}
			dieAt.Store("")
			if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "" {
				t.Fatalf("GetTask during the move left behind: %+v, %v", got, err)
			}
			n, ep := 6, 0
			if c.settle == "repartition" {
				// (A move left behind that nobody settles keeps its
				// partition from retiring: the repartition never ends.)
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				if err := e.b.Repartition(rctx, q, 3, nil); err != nil {
					t.Fatal(err)
				}
				n, ep = 3, 1
			} else {
				testwait.For(t, 10*time.Second, "the maintainer to settle the move", func() bool {
					if _, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: 2, Owner: "test", OwnerTTL: time.Minute}); err != nil {
						t.Fatal(err)
					}
					l, err := e.rdb.HLen(ctx, e.prefix+":{"+q+":2}:xl").Result()
					return err == nil && l == 0
				})
			}
			ix := indexAt(t, e.rdb, e.prefix, q, n, ep, "order-cancel:42")
			rec, in := broker.Partition(storeKeyOf(freeMsg(q, "order-cancel:42", c.group)), n), broker.Partition("order-cancel:42", n)
			var ptrs []string
			if rec != in {
				ptrs = []string{strconv.Itoa(in) + ":k:" + c.group}
			}
			if len(ix.records) != 1 || ix.records[0] != rec || !slices.Equal(ix.pointers, ptrs) {
				t.Fatalf("records in %v, pointers %v; want a record in %d and pointers %v", ix.records, ix.pointers, rec, ptrs)
			}
			if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != c.group || string(got.Payload) != c.data {
				t.Fatalf("GetTask after the settling: %+v, %v", got, err)
			}
			if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
				t.Fatalf("ran %v", ran)
			}
		})
	}
}
