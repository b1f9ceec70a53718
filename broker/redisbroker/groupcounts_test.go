package redisbroker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// A partition keeps its groups' running counts only while a group limit is
// set; leasing and settling grouped tasks skips them otherwise. A
// GroupConcurrency set while tasks of a group run counts them at once, a
// limit unset leaves no count behind, and Groups reports the running tasks
// either way.
func TestGroupCountsFollowTheLimits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	c := tide.NewClient(e.b)
	const q = "gcounts"
	set := func(l tidetype.QueueLimits) {
		t.Helper()
		if err := e.b.SetQueueLimits(ctx, q, l); err != nil {
			t.Fatal(err)
		}
	}
	// lease leases up to n tasks, calling until a call leases none (one
	// call serves a group at most twice: once per turn of the rotation).
	lease := func(n int) []*broker.Delivery {
		t.Helper()
		var out []*broker.Delivery
		for len(out) < n {
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
	settle := func(ds []*broker.Delivery) {
		t.Helper()
		ss := make([]broker.Settlement, len(ds))
		for i, d := range ds {
			ss[i] = broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task}
		}
		if errs, err := e.b.Settle(ctx, ss); err != nil {
			t.Fatal(err)
		} else {
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	running := func(want int) {
		t.Helper()
		gs, err := e.b.Groups(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, g := range gs {
			if g.Group == "acme" {
				got = g.Running
			}
		}
		if got != want {
			t.Fatalf("Groups reports %d running in acme (%+v), want %d", got, gs, want)
		}
	}
	counts := func() []string {
		t.Helper()
		st, err := e.rdb.HGetAll(ctx, e.prefix+":{"+q+":0}:gs").Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for f := range st {
			if strings.HasPrefix(f, "a:") {
				out = append(out, f+"="+st[f])
			}
		}
		return out
	}

	// A queue limit without group limits: no counts kept.
	set(tidetype.QueueLimits{Concurrency: 10})
	for range 6 {
		if _, err := c.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue(q), tide.Group("acme")); err != nil {
			t.Fatal(err)
		}
	}
	first := lease(3)
	if len(first) != 3 {
		t.Fatalf("leased %d of 6 tasks of an unlimited group, want 3", len(first))
	}
	if cs := counts(); len(cs) != 0 {
		t.Fatalf("running counts kept without a group limit: %v", cs)
	}
	running(3)

	// GroupConcurrency 2 with 3 running: nothing starts until two settle.
	set(tidetype.QueueLimits{Concurrency: 10, GroupConcurrency: 2})
	if ds := lease(5); len(ds) != 0 {
		t.Fatalf("%d tasks started in a group running 3 under GroupConcurrency 2", len(ds))
	}
	running(3)
	settle(first[:2])
	second := lease(5)
	if len(second) != 1 {
		t.Fatalf("leased %d tasks with 1 of the group's 2 slots free, want 1", len(second))
	}
	running(2)

	// Unset: the rest start, and no count is left behind.
	set(tidetype.QueueLimits{Concurrency: 10})
	if cs := counts(); len(cs) != 0 {
		t.Fatalf("running counts left after the group limit was unset: %v", cs)
	}
	rest := lease(5)
	if len(rest) != 2 {
		t.Fatalf("leased %d of the group's 2 waiting tasks with no group limit, want 2", len(rest))
	}
	running(4)
	settle(append(append(first[2:], second...), rest...))
	running(0)
	if cs := counts(); len(cs) != 0 {
		t.Fatalf("running counts left after every task settled: %v", cs)
	}
}
