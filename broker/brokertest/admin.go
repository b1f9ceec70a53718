package brokertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// adminTests run when the broker implements broker.Admin.
var adminTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker, a broker.Admin)
}{
	{"AdminStatsAndListing", testAdminStatsAndListing},
	{"AdminRunArchive", testAdminRunArchive},
	{"AdminBulk", testAdminBulk},
	{"AdminCounters", testAdminCounters},
	{"AdminCancel", testAdminCancel},
	{"AdminRegistry", testAdminRegistry},
	{"AdminDeleteQueue", testAdminDeleteQueue},
	{"AdminAttempts", testAdminAttempts},
	{"AdminPauseFor", testAdminPauseFor},
	{"AdminSearchSeriesStore", testAdminSearchSeriesStore},
}

// A task's failed attempts are kept with their start, end, server and error
// (and the successful one when the task is kept); an active task shows when
// its lease runs out.
func testAdminAttempts(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	m := newMsg("q", "flaky")
	m.Retention = time.Hour
	enqueue(t, b, m)
	for i, errMsg := range []string{"first failure", "second failure"} {
		d := redeliver(t, b, "q", time.Minute)
		if i == 0 {
			ts, err := a.ListTasks(ctx, "q", tidetype.StateActive, 0, 10)
			if err != nil || len(ts) != 1 || ts[0].LeaseExpiresAt.Before(time.Now().Add(50*time.Second)) {
				t.Fatalf("active list: %+v, %v; want the lease's expiry about a minute ahead", ts, err)
			}
		}
		s := retryOf(d, time.Now(), errMsg)
		s.Started, s.Server = time.Now().Add(-time.Second), "srv-1"
		settleOK(t, b, s)
	}
	d := redeliver(t, b, "q", time.Minute)
	s := outcomeOf(d, broker.SettleDone)
	s.Server = "srv-2"
	settleOK(t, b, s)
	got := get(t, b, "q", "flaky")
	if len(got.Attempts) != 3 {
		t.Fatalf("attempts: %+v, want 3", got.Attempts)
	}
	first, last := got.Attempts[0], got.Attempts[2]
	if first.Outcome != "retry" || first.Err != "first failure" || first.Server != "srv-1" || first.Started.IsZero() || first.Ended.Before(first.Started) {
		t.Fatalf("first attempt: %+v", first)
	}
	if last.Outcome != "done" || last.Server != "srv-2" || last.Err != "" {
		t.Fatalf("last attempt: %+v", last)
	}
	// At most MaxAttempts are kept.
	enqueue(t, b, newMsg("q", "hopeless"))
	for i := range tidetype.MaxAttempts + 3 {
		d := redeliver(t, b, "q", time.Minute)
		settleOK(t, b, retryOf(d, time.Now(), fmt.Sprint("failure ", i)))
	}
	if h := get(t, b, "q", "hopeless").Attempts; len(h) != tidetype.MaxAttempts || h[len(h)-1].Err != fmt.Sprint("failure ", tidetype.MaxAttempts+2) {
		t.Fatalf("history of %d failures: %d kept, last %+v", tidetype.MaxAttempts+3, len(h), h[len(h)-1])
	}
}

// SearchTasks filters by ID, type, payload and error and pages; Series
// counts this minute's attempts; StoreInfo describes the store.
func testAdminSearchSeriesStore(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	var ms []*tidetype.TaskInfo
	for i := range 30 {
		m := newMsg("s", fmt.Sprintf("order-%02d", i))
		m.Payload = []byte(fmt.Sprintf(`{"customer":"c%d"}`, i%3))
		ms = append(ms, m)
	}
	enqueue(t, b, ms...)
	var found []string
	for off := 0; off >= 0; {
		ts, next, err := a.SearchTasks(ctx, "s", tidetype.StatePending, tidetype.TaskFilter{Payload: `"c1"`}, off, 4)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range ts {
			found = append(found, x.ID)
		}
		if next >= 0 && next <= off {
			t.Fatalf("search did not advance: %d -> %d", off, next)
		}
		off = next
	}
	if len(found) != 10 {
		t.Fatalf("search by payload found %d tasks (%v), want 10", len(found), found)
	}
	if ts, _, err := a.SearchTasks(ctx, "s", tidetype.StatePending, tidetype.TaskFilter{ID: "order-07"}, 0, 10); err != nil || len(ts) != 1 || ts[0].ID != "order-07" {
		t.Fatalf("search by ID: %+v, %v", ts, err)
	}
	d := dequeueOne(t, b, "s", time.Minute)
	settleOK(t, b, retryOf(d, time.Now().Add(time.Hour), "gateway timeout"))
	if ts, _, err := a.SearchTasks(ctx, "s", tidetype.StateRetry, tidetype.TaskFilter{Err: "timeout"}, 0, 10); err != nil || len(ts) != 1 {
		t.Fatalf("search by error: %+v, %v", ts, err)
	}
	pts, err := a.Series(ctx, "s", time.Now().Add(-5*time.Minute))
	if err != nil || len(pts) < 5 {
		t.Fatalf("series: %d points, %v", len(pts), err)
	}
	total := 0
	for _, p := range pts {
		total += p.Failed
	}
	if total != 1 {
		t.Fatalf("series counts %d failures in the last minutes, want 1: %+v", total, pts)
	}
	si, err := a.StoreInfo(ctx)
	if err != nil || si.Kind == "" || si.Nodes < 1 {
		t.Fatalf("store info: %+v, %v", si, err)
	}
}

