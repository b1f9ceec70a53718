package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// replaceOne enqueues m with Replace and returns its error.
func replaceOne(b broker.Broker, m *tidetype.TaskInfo) error {
	errs, err := b.Enqueue(context.Background(), []*tidetype.TaskInfo{m}, broker.EnqueueOptions{Replace: true})
	if err == nil {
		err = errs[0]
	}
	return err
}

// wantIndex fails unless id has one record, in partition rec, and the
// pointers ptrs (of six partitions).
func wantIndex(t *testing.T, e env, q, id string, rec int, ptrs ...string) {
	t.Helper()
	ix := indexOf(t, e.rdb, e.prefix, q, 6, id)
	if len(ix.records) != 1 || ix.records[0] != rec || !slices.Equal(ix.pointers, ptrs) {
		t.Fatalf("%s: records in %v, pointers %v; want a record in %d and pointers %v", id, ix.records, ix.pointers, rec, ptrs)
	}
}

// Replace moves a waiting grouped task with a free ID into a group of
// another partition: a new task there, after that group's others, found
// by its ID, with its pointer naming the new group; its old ordered group
// lets it go.
func TestFreeIDReplaceIntoAnotherPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "move"
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	// shop-7 in partition 3 holds order-cancel:42 (ID in 2) and a task
	// after it; shop-8 in partition 4 one task.
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"), freeMsg(q, "after", "shop-7"), freeMsg(q, "first", "shop-8"))
	wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
	m := freeMsg(q, "order-cancel:42", "shop-8")
	m.Payload = []byte("moved")
	if err := replaceOne(e.b, m); err != nil {
		t.Fatalf("Replace into a group of another partition: %v", err)
	}
	wantIndex(t, e, q, "order-cancel:42", 4, "2:k:shop-8")
	got, err := e.b.GetTask(ctx, q, "order-cancel:42")
	if err != nil || got.Group != "shop-8" || string(got.Payload) != "moved" {
		t.Fatalf("GetTask after the move: %+v, %v", got, err)
	}
	ran := runOneByOne(t, e.b, q)
	if len(ran) != 3 || slices.Index(ran, "first") > slices.Index(ran, "order-cancel:42") || !slices.Contains(ran, "after") {
		t.Fatalf("ran %v; want after, and first before order-cancel:42", ran)
	}
	// Replace again, back, once it has run: a new task in shop-7.
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-8"))
	if err := replaceOne(e.b, freeMsg(q, "order-cancel:42", "shop-7")); err != nil {
		t.Fatalf("Replace back: %v", err)
	}
	wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
}

