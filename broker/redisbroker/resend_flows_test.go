package redisbroker_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/tidetype"
)

// Every flow call whose reply is lost is sent again by the broker, and the
// second run answers like the first: the flow is created and indexed
// once, an end counts once, a step is made ready once.
func TestResentFlowCallsCountOnce(t *testing.T) {
	t.Parallel()
	f := newFaulty(t)
	ctx := context.Background()
	step := func(name string, after ...string) broker.FlowStep {
		m := &tidetype.TaskInfo{ID: "dia." + name, Queue: "q", Type: "t", State: tidetype.StatePending, NextProcessAt: time.Now(), EnqueuedAt: time.Now()}
		return broker.FlowStep{Name: name, Task: m, After: after}
	}
	fl := &broker.Flow{ID: "dia", Kind: tidetype.KindWorkflow, Digest: "d", Retention: time.Hour, CreatedAt: time.Now(),
		Steps: []broker.FlowStep{step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c")}}
	fl.Steps[0].Dependents = []string{"b", "c"}
	fl.Steps[1].Dependents = []string{"d"}
	fl.Steps[2].Dependents = []string{"d"}
	// Load flow.lua, so that the faults hit runs of it, not NOSCRIPT.
	if _, err := f.b.CancelFlow(ctx, "warm"); err == nil {
		t.Fatal("cancelled a flow that does not exist")
	}
	resend := func(what string, call func()) {
		t.Helper()
		seen := f.proxy.Seen("EVALSHA") + f.proxy.Seen("EVAL")
		f.proxy.DelayReplies(faultproxy.Commands("EVALSHA", "EVAL"), 500*time.Millisecond, 1)
		call()
		if f.proxy.Seen("EVALSHA")+f.proxy.Seen("EVAL") < seen+2 {
			t.Fatalf("%s was not sent again", what)
		}
	}
	names := func(rs []broker.ReadyStep) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name)
		}
		return out
	}
	resend("create", func() {
		ready, err := f.b.CreateFlow(ctx, fl)
		if err != nil || len(ready) != 1 || ready[0].Name != "a" {
			t.Fatalf("CreateFlow: %v %v", names(ready), err)
		}
	})
	if list, total, err := f.b.ListFlows(ctx, tidetype.KindWorkflow, 0, 10); err != nil || total != 1 || len(list) != 1 {
		t.Fatalf("a re-sent creation is not listed: %v %d %v", list, total, err)
	}
	resend("release", func() {
		if c, err := f.b.ReleaseSteps(ctx, "dia", []string{"a"}); err != nil || len(c) != 0 {
			t.Fatalf("ReleaseSteps: %v %v", c, err)
		}
	})
	end := func(s string, want int) {
		t.Helper()
		resend("end of "+s, func() {
			ready, err := f.b.EndStep(ctx, "dia", s, "dia."+s, true, "")
			if err != nil || len(ready) != want {
				t.Fatalf("EndStep(%s): %v %v, want %d ready", s, names(ready), err, want)
			}
			var rel []string
			for _, r := range ready {
				rel = append(rel, r.Name)
			}
			if _, err := f.b.ReleaseSteps(ctx, "dia", rel); err != nil {
				t.Fatal(err)
			}
		})
	}
	end("a", 2)
	end("b", 0)
	end("c", 1)
	end("d", 0)
	info, err := f.b.GetFlow(ctx, "dia", false)
	if err != nil || info.Succeeded != 4 || info.State != tidetype.FlowSucceeded {
		t.Fatalf("after re-sent ends: %+v %v", info, err)
	}
	resend("cancel", func() {
		if running, err := f.b.CancelFlow(ctx, "dia"); err != nil || len(running) != 0 {
			t.Fatalf("CancelFlow of an ended flow: %v %v", running, err)
		}
	})
}
