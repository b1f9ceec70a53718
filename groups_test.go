package tide_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// startLog records the order in which handlers start.
type startLog struct {
	mu  sync.Mutex
	ids []string
	grp []string
}

func (l *startLog) add(ctx context.Context) {
	id, _ := tide.GetTaskID(ctx)
	g, _ := tide.GetGroup(ctx)
	l.mu.Lock()
	l.ids = append(l.ids, id)
	l.grp = append(l.grp, g)
	l.mu.Unlock()
}

func (l *startLog) groups() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.grp)
}

// A group with 50,000 tasks waiting does not starve one with 50 enqueued
// after it: served round-robin, the small group's tasks all start while
// the big one starts about as many, on one partition and on four.
func TestGroupFairness(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 4} {
		t.Run(fmt.Sprintf("%dpartitions", parts), func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(parts))
			ctx := context.Background()
			const q, big, small, conc = "fair", 50000, 50, 4
			batch := make([]*tide.Task, 1000)
			for i := range batch {
				batch[i] = tide.NewTask("work", nil)
			}
			for range big / len(batch) {
				if _, err := e.c.EnqueueMany(ctx, batch, tide.Queue(q), tide.Group("big")); err != nil {
					t.Fatal(err)
				}
			}
			for range small {
				if _, err := e.c.Enqueue(ctx, tide.NewTask("work", nil), tide.Queue(q), tide.Group("small")); err != nil {
					t.Fatal(err)
				}
			}
			var log startLog
			var smallDone atomic.Int64
			e.server(tide.Config{Concurrency: conc, Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
				log.add(ctx)
				if g, _ := tide.GetGroup(ctx); g == "small" {
					smallDone.Add(1)
				}
				return nil
			}))
			testwait.For(t, 60*time.Second, "the small group's tasks to run", func() bool { return smallDone.Load() == small })
			starts := log.groups()
			last := slices.Index(starts, "small")
			n := 0
			for i, g := range starts {
				if g == "small" {
					n++
					if n == small {
						last = i
						break
					}
				}
			}
			bigBefore := last + 1 - small
			t.Logf("%d partitions: the small group's last task was start %d; the big group had %d by then", parts, last+1, bigBefore)
			// Round-robin: while both have work, starts differ by at most
			// the servers' total concurrency.
			if bigBefore-small > conc {
				t.Fatalf("the big group started %d tasks while the small one started %d (concurrency %d): not round-robin", bigBefore, small, conc)
			}
		})
	}
}

// GroupRate 5 per second: no window of a second holds more than 5 starts
// of a group, while another group keeps its own budget. The starts are
// read from the queue's task events, whose times the lease script itself
// takes on Redis's clock: a handler's own reading comes a varying delay
// after the start (long on a loaded machine), which made gaps read short.
func TestGroupRate(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(2))
	ctx := context.Background()
	const q, limit, per, n = "grate", 5, time.Second, 15
	in := tide.NewInspector(e.b)
	if err := in.SetQueueLimits(ctx, q, tide.QueueLimits{GroupRate: tide.Rate{Limit: limit, Per: per}}); err != nil {
		t.Fatal(err)
	}
	if err := in.SetQueueEvents(ctx, q, true); err != nil {
		t.Fatal(err)
	}
	group := map[string]string{} // task ID -> group
	for i := range 2 * n {
		g := fmt.Sprint("g", i%2)
		ti, err := e.c.Enqueue(ctx, tide.NewTask("work", nil), tide.Queue(q), tide.Group(g))
		if err != nil {
			t.Fatal(err)
		}
		group[ti.ID] = g
	}
	var ran atomic.Int64
	for range 2 {
		e.server(tide.Config{Concurrency: 10, Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
			ran.Add(1)
			return nil
		}))
	}
	testwait.For(t, 60*time.Second, "every task to run", func() bool { return ran.Load() >= 2*n })
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := in.Events(rctx, tide.EventsFrom{Queues: []string{q}, After: tide.EventsOldest})
	if err != nil {
		t.Fatal(err)
	}
	starts := map[string][]time.Time{}
	got := 0
	timeout := time.After(30 * time.Second)
	for got < 2*n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("the events ended after %d starts of %d", got, 2*n)
			}
			if ev.Kind == tide.EventStarted {
				starts[group[ev.TaskID]] = append(starts[group[ev.TaskID]], ev.At)
				got++
			}
		case <-timeout:
			t.Fatalf("read %d start events of %d", got, 2*n)
		}
	}
	for g, ts := range starts {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		for i := limit; i < len(ts); i++ {
			// A start is let through once the start limit before it left
			// the window, on the same clock the event's time is read from
			// (at the end of the lease script, in milliseconds): a gap
			// reads short only by how long one script ran. A broken limit
			// shows as gaps near zero or a window short.
			if gap := ts[i].Sub(ts[i-limit]); gap < per-eventSkew {
				t.Fatalf("group %s: starts %d and %d are %v apart: more than %d starts in %v", g, i-limit, i, gap, limit, per)
			}
		}
	}
}

