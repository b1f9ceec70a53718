package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// faulty is a broker on go-redis's default options but a short read
// timeout, talking to a private Redis through a fault-injection proxy; direct
// reads Redis without the proxy.
type faulty struct {
	proxy  *faultproxy.Proxy
	b      *redisbroker.Broker
	c      *tide.Client
	direct *redis.Client
	prefix string
}

func newFaulty(t *testing.T, opts ...redisbroker.Option) *faulty {
	t.Helper()
	srv := redistest.Start(t)
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	// go-redis's defaults but for the read timeout, so that a stall "longer
	// than the read timeout" takes a fraction of a second.
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	f := &faulty{proxy: p, direct: redistest.Client(t, srv.Addr), prefix: redistest.Prefix(t)}
	f.b = redisbroker.New(rdb, append([]redisbroker.Option{redisbroker.WithPrefix(f.prefix)}, opts...)...)
	t.Cleanup(func() { _ = f.b.Close() })
	f.c = tide.NewClient(f.b)
	// Load the scripts and the queue's layout, so that the faults below hit
	// the calls under test.
	ctx := context.Background()
	if _, err := f.c.Enqueue(ctx, tide.NewTask("warm", nil), tide.Queue("q")); err != nil {
		t.Fatal(err)
	}
	ds, err := f.b.Dequeue(ctx, []string{"q"}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	if errs, err := f.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone}}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	f.b.Extend(ctx, nil, time.Second)
	return f
}

// stored counts the task records of queue q.
func (f *faulty) stored(t *testing.T) int64 {
	t.Helper()
	n, err := f.direct.HLen(context.Background(), f.prefix+":{q:0}:t").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A script whose reply comes later than the client's read timeout is sent
// again by go-redis and Redis runs it twice. Every state change answers the
// second run like the first: one Enqueue stores one task and reports it
// stored (not a conflict with itself), with a chosen ID, a caller's ID or a
// unique key.
func TestResentEnqueueStoresOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		opts []tide.Option
	}{
		{"GeneratedID", nil},
		{"TaskID", []tide.Option{tide.TaskID("order-cancel:42")}},
		{"Unique", []tide.Option{tide.Unique(time.Hour)}},
		{"Scheduled", []tide.Option{tide.ProcessIn(time.Hour)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFaulty(t)
			f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
			info, err := f.c.Enqueue(context.Background(), tide.NewTask("t", []byte("p")), append(c.opts, tide.Queue("q"))...)
			if err != nil {
				t.Fatalf("Enqueue after a re-send: %v", err)
			}
			if f.proxy.Seen("EVALSHA") < 2 {
				t.Fatal("the enqueue was not sent again: the fault did not happen")
			}
			if n := f.stored(t); n != 1 {
				t.Fatalf("%d tasks stored by one Enqueue", n)
			}
			if _, err := f.b.GetTask(context.Background(), "q", info.ID); err != nil {
				t.Fatalf("the task Enqueue reported: %v", err)
			}
		})
	}
}

// A re-sent Enqueue whose first run met another task answers like the
// first run, a conflict: the reply cache entry a request claims first (with
// the reply it expects, stored) is written over with the conflict.
func TestResentEnqueueConflictAnswersConflict(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	opts := []tide.Option{tide.TaskID("order-cancel:44"), tide.Queue("q")}
	if _, err := f.c.Enqueue(ctx, tide.NewTask("t", []byte("p")), opts...); err != nil {
		t.Fatal(err)
	}
	seen := f.proxy.Seen("EVALSHA")
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	_, err := f.c.Enqueue(ctx, tide.NewTask("t", []byte("p")), opts...)
	if f.proxy.Seen("EVALSHA") < seen+2 {
		t.Fatal("the enqueue was not sent again: the fault did not happen")
	}
	if !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("a re-sent Enqueue of a taken ID: %v, want ErrTaskIDConflict", err)
	}
	if n := f.stored(t); n != 1 {
		t.Fatalf("%d tasks stored", n)
	}
}