// A queue can be deleted only when empty; it then disappears from Queues,
// and an Enqueue brings it back.
func testAdminDeleteQueue(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	enqueue(t, b, newMsg("gone", "x"))
	if err := a.DeleteQueue(ctx, "gone"); !errors.Is(err, broker.ErrQueueNotEmpty) {
		t.Fatalf("deleting a queue with a task: %v, want ErrQueueNotEmpty", err)
	}
	if err := b.Delete(ctx, "gone", "x"); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteQueue(ctx, "gone"); err != nil {
		t.Fatalf("deleting an empty queue: %v", err)
	}
	if qs, err := a.Queues(ctx); err != nil || contains(qs, "gone") {
		t.Fatalf("queues after the deletion: %v, %v", qs, err)
	}
	enqueue(t, b, newMsg("gone", "y"))
	if qs, _ := a.Queues(ctx); !contains(qs, "gone") {
		t.Fatalf("the queue did not come back with a new task: %v", qs)
	}
	if d := dequeueOne(t, b, "gone", time.Minute); d.Task.ID != "y" {
		t.Fatalf("dequeued %q", d.Task.ID)
	}
}

func testAdminStatsAndListing(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	var msgs []*tidetype.TaskInfo
	for i := range 9 {
		msgs = append(msgs, newMsg("alpha", fmt.Sprintf("p%d", i)))
	}
	for i := range 4 {
		m := newMsg("alpha", fmt.Sprintf("s%d", i))
		m.State, m.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Duration(i+1)*time.Hour)
		msgs = append(msgs, m)
	}
	msgs = append(msgs, newMsg("beta", "b0"))
	enqueue(t, b, msgs...)
	dequeueOne(t, b, "beta", time.Minute)

	qs, err := a.Queues(ctx)
	if err != nil || !contains(qs, "alpha") || !contains(qs, "beta") {
		t.Fatalf("Queues = %v, %v", qs, err)
	}
	st, err := a.QueueInfo(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 9 || st.Scheduled != 4 || st.Active != 0 || st.OldestPending.IsZero() {
		t.Fatalf("alpha stats = %+v", st)
	}
	if st, _ := a.QueueInfo(ctx, "beta"); st.Active != 1 {
		t.Fatalf("beta stats = %+v", st)
	}
	seen := map[string]bool{}
	for off := 0; ; off += 2 {
		page, err := a.ListTasks(ctx, "alpha", tidetype.StatePending, off, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			if seen[m.ID] || m.State != tidetype.StatePending || m.Type != taskType {
				t.Fatalf("page at %d: %+v (seen %v)", off, m, seen[m.ID])
			}
			seen[m.ID] = true
		}
	}
	if len(seen) != 9 {
		t.Fatalf("listed %d pending tasks, want 9", len(seen))
	}
	sched, err := a.ListTasks(ctx, "alpha", tidetype.StateScheduled, 0, 10)
	if err != nil || len(sched) != 4 {
		t.Fatalf("scheduled listing: %d, %v", len(sched), err)
	}
	if partitions(t, b, "alpha") == 1 {
		for i := 1; i < len(sched); i++ {
			if sched[i].NextProcessAt.Before(sched[i-1].NextProcessAt) {
				t.Fatalf("scheduled tasks not in due order: %v then %v", sched[i-1].NextProcessAt, sched[i].NextProcessAt)
			}
		}
	}
	if _, err := a.ListTasks(ctx, "alpha", tidetype.StatePending, 0, 0); err == nil {
		t.Fatal("limit 0 accepted")
	}
}