// A running task is not waiting: its Replace into a group of another
// partition is ErrTaskIDConflict, as on one partition, and leaves it as it
// was (into a group of the same partition too: its pointer stays); so is
// one leased while the move begins. A task taken out of its
// group by a move is leased by nobody.
func TestFreeIDMoveOfARunningTask(t *testing.T) {
	// Not parallel: it sets the package's hooks.
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "moverun"
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
	ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %v, %v", ds, err)
	}
	if err := replaceOne(e.b, freeMsg(q, "order-cancel:42", "shop-8")); !errors.Is(err, broker.ErrTaskIDConflict) {
		t.Fatalf("Replace of a running task into another partition: %v, want ErrTaskIDConflict", err)
	}
	wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
	// Into a group of the same partition (shop-9) too; its pointer stays.
	if err := replaceOne(e.b, freeMsg(q, "order-cancel:42", "shop-9")); !errors.Is(err, broker.ErrTaskIDConflict) {
		t.Fatalf("Replace of a running task into a group of its partition: %v, want ErrTaskIDConflict", err)
	}
	wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
	if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil || errs[0] != nil {
		t.Fatalf("Settle of the task the Replace left running: %v %v", errs, err)
	}

	// Leased between the move's claim and its leave.
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:43", "shop-7"))
	var leased []*broker.Delivery
	redisbroker.SetAfterMove(func(id, step string) error {
		if step != "claimed" {
			return nil
		}
		ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
		if err != nil {
			return err
		}
		leased = ds
		return nil
	})
	t.Cleanup(func() { redisbroker.SetAfterMove(nil) })
	if err := replaceOne(e.b, freeMsg(q, "order-cancel:43", "shop-8")); !errors.Is(err, broker.ErrTaskIDConflict) {
		t.Fatalf("Replace of a task leased as the move began: %v, want ErrTaskIDConflict", err)
	}
	if len(leased) != 1 || leased[0].Task.ID != "order-cancel:43" {
		t.Fatalf("leased %v as the move began", leased)
	}
	ix := indexOf(t, e.rdb, e.prefix, q, 6, "order-cancel:43")
	if len(ix.records) != 1 || ix.records[0] != 3 || len(ix.pointers) != 1 || !strings.HasSuffix(ix.pointers[0], ":k:shop-7") {
		t.Fatalf("order-cancel:43 after the refused move: records %v, pointers %v", ix.records, ix.pointers)
	}
	if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: leased[0].Lease(), Kind: broker.SettleDone, Task: leased[0].Task}}); err != nil || errs[0] != nil {
		t.Fatalf("Settle: %v %v", errs, err)
	}

	// Leased by nobody once it left its group.
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
	leased = nil
	redisbroker.SetAfterMove(func(id, step string) error {
		if step != "left" {
			return nil
		}
		ds, err := e.b.Dequeue(ctx, []string{q}, 10, time.Minute)
		leased = ds
		return err
	})
	if err := replaceOne(e.b, freeMsg(q, "order-cancel:42", "shop-8")); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if len(leased) != 0 {
		t.Fatalf("leased %v while it moved", leased[0].Task.ID)
	}
	wantIndex(t, e, q, "order-cancel:42", 4, "2:k:shop-8")
}

// Each call of a move re-sent after a lost reply answers like its first
// run: one task, in the new group's partition, one pointer naming it.
func TestResentFreeIDMoveStoresOnce(t *testing.T) {
	t.Parallel()
	files := redisbroker.ScriptFiles()
	sha := map[string]string{}
	for s, f := range files {
		sha[f] = s
	}
	home := freeIDIn("shop-", 6, 2) // order-cancel:42's partition
	for _, c := range []struct {
		name string
		file string
		n    int
		into string // the group moved into
	}{
		{"ClaimMoveAndMoved", "ids.lua", 3, "shop-8"}, {"LeaveAndGone", "relocate.lua", 2, "shop-8"}, {"Store", "enqueue.lua", 1, "shop-8"},
		{"IntoTheIDsPartition/LeaveAndGone", "relocate.lua", 2, home}, {"IntoTheIDsPartition/Store", "enqueue.lua", 2, home},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFaulty(t, redisbroker.WithPartitions(6))
			ctx := context.Background()
			mustEnqueue(t, f.b, broker.EnqueueOptions{}, freeMsg("q6", "order-cancel:42", "shop-7"))
			before := f.proxy.Seen("EVALSHA")
			f.proxy.DelayReplies(faultproxy.Commands("EVALSHA").WithFirstArg(sha[c.file]), 500*time.Millisecond, c.n)
			m := freeMsg("q6", "order-cancel:42", c.into)
			m.Payload = []byte("moved")
			mustEnqueue(t, f.b, broker.EnqueueOptions{Replace: true}, m)
			if sent := f.proxy.Seen("EVALSHA") - before; sent < 5+int64(c.n) {
				t.Fatalf("%d calls for the move: the fault did not happen", sent)
			}
			rec, ptrs := 4, []string{"2:k:shop-8"}
			if c.into == home {
				rec, ptrs = 2, nil
			}
			ix := indexOf(t, f.direct, f.prefix, "q6", 6, "order-cancel:42")
			if len(ix.records) != 1 || ix.records[0] != rec || !slices.Equal(ix.pointers, ptrs) {
				t.Fatalf("records in partitions %v, pointers %v; want one record in %d and pointers %v", ix.records, ix.pointers, rec, ptrs)
			}
			if got, err := f.b.GetTask(ctx, "q6", "order-cancel:42"); err != nil || got.Group != c.into || string(got.Payload) != "moved" {
				t.Fatalf("GetTask: %+v, %v", got, err)
			}
		})
	}
}

