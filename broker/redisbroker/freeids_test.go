package redisbroker_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// freeMsg is a task of group g with the ID id as given (no tag added).
func freeMsg(q, id, g string) *tidetype.TaskInfo {
	m := groupMsg(q, id, "")
	m.Group = g
	return m
}

// taskIndex tells, for queue q of n partitions under prefix, the task
// records and the pointers (state byte and group) each partition holds
// for id.
type taskIndex struct {
	records  []int    // partitions holding a task record for id
	pointers []string // "<partition>:<state>:<group>"
}

func indexOf(t *testing.T, rdb *redis.Client, prefix, q string, n int, id string) taskIndex {
	t.Helper()
	var ix taskIndex
	for p := range n {
		v, err := rdb.HGet(context.Background(), prefix+":{"+q+":"+strconv.Itoa(p)+"}:t", id).Result()
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

// The IDs and groups below are chosen so that on six partitions an ID's
// partition is not its group's: order-cancel:42 is in partition 2,
// shop-7's tasks in 3, shop-8's in 4.
func TestFreeIDPartitionsOfTheTests(t *testing.T) {
	for _, c := range []struct {
		key  string
		want int
	}{{"order-cancel:42", 2}, {"shop-7", 3}, {"shop-8", 4}, {"dead:1", 0}, {"dead:2", 1}, {"slow:1", 1}} {
		if got := broker.Partition(c.key, 6); got != c.want {
			t.Fatalf("Partition(%q, 6) = %d, want %d", c.key, got, c.want)
		}
	}
}

// An enqueue of a grouped task with a free ID on six partitions is three
// calls (claim, store, confirm); each re-sent after a lost reply answers
// like its first run: one task, one confirmed pointer, found by its ID.
func TestResentFreeIDEnqueueStoresOnce(t *testing.T) {
	t.Parallel()
	files := redisbroker.ScriptFiles()
	sha := map[string]string{}
	for s, f := range files {
		sha[f] = s
	}
	for _, c := range []struct {
		name string
		file string
		n    int
	}{{"ClaimAndConfirm", "ids.lua", 2}, {"Store", "enqueue.lua", 1}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFaulty(t, redisbroker.WithPartitions(6))
			ctx := context.Background()
			// Load the scripts, so that the faults hit runs of them.
			mustEnqueue(t, f.b, broker.EnqueueOptions{}, freeMsg("q6", "warm", "shop-7"))
			before := f.proxy.Seen("EVALSHA")
			f.proxy.DelayReplies(faultproxy.Commands("EVALSHA").WithFirstArg(sha[c.file]), 500*time.Millisecond, c.n)
			mustEnqueue(t, f.b, broker.EnqueueOptions{}, freeMsg("q6", "order-cancel:42", "shop-7"))
			if sent := f.proxy.Seen("EVALSHA") - before; sent < 3+int64(c.n) {
				t.Fatalf("%d calls for claim, store and confirm: the fault did not happen", sent)
			}
			ix := indexOf(t, f.direct, f.prefix, "q6", 6, "order-cancel:42")
			if len(ix.records) != 1 || ix.records[0] != 3 || len(ix.pointers) != 1 || ix.pointers[0] != "2:k:shop-7" {
				t.Fatalf("records in partitions %v, pointers %v; want one record in 3 and a confirmed pointer in 2", ix.records, ix.pointers)
			}
			if got, err := f.b.GetTask(ctx, "q6", "order-cancel:42"); err != nil || got.Group != "shop-7" {
				t.Fatalf("GetTask: %+v, %v", got, err)
			}
		})
	}
}