func testAdminRunArchive(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	s := newMsg("q", "sched")
	s.State, s.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
	enqueue(t, b, s, newMsg("q", "pend"))
	if err := a.RunTask(ctx, "q", "sched"); err != nil {
		t.Fatal(err)
	}
	if m := get(t, b, "q", "sched"); m.State != tidetype.StatePending {
		t.Fatalf("after RunTask: %s", m.State)
	}
	if err := a.ArchiveTask(ctx, "q", "pend"); err != nil {
		t.Fatal(err)
	}
	if m := get(t, b, "q", "pend"); m.State != tidetype.StateArchived {
		t.Fatalf("after ArchiveTask: %s", m.State)
	}
	if err := a.ArchiveTask(ctx, "q", "pend"); !errors.Is(err, broker.ErrTaskState) {
		t.Fatalf("archiving an archived task: %v, want ErrTaskState", err)
	}
	if err := a.RunTask(ctx, "q", "pend"); err != nil {
		t.Fatalf("running an archived task: %v", err)
	}
	if err := a.RunTask(ctx, "q", "missing"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("RunTask(missing) = %v", err)
	}
	d := dequeueOne(t, b, "q", time.Minute)
	if err := a.ArchiveTask(ctx, "q", d.Task.ID); !errors.Is(err, broker.ErrTaskState) {
		t.Fatalf("archiving an active task: %v, want ErrTaskState", err)
	}
	if err := a.RunTask(ctx, "q", d.Task.ID); !errors.Is(err, broker.ErrTaskState) {
		t.Fatalf("running an active task: %v, want ErrTaskState", err)
	}
}

func testAdminBulk(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	var msgs []*tidetype.TaskInfo
	for i := range 30 {
		m := newMsg("q", fmt.Sprintf("t%d", i))
		m.State, m.NextProcessAt = tidetype.StateScheduled, time.Now().Add(time.Hour)
		msgs = append(msgs, m)
	}
	enqueue(t, b, msgs...)
	drain := func(step func(context.Context, string, tidetype.TaskState, int) (int, error), st tidetype.TaskState) int {
		total := 0
		for range 100 {
			n, err := step(ctx, "q", st, 7)
			if err != nil {
				t.Fatal(err)
			}
			if n > 7 {
				t.Fatalf("bulk step handled %d tasks, over its limit of 7", n)
			}
			if n == 0 {
				return total
			}
			total += n
		}
		t.Fatal("bulk operation never finished")
		return 0
	}
	if n := drain(a.RunTasks, tidetype.StateScheduled); n != 30 {
		t.Fatalf("RunTasks moved %d, want 30", n)
	}
	if n := drain(a.ArchiveTasks, tidetype.StatePending); n != 30 {
		t.Fatalf("ArchiveTasks moved %d, want 30", n)
	}
	if n := drain(a.DeleteTasks, tidetype.StateArchived); n != 30 {
		t.Fatalf("DeleteTasks removed %d, want 30", n)
	}
	st, err := a.QueueInfo(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range tidetype.States {
		if n := st.Count(s); n != 0 {
			t.Fatalf("%d tasks left in %s", n, s)
		}
	}
	if _, err := a.DeleteTasks(ctx, "q", tidetype.StateActive, 10); err == nil {
		t.Fatal("bulk delete of active tasks accepted")
	}
}

func testAdminCounters(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	enqueue(t, b, newMsg("q", "ok"), newMsg("q", "bad"))
	for range 2 {
		d := dequeueOne(t, b, "q", time.Minute)
		o := outcomeOf(d, broker.SettleDone)
		if d.Task.ID == "bad" {
			o = retryOf(d, time.Now().Add(time.Hour), "boom")
		}
		settleOK(t, b, o)
	}
	st, err := a.QueueInfo(ctx, "q")
	if err != nil || st.Processed != 2 || st.Failed != 1 {
		t.Fatalf("counters = %+v, %v", st, err)
	}
	h, err := a.History(ctx, "q", 3)
	if err != nil || len(h) != 3 || h[0].Processed != 2 || h[0].Failed != 1 || h[1].Processed != 0 {
		t.Fatalf("history = %+v, %v", h, err)
	}
	if !h[0].Date.After(h[1].Date) {
		t.Fatalf("history not newest first: %v", h)
	}
}

func testAdminCancel(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := b.Subscribe(ctx, []string{"q"})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, b, newMsg("q", "job"))
	if err := a.CancelProcessing(ctx, "q", "job"); !errors.Is(err, broker.ErrTaskState) {
		t.Fatalf("CancelProcessing of a pending task: %v, want ErrTaskState", err)
	}
	dequeueOne(t, b, "q", time.Minute)
	if err := a.CancelProcessing(ctx, "q", "job"); err != nil {
		t.Fatal(err)
	}
	if !awaitEvent(t, ch, 5*time.Second, func(ev broker.Event) bool {
		return ev.Kind == broker.EventCancel && ev.ID == "job" && ev.Queue == "q"
	}) {
		t.Fatal("no cancel event")
	}
	if err := a.CancelProcessing(ctx, "q", "missing"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("cancel missing: %v", err)
	}
}