// A client that dies in the middle of a move leaves a move's claim; the
// maintainer of the ID's partition settles it once it is older than a
// store may be: a task that left its group and was not stored in the new
// one goes back (found, and run, where it was); one that was stored there
// stays there and the one that left is deleted. Meanwhile the task is
// found by its ID.
func TestFreeIDMoveOfADeadClient(t *testing.T) {
	// Not parallel: it sets the package's hooks.
	defer redisbroker.SetClockSlack(redisbroker.SetClockSlack(0))
	e := setup(t, redisbroker.WithPartitions(6), redisbroker.WithReplayWindow(time.Second))
	ctx := context.Background()
	const q = "movedead"
	died := errors.New("the client died")
	var dieAt atomic.Value
	redisbroker.SetAfterMove(func(id, step string) error {
		if s, _ := dieAt.Load().(string); s == step {
			return died
		}
		return nil
	})
	t.Cleanup(func() { redisbroker.SetAfterMove(nil) })
	repair := func(what string, done func() bool) {
		t.Helper()
		testwait.For(t, 10*time.Second, what, func() bool {
			// The maintainers of the ID's partition and of the one the
			// task left.
			for _, p := range []int{2, 3} {
				if _, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: p, Owner: "test", OwnerTTL: time.Minute}); err != nil {
					t.Fatal(err)
				}
			}
			return done()
		})
	}
	settled := func() bool {
		ix := indexOf(t, e.rdb, e.prefix, q, 6, "order-cancel:42")
		return len(ix.records) == 1 && !slices.ContainsFunc(ix.pointers, func(p string) bool { return strings.Contains(p, ":v:") })
	}
	home := freeIDIn("shop-", 6, 2) // order-cancel:42's partition
	for _, into := range []string{"shop-8", home} {
		// Died after the task left shop-7: it goes back.
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
		dieAt.Store("left")
		m := freeMsg(q, "order-cancel:42", into)
		m.Payload = []byte("moved")
		if err := replaceOne(e.b, m); !errors.Is(err, died) {
			t.Fatalf("Replace into %s dying after the leave: %v", into, err)
		}
		if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-7" {
			t.Fatalf("GetTask during the move left behind: %+v, %v", got, err)
		}
		if ds, err := e.b.Dequeue(ctx, []string{q}, 10, time.Minute); err != nil || len(ds) != 0 {
			t.Fatalf("Dequeue of a task that left: %v, %v", ds, err)
		}
		repair("the maintainer to put the task back", settled)
		wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
		if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-7" || string(got.Payload) == "moved" {
			t.Fatalf("GetTask after the repair: %+v, %v", got, err)
		}
		if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
			t.Fatalf("ran %v after the repair", ran)
		}

		// Died after the store in the new group: the move is finished.
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
		dieAt.Store("stored")
		if err := replaceOne(e.b, m); !errors.Is(err, died) {
			t.Fatalf("Replace into %s dying after the store: %v", into, err)
		}
		repair("the maintainer to finish the move", settled)
		if into == home {
			wantIndex(t, e, q, "order-cancel:42", 2)
		} else {
			wantIndex(t, e, q, "order-cancel:42", 4, "2:k:shop-8")
		}
		if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != into || string(got.Payload) != "moved" {
			t.Fatalf("GetTask after the repair: %+v, %v", got, err)
		}
		if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
			t.Fatalf("ran %v after the repair", ran)
		}

		// Died after the store, and the new task ran (and is gone)
		// before the repair: the move is finished all the same, and the
		// task that left does not come back to run a second time.
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
		dieAt.Store("stored")
		if err := replaceOne(e.b, m); !errors.Is(err, died) {
			t.Fatalf("Replace into %s dying after the store: %v", into, err)
		}
		if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
			t.Fatalf("ran %v before the repair", ran)
		}
		repair("the maintainer to settle the move", func() bool {
			left, err := e.rdb.HLen(ctx, e.prefix+":{"+q+":3}:xl").Result()
			ix := indexOf(t, e.rdb, e.prefix, q, 6, "order-cancel:42")
			return err == nil && left == 0 && !slices.ContainsFunc(ix.pointers, func(p string) bool { return strings.Contains(p, ":v:") })
		})
		if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("GetTask after the repair of a move whose task ran: %+v, %v", got, err)
		}
		if ran := runOneByOne(t, e.b, q); len(ran) != 0 {
			t.Fatalf("ran %v again after the repair", ran)
		}
	}
}