// eventSkew bounds how much later than the instant its limits were checked
// a start's event time is read: both come from Redis's clock in the same
// lease script (a few milliseconds even when the machine is busy).
const eventSkew = 20 * time.Millisecond

// An ordered group runs its tasks one at a time in enqueue order, even when
// tasks fail and are retried (the retried task holds its place) or are
// archived (the next one follows).
func TestOrderedGroups(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(2))
	ctx := context.Background()
	const q, groups, per = "ord", 3, 12
	if err := tide.NewInspector(e.b).SetQueueLimits(ctx, q, tide.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	for i := range per {
		for g := range groups {
			opts := []tide.Option{tide.Queue(q), tide.Group(fmt.Sprint("acct-", g)), tide.MaxRetry(2)}
			if i == 7 {
				opts = append(opts, tide.MaxRetry(0)) // fails and is archived
			}
			if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte(strconv.Itoa(i))), opts...); err != nil {
				t.Fatal(err)
			}
		}
	}
	type run struct {
		seq      int
		from, to time.Time
	}
	var mu sync.Mutex
	runs := map[string][]run{}
	var finished atomic.Int64
	for range 2 {
		e.server(tide.Config{
			Concurrency: 8, Queues: map[string]int{q: 1},
			RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 20 * time.Millisecond },
		}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
			g, _ := tide.GetGroup(ctx)
			retried, _ := tide.GetRetryCount(ctx)
			seq, _ := strconv.Atoi(string(task.Payload()))
			r := run{seq: seq, from: time.Now()}
			time.Sleep(2 * time.Millisecond)
			r.to = time.Now()
			mu.Lock()
			runs[g] = append(runs[g], r)
			mu.Unlock()
			if seq == 7 {
				finished.Add(1) // archived: MaxRetry(0)
				return errors.New("fails for good")
			}
			if seq%4 == 1 && retried == 0 {
				return errors.New("first attempt fails")
			}
			finished.Add(1)
			return nil
		}))
	}
	testwait.For(t, 60*time.Second, "every task to finish", func() bool { return finished.Load() == groups*per })
	mu.Lock()
	defer mu.Unlock()
	for g, rs := range runs {
		var seqs []int
		for i, r := range rs {
			seqs = append(seqs, r.seq)
			if i > 0 && r.from.Before(rs[i-1].to) {
				t.Fatalf("group %s: run of task %d started before the run of task %d ended", g, r.seq, rs[i-1].seq)
			}
		}
		// Each task in order; a failing first attempt runs again at once.
		var want []int
		for i := range per {
			want = append(want, i)
			if i%4 == 1 {
				want = append(want, i)
			}
		}
		if !slices.Equal(seqs, want) {
			t.Fatalf("group %s ran %v, want %v", g, seqs, want)
		}
	}
}