// A single Enqueue sent three times (two replies dropped) answers each
// time like its first run: its reply slot keeps the first run's reply
// when a later run claims the slot again, so a conflict stays a conflict
// and a stored task is stored once.
func TestResentEnqueueTwiceAnswersTheFirstReply(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		opts     []tide.Option
		conflict bool
	}{
		{"Conflict", []tide.Option{tide.TaskID("order-cancel:45")}, true},
		{"GeneratedID", nil, false},
		{"TaskID", []tide.Option{tide.TaskID("order-cancel:46")}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFaulty(t)
			ctx := context.Background()
			opts := append(c.opts, tide.Queue("q"))
			if c.conflict {
				if _, err := f.c.Enqueue(ctx, tide.NewTask("t", []byte("p")), opts...); err != nil {
					t.Fatal(err)
				}
			}
			seen := f.proxy.Seen("EVALSHA")
			f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 2)
			_, err := f.c.Enqueue(ctx, tide.NewTask("t", []byte("p")), opts...)
			if f.proxy.Seen("EVALSHA") < seen+3 {
				t.Fatal("the enqueue was not sent three times: the fault did not happen")
			}
			if c.conflict && !errors.Is(err, tide.ErrTaskIDConflict) {
				t.Fatalf("an Enqueue of a taken ID sent three times: %v, want ErrTaskIDConflict", err)
			}
			if !c.conflict && err != nil {
				t.Fatalf("Enqueue sent three times: %v", err)
			}
			if n := f.stored(t); n != 1 {
				t.Fatalf("%d tasks stored", n)
			}
		})
	}
}

// A re-sent Enqueue that arrives after its task already ran and was deleted
// (a server was quicker than the client's read timeout) must not store the
// task again: the reply cache, not the task's record, remembers the request.
func TestResentEnqueueAfterTheTaskEnded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		opts []tide.Option
	}{
		{"GeneratedID", nil},
		{"TaskID", []tide.Option{tide.TaskID("order-cancel:43")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFaulty(t)
			ctx := context.Background()
			// A worker that talks to Redis directly, beside the proxy.
			worker := redisbroker.New(f.direct, redisbroker.WithPrefix(f.prefix))
			t.Cleanup(func() { _ = worker.Close() })
			f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), time.Second, 1)
			type result struct {
				info *tide.TaskInfo
				err  error
			}
			done := make(chan result, 1)
			go func() {
				info, err := f.c.Enqueue(ctx, tide.NewTask("t", []byte("p")), append(c.opts, tide.Queue("q"))...)
				done <- result{info, err}
			}()
			// The first run stored the task; its reply is held. Run the
			// task to its end (no retention: the record goes) before the
			// client's read timeout sends the call again.
			var ran string
			testwait.For(t, 10*time.Second, "the task to appear", func() bool {
				ds, err := worker.Dequeue(ctx, []string{"q"}, 1, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if len(ds) == 0 {
					return false
				}
				if errs, err := worker.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone}}); err != nil || errs[0] != nil {
					t.Fatal(errs, err)
				}
				ran = ds[0].Task.ID
				return true
			})
			r := <-done
			if r.err != nil {
				t.Fatalf("Enqueue after a re-send: %v", r.err)
			}
			if f.proxy.Seen("EVALSHA") < 2 {
				t.Fatal("the enqueue was not sent again: the fault did not happen")
			}
			if r.info.ID != ran {
				t.Fatalf("Enqueue reported task %q, the worker ran %q", r.info.ID, ran)
			}
			if n := f.stored(t); n != 0 {
				t.Fatalf("%d tasks stored after the only one ran: the re-send stored it again", n)
			}
		})
	}
}

// A re-sent Dequeue returns the tasks its first run leased instead of
// leasing more to nobody: with MaxRetry(0) the task still runs, once.
func TestResentDequeueLeasesToNobody(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	var ids []string
	for range 6 {
		info, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"), tide.MaxRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	ds, err := f.b.Dequeue(ctx, []string{"q"}, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if f.proxy.Seen("EVALSHA") < 2 {
		t.Fatal("the dequeue was not sent again")
	}
	if len(ds) != 5 {
		t.Fatalf("a re-sent Dequeue(5) returned %d tasks", len(ds))
	}
	for i, d := range ds {
		if d.Task.ID != ids[i] {
			t.Errorf("task %d of the re-sent Dequeue is %s, want %s (the oldest first, as the first run leased them)", i, d.Task.ID, ids[i])
		}
	}
	active, err := f.direct.ZCard(ctx, f.prefix+":{q:0}:active").Result()
	if err != nil || active != 5 {
		t.Fatalf("%d tasks leased, want the 5 returned (%v)", active, err)
	}
	rest, err := f.b.Dequeue(ctx, []string{"q"}, 10, time.Minute)
	if err != nil || len(rest) != 1 {
		t.Fatalf("the sixth task: %v, %v", rest, err)
	}
	// Their leases hold: each is settled with the token it was handed.
	for _, d := range ds {
		if errs, err := f.b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone}}); err != nil || errs[0] != nil {
			t.Fatalf("settling %s: %v %v", d.Task.ID, errs, err)
		}
	}
}