// A client that dies between its claim and its store leaves a claim and
// no task. The next enqueue of the ID, in any group, fences the claim and
// takes the ID; a claim nobody comes back for is released by the
// maintainer of its partition once it is older than a store may be.
func TestFreeIDClaimOfADeadClient(t *testing.T) {
	// Not parallel: it sets the package's hooks.
	defer redisbroker.SetClockSlack(redisbroker.SetClockSlack(0))
	e := setup(t, redisbroker.WithPartitions(6), redisbroker.WithReplayWindow(time.Second))
	ctx := context.Background()
	const q = "dead"
	died := errors.New("the client died")
	var dying atomic.Int32
	dying.Store(2)
	redisbroker.SetAfterClaim(func(id string) error {
		if strings.HasPrefix(id, "dead:") && dying.Add(-1) >= 0 {
			return died
		}
		return nil
	})
	defer redisbroker.SetAfterClaim(nil)
	for _, id := range []string{"dead:1", "dead:2"} {
		if errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{freeMsg(q, id, "shop-7")}, broker.EnqueueOptions{}); err != nil || !errors.Is(errs[0], died) {
			t.Fatalf("Enqueue(%s) dying after its claim: %v, %v", id, errs, err)
		}
		if _, err := e.b.GetTask(ctx, q, id); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("GetTask(%s) of a claim without its task: %v, want ErrTaskNotFound", id, err)
		}
		if ix := indexOf(t, e.rdb, e.prefix, q, 6, id); len(ix.records) != 0 || len(ix.pointers) != 1 || !strings.Contains(ix.pointers[0], ":c:shop-7") {
			t.Fatalf("%s after the dead client: records %v, pointers %v; want one claim", id, ix.records, ix.pointers)
		}
	}
	// dead:1 again, in another group: the dead claim is no conflict.
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "dead:1", "shop-8"))
	if got, err := e.b.GetTask(ctx, q, "dead:1"); err != nil || got.Group != "shop-8" {
		t.Fatalf("GetTask(dead:1) enqueued over a dead claim: %+v, %v", got, err)
	}
	if ix := indexOf(t, e.rdb, e.prefix, q, 6, "dead:1"); len(ix.records) != 1 || ix.records[0] != 4 || len(ix.pointers) != 1 || ix.pointers[0] != "0:k:shop-8" {
		t.Fatalf("dead:1: records %v, pointers %v", ix.records, ix.pointers)
	}
	// dead:2 nobody enqueues again: the maintainer of partition 1 repairs
	// its claim once it is older than the replay window.
	testwait.For(t, 10*time.Second, "the maintainer to release the dead claim", func() bool {
		if _, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: 1, Owner: "test", OwnerTTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		return len(indexOf(t, e.rdb, e.prefix, q, 6, "dead:2").pointers) == 0
	})
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, "dead:2", ""))
	if got, err := e.b.GetTask(ctx, q, "dead:2"); err != nil || got.Group != "" {
		t.Fatalf("GetTask(dead:2) enqueued without a group after the repair: %+v, %v", got, err)
	}
}

// A store that comes after its claim was fenced (here: a client paused
// between claim and store while another enqueue took the ID) stores
// nothing and says so; the task that took the ID stays the only one.
func TestFreeIDSlowStoreIsFenced(t *testing.T) {
	// Not parallel: it sets the package's hooks.
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "slow"
	paused, resume := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	redisbroker.SetAfterClaim(func(id string) error {
		if id == "slow:1" && once.CompareAndSwap(false, true) {
			close(paused)
			<-resume
		}
		return nil
	})
	defer redisbroker.SetAfterClaim(nil)
	done := make(chan error, 1)
	go func() {
		errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{freeMsg(q, "slow:1", "shop-7")}, broker.EnqueueOptions{})
		if err == nil {
			err = errs[0]
		}
		done <- err
	}()
	select {
	case <-paused:
	case err := <-done:
		t.Fatalf("the enqueue ended before its store: %v", err)
	}
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "slow:1", "shop-8"))
	close(resume)
	if err := <-done; !errors.Is(err, broker.ErrUnavailable) || errors.Is(err, broker.ErrOutcomeUnknown) {
		t.Fatalf("the fenced enqueue: %v, want ErrUnavailable (nothing stored)", err)
	}
	if got, err := e.b.GetTask(ctx, q, "slow:1"); err != nil || got.Group != "shop-8" {
		t.Fatalf("GetTask: %+v, %v; want the task of shop-8", got, err)
	}
	if ix := indexOf(t, e.rdb, e.prefix, q, 6, "slow:1"); len(ix.records) != 1 || ix.records[0] != 4 || len(ix.pointers) != 1 || ix.pointers[0] != "1:k:shop-8" {
		t.Fatalf("records %v, pointers %v", ix.records, ix.pointers)
	}
}

