package brokertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
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
}

func testAdminStatsAndListing(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	var msgs []*broker.Message
	for i := range 9 {
		msgs = append(msgs, newMsg("alpha", fmt.Sprintf("p%d", i)))
	}
	for i := range 4 {
		m := newMsg("alpha", fmt.Sprintf("s%d", i))
		m.State, m.ProcessAt = broker.StateScheduled, time.Now().Add(time.Duration(i+1)*time.Hour)
		msgs = append(msgs, m)
	}
	msgs = append(msgs, newMsg("beta", "b0"))
	enqueue(t, b, msgs...)
	dequeueOne(t, b, "beta", time.Minute)

	qs, err := a.Queues(ctx)
	if err != nil || !contains(qs, "alpha") || !contains(qs, "beta") {
		t.Fatalf("Queues = %v, %v", qs, err)
	}
	st, err := a.QueueStats(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if st.Sizes[broker.StatePending] != 9 || st.Sizes[broker.StateScheduled] != 4 || st.Sizes[broker.StateActive] != 0 || st.OldestPending.IsZero() {
		t.Fatalf("alpha stats = %+v", st)
	}
	if st, _ := a.QueueStats(ctx, "beta"); st.Sizes[broker.StateActive] != 1 {
		t.Fatalf("beta stats = %+v", st)
	}
	seen := map[string]bool{}
	for off := 0; ; off += 2 {
		page, err := a.ListTasks(ctx, "alpha", broker.StatePending, off, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			if seen[m.ID] || m.State != broker.StatePending || m.Type != taskType {
				t.Fatalf("page at %d: %+v (seen %v)", off, m, seen[m.ID])
			}
			seen[m.ID] = true
		}
	}
	if len(seen) != 9 {
		t.Fatalf("listed %d pending tasks, want 9", len(seen))
	}
	sched, err := a.ListTasks(ctx, "alpha", broker.StateScheduled, 0, 10)
	if err != nil || len(sched) != 4 {
		t.Fatalf("scheduled listing: %d, %v", len(sched), err)
	}
	if b.Partitions("alpha") == 1 {
		for i := 1; i < len(sched); i++ {
			if sched[i].ProcessAt.Before(sched[i-1].ProcessAt) {
				t.Fatalf("scheduled tasks not in due order: %v then %v", sched[i-1].ProcessAt, sched[i].ProcessAt)
			}
		}
	}
	if _, err := a.ListTasks(ctx, "alpha", broker.StatePending, 0, 0); err == nil {
		t.Fatal("limit 0 accepted")
	}
}

func testAdminRunArchive(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	s := newMsg("q", "sched")
	s.State, s.ProcessAt = broker.StateScheduled, time.Now().Add(time.Hour)
	enqueue(t, b, s, newMsg("q", "pend"))
	if err := a.RunTask(ctx, "q", "sched"); err != nil {
		t.Fatal(err)
	}
	if m := get(t, b, "q", "sched"); m.State != broker.StatePending {
		t.Fatalf("after RunTask: %s", m.State)
	}
	if err := a.ArchiveTask(ctx, "q", "pend"); err != nil {
		t.Fatal(err)
	}
	if m := get(t, b, "q", "pend"); m.State != broker.StateArchived {
		t.Fatalf("after ArchiveTask: %s", m.State)
	}
	if err := a.ArchiveTask(ctx, "q", "pend"); err == nil {
		t.Fatal("archiving an archived task succeeded")
	}
	if err := a.RunTask(ctx, "q", "pend"); err != nil {
		t.Fatalf("running an archived task: %v", err)
	}
	if err := a.RunTask(ctx, "q", "missing"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("RunTask(missing) = %v", err)
	}
	d := dequeueOne(t, b, "q", time.Minute)
	if err := a.ArchiveTask(ctx, "q", d.Message.ID); err == nil {
		t.Fatal("archiving an active task succeeded")
	}
}

func testAdminBulk(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	var msgs []*broker.Message
	for i := range 30 {
		m := newMsg("q", fmt.Sprintf("t%d", i))
		m.State, m.ProcessAt = broker.StateScheduled, time.Now().Add(time.Hour)
		msgs = append(msgs, m)
	}
	enqueue(t, b, msgs...)
	drain := func(step func(context.Context, string, broker.State, int) (int, error), st broker.State) int {
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
	if n := drain(a.RunTasks, broker.StateScheduled); n != 30 {
		t.Fatalf("RunTasks moved %d, want 30", n)
	}
	if n := drain(a.ArchiveTasks, broker.StatePending); n != 30 {
		t.Fatalf("ArchiveTasks moved %d, want 30", n)
	}
	if n := drain(a.DeleteTasks, broker.StateArchived); n != 30 {
		t.Fatalf("DeleteTasks removed %d, want 30", n)
	}
	st, err := a.QueueStats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	for s, n := range st.Sizes {
		if n != 0 {
			t.Fatalf("%d tasks left in %s", n, s)
		}
	}
	if _, err := a.DeleteTasks(ctx, "q", broker.StateActive, 10); err == nil {
		t.Fatal("bulk delete of active tasks accepted")
	}
}

func testAdminCounters(t *testing.T, b broker.Broker, a broker.Admin) {
	ctx := context.Background()
	enqueue(t, b, newMsg("q", "ok"), newMsg("q", "bad"))
	for range 2 {
		d := dequeueOne(t, b, "q", time.Minute)
		o := outcomeOf(d, broker.OutcomeDone)
		if d.Message.ID == "bad" {
			o = retryOf(d, time.Now().Add(time.Hour), "boom")
		}
		settleOK(t, b, o)
	}
	st, err := a.QueueStats(ctx, "q")
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
	if err := a.CancelProcessing(ctx, "q", "job"); err == nil {
		t.Fatal("cancelling a pending task succeeded")
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

func testAdminRegistry(t *testing.T, _ broker.Broker, a broker.Admin) {
	ctx := context.Background()
	info := broker.ServerInfo{ID: "srv-1", Host: "h", PID: 7, Concurrency: 3, Queues: map[string]int{"q": 1},
		Active: []broker.ActiveTask{{Queue: "q", ID: "x", Type: "t"}}}
	if err := a.RegisterServer(ctx, info, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.RegisterServer(ctx, broker.ServerInfo{ID: "srv-short"}, 50*time.Millisecond); err != nil {
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
	if err := a.UnregisterServer(ctx, "srv-1"); err != nil {
		t.Fatal(err)
	}
	if ss, _ := a.Servers(ctx); len(ss) != 0 {
		t.Fatalf("servers after unregister = %+v", ss)
	}
	es := []broker.SchedulerEntry{{SchedulerID: "s1", ID: "e1", Spec: "@every 1m", Type: "t", Queue: "q"}}
	if err := a.RegisterSchedulerEntries(ctx, "s1", es, time.Minute); err != nil {
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