// ThrottleGroup holds back one group for the given time on every server;
// other groups keep running, the throttled group shows in Groups, and its
// tasks run afterwards without using a retry.
func TestThrottleGroup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, hold = "thr", 600 * time.Millisecond
	in := tide.NewInspector(e.b)
	var once atomic.Bool
	var mu sync.Mutex
	var throttledAt time.Time
	startsA := []time.Time{}
	var doneA, doneB atomic.Int64
	e.server(tide.Config{Concurrency: 4, Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		g, _ := tide.GetGroup(ctx)
		if g == "b" {
			doneB.Add(1)
			return nil
		}
		mu.Lock()
		startsA = append(startsA, time.Now())
		mu.Unlock()
		if once.CompareAndSwap(false, true) {
			mu.Lock()
			throttledAt = time.Now()
			mu.Unlock()
			return fmt.Errorf("downstream says slow down: %w", tide.ThrottleGroup(hold))
		}
		if n, _ := tide.GetRetryCount(ctx); n != 0 {
			return fmt.Errorf("retry count %d after a throttle, want 0", n)
		}
		doneA.Add(1)
		return nil
	}))
	first, err := e.c.Enqueue(ctx, tide.NewTask("call", nil), tide.Queue(q), tide.Group("a"))
	if err != nil {
		t.Fatal(err)
	}
	// The throttle holds from the first task's settlement, a moment after
	// its handler returned: the other tasks come only then, so that none
	// of group a may start in between.
	testwait.For(t, 10*time.Second, "the throttle", func() bool {
		return once.Load() && e.info(q, first.ID).State != tide.StateActive
	})
	var sawThrottle bool
	for i := range 20 {
		for _, g := range []string{"a", "b"} {
			if _, err := e.c.Enqueue(ctx, tide.NewTask("call", []byte(strconv.Itoa(i))), tide.Queue(q), tide.Group(g)); err != nil {
				t.Fatal(err)
			}
		}
		gs, err := in.Groups(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, gi := range gs {
			if gi.Group == "a" && !gi.ThrottledUntil.IsZero() {
				sawThrottle = true
			}
		}
	}
	testwait.For(t, 10*time.Second, "group b to run while a is throttled", func() bool { return doneB.Load() == 20 })
	testwait.For(t, 20*time.Second, "group a to run after the throttle", func() bool { return doneA.Load() == 21 })
	if !sawThrottle {
		t.Fatal("Groups never showed group a as throttled")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range startsA[1:] {
		if s.Sub(throttledAt) < hold-50*time.Millisecond {
			t.Fatalf("a task of group a started %v after ThrottleGroup(%v)", s.Sub(throttledAt), hold)
		}
	}
}

// Replace debounces: three Enqueues of one ID within its delay run once,
// with the last payload and due time; a grouped ID needs the group's tag.
func TestReplaceDebounces(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(4))
	ctx := context.Background()
	const q = "deb"
	got := make(chan string, 10)
	e.server(tide.Config{Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
		got <- string(task.Payload())
		return nil
	}))
	for _, tc := range []struct{ id, group string }{{"recalc-1", ""}, {"recalc{acme}", "acme"}} {
		opts := []tide.Option{tide.Queue(q), tide.TaskID(tc.id), tide.Replace(), tide.ProcessIn(400 * time.Millisecond)}
		if tc.group != "" {
			opts = append(opts, tide.Group(tc.group))
		}
		for i := range 3 {
			if _, err := e.c.Enqueue(ctx, tide.NewTask("recalc", []byte(fmt.Sprint(tc.id, "#", i))), opts...); err != nil {
				t.Fatalf("%s: Enqueue %d: %v", tc.id, i, err)
			}
		}
		select {
		case p := <-got:
			if p != tc.id+"#2" {
				t.Fatalf("ran %q, want the last payload %q", p, tc.id+"#2")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never ran", tc.id)
		}
		select {
		case p := <-got:
			t.Fatalf("ran again: %q", p)
		case <-time.After(600 * time.Millisecond):
		}
	}
	// Without Replace the ID conflicts; a grouped ID needs no tag, and is
	// unique in the queue across groups.
	if _, err := e.c.Enqueue(ctx, tide.NewTask("recalc", nil), tide.Queue(q), tide.TaskID("x"), tide.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("recalc", nil), tide.Queue(q), tide.TaskID("x"), tide.ProcessIn(time.Hour)); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("second Enqueue without Replace: %v, want ErrTaskIDConflict", err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("recalc", nil), tide.Queue(q), tide.TaskID("y"), tide.Group("acme"), tide.ProcessIn(time.Hour)); err != nil {
		t.Fatalf("grouped ID without its tag: %v", err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("recalc", nil), tide.Queue(q), tide.TaskID("y"), tide.Group("other")); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("the same grouped ID in another group: %v, want ErrTaskIDConflict", err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("recalc", nil), tide.Queue(q), tide.Replace()); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("Replace without TaskID: %v, want ErrInvalidTask", err)
	}
}