// A re-sent dequeue finds the tasks its first run leased by their lease
// expiry and their tokens, so another server's task whose lease ends in the
// same millisecond (the same LeaseDuration, dequeued at the same instant)
// is not handed out a second time.
func TestResentDequeueLeavesAnotherLeaseAtTheSameExpiry(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	var ids []string
	for range 4 {
		info, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	other := redisbroker.New(f.direct, redisbroker.WithPrefix(f.prefix))
	t.Cleanup(func() { _ = other.Close() })
	theirs, err := other.Dequeue(ctx, []string{"q"}, 1, time.Minute)
	if err != nil || len(theirs) != 1 || theirs[0].Task.ID != ids[0] {
		t.Fatalf("the other server's dequeue: %v, %v", theirs, err)
	}
	// Between the first run and go-redis's re-send, the other server's
	// lease is made to end in the same millisecond as the first run's.
	active := f.prefix + ":{q:0}:active"
	moved := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			zs, err := f.direct.ZRangeWithScores(ctx, active, 0, -1).Result()
			if err != nil {
				moved <- err
				return
			}
			for _, z := range zs {
				if z.Member == ids[1] {
					moved <- f.direct.ZAdd(ctx, active, redis.Z{Score: z.Score, Member: ids[0]}).Err()
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
		moved <- errors.New("the first run leased nothing within 5s")
	}()
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	ds, err := f.b.Dequeue(ctx, []string{"q"}, 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	if f.proxy.Seen("EVALSHA") < 2 {
		t.Fatal("the dequeue was not sent again")
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.Task.ID)
	}
	if len(got) != 2 || got[0] != ids[1] || got[1] != ids[2] {
		t.Fatalf("the re-sent Dequeue(2) returned %v, want [%s %s] (not the other server's %s)", got, ids[1], ids[2], ids[0])
	}
}

// Settle, Delete and Cancel run twice answer like the first run: a
// settlement is applied (not "lease lost"), a deletion succeeded (not "not
// found").
func TestResentChangesAnswerLikeTheFirstRun(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	info, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := f.b.Dequeue(ctx, []string{"q"}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatal(ds, err)
	}
	seen := f.proxy.Seen("EVALSHA")
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	errs, err := f.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleRetry, RetryAt: time.Now().Add(time.Hour), Err: "boom"}})
	if err != nil || errs[0] != nil {
		t.Fatalf("a re-sent settlement: %v %v", errs, err)
	}
	if f.proxy.Seen("EVALSHA") < seen+2 {
		t.Fatal("the settlement was not sent again")
	}
	if got, _ := f.b.GetTask(ctx, "q", info.ID); got.State != tidetype.StateRetry || got.Retried != 1 {
		t.Fatalf("after a re-sent retry: %+v (retried once, not twice)", got)
	}
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	if err := f.c.Delete(ctx, "q", info.ID); err != nil {
		t.Fatalf("a re-sent Delete: %v", err)
	}
	info2, _ := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"), tide.ProcessIn(time.Hour))
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	if err := f.c.Cancel(ctx, "q", info2.ID); err != nil {
		t.Fatalf("a re-sent Cancel: %v", err)
	}
}