// Replace moves a grouped task with a free ID also into its ID's own
// partition: into a group there, or out of any group; the task's record
// then takes the place of its pointer. And back: a task stored in its ID's
// partition moves into a group of another one, its pointer taking the
// record's place.
func TestFreeIDReplaceIntoTheIDsPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "movein"
	home := freeIDIn("shop-", 6, 2) // order-cancel:42's partition
	for _, g := range []string{home, ""} {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
		wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
		m := freeMsg(q, "order-cancel:42", g)
		m.Payload = []byte("moved")
		if err := replaceOne(e.b, m); err != nil {
			t.Fatalf("Replace into group %q of the ID's partition: %v", g, err)
		}
		wantIndex(t, e, q, "order-cancel:42", 2)
		if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != g || string(got.Payload) != "moved" {
			t.Fatalf("GetTask after the move: %+v, %v", got, err)
		}
		if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
			t.Fatalf("ran %v", ran)
		}
	}
	// And back out of the ID's own partition, from a group there or from
	// none: the new group's pointer takes the record's place.
	for _, g := range []string{home, ""} {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", g))
		m := freeMsg(q, "order-cancel:42", "shop-7")
		m.Payload = []byte("out")
		if err := replaceOne(e.b, m); err != nil {
			t.Fatalf("Replace out of the ID's partition from group %q: %v", g, err)
		}
		wantIndex(t, e, q, "order-cancel:42", 3, "2:k:shop-7")
		if got, err := e.b.GetTask(ctx, q, "order-cancel:42"); err != nil || got.Group != "shop-7" || string(got.Payload) != "out" {
			t.Fatalf("GetTask after the move out: %+v, %v", got, err)
		}
		if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
			t.Fatalf("ran %v", ran)
		}
	}
}

// Moves across partitions racing with each other, with leases, retries,
// successes and deletes of the same tasks keep every invariant of the
// free-ID index once the maintainers have settled what was left: at most
// one record per ID, a confirmed pointer naming the group of every record
// away from its ID's partition, no move's claim, leaver or moving flag
// left, and each task found by its ID where its record is. Not parallel:
// it sets the package's clock slack.
//
// It runs only with TIDE_FREEID_STRESS=1: a load test whose faults show in
// a run now and then (each found so far has a test of its own that drives
// its steps by hand); loop it with -count.
func TestFreeIDMovesUnderLoad(t *testing.T) {
	if os.Getenv("TIDE_FREEID_STRESS") == "" {
		t.Skip("set TIDE_FREEID_STRESS=1 to run the load test of moves (loop it with -count)")
	}
	t.Run("Moves", func(t *testing.T) { movesUnderLoad(t, 0) })
	t.Run("AcrossARepartition", func(t *testing.T) { movesUnderLoad(t, 3) })
}

