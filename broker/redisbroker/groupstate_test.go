package redisbroker_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
)

// TestGroupActiveCounts: the group state hash counts, for each group, the
// tasks running (dequeue and settle read and write the counts of a batch
// at once), and holds a count only while the group has tasks running, so
// that it stays a small hash whatever the number of groups.
func TestGroupActiveCounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q, groups, per = "gcounts", 40, 3
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