// A bulk action run twice (its reply came after the read timeout) answers
// like the first run: how many tasks it handled, not what the second run
// found left (none).
func TestResentBulkActionCountsWhatItDid(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	// Load the admin script: a first EVALSHA would fall back to EVAL.
	if _, err := f.b.RunTasks(ctx, "q", tidetype.StateRetry, 1); err != nil {
		t.Fatal(err)
	}
	for _, op := range []struct {
		name string
		do   func(context.Context, string, tidetype.TaskState, int) (int, error)
	}{{"DeleteTasks", f.b.DeleteTasks}, {"ArchiveTasks", f.b.ArchiveTasks}, {"RunTasks", f.b.RunTasks}} {
		for range 5 {
			if _, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"), tide.ProcessIn(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		seen := f.proxy.Seen("EVALSHA")
		f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
		n, err := op.do(ctx, "q", tidetype.StateScheduled, 100)
		if f.proxy.Seen("EVALSHA") < seen+2 {
			t.Fatalf("%s was not sent again", op.name)
		}
		if err != nil || n != 5 {
			t.Errorf("a re-sent %s: %d, %v; want 5 (the first run's answer)", op.name, n, err)
		}
		// Clear the queue for the next action.
		for _, st := range []tidetype.TaskState{tidetype.StateScheduled, tidetype.StatePending, tidetype.StateArchived} {
			if _, err := f.b.DeleteTasks(ctx, "q", st, 100); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A request whose replies never come reports that its outcome is unknown,
// with the task's ID, instead of guessing; sent again with that ID it is
// recognised as stored.
func TestUnknownOutcomeIsReported(t *testing.T) {
	t.Parallel()
	f := newFaulty(t, redisbroker.WithReplayWindow(3*time.Second))
	ctx := context.Background()
	f.proxy.DropReplies(faultproxy.Commands("EVALSHA", "EVAL"), 0)
	info, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"))
	f.proxy.Clear()
	if !errors.Is(err, tide.ErrOutcomeUnknown) || !errors.Is(err, tide.ErrUnavailable) || info == nil || info.ID == "" {
		t.Fatalf("Enqueue whose replies are all lost: %v, %+v; want ErrOutcomeUnknown with the task's info", info, err)
	}
	if n := f.stored(t); n != 1 {
		t.Fatalf("%d tasks stored, want 1 (the requests ran, their replies were lost)", n)
	}
	if _, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID(info.ID)); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("enqueue again with the reported ID: %v, want ErrTaskIDConflict (it is stored)", err)
	}
	if n := f.stored(t); n != 1 {
		t.Fatalf("%d tasks stored after the retry", n)
	}
}

// An Enqueue that waits for replicas longer than the client's read timeout
// does not have its whole pipeline sent again: the task is stored once and
// the missing confirmation is reported.
func TestLongReplicaWaitStoresOnce(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(primary.Addr)
	replica := redistest.Start(t, "--replicaof", host, port)
	direct := redistest.Client(t, primary.Addr)
	rr := redistest.Client(t, replica.Addr)
	testwait.For(t, 20*time.Second, "the replica to sync", func() bool {
		return strings.Contains(rr.Info(context.Background(), "replication").Val(), "master_link_status:up")
	})
	rdb := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := redistest.Prefix(t)
	c := tide.NewClient(redisbroker.New(rdb, redisbroker.WithPrefix(prefix)))
	// Two replicas asked for, one exists: WAIT runs for its whole second.
	info, err := c.Enqueue(context.Background(), tide.NewTask("t", nil), tide.Queue("q"), tide.WaitForReplicas(2, time.Second))
	if !errors.Is(err, tide.ErrNotReplicated) || info == nil {
		t.Fatalf("Enqueue waiting for a missing replica: %v, %v", info, err)
	}
	if n := direct.HLen(context.Background(), prefix+":{q:0}:t").Val(); n != 1 {
		t.Fatalf("%d tasks stored by one Enqueue", n)
	}
}

// Dequeue and Settle of grouped tasks sent twice (their replies came later
// than the read timeout) count the group's running task once: with
// GroupConcurrency 1 the group's second task starts only after the first
// settled, and its third only after the second.
func TestResentGroupedCallsCountOnce(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	if err := f.b.SetQueueLimits(ctx, "g", tidetype.QueueLimits{GroupConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := f.c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("g"), tide.Group("acme")); err != nil {
			t.Fatal(err)
		}
	}
	dequeue := func(resent bool) []*broker.Delivery {
		t.Helper()
		seen := f.proxy.Seen("EVALSHA")
		if resent {
			f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
		}
		ds, err := f.b.Dequeue(ctx, []string{"g"}, 5, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if resent && f.proxy.Seen("EVALSHA") < seen+2 {
			t.Fatal("the dequeue was not sent again")
		}
		return ds
	}
	for round := range 3 {
		ds := dequeue(true)
		if len(ds) != 1 {
			t.Fatalf("round %d: a re-sent dequeue leased %d tasks of a group limited to 1", round, len(ds))
		}
		if more := dequeue(false); len(more) != 0 {
			t.Fatalf("round %d: %d more tasks started while the group's one runs", round, len(more))
		}
		f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
		errs, err := f.b.Settle(ctx, []broker.Settlement{{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task}})
		if err != nil || errs[0] != nil {
			t.Fatalf("round %d: a re-sent settlement: %v %v", round, errs, err)
		}
	}
	gs, err := f.b.Groups(ctx, "g", 10)
	if err != nil || len(gs) != 0 {
		t.Fatalf("Groups after every task settled: %+v, %v; want none (no running count left over)", gs, err)
	}
}

// Every reply cache expires, also when plain enqueues leave setting the
// expiry to the first call of each cache, and also when a cache is deleted
// under a process that had seen its expiry set.
func TestReplyCachesExpire(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	prefix := redistest.Prefix(t)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix), redisbroker.WithReplayWindow(time.Second))
	t.Cleanup(func() { _ = b.Close() })
	c := tide.NewClient(b)
	ctx := context.Background()
	caches := func() []string {
		keys, err := rdb.Keys(ctx, prefix+":{q:0}:r[qs]:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	noForever := func(when string) {
		t.Helper()
		for _, k := range caches() {
			if ttl, err := rdb.Do(ctx, "PTTL", k).Int64(); err != nil || ttl == -1 {
				t.Fatalf("%s: reply cache %s has no expiry (PTTL %d, %v)", when, k, ttl, err)
			}
		}
	}
	enqueue := func(n int) {
		t.Helper()
		for range n {
			if _, err := c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q")); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Several slices of the 1s window (a slice is a second at least).
	for deadline := time.Now().Add(2500 * time.Millisecond); time.Now().Before(deadline); {
		enqueue(20)
		noForever("while enqueueing")
	}
	// A cache deleted under the process: a later call sets its expiry again
	// (the last of its fifty, or one in 64 before). A cache deleted in the
	// middle of its fifty and left before the fifty's end, when its slice of
	// the window ends, keeps no expiry unless one of the 64 comes; so the
	// deletion comes at the start of a slice (a second here), which the
	// rest of the fifty does not outlast.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
	for _, k := range caches() {
		rdb.Del(ctx, k)
	}
	enqueue(2000)
	noForever("after the cache was deleted")
	// All of them go within the window and a slice.
	testwait.Until(t, 10*time.Second, func() error {
		if c := caches(); len(c) > 0 {
			return fmt.Errorf("reply caches still there after the last call: %v", c)
		}
		return nil
	})
}

// Reply caches stay small: each holds the replies of at most fifty
// requests of one process, short enough that Redis keeps it as a compact
// list (a third of the memory of a larger hash), also for dequeues and
// settlements of many tasks and enqueues of many.
func TestReplyCachesStayCompact(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rdb, prefix, b := e.rdb, e.prefix, e.b
	c := tide.NewClient(b)
	ctx := context.Background()
	for range 350 {
		if _, err := c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q")); err != nil {
			t.Fatal(err)
		}
	}
	many := make([]*tide.Task, 200)
	for i := range many {
		many[i] = tide.NewTask("t", nil)
	}
	if _, err := c.EnqueueMany(ctx, many, tide.Queue("q")); err != nil {
		t.Fatal(err)
	}
	for {
		ds, err := b.Dequeue(ctx, []string{"q"}, 50, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break
		}
		ss := make([]broker.Settlement, len(ds))
		for i, d := range ds {
			ss[i] = broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone}
		}
		if errs, err := b.Settle(ctx, ss); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
	}
	keys, err := rdb.Keys(ctx, prefix+":{q:0}:rq:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("no reply caches: %v", err)
	}
	entries := 0
	for _, k := range keys {
		n, err := rdb.HLen(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		entries += int(n)
		if n > 50 {
			t.Errorf("reply cache %s holds %d replies, want at most 50", k, n)
		}
		if enc, err := rdb.ObjectEncoding(ctx, k).Result(); err != nil || enc != "listpack" {
			t.Errorf("reply cache %s (%d replies) is encoded as %q, want listpack (%v)", k, n, enc, err)
		}
	}
	// The single enqueues' reply slots: a byte a request, fifty at most
	// a key.
	slots, err := rdb.Keys(ctx, prefix+":{q:0}:rs:*").Result()
	if err != nil || len(slots) == 0 {
		t.Fatalf("no reply slots: %v", err)
	}
	for _, k := range slots {
		v, err := rdb.Get(ctx, k).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if len(v) > 50 {
			t.Errorf("reply slots %s hold %d bytes, want at most 50", k, len(v))
		}
		for _, b := range v {
			if b != 0 {
				entries++
			}
		}
	}
	// 350 + 1 enqueues, 11 dequeues that leased, 11 settlements.
	if entries < 373 {
		t.Errorf("%d replies kept, want one a request (373 at least)", entries)
	}
}