// A task with a free ID that ends in its group's partition leaves its
// pointer behind; the pointer leads nowhere (not found), gives way to a
// new task with the ID, and the maintainer of its partition drops it. A
// pointer to a task that is still there stays.
func TestFreeIDPointersOfEndedTasksGo(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "ends"
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"), freeMsg(q, "dead:2", "shop-8"))
	ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %v, %v", ds, err)
	}
	done := ds[0].Task.ID
	if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil || errs[0] != nil {
		t.Fatalf("Settle: %v %v", errs, err)
	}
	kept := map[string]string{"order-cancel:42": "dead:2", "dead:2": "order-cancel:42"}[done]
	if _, err := e.b.GetTask(ctx, q, done); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("GetTask(%s) after it succeeded: %v", done, err)
	}
	if ix := indexOf(t, e.rdb, e.prefix, q, 6, done); len(ix.pointers) != 1 {
		t.Fatalf("pointers of %s right after it ended: %v, want the one left behind", done, ix.pointers)
	}
	// The maintainer looks at pointers when they are due: make them due now.
	for p := range 6 {
		k := e.prefix + ":{" + q + ":" + strconv.Itoa(p) + "}:x"
		for _, id := range []string{done, kept} {
			if err := e.rdb.ZAddXX(ctx, k, redis.Z{Score: 0, Member: id}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for p := range 6 {
		if _, err := e.b.Maintain(ctx, broker.MaintainRequest{Queue: q, Partition: p, Owner: "test", OwnerTTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if ix := indexOf(t, e.rdb, e.prefix, q, 6, done); len(ix.pointers) != 0 {
		t.Fatalf("pointers of %s after the sweep: %v, want none", done, ix.pointers)
	}
	if ix := indexOf(t, e.rdb, e.prefix, q, 6, kept); len(ix.pointers) != 1 || len(ix.records) != 1 {
		t.Fatalf("%s, still waiting, after the sweep: records %v, pointers %v", kept, ix.records, ix.pointers)
	}
	if got, err := e.b.GetTask(ctx, q, kept); err != nil || got.ID != kept {
		t.Fatalf("GetTask(%s): %+v, %v", kept, got, err)
	}
}

// An empty queue whose tasks with free IDs ended (their pointers left
// behind) is deleted; one that holds such a task is not empty.
func TestFreeIDDeleteQueue(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "delq"
	mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, "order-cancel:42", "shop-7"))
	if err := e.b.DeleteQueue(ctx, q); !errors.Is(err, broker.ErrQueueNotEmpty) {
		t.Fatalf("DeleteQueue holding a task: %v, want ErrQueueNotEmpty", err)
	}
	ds, err := e.b.Dequeue(ctx, []string{q}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue: %v, %v", ds, err)
	}
	if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil || errs[0] != nil {
		t.Fatalf("Settle: %v %v", errs, err)
	}
	if err := e.b.DeleteQueue(ctx, q); err != nil {
		t.Fatalf("DeleteQueue once its task ended: %v", err)
	}
	keys, err := e.rdb.Keys(ctx, e.prefix+":{"+q+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !strings.Contains(k, "}:rq:") && !strings.Contains(k, "}:rs:") { // reply caches and slots expire on their own
			t.Fatalf("key left: %s", k)
		}
	}
}

// A Delete whose lookup found nothing in the ID's partition, where an
// enqueue of the ID then wrote its pointer, follows the pointer to the task
// instead of taking it for a record there: the task is deleted, and no
// record is left without its pointer. Not parallel: it sets a hook.
func TestFreeIDDeleteMeetsAPointerWrittenAfterItsLookup(t *testing.T) {
	e := setup(t, redisbroker.WithPartitions(6))
	ctx := context.Background()
	const q = "deleteptr"
	// order-cancel:42 is in partition 2, shop-7 in 3.
	once := true
	redisbroker.SetAfterLookup(func(id string) {
		if once {
			once = false
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, freeMsg(q, id, "shop-7"))
		}
	})
	defer redisbroker.SetAfterLookup(nil)
	if err := e.b.Delete(ctx, q, "order-cancel:42"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if ix := indexOf(t, e.rdb, e.prefix, q, 6, "order-cancel:42"); len(ix.records) != 0 {
		t.Fatalf("after Delete: records in %v, pointers %v", ix.records, ix.pointers)
	}
	if _, err := e.b.GetTask(ctx, q, "order-cancel:42"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("GetTask after Delete: %v", err)
	}
}
