package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// ran reports whether calls recorded a run of the script file.
func (s *bindingCalls) ran(file string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen[file]) > 0
}

// plainEnv is a broker whose calls are recorded, with one partition per
// queue.
func plainEnv(t *testing.T, opts ...redisbroker.Option) (env, *bindingCalls) {
	t.Helper()
	e := setup(t, opts...)
	calls := newBindingCalls()
	e.rdb.AddHook(calls)
	return e, calls
}

func lease1(t *testing.T, b *redisbroker.Broker) *broker.Delivery {
	t.Helper()
	ds, err := b.Dequeue(context.Background(), []string{"q"}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("dequeue: %v, %v", ds, err)
	}
	return ds[0]
}

func done(d *broker.Delivery) broker.Settlement {
	return broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task, At: time.Now()}
}

// The plain lease and settle scripts fence as the general ones do: a
// settlement with the token of an earlier lease of the task is refused and
// changes nothing; the current lease's settlement deletes the task.
func TestPlainSettleRefusesAStaleToken(t *testing.T) {
	t.Parallel()
	e, calls := plainEnv(t)
	ctx := context.Background()
	if _, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("a")}, broker.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	d1 := lease1(t, e.b)
	if errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: d1.Lease(), Kind: broker.SettleRequeue}}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	d2 := lease1(t, e.b)
	if d2.Token == d1.Token {
		t.Fatalf("the second lease has the first one's token %d", d1.Token)
	}
	errs, err := e.b.Settle(ctx, []broker.Settlement{done(d1)})
	if err != nil || !errors.Is(errs[0], broker.ErrLeaseLost) {
		t.Fatalf("settling with the first lease's token: %v, %v (want ErrLeaseLost)", errs, err)
	}
	if got, err := e.b.GetTask(ctx, "q", "a"); err != nil || got.State != tidetype.StateActive {
		t.Fatalf("after a stale settlement: %+v, %v (want it active, under the second lease)", got, err)
	}
	if errs, err := e.b.Settle(ctx, []broker.Settlement{done(d2)}); err != nil || errs[0] != nil {
		t.Fatalf("settling with the current token: %v, %v", errs, err)
	}
	if _, err := e.b.GetTask(ctx, "q", "a"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("after its settlement: %v (want it deleted)", err)
	}
	if !calls.ran("dequeue_plain.lua") || !calls.ran("settle_plain.lua") {
		t.Fatal("the plain scripts did not run")
	}
}

// What the plain settle script cannot do, settle.lua does: a task whose
// record holds a unique key or a follower, or one someone waits for, is
// settled by it even when the settlement's copy of the task says nothing of
// that. A task settled twice in one call is settled once; its progress goes
// with it.
func TestPlainSettleLeavesTheRestToSettleLua(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("UniqueKey", func(t *testing.T) {
		t.Parallel()
		e, _ := plainEnv(t)
		m := pendingTask("u1")
		m.UniqueKey, m.UniqueTTL = "key", time.Hour
		if errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
		d := lease1(t, e.b)
		s := done(d)
		plain := *d.Task
		plain.UniqueKey = ""
		s.Task = &plain
		if errs, err := e.b.Settle(ctx, []broker.Settlement{s}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
		again := pendingTask("u2")
		again.UniqueKey, again.UniqueTTL = "key", time.Hour
		if errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{again}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
			t.Fatalf("the unique key after its task was done: %v, %v (the lock was not released)", errs, err)
		}
	})
	t.Run("Followed", func(t *testing.T) {
		t.Parallel()
		e, _ := plainEnv(t)
		m := pendingTask("n1")
		m.Headers = map[string]string{broker.NotifyHeader: "https://h.example/x"}
		if errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
		d := lease1(t, e.b)
		s := done(d)
		plain := *d.Task
		plain.Headers = nil
		s.Task = &plain
		if errs, err := e.b.Settle(ctx, []broker.Settlement{s}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
		ids, err := e.rdb.HKeys(ctx, e.prefix+":{q:0}:t").Result()
		if err != nil || len(ids) != 1 || !strings.HasPrefix(ids[0], "tide:f") {
			t.Fatalf("records after a followed task ended: %v, %v (want its follow-up alone)", ids, err)
		}
	})
	t.Run("Waiter", func(t *testing.T) {
		t.Parallel()
		e, _ := plainEnv(t)
		if errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("w1")}, broker.EnqueueOptions{Watch: true}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
		d := lease1(t, e.b)
		if errs, err := e.b.Settle(ctx, []broker.Settlement{done(d)}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		info, err := e.b.Wait(wctx, "q", "w1")
		if err != nil || info == nil || info.State != tidetype.StateCompleted {
			t.Fatalf("Wait for a task done: %+v, %v (its outcome was not kept)", info, err)
		}
	})
	t.Run("TwiceInOneCall", func(t *testing.T) {
		t.Parallel()
		e, calls := plainEnv(t)
		if _, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("t1")}, broker.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
		d := lease1(t, e.b)
		if err := e.b.SetProgress(ctx, d.Lease(), tidetype.Progress{Percent: 50}); err != nil {
			t.Fatal(err)
		}
		errs, err := e.b.Settle(ctx, []broker.Settlement{done(d), done(d)})
		if err != nil || errs[0] != nil || !errors.Is(errs[1], broker.ErrLeaseLost) {
			t.Fatalf("one lease settled twice in one call: %v, %v (want nil, ErrLeaseLost)", errs, err)
		}
		day := time.Now().UTC().Format(time.DateOnly)
		if n, err := e.rdb.HGet(ctx, e.prefix+":{q:0}:stat", "p:"+day).Int(); err != nil || n != 1 {
			t.Fatalf("processed today: %d, %v (want 1)", n, err)
		}
		if n, err := e.rdb.Exists(ctx, e.prefix+":{q:0}:pg").Result(); err != nil || n != 0 {
			t.Fatalf("the progress of a deleted task is kept (%v)", err)
		}
		if !calls.ran("settle_plain.lua") {
			t.Fatal("settle_plain.lua did not run")
		}
	})
}