// A grouped task is found by ID, listed, counted, deleted and cancelled
// like any other, on a queue of several partitions.
func TestGroupedTaskOperations(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(4))
	ctx := context.Background()
	const q = "gops"
	in := tide.NewInspector(e.b)
	var ids []string
	for i := range 6 {
		info, err := e.c.Enqueue(ctx, tide.NewTask("work", nil), tide.Queue(q), tide.Group(fmt.Sprint("t", i%2)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	qi, err := in.QueueInfo(ctx, q)
	if err != nil || qi.Pending != 6 {
		t.Fatalf("QueueInfo = %+v, %v; want 6 pending", qi, err)
	}
	list, err := in.ListTasks(ctx, q, tide.StatePending, 1, 10)
	if err != nil || len(list) != 6 {
		t.Fatalf("ListTasks pending: %d tasks, %v; want 6", len(list), err)
	}
	ti := e.info(q, ids[0])
	if ti.Group != "t0" || ti.State != tide.StatePending {
		t.Fatalf("GetTaskInfo = group %q state %v", ti.Group, ti.State)
	}
	if err := e.c.Delete(ctx, q, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Cancel(ctx, q, ids[1]); err != nil {
		t.Fatal(err)
	}
	gs, err := in.Groups(ctx, q, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []tide.GroupInfo{{Queue: q, Group: "t0", Waiting: 2}, {Queue: q, Group: "t1", Waiting: 2}}
	if !slices.Equal(gs, want) {
		t.Fatalf("Groups = %+v, want %+v", gs, want)
	}
	var ran atomic.Int64
	e.server(tide.Config{Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		ran.Add(1)
		return nil
	}))
	testwait.For(t, 10*time.Second, "the 4 tasks left to run", func() bool { return ran.Load() == 4 })
	testwait.For(t, 5*time.Second, "the groups to empty", func() bool {
		gs, err := in.Groups(ctx, q, 10)
		return err == nil && len(gs) == 0
	})
}

// A repartition moves grouped tasks with their groups while servers run
// them: every task runs once, and ordered groups keep their order across
// the move (grouped tasks wait while the old partitions still run some).
func TestRepartitionKeepsGroups(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, groups, per = "regroup", 4, 60
	in := tide.NewInspector(e.b)
	if err := in.SetQueueLimits(ctx, q, tide.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	for i := range per {
		for g := range groups {
			if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte(strconv.Itoa(i))), tide.Queue(q), tide.Group(fmt.Sprint("g", g))); err != nil {
				t.Fatal(err)
			}
		}
	}
	var mu sync.Mutex
	seen := map[string][]int{}
	var n atomic.Int64
	e.server(tide.Config{Concurrency: 8, Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		g, _ := tide.GetGroup(ctx)
		i, _ := strconv.Atoi(string(task.Payload()))
		time.Sleep(time.Millisecond)
		mu.Lock()
		seen[g] = append(seen[g], i)
		mu.Unlock()
		n.Add(1)
		return nil
	}))
	testwait.For(t, 20*time.Second, "some tasks to run", func() bool { return n.Load() >= groups*per/5 })
	if err := in.Repartition(ctx, q, 3, nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 60*time.Second, "every task to run", func() bool { return n.Load() >= groups*per })
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for g, got := range seen {
		want := make([]int, per)
		for i := range want {
			want[i] = i
		}
		if !slices.Equal(got, want) {
			t.Fatalf("group %s ran %v, want 0..%d once each in order", g, got, per-1)
		}
	}
}

// Bad group keys, group limits and listing bounds are refused with errors
// that name the problem, before anything is stored.
func TestGroupInputValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	for _, tc := range []struct {
		name string
		opts []tide.Option
		want string
	}{
		{"empty", []tide.Option{tide.Group("")}, "group key is 0 bytes"},
		{"long", []tide.Option{tide.Group(strings.Repeat("g", 129))}, "group key is 129 bytes"},
		{"brace", []tide.Option{tide.Group("a{b")}, "invalid character '{'"},
		{"control", []tide.Option{tide.Group("a\x01")}, "invalid character"},
		{"replace unique", []tide.Option{tide.TaskID("x"), tide.Replace(), tide.Unique(time.Minute)}, "Replace cannot be combined with Unique"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.Enqueue(ctx, tide.NewTask("work", nil), tc.opts...)
			if !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Enqueue: %v, want ErrInvalidTask naming %s", err, tc.want)
			}
		})
	}
	for _, l := range []tide.QueueLimits{
		{GroupConcurrency: -1},
		{GroupRate: tide.Rate{Limit: 1001, Per: time.Second}},
		{GroupRate: tide.Rate{Limit: 5}},
		{GroupRate: tide.Rate{Per: time.Second}},
	} {
		if err := in.SetQueueLimits(ctx, "v", l); !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), "QueueLimits.Group") {
			t.Fatalf("SetQueueLimits(%+v): %v, want ErrInvalidTask naming the field", l, err)
		}
	}
	for _, n := range []int{0, 1001} {
		if _, err := in.Groups(ctx, "v", n); !errors.Is(err, tide.ErrInvalidTask) {
			t.Fatalf("Groups(n=%d): %v, want ErrInvalidTask", n, err)
		}
	}
	// Replace given to some tasks with IDs of one EnqueueMany and not others.
	_, err := e.c.EnqueueMany(ctx, []*tide.Task{
		tide.NewTask("work", nil, tide.TaskID("a"), tide.Replace()),
		tide.NewTask("work", nil, tide.TaskID("b")),
	})
	if !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), "Replace") {
		t.Fatalf("EnqueueMany mixing Replace: %v", err)
	}
	// The full round trip of the limits.
	want := tide.QueueLimits{Concurrency: 3, GroupConcurrency: 2, GroupRate: tide.Rate{Limit: 7, Per: 2 * time.Second}, Ordered: true}
	if err := in.SetQueueLimits(ctx, "v", want); err != nil {
		t.Fatal(err)
	}
	if got, err := in.QueueLimits(ctx, "v"); err != nil || got != want {
		t.Fatalf("QueueLimits = %+v, %v; want %+v", got, err, want)
	}
}