// movesUnderLoad runs TestFreeIDMovesUnderLoad on six partitions and,
// when to > 0, repartitions the queue to that many meanwhile.
func movesUnderLoad(t *testing.T, to int) {
	defer redisbroker.SetClockSlack(redisbroker.SetClockSlack(0))
	// Events show, for a failed run, what happened to each task where.
	e := setup(t, redisbroker.WithPartitions(6), redisbroker.WithReplayWindow(time.Second), redisbroker.WithEvents(true))
	ctx := context.Background()
	q := "movestress" + strconv.Itoa(to)
	ids := []string{"order-cancel:42", "order-cancel:43", "order-cancel:44", "dead:1", "dead:2", "slow:1"}
	groups := []string{"shop-7", "shop-8", "shop-9", "shop-10", freeIDIn("shop-", 6, 2), freeIDIn("shop-", 6, 0)}
	for i, id := range ids {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, id, groups[i%len(groups)]))
	}
	var wg sync.WaitGroup
	var moved, refused atomic.Int64
	stop := make(chan struct{})
	// What the clients did to each ID, and when (start and end), for a
	// failed run.
	var opsMu sync.Mutex
	ops := map[string][]string{}
	logOp := func(id string, began time.Time, what string, err error) {
		opsMu.Lock()
		defer opsMu.Unlock()
		ops[id] = append(ops[id], fmt.Sprintf("%s–%s %s %s: %v", began.Format("15:04:05.000"), time.Now().Format("15:04:05.000"), id, what, err))
	}
	for w := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 60 {
				m := freeMsg(q, ids[r.IntN(len(ids))], groups[r.IntN(len(groups))])
				began := time.Now()
				err := replaceOne(e.b, m)
				logOp(m.ID, began, fmt.Sprintf("client %d Replace into %s", w, m.Group), err)
				switch {
				case err == nil:
					moved.Add(1)
				case errors.Is(err, broker.ErrTaskIDConflict) || errors.Is(err, broker.ErrUnavailable):
					refused.Add(1)
				default:
					t.Errorf("Replace %s into %s: %v", m.ID, m.Group, err)
				}
			}
		})
	}
	var workers sync.WaitGroup
	if to > 0 {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := e.b.Repartition(rctx, q, to, nil); err != nil {
				left := dumpIDs(e.rdb, e.prefix, q, ids)
				t.Errorf("Repartition: %v; what holds the IDs:\n%s", err, strings.Join(left, "\n"))
			}
		})
	}
	workers.Go(func() {
		r := rand.New(rand.NewPCG(7, 1))
		for {
			select {
			case <-stop:
				return
			default:
			}
			// A lease lost to a layout change ends soon and the
			// maintainers recover its task, as servers do.
			if n, err := e.b.Partitions(ctx, q); err == nil {
				for p := range n {
					_, _ = e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: p, Owner: "test", OwnerTTL: time.Minute})
				}
			}
			ds, err := e.b.Dequeue(ctx, []string{q}, 2, 2*time.Second)
			if errors.Is(err, broker.ErrUnavailable) {
				continue // a repartition changed the layout: read again
			}
			if err != nil {
				t.Error(err)
				return
			}
			for _, d := range ds {
				logOp(d.Task.ID, time.Now(), "leased from "+d.Task.Group, nil)
				s := broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task}
				if r.IntN(2) == 0 {
					s.Kind, s.RetryAt = broker.SettleRetry, time.Now()
				}
				// A server settles again when a repartition changed the
				// layout under it.
				for try := 0; ; try++ {
					began := time.Now()
					errs, err := e.b.Settle(ctx, []broker.Settlement{s})
					if err == nil && errs[0] != nil {
						err = errs[0]
					}
					logOp(d.Task.ID, began, fmt.Sprintf("settle %v", s.Kind), err)
					if err == nil || errors.Is(err, broker.ErrLeaseLost) {
						break
					}
					if !errors.Is(err, broker.ErrUnavailable) || try == 20 {
						t.Errorf("Settle: %v", err)
						break
					}
				}
			}
			if id := ids[r.IntN(len(ids))]; r.IntN(4) == 0 {
				began := time.Now()
				err := e.b.Delete(ctx, q, id)
				logOp(id, began, "Delete", err)
				if err != nil && !errors.Is(err, broker.ErrTaskNotFound) && !errors.Is(err, broker.ErrTaskActive) && !errors.Is(err, broker.ErrUnavailable) {
					t.Errorf("Delete(%s): %v", id, err)
				}
			}
		}
	})
	wg.Wait()
	close(stop)
	workers.Wait()
	t.Logf("%d Replaces done, %d refused", moved.Load(), refused.Load())
	if moved.Load() == 0 {
		t.Fatal("no Replace went through")
	}
	if t.Failed() {
		t.FailNow()
	}
	n, ep := 6, 0
	if to > 0 {
		n, ep = to, 1
	}
	base := func(p int) string {
		if ep == 0 {
			return e.prefix + ":{" + q + ":" + strconv.Itoa(p) + "}:"
		}
		return e.prefix + ":{" + q + ":" + strconv.Itoa(p) + "@" + strconv.Itoa(ep) + "}:"
	}
	// Settle what is left: every maintainer, until no move is under way.
	pending := func() bool {
		for _, id := range ids {
			for _, p := range indexAt(t, e.rdb, e.prefix, q, n, ep, id).pointers {
				if !strings.Contains(p, ":k:") {
					return true
				}
			}
		}
		for p := range n {
			if n, err := e.rdb.HLen(ctx, base(p)+"xl").Result(); err != nil || n > 0 {
				return true
			}
		}
		return false
	}
	testwait.For(t, 20*time.Second, "the maintainers to settle the moves", func() bool {
		for p := range n {
			if _, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: p, Owner: "test", OwnerTTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		return !pending()
	})
	// A failed check shows what holds the IDs in every span.
	fail := func(format string, args ...any) {
		t.Helper()
		opsMu.Lock()
		var did []string
		for _, id := range ids {
			did = append(did, ops[id]...)
		}
		opsMu.Unlock()
		t.Fatalf(format+"; what holds the IDs:\n%s\nwhat the clients did:\n%s", append(args, strings.Join(dumpIDs(e.rdb, e.prefix, q, ids), "\n"), strings.Join(did, "\n"))...)
	}
	for _, id := range ids {
		ix := indexAt(t, e.rdb, e.prefix, q, n, ep, id)
		if len(ix.records) > 1 {
			fail("%s: records in %v", id, ix.records)
		}
		got, err := e.b.GetTask(ctx, q, id)
		if len(ix.records) == 0 {
			if !errors.Is(err, broker.ErrTaskNotFound) {
				fail("GetTask(%s) with no record: %+v, %v", id, got, err)
			}
			continue
		}
		if err != nil {
			fail("GetTask(%s): %v; records in %v, pointers %v", id, err, ix.records, ix.pointers)
		}
		rec, in := ix.records[0], broker.Partition(id, n)
		if rec != broker.Partition(storeKeyOf(got), n) {
			fail("%s of group %q has its record in %d", id, got.Group, rec)
		}
		if rec != in && !slices.Contains(ix.pointers, strconv.Itoa(in)+":k:"+got.Group) {
			fail("%s of group %q in %d: pointers %v", id, got.Group, rec, ix.pointers)
		}
		raw, err := e.rdb.HGet(ctx, base(rec)+"t", id).Bytes()
		if err != nil || raw[1]&64 != 0 {
			fail("%s: record flagged as moving (%v)", id, err)
		}
	}
	// Each runs once.
	ran := runOneByOne(t, e.b, q)
	seen := map[string]bool{}
	for _, id := range ran {
		if seen[id] {
			fail("%s ran twice: %v", id, ran)
		}
		seen[id] = true
	}
}

