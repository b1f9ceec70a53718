package redisbroker_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// TestGroupActiveCounts: under a group limit the group state hash counts,
// for each group, the tasks running (dequeue and settle read and write the
// counts of a batch at once), and holds a count only while the group has
// tasks running, so that it stays a small hash whatever the number of
// groups. (Without a group limit no count is kept: TestGroupCountsUnlimited.)
func TestGroupActiveCounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, groups, per = "gcounts", 40, 3
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{GroupConcurrency: 100}); err != nil {
		t.Fatal(err)
	}
	for g := range groups {
		for i := range per {
			mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, fmt.Sprintf("t%d", i), fmt.Sprintf("g%02d", g)))
		}
	}
	const out = int64(1) << 40 // groups.lua's g_out mark
	check := func(when string, running map[string]int) {
		t.Helper()
		state, err := e.rdb.HGetAll(ctx, e.prefix+":{"+q+":0}:gs").Result()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for f, v := range state {
			g, ok := strings.CutPrefix(f, "a:")
			if !ok {
				continue
			}
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: field %s = %q", when, f, v)
			}
			if x%out == 0 {
				t.Fatalf("%s: field %s = %d: a group without running tasks keeps a count", when, f, x)
			}
			got[g] = int(x % out)
		}
		for g, n := range running {
			if got[g] != n {
				t.Fatalf("%s: group %s counts %d running, want %d (counts %v)", when, g, got[g], n, got)
			}
		}
		for g, n := range got {
			if running[g] == 0 {
				t.Fatalf("%s: group %s counts %d running, want none", when, g, n)
			}
		}
	}
	running := map[string]int{}
	var held []*broker.Delivery
	for round := 0; ; round++ {
		ds, err := e.b.Dequeue(ctx, []string{q}, 7, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			running[d.Task.Group]++
		}
		held = append(held, ds...)
		check(fmt.Sprintf("round %d, after a Dequeue of %d", round, len(ds)), running)
		// Settle the older half (a batch across several groups), keep the rest running.
		n := (len(held) + 1) / 2
		if len(ds) == 0 {
			n = len(held)
		}
		ss := make([]broker.Settlement, n)
		for i, d := range held[:n] {
			ss[i] = broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task, At: time.Now()}
			running[d.Task.Group]--
			if running[d.Task.Group] == 0 {
				delete(running, d.Task.Group)
			}
		}
		errs, err := e.b.Settle(ctx, ss)
		if err != nil {
			t.Fatal(err)
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("settle %s: %v", ss[i].Lease.ID, err)
			}
		}
		held = held[n:]
		check(fmt.Sprintf("round %d, after settling %d", round, n), running)
		if len(ds) == 0 && len(held) == 0 {
			break
		}
	}
}

// groupCounts returns the running counts (a:<group> fields, modulo the
// g_out mark) of partition 0 of queue q.
func groupCounts(t *testing.T, e env, q string) map[string]int64 {
	t.Helper()
	state, err := e.rdb.HGetAll(context.Background(), e.prefix+":{"+q+":0}:gs").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for f, v := range state {
		if g, ok := strings.CutPrefix(f, "a:"); ok {
			x, _ := strconv.ParseInt(v, 10, 64)
			out[g] = x % (1 << 40)
		}
	}
	return out
}