// A re-sent plain settlement answers like its first run (applied, not
// lease lost) and counts its tasks once.
func TestResentPlainSettleAnswersLikeTheFirstRun(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := f.b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask(fmt.Sprint("r", i))}, broker.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := f.b.Dequeue(ctx, []string{"q"}, 3, time.Minute)
	if err != nil || len(ds) != 3 {
		t.Fatal(ds, err)
	}
	var ss []broker.Settlement
	for _, d := range ds {
		ss = append(ss, done(d))
	}
	// Load settle_plain.lua: a first EVALSHA would fall back to EVAL.
	if _, err := f.b.Settle(ctx, []broker.Settlement{{Lease: broker.LeaseRef{Queue: "q", ID: "none", Token: 1}, Kind: broker.SettleDone, Task: ds[0].Task}}); err != nil {
		t.Fatal(err)
	}
	seen := f.proxy.Seen("EVALSHA")
	f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
	errs, err := f.b.Settle(ctx, ss)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Errorf("settlement %d of a re-sent call: %v", i, e)
		}
	}
	if f.proxy.Seen("EVALSHA") < seen+2 {
		t.Fatal("the settlement was not sent again")
	}
	day := time.Now().UTC().Format(time.DateOnly)
	// The warm-up settled one task.
	if n, err := f.direct.HGet(ctx, f.prefix+":{q:0}:stat", "p:"+day).Int(); err != nil || n != 4 {
		t.Fatalf("processed today: %d, %v (want 4: the warm-up's task and these 3, once)", n, err)
	}
}