// storeKeyOf is what places t in its partition: its group, else its ID.
func storeKeyOf(t *tidetype.TaskInfo) string {
	if t.Group != "" {
		return t.Group
	}
	return t.ID
}

// A Wait for a task that Replace moves into a group of another partition
// follows it there and learns how the new task ended.
func TestFreeIDWaitFollowsAMove(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "movewait"
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
	done := make(chan error, 1)
	go func() {
		info, err := e.b.Wait(ctx, q, "order-cancel:42")
		if err == nil && info.State != tidetype.StateCompleted {
			err = errors.New("ended " + info.State.String())
		}
		done <- err
	}()
	// The waiter is registered in shop-7's partition before the move.
	testwait.For(t, 10*time.Second, "the waiter to register", func() bool {
		n, _ := e.rdb.HLen(ctx, e.prefix+":{"+q+":3}:wt").Result()
		return n == 1
	})
	m := freeMsg(q, "order-cancel:42", "shop-8")
	m.Payload = []byte("moved")
	if err := replaceOne(e.b, m); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	testwait.For(t, 10*time.Second, "the waiter to follow the task", func() bool {
		n, _ := e.rdb.HLen(ctx, e.prefix+":{"+q+":4}:wt").Result()
		return n == 1
	})
	if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{"order-cancel:42"}) {
		t.Fatalf("ran %v", ran)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait across the move: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not learn the moved task's end")
	}
}