// A grouped task whose record cannot be read is archived when its turn
// comes, and its group gets its slot back: with GroupConcurrency 1 the
// group's next task still runs.
func TestUndecodableGroupedRecordFreesItsSlot(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "gbad"
	if err := tide.NewInspector(e.b).SetQueueLimits(ctx, q, tide.QueueLimits{GroupConcurrency: 1, Ordered: true}); err != nil {
		t.Fatal(err)
	}
	bad, err := e.c.Enqueue(ctx, tide.NewTask("work", nil), tide.Queue(q), tide.Group("acme"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HSet(ctx, e.prefix+":{"+q+":0}:t", bad.ID, "not a record").Err(); err != nil {
		t.Fatal(err)
	}
	good, err := e.c.Enqueue(ctx, tide.NewTask("work", nil), tide.Queue(q), tide.Group("acme"))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 2)
	e.server(tide.Config{Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		ran <- id
		return nil
	}))
	select {
	case id := <-ran:
		if id != good.ID {
			t.Fatalf("ran %s, want %s", id, good.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the group's next task never ran: the unreadable one kept its slot")
	}
	if st := e.info(q, bad.ID).State; st != tide.StateArchived {
		t.Fatalf("unreadable task is %v, want archived", st)
	}
}

// A sequence's task that failed keeps the group's place even when a task
// enqueued before it becomes due while it waits to be retried: it runs
// again first, then the other one (no deadlock between the two).
func TestOrderedHolderGoesFirstWhenBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "ordback"
	if err := tide.NewInspector(e.b).SetQueueLimits(ctx, q, tide.QueueLimits{Ordered: true}); err != nil {
		t.Fatal(err)
	}
	// A is enqueued first but due later; B runs first, fails, and is
	// retried after A became due. A is made due from B's first attempt
	// (RunTask), not by a short ProcessIn, so that a server slow to start
	// cannot find A due before B has taken the group's place.
	a, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("A")), tide.Queue(q), tide.Group("acct"), tide.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("B")), tide.Queue(q), tide.Group("acct")); err != nil {
		t.Fatal(err)
	}
	in := tide.NewInspector(e.b)
	var mu sync.Mutex
	var order []string
	done := make(chan struct{}, 2)
	e.server(tide.Config{
		Queues:         map[string]int{q: 1},
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 400 * time.Millisecond },
	}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		n, _ := tide.GetRetryCount(ctx)
		mu.Lock()
		order = append(order, fmt.Sprint(string(task.Payload()), n))
		mu.Unlock()
		if string(task.Payload()) == "B" && n == 0 {
			if err := in.RunTask(ctx, q, a.ID); err != nil {
				return fmt.Errorf("RunTask(A): %w: %w", err, tide.SkipRetry)
			}
			return errors.New("first attempt fails")
		}
		done <- struct{}{}
		return nil
	}))
	for range 2 {
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("stuck after %v: the sequence deadlocked", order)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"B0", "B1", "A0"}; !slices.Equal(order, want) {
		t.Fatalf("ran %v, want %v", order, want)
	}
}

// A group's rate window is forgotten once its newest start left it, so
// groups gone idle leave nothing behind in Redis.
func TestGroupRateWindowsAreForgotten(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "gforget"
	if err := tide.NewInspector(e.b).SetQueueLimits(ctx, q, tide.QueueLimits{GroupRate: tide.Rate{Limit: 5, Per: 100 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	e.server(tide.Config{Queues: map[string]int{q: 1}}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		ran.Add(1)
		return nil
	}))
	for i := range 20 {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("work", nil), tide.Queue(q), tide.Group(fmt.Sprint("tenant-", i))); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "every task to run", func() bool { return ran.Load() == 20 })
	key := e.prefix + ":{" + q + ":0}:gl"
	testwait.For(t, 30*time.Second, "the rate windows to be forgotten", func() bool {
		n, err := e.rdb.HLen(ctx, key).Result()
		return err == nil && n == 0
	})
}