// The plain scripts leave Redis as the general ones do. The same steps run
// on two brokers, one served by the general scripts alone: plain and
// scheduled tasks due, an unreadable record, a task whose cancel flag is
// set, progress, a stale token, a task settled twice in a call, a retry.
// Every key, every hash field, zset member and list entry matches, and
// every active record but for its token.
func TestPlainScriptsLeaveWhatTheGeneralOnesLeave(t *testing.T) {
	t.Parallel()
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	ctx := context.Background()
	type result struct {
		leased []string
		errs   []string
	}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	task := func(id string) *tidetype.TaskInfo {
		m := pendingTask(id)
		m.NextProcessAt, m.EnqueuedAt = t0, t0
		return m
	}
	run := func(prefix string, general bool) (result, *bindingCalls) {
		calls := newBindingCalls()
		c := redistest.Client(t, addr)
		c.AddHook(calls)
		b := redisbroker.New(c, redisbroker.WithPrefix(prefix))
		t.Cleanup(func() { _ = b.Close() })
		base := prefix + ":{q:0}:"
		if general {
			redisbroker.PausePlain(b, base, time.Hour)
		}
		var ms []*tidetype.TaskInfo
		for i := range 10 {
			ms = append(ms, task(fmt.Sprint("p", i)))
		}
		for i := range 2 {
			m := task(fmt.Sprint("s", i))
			m.State = tidetype.StateScheduled
			ms = append(ms, m)
		}
		if _, err := b.Enqueue(ctx, ms, broker.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
		// A record whose cancel flag is set (flag bit 7), and one that
		// cannot be read.
		rec, err := rdb.HGet(ctx, base+"t", "p2").Bytes()
		if err != nil {
			t.Fatal(err)
		}
		rec[1] |= 0x80
		rdb.HSet(ctx, base+"t", "p2", rec, "bad", "garbage")
		rdb.LPush(ctx, base+"pending", "bad")
		var r result
		ds, err := b.Dequeue(ctx, []string{"q"}, 20, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			r.leased = append(r.leased, d.Task.ID)
		}
		if err := b.SetProgress(ctx, ds[1].Lease(), tidetype.Progress{Percent: 10}); err != nil {
			t.Fatal(err)
		}
		stale := done(ds[2])
		stale.Lease.Token--
		batch := []broker.Settlement{done(ds[0]), done(ds[1]), stale, done(ds[3]), done(ds[3])}
		for _, d := range ds[4:9] {
			batch = append(batch, done(d))
		}
		errs, err := b.Settle(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		retry := broker.Settlement{Lease: ds[9].Lease(), Kind: broker.SettleRetry, Task: ds[9].Task, RetryAt: time.Now().Add(time.Hour), Err: "x"}
		errs2, err := b.Settle(ctx, []broker.Settlement{retry})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range append(errs, errs2...) {
			r.errs = append(r.errs, fmt.Sprint(e))
		}
		return r, calls
	}
	pa, pb := redistest.Prefix(t)+"plain", redistest.Prefix(t)+"general"
	ra, ca := run(pa, false)
	rb, cb := run(pb, true)
	if !ca.ran("dequeue_plain.lua") || !ca.ran("settle_plain.lua") || cb.ran("dequeue_plain.lua") || cb.ran("settle_plain.lua") {
		t.Fatal("the brokers did not run the scripts they were to")
	}
	if !slices.Equal(ra.leased, rb.leased) || !slices.Equal(ra.errs, rb.errs) {
		t.Fatalf("plain: leased %v, settled %v\ngeneral: leased %v, settled %v", ra.leased, ra.errs, rb.leased, rb.errs)
	}
	sa, sb := keyState(t, rdb, pa), keyState(t, rdb, pb)
	if sa != sb {
		t.Fatalf("after the plain scripts:\n%s\nafter the general ones:\n%s", sa, sb)
	}
}

// keyState describes the keys under prefix: each key's name (reply caches
// and the token sequence by kind), type and members; records of active
// tasks with their token masked, other values by length; scores left out
// (they are times).
func keyState(t *testing.T, rdb *redis.Client, prefix string) string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	caches := 0
	for _, k := range keys {
		name := strings.TrimPrefix(k, prefix)
		typ := rdb.Type(ctx, k).Val()
		if strings.Contains(name, ":rq:") {
			caches += int(rdb.HLen(ctx, k).Val())
			continue
		}
		line := name + " " + typ + ":"
		switch typ {
		case "hash":
			h := rdb.HGetAll(ctx, k).Val()
			var fs []string
			for f, v := range h {
				switch {
				case strings.HasSuffix(name, ":t") && len(v) >= 24 && v[1]&7 == 2:
					b := []byte(v)
					copy(b[2:10], make([]byte, 8))
					fs = append(fs, fmt.Sprintf("%q=%x", f, b))
				case strings.HasSuffix(name, ":stat") || strings.HasSuffix(name, ":m"):
					fs = append(fs, f+"="+v)
				default:
					fs = append(fs, fmt.Sprintf("%q(%d)", f, len(v)))
				}
			}
			sort.Strings(fs)
			line += strings.Join(fs, " ")
		case "zset":
			if strings.HasSuffix(name, ":starts") {
				line += fmt.Sprint(rdb.ZCard(ctx, k).Val())
				break
			}
			line += strings.Join(rdb.ZRange(ctx, k, 0, -1).Val(), " ")
		case "list":
			line += strings.Join(rdb.LRange(ctx, k, 0, -1).Val(), " ")
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	lines = append(lines, fmt.Sprint("reply cache entries: ", caches))
	return strings.Join(lines, "\n")
}

// A reply cache gets its expiry from the first call that writes it: a
// lease that found nothing (and wrote nothing) does not count as having set
// it, so the enqueue after it, on the same cache, still sets it.
func TestReplyCacheExpiresAfterAnEmptyLease(t *testing.T) {
	t.Parallel()
	e, _ := plainEnv(t)
	ctx := context.Background()
	if _, err := e.b.Partitions(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if ds, err := e.b.Dequeue(ctx, []string{"q"}, 5, time.Minute); err != nil || len(ds) != 0 {
		t.Fatalf("dequeue of an empty queue: %v, %v", ds, err)
	}
	// Two tasks: a single one keeps its reply in reply slots of its own
	// (enqueue_one.lua), not in the reply cache the lease named.
	if _, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("a"), pendingTask("b")}, broker.EnqueueOptions{}); err != nil {
		t.Fatal(err)
	}
	keys, err := e.rdb.Keys(ctx, e.prefix+":{q:0}:rq:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("reply caches: %v, %v", keys, err)
	}
	for _, k := range keys {
		if ttl := e.rdb.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("reply cache %s has no expiry (PTTL %v)", k, ttl)
		}
	}
}

// A single Enqueue is sent by the script's SHA, with its command built
// once; when Redis has not cached the script (a restart, SCRIPT FLUSH) it
// is sent again with the script's body, alone or pipelined with other
// partitions' calls.
func TestSingleEnqueueAfterScriptFlush(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithQueuePartitions("q", 4))
	ctx := context.Background()
	flush := func() {
		t.Helper()
		if err := e.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		flush()
		task := pendingTask("")
		if i == 1 {
			task = pendingTask(fmt.Sprintf("own-%d", i))
		}
		if errs, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{task}, broker.EnqueueOptions{}); err != nil || errs[0] != nil {
			t.Fatalf("single Enqueue after SCRIPT FLUSH: %v, %v", errs, err)
		}
	}
	// Tasks in different partitions, one a partition: one pipeline of
	// single-task calls.
	flush()
	var many []*tidetype.TaskInfo
	taken := map[int]bool{}
	for i := 0; len(many) < 4; i++ {
		id := fmt.Sprintf("many-%d", i)
		if p := broker.Partition(id, 4); !taken[p] {
			taken[p] = true
			many = append(many, pendingTask(id))
		}
	}
	errs, err := e.b.Enqueue(ctx, many, broker.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
	}
	n := 0
	for p := range 4 {
		c, err := e.rdb.HLen(ctx, fmt.Sprintf("%s:{q:%d}:t", e.prefix, p)).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += int(c)
	}
	if n != 7 {
		t.Fatalf("%d tasks stored, want 7", n)
	}
}