func testAdminRegistry(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	reg := b
	needs(t, "Registry", reg.UnregisterServer(ctx, "probe"))
	info := tidetype.ServerInfo{ID: "srv-1", Host: "h", PID: 7, Concurrency: 3, Queues: map[string]int{"q": 1},
		Active: []tidetype.ActiveTask{{Queue: "q", ID: "x", Type: "t"}}}
	if err := reg.RegisterServer(ctx, info, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := reg.RegisterServer(ctx, tidetype.ServerInfo{ID: "srv-short"}, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the short-lived server record to expire", func() bool {
		ss, err := a.Servers(ctx)
		return err == nil && len(ss) == 1
	})
	ss, _ := a.Servers(ctx)
	if ss[0].ID != "srv-1" || len(ss[0].Active) != 1 || ss[0].Queues["q"] != 1 {
		t.Fatalf("servers = %+v", ss)
	}
	if err := reg.UnregisterServer(ctx, "srv-1"); err != nil {
		t.Fatal(err)
	}
	if ss, _ := a.Servers(ctx); len(ss) != 0 {
		t.Fatalf("servers after unregister = %+v", ss)
	}
	es := []tidetype.SchedulerEntry{{SchedulerID: "s1", ID: "e1", Spec: "@every 1m", Type: "t", Queue: "q"}}
	if err := reg.RegisterSchedulerEntries(ctx, "s1", es, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := a.SchedulerEntries(ctx)
	if err != nil || len(got) != 1 || got[0].Spec != "@every 1m" {
		t.Fatalf("entries = %+v, %v", got, err)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// testAdminPauseFor: a timed pause holds the queue's tasks back, reports
// when it ends, lifts by itself, and Pause afterwards makes it indefinite.
func testAdminPauseFor(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := t.Context()
	const d = 400 * time.Millisecond
	start := time.Now()
	if err := a.PauseFor(ctx, "p", d); err != nil {
		t.Fatalf("PauseFor: %v", err)
	}
	enqueue(t, b, newMsg("p", "p1"))
	qi, err := a.QueueInfo(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if !qi.Paused || qi.PausedUntil.Before(start.Add(d-50*time.Millisecond)) || qi.PausedUntil.After(time.Now().Add(d+50*time.Millisecond)) {
		t.Fatalf("QueueInfo: paused %v until %v; want paused until about %v", qi.Paused, qi.PausedUntil, start.Add(d))
	}
	if ds := dequeue(t, b, []string{"p"}, 10, time.Minute); len(ds) != 0 && time.Since(start) < d {
		t.Fatalf("Dequeue of a queue paused for %v returned %d deliveries after %v", d, len(ds), time.Since(start))
	}
	var got []*broker.Delivery
	eventually(t, waitLong, "the timed pause to end", func() bool {
		got = dequeue(t, b, []string{"p"}, 10, time.Minute)
		return len(got) == 1
	})
	if time.Since(start) < d {
		t.Fatalf("the pause lifted after %v, before its %v", time.Since(start), d)
	}
	if qi, err := a.QueueInfo(ctx, "p"); err != nil || qi.Paused || !qi.PausedUntil.IsZero() {
		t.Fatalf("after the pause: %+v, %v", qi, err)
	}
	// A timed pause, then Pause: indefinite.
	if err := a.PauseFor(ctx, "p", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := b.Pause(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // past the timed pause's end
	if qi, err := a.QueueInfo(ctx, "p"); err != nil || !qi.Paused || !qi.PausedUntil.IsZero() {
		t.Fatalf("Pause after PauseFor: %+v, %v; want paused indefinitely", qi, err)
	}
	if err := a.PauseFor(ctx, "p", 0); err == nil {
		t.Fatal("PauseFor(0) was accepted")
	}
}