// TestGroupCountsUnlimited: without a group limit no running counts are
// kept; a GroupConcurrency set while grouped tasks run holds at once (the
// counts are rebuilt from the running tasks), and unsetting it drops the
// counts and lets the group that waited at its limit run again at once.
func TestGroupCountsUnlimited(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "gcountsfree"
	for i := range 8 {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, fmt.Sprintf("t%d", i), "g"))
	}
	dequeue := func(n int) []*broker.Delivery {
		t.Helper()
		var out []*broker.Delivery
		for len(out) < n { // a call serves a group at most twice
			ds, err := e.b.Dequeue(ctx, []string{q}, n-len(out), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 0 {
				break
			}
			out = append(out, ds...)
		}
		return out
	}
	settle := func(ds ...*broker.Delivery) {
		t.Helper()
		for _, d := range ds {
			errs, err := e.b.Settle(ctx, []broker.Settlement{{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task, At: time.Now()}})
			if err != nil || errs[0] != nil {
				t.Fatalf("settle %s: %v %v", d.Task.ID, err, errs)
			}
		}
	}
	inG := dequeue(3)
	if len(inG) != 3 {
		t.Fatalf("%d tasks started, want 3", len(inG))
	}
	if c := groupCounts(t, e, q); len(c) != 0 {
		t.Fatalf("counts %v kept without a group limit", c)
	}
	// Three of g run; a limit of 2 set now holds g until two have ended.
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{GroupConcurrency: 2}); err != nil {
		t.Fatal(err)
	}
	if c := groupCounts(t, e, q); c["g"] != 3 || len(c) != 1 {
		t.Fatalf("counts %v after the limit was set, want g: 3", c)
	}
	if ds := dequeue(5); len(ds) != 0 {
		t.Fatalf("%d tasks of g started with 3 running under GroupConcurrency 2", len(ds))
	}
	settle(inG[0])
	if ds := dequeue(5); len(ds) != 0 {
		t.Fatalf("%d tasks of g started with 2 running under GroupConcurrency 2", len(ds))
	}
	settle(inG[1])
	ds := dequeue(5)
	if len(ds) != 1 {
		t.Fatalf("%d tasks of g started with 1 running under GroupConcurrency 2, want 1", len(ds))
	}
	// g is at its limit (2 running) and out of the rotation: unsetting the
	// limit drops the counts and lets it run its other tasks at once.
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{}); err != nil {
		t.Fatal(err)
	}
	if c := groupCounts(t, e, q); len(c) != 0 {
		t.Fatalf("counts %v kept after the group limit was unset", c)
	}
	rest := dequeue(10)
	if len(rest) != 4 {
		t.Fatalf("%d tasks started after the limit was unset, want the 4 left", len(rest))
	}
	settle(append(append(rest, ds...), inG[2])...)
	if c := groupCounts(t, e, q); len(c) != 0 {
		t.Fatalf("counts %v left after every task ended", c)
	}
	// Set again with nothing running: no count, and the limit holds.
	for i := range 3 {
		mustEnqueue(t, e.b, broker.EnqueueOptions{}, groupMsg(q, fmt.Sprintf("v%d", i), "g"))
	}
	if err := e.b.SetQueueLimits(ctx, q, tidetype.QueueLimits{GroupConcurrency: 1}); err != nil {
		t.Fatal(err)
	}
	if ds := dequeue(3); len(ds) != 1 {
		t.Fatalf("%d tasks of g started under GroupConcurrency 1, want 1", len(ds))
	}
}

// TestGroupedLeaseCommands: a Settle that frees slots of a full partition
// while groups wait in the rotation wakes the servers once and reads no
// clock (it needs one only to look for held groups whose time has come,
// when the rotation is empty); the tasks still waiting then start.
func TestGroupedLeaseCommands(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t) // own server: the command counts are ours alone
	rdb := redistest.Client(t, srv.Addr)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	const q, groups, limit = "gcmds", 30, 20
	if err := b.SetQueueLimits(ctx, q, tidetype.QueueLimits{Concurrency: limit}); err != nil {
		t.Fatal(err)
	}
	for g := range groups {
		mustEnqueue(t, b, broker.EnqueueOptions{}, groupMsg(q, "t", fmt.Sprintf("g%02d", g)))
	}
	calls := func() map[string]int {
		t.Helper()
		out := map[string]int{}
		for _, line := range strings.Split(rdb.Info(ctx, "commandstats").Val(), "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") {
				continue
			}
			n, err := strconv.Atoi(strings.TrimPrefix(strings.Split(rest, ",")[0], "calls="))
			if err != nil {
				t.Fatalf("commandstats line %q: %v", line, err)
			}
			out[strings.TrimPrefix(name, "cmdstat_")] = n
		}
		return out
	}
	// Each group has one task; the partition fills up to its limit.
	var held []*broker.Delivery
	for len(held) < limit {
		ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			t.Fatalf("Dequeue leased nothing with %d of %d slots in use and %d groups waiting", len(held), limit, groups-len(held))
		}
		held = append(held, ds...)
	}
	if len(held) != limit {
		t.Fatalf("leased %d tasks under Concurrency %d", len(held), limit)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ss := make([]broker.Settlement, 5)
	for i, d := range held[:5] {
		ss[i] = broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task, At: time.Now()}
	}
	errs, err := b.Settle(ctx, ss)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("settle %s: %v", ss[i].Lease.ID, err)
		}
	}
	c := calls()
	if c["publish"] != 1 {
		t.Errorf("a Settle freeing slots of a full partition with groups waiting published %d wake-ups, want 1", c["publish"])
	}
	if c["time"] != 0 {
		t.Errorf("a Settle of done tasks with groups waiting in the rotation read the clock %d times, want 0", c["time"])
	}
	// The rest start, in the order the groups joined the rotation.
	ds, err := b.Dequeue(ctx, []string{q}, 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 5 {
		t.Fatalf("after 5 slots freed, Dequeue leased %d tasks, want 5", len(ds))
	}
	seen := map[string]bool{}
	for _, d := range append(held, ds...) {
		if seen[d.Task.Group] {
			t.Fatalf("group %s started twice", d.Task.Group)
		}
		seen[d.Task.Group] = true
	}
	for g := range limit + 5 {
		if name := fmt.Sprintf("g%02d", g); !seen[name] {
			t.Errorf("group %s did not start though it joined the rotation among the first %d", name, limit+5)
		}
	}
}