// settle.lua reads a call's records with one command and deletes done
// tasks' records with one after its loop; an ID settled twice in one call
// still sees what the first settlement left: a done task is gone for the
// second (not done again, not counted twice), a task set to retry is no
// longer leased.
func TestSettleLuaTwiceInOneCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, first := range map[string]broker.SettleKind{"Done": broker.SettleDone, "Retry": broker.SettleRetry} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e, calls := plainEnv(t)
			if err := e.b.SetQueueLimits(ctx, "q", tidetype.QueueLimits{Concurrency: 4}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.b.Enqueue(ctx, []*tidetype.TaskInfo{pendingTask("t1")}, broker.EnqueueOptions{}); err != nil {
				t.Fatal(err)
			}
			d := lease1(t, e.b)
			s := done(d)
			s.Kind = first
			if first == broker.SettleRetry {
				s.RetryAt, s.Err = time.Now().Add(time.Hour), "boom"
			}
			errs, err := e.b.Settle(ctx, []broker.Settlement{s, done(d)})
			if err != nil || errs[0] != nil || !errors.Is(errs[1], broker.ErrLeaseLost) {
				t.Fatalf("%s then done in one call: %v, %v (want nil, ErrLeaseLost)", name, errs, err)
			}
			day := time.Now().UTC().Format(time.DateOnly)
			if n, err := e.rdb.HGet(ctx, e.prefix+":{q:0}:stat", "p:"+day).Int(); err != nil || n != 1 {
				t.Fatalf("processed today: %d, %v (want 1)", n, err)
			}
			info, err := e.b.GetTask(ctx, "q", "t1")
			switch first {
			case broker.SettleDone:
				if !errors.Is(err, broker.ErrTaskNotFound) {
					t.Fatalf("after done twice: %+v, %v (want it deleted)", info, err)
				}
			case broker.SettleRetry:
				if err != nil || info.State != tidetype.StateRetry {
					t.Fatalf("after retry then done: %+v, %v (want it in retry)", info, err)
				}
			}
			if !calls.ran("settle.lua") {
				t.Fatal("settle.lua did not run")
			}
		})
	}
}