// dumpIDs describes, for a failed run, every entry of queue q (all spans)
// that holds one of ids: records (state, group, moving), placeholders,
// pointers in full (state, nonce, time, groups), leavers, the active set,
// pointers' looks, a repartition's moving and reserved entries, and the
// events of the tasks (each stream in the order written).
func dumpIDs(rdb *redis.Client, prefix, q string, ids []string) []string {
	ctx := context.Background()
	keys, _ := rdb.Keys(ctx, prefix+":{"+q+":*").Result()
	slices.Sort(keys)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var out []string
	for _, k := range keys {
		typ, _ := rdb.Type(ctx, k).Result()
		switch typ {
		case "hash":
			m, _ := rdb.HGetAll(ctx, k).Result()
			for f, v := range m {
				if !want[f] {
					continue
				}
				out = append(out, fmt.Sprintf("%s[%s] = %s", k, f, describeEntry(q, f, v)))
			}
		case "stream":
			xs, _ := rdb.XRange(ctx, k, "-", "+").Result()
			for _, x := range xs {
				v, _ := x.Values["e"].(string)
				at, evs, err := redisbroker.DecodeEvents(v)
				if err != nil {
					out = append(out, fmt.Sprintf("%s %s: %v", k, x.ID, err))
				}
				for _, ev := range evs {
					if want[ev.TaskID] {
						out = append(out, fmt.Sprintf("%s %s %s %s at %s", k, x.ID, ev.TaskID, ev.Kind, at.Format("15:04:05.000")))
					}
				}
			}
		case "zset":
			zs, _ := rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
			for _, z := range zs {
				if m, _ := z.Member.(string); want[m] {
					out = append(out, fmt.Sprintf("%s %s @%.0f", k, m, z.Score))
				}
			}
		}
	}
	return out
}

// describeEntry reads a hash value of the free-ID index or a task record.
func describeEntry(q, id, v string) string {
	switch {
	case strings.HasPrefix(v, "\x00g") && len(v) >= 19:
		return fmt.Sprintf("pointer %s nonce %s at+groups %q", v[2:3], v[3:19], v[19:])
	case v == "\x00mv":
		return "placeholder"
	}
	if t, err := codec.DecodeHeader(q, id, []byte(v)); err == nil {
		return fmt.Sprintf("record state %v group %q moving %v", t.State, t.Group, codec.Moving([]byte(v)))
	}
	return fmt.Sprintf("%q", v[:min(len(v), 40)])
}

// A Replace into another group of the task's partition takes the place of
// the task's pointer with its claim (naming the new group). When its client
// dies before the store, or the store is refused while another enqueue of
// the ID repairs the claim, the task is still where it was, of its old
// group: the repair must point to that group again, not confirm the claim
// (a pointer naming a group the task is not in; run, or deleted, the task
// then leaves the index wrong for good).
func TestFreeIDRepairOfAClaimThatTookAPointersPlace(t *testing.T) {
	// Not parallel: it sets the package's hooks and clock slack.
	defer redisbroker.SetClockSlack(redisbroker.SetClockSlack(0))
	e := setup(t, redisbroker.WithPartitions(6), redisbroker.WithReplayWindow(time.Second))
	ctx := context.Background()
	const q = "swapdead"
	const id = "order-cancel:42" // in partition 2; shop-7 and shop-9 both in 3
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, id, "shop-7"))
	wantIndex(t, e, q, id, 3, "2:k:shop-7")
	died := errors.New("the client died")
	redisbroker.SetAfterClaim(func(string) error { return died })
	err := replaceOne(e.b, freeMsg(q, id, "shop-9"))
	redisbroker.SetAfterClaim(nil)
	if !errors.Is(err, died) {
		t.Fatalf("Replace into shop-9 dying after its claim: %v", err)
	}
	wantIndex(t, e, q, id, 3, "2:c:shop-9")
	// The maintainer of the ID's partition repairs the claim once it is
	// older than a store may be.
	testwait.For(t, 10*time.Second, "the maintainer to repair the claim", func() bool {
		if _, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: 2, Owner: "test", OwnerTTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		return !slices.ContainsFunc(indexOf(t, e.rdb, e.prefix, q, 6, id).pointers, func(p string) bool { return strings.Contains(p, ":c:") })
	})
	wantIndex(t, e, q, id, 3, "2:k:shop-7")
	if got, err := e.b.GetTask(ctx, q, id); err != nil || got.Group != "shop-7" {
		t.Fatalf("GetTask after the repair: %+v, %v", got, err)
	}
	// The claim is fenced: the store it was for never happens.
	m := freeMsg(q, id, "shop-9")
	m.Payload = []byte("moved")
	if err := replaceOne(e.b, m); err != nil {
		t.Fatalf("Replace into shop-9 after the repair: %v", err)
	}
	wantIndex(t, e, q, id, 3, "2:k:shop-9")
	if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{id}) {
		t.Fatalf("ran %v", ran)
	}
}

// A Replace into the task's own group takes the place of its pointer with
// its claim; before its store, another Replace of the ID meets the claim,
// repairs it and moves the task into a group of another partition. The
// first Replace's store must then be refused: stored after the move, it
// would leave a second task, one no pointer leads to (GetTask, Delete and
// Replace would not find it, and it would run besides the moved one).
func TestFreeIDClaimRepairedBeforeItsStore(t *testing.T) {
	// Not parallel: it sets the package's hooks.
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "claimrace"
	const id = "order-cancel:42" // in partition 2; shop-7 in 3, shop-8 in 4
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, id, "shop-7"))
	var once sync.Once
	var moveErr error
	redisbroker.SetAfterClaim(func(string) error {
		once.Do(func() {
			m := freeMsg(q, id, "shop-8")
			m.Payload = []byte("moved")
			moveErr = replaceOne(e.b, m)
		})
		return nil
	})
	t.Cleanup(func() { redisbroker.SetAfterClaim(nil) })
	err := replaceOne(e.b, freeMsg(q, id, "shop-7"))
	redisbroker.SetAfterClaim(nil)
	if moveErr != nil {
		t.Fatalf("Replace into shop-8 meeting the claim: %v", moveErr)
	}
	if !errors.Is(err, broker.ErrUnavailable) {
		t.Fatalf("the Replace whose claim was repaired and overtaken: %v, want ErrUnavailable (nothing stored)", err)
	}
	wantIndex(t, e, q, id, 4, "2:k:shop-8")
	if got, err := e.b.GetTask(ctx, q, id); err != nil || got.Group != "shop-8" || string(got.Payload) != "moved" {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}
	if ran := runOneByOne(t, e.b, q); !slices.Equal(ran, []string{id}) {
		t.Fatalf("ran %v", ran)
	}
}
