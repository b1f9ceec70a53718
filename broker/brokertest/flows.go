package brokertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Workflows and batches (broker.Flows): the protocol of ready steps, their
// release, how an end releases or cancels dependents, cancelling, and that
// every call may run twice.
var flowTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker)
}{
	{"FlowDiamond", testFlowDiamond},
	{"FlowFailure", testFlowFailure},
	{"FlowCreateTwice", testFlowCreateTwice},
	{"FlowCancel", testFlowCancel},
	{"FlowCancelReadySucceeded", testFlowCancelReadySucceeded},
	{"FlowBatch", testFlowBatch},
	{"FlowRetention", testFlowRetention},
	{"FlowRepair", testFlowRepair},
}

// flowOf builds a flow: steps "name" or "name<-dep,dep" ("name<~dep" runs
// on failure), each with a task in queue "flows" whose payload is its name.
func flowOf(id string, kind tidetype.FlowKind, steps ...string) *broker.Flow {
	f := &broker.Flow{ID: id, Kind: kind, Digest: "d1", Retention: time.Hour, CreatedAt: time.Now()}
	index := map[string]int{}
	for _, spec := range steps {
		s := broker.FlowStep{}
		name, deps, rof := spec, "", false
		for i := 0; i < len(spec)-1; i++ {
			if spec[i] == '<' {
				name, deps, rof = spec[:i], spec[i+2:], spec[i+1] == '~'
				break
			}
		}
		s.Name, s.RunOnFailure = name, rof
		if deps != "" {
			s.After = splitComma(deps)
		}
		m := newMsg("flows", id+"."+name)
		m.Payload = []byte(name)
		s.Task = m
		index[name] = len(f.Steps)
		f.Steps = append(f.Steps, s)
	}
	for i, s := range f.Steps {
		for _, a := range s.After {
			j := index[a]
			f.Steps[j].Dependents = append(f.Steps[j].Dependents, f.Steps[i].Name)
		}
	}
	return f
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

func flows(t *testing.T, b broker.Broker) broker.Flows {
	t.Helper()
	_, err := b.GetFlow(t.Context(), "probe", false)
	needs(t, "Flows", err)
	return b
}

// names returns the names of ready steps, sorted, and checks that each
// comes with its task.
func names(t *testing.T, f *broker.Flow, ready []broker.ReadyStep) []string {
	t.Helper()
	var out []string
	for _, r := range ready {
		out = append(out, r.Name)
		var spec *broker.FlowStep
		for i := range f.Steps {
			if f.Steps[i].Name == r.Name {
				spec = &f.Steps[i]
			}
		}
		switch {
		case spec == nil:
			t.Fatalf("ready step %q is not a step", r.Name)
		case r.Task == nil || r.Task.ID != spec.Task.ID || r.Task.Queue != "flows" || string(r.Task.Payload) != r.Name:
			t.Fatalf("ready step %q came with task %+v", r.Name, r.Task)
		}
	}
	slices.Sort(out)
	return out
}

func endStep(t *testing.T, fl broker.Flows, f *broker.Flow, step string, ok bool) []broker.ReadyStep {
	t.Helper()
	ready, err := fl.EndStep(t.Context(), f.ID, step, f.ID+"."+step, ok, "reason of "+step)
	if err != nil {
		t.Fatalf("EndStep(%s): %v", step, err)
	}
	return ready
}

func release(t *testing.T, fl broker.Flows, id string, steps ...string) []string {
	t.Helper()
	c, err := fl.ReleaseSteps(t.Context(), id, steps)
	if err != nil {
		t.Fatalf("ReleaseSteps(%v): %v", steps, err)
	}
	return c
}

func getFlow(t *testing.T, fl broker.Flows, id string, steps bool) *tidetype.WorkflowInfo {
	t.Helper()
	info, err := fl.GetFlow(t.Context(), id, steps)
	if err != nil {
		t.Fatalf("GetFlow(%s): %v", id, err)
	}
	return info
}

func wantNames(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

func testFlowDiamond(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	f := flowOf("dia", tidetype.KindWorkflow, "a", "b<-a", "c<-a", "d<-b,c")
	ready, err := fl.CreateFlow(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	wantNames(t, "ready at creation", names(t, f, ready), "a")
	wantNames(t, "cancelled among released", release(t, fl, "dia", "a"))
	wantNames(t, "ready after a", names(t, f, endStep(t, fl, f, "a", true)), "b", "c")
	// Not released yet: the same end, run again, names them again.
	wantNames(t, "ready after a again", names(t, f, endStep(t, fl, f, "a", true)), "b", "c")
	release(t, fl, "dia", "b", "c")
	wantNames(t, "ready after a, b and c released", names(t, f, endStep(t, fl, f, "a", true)))
	wantNames(t, "ready after b", names(t, f, endStep(t, fl, f, "b", true)))
	wantNames(t, "ready after b again", names(t, f, endStep(t, fl, f, "b", true)))
	wantNames(t, "ready after c", names(t, f, endStep(t, fl, f, "c", true)), "d")
	if info := getFlow(t, fl, "dia", false); info.State != tidetype.FlowRunning || info.Succeeded != 3 || info.Total != 4 || info.Kind != tidetype.KindWorkflow {
		t.Fatalf("flow = %+v", info)
	}
	release(t, fl, "dia", "d")
	endStep(t, fl, f, "d", true)
	info := getFlow(t, fl, "dia", true)
	if info.State != tidetype.FlowSucceeded || info.Succeeded != 4 || info.FinishedAt.IsZero() || len(info.Steps) != 4 {
		t.Fatalf("flow = %+v", info)
	}
	d := info.Steps[3]
	if d.Name != "d" || d.State != tidetype.StepSucceeded || d.TaskID != "dia.d" || d.Queue != "flows" || !slices.Equal(d.After, []string{"b", "c"}) {
		t.Fatalf("step d = %+v", d)
	}
	s, err := fl.GetStep(t.Context(), "dia", "b")
	if err != nil || s.State != tidetype.StepSucceeded || s.TaskID != "dia.b" {
		t.Fatalf("GetStep(b) = %+v, %v", s, err)
	}
	if _, err := fl.GetStep(t.Context(), "dia", "zz"); !errors.Is(err, broker.ErrFlowNotFound) {
		t.Fatalf("GetStep(unknown) = %v", err)
	}
	if _, err := fl.EndStep(t.Context(), "dia", "b", "someone-else", true, ""); !errors.Is(err, broker.ErrFlowNotFound) {
		t.Fatalf("EndStep with another task ID = %v", err)
	}
}

func testFlowFailure(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	// b is cancelled with a, e with b; c runs on failure; f needs c and e
	// and runs on failure too.
	f := flowOf("fail", tidetype.KindWorkflow, "a", "b<-a", "c<~a", "e<-b", "f<~c,e")
	ready, err := fl.CreateFlow(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	wantNames(t, "ready", names(t, f, ready), "a")
	release(t, fl, "fail", "a")
	wantNames(t, "ready after a failed", names(t, f, endStep(t, fl, f, "a", false)), "c")
	release(t, fl, "fail", "c")
	wantNames(t, "ready after c", names(t, f, endStep(t, fl, f, "c", true)), "f")
	release(t, fl, "fail", "f")
	endStep(t, fl, f, "f", true)
	info := getFlow(t, fl, "fail", true)
	states := map[string]tidetype.StepState{}
	for _, s := range info.Steps {
		states[s.Name] = s.State
	}
	want := map[string]tidetype.StepState{"a": tidetype.StepFailed, "b": tidetype.StepCanceled, "c": tidetype.StepSucceeded, "e": tidetype.StepCanceled, "f": tidetype.StepSucceeded}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Fatalf("steps = %v, want %v", states, want)
	}
	if info.State != tidetype.FlowFailed || info.Failed != 1 || info.Canceled != 2 || info.Succeeded != 2 || !slices.Equal(info.FailedIDs, []string{"fail.a"}) {
		t.Fatalf("flow = %+v", info)
	}
	if info.Steps[0].Err != "reason of a" || info.Steps[1].Err == "" {
		t.Fatalf("reasons: a %q, b %q", info.Steps[0].Err, info.Steps[1].Err)
	}
	// A later end of a finished step keeps the first outcome.
	endStep(t, fl, f, "a", true)
	if again := getFlow(t, fl, "fail", false); again.Failed != 1 || again.Succeeded != 2 {
		t.Fatalf("a second end changed the counts: %+v", again)
	}
}

func testFlowCreateTwice(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	f := flowOf("twice", tidetype.KindWorkflow, "a", "b", "c<-a,b")
	ctx := t.Context()
	if _, err := fl.CreateFlow(ctx, f); err != nil {
		t.Fatal(err)
	}
	release(t, fl, "twice", "a")
	ready, err := fl.CreateFlow(ctx, f)
	if err != nil {
		t.Fatalf("the same flow again: %v", err)
	}
	wantNames(t, "ready on the second creation", names(t, f, ready), "b")
	other := flowOf("twice", tidetype.KindWorkflow, "a")
	other.Digest = "d2"
	if _, err := fl.CreateFlow(ctx, other); !errors.Is(err, broker.ErrFlowExists) {
		t.Fatalf("another flow under the ID: %v", err)
	}
	for name, err := range map[string]error{
		"GetFlow": func() error { _, err := fl.GetFlow(ctx, "nope", false); return err }(),
		"GetStep": func() error { _, err := fl.GetStep(ctx, "nope", "a"); return err }(),
		"EndStep": func() error {
			_, err := fl.EndStep(ctx, "nope", "a", "nope.a", true, "")
			return err
		}(),
		"CancelFlow": func() error { _, err := fl.CancelFlow(ctx, "nope"); return err }(),
	} {
		if !errors.Is(err, broker.ErrFlowNotFound) {
			t.Errorf("%s of an unknown flow: %v, want ErrFlowNotFound", name, err)
		}
	}
	if info := getFlow(t, fl, "twice", true); info.Total != 3 || len(info.Steps) != 3 {
		t.Fatalf("flow after the second creation = %+v", info)
	}
}

func testFlowCancel(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	f := flowOf("cx", tidetype.KindWorkflow, "a", "b", "c<-a", "d<-b")
	ctx := t.Context()
	if _, err := fl.CreateFlow(ctx, f); err != nil {
		t.Fatal(err)
	}
	release(t, fl, "cx", "a", "b")
	wantNames(t, "ready after b", names(t, f, endStep(t, fl, f, "b", true)), "d")
	// d is ready and not released when the flow is cancelled: its task
	// may have been stored by a release that never confirmed.
	live := func(what string, want ...string) {
		t.Helper()
		running, err := fl.CancelFlow(ctx, "cx")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range running {
			got = append(got, s.Name)
			if s.Queue != "flows" || s.TaskID != "cx."+s.Name {
				t.Fatalf("%s: CancelFlow returned %+v", what, s)
			}
		}
		wantNames(t, what, got, want...)
	}
	live("CancelFlow", "a", "d")
	// A second call (a lost reply, a caller that retries) answers the same.
	live("CancelFlow again", "a", "d")
	wantNames(t, "cancelled among released", release(t, fl, "cx", "d"), "d")
	wantNames(t, "ready after a ended", names(t, f, endStep(t, fl, f, "a", false)))
	live("CancelFlow after a ended", "d")
	wantNames(t, "ready after d's task ended", names(t, f, endStep(t, fl, f, "d", false)))
	info := getFlow(t, fl, "cx", false)
	if info.State != tidetype.FlowCanceled || info.Canceled != 3 || info.Succeeded != 1 || info.FinishedAt.IsZero() {
		t.Fatalf("flow = %+v", info)
	}
	live("cancelling a flow whose tasks all ended")
}

// testFlowCancelReadySucceeded: a step ready and not released when its
// flow is cancelled (its release stored the task, then its ReleaseSteps
// was lost or its releaser died) whose task succeeded before the cancel
// reached it keeps that outcome, as an enqueued step does: a workflow's
// step and a batch's callback alike. One whose task failed stays
// cancelled.
func testFlowCancelReadySucceeded(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	ctx := t.Context()
	f := flowOf("crs", tidetype.KindWorkflow, "a", "b<-a", "c<-a", "d<-b")
	if _, err := fl.CreateFlow(ctx, f); err != nil {
		t.Fatal(err)
	}
	release(t, fl, "crs", "a")
	wantNames(t, "ready after a", names(t, f, endStep(t, fl, f, "a", true)), "b", "c")
	running, err := fl.CancelFlow(ctx, "crs")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range running {
		got = append(got, s.Name)
	}
	wantNames(t, "CancelFlow", got, "b", "c")
	for range 2 { // a second end (a follow-up run again) changes nothing
		wantNames(t, "ready after b's task succeeded", names(t, f, endStep(t, fl, f, "b", true)))
		wantNames(t, "ready after c's task failed", names(t, f, endStep(t, fl, f, "c", false)))
	}
	info := getFlow(t, fl, "crs", true)
	states := map[string]tidetype.StepState{}
	for _, s := range info.Steps {
		states[s.Name] = s.State
	}
	if states["b"] != tidetype.StepSucceeded || states["c"] != tidetype.StepCanceled || states["d"] != tidetype.StepCanceled {
		t.Fatalf("steps after their tasks ended: %v; want b succeeded (its task did), c and d cancelled", states)
	}
	if info.State != tidetype.FlowCanceled || info.Succeeded != 2 || info.Canceled != 2 || info.Failed != 0 || info.FinishedAt.IsZero() {
		t.Fatalf("flow = %+v; want cancelled, 2 succeeded, 2 cancelled, finished", info)
	}
	if running, err := fl.CancelFlow(ctx, "crs"); err != nil || len(running) != 0 {
		t.Fatalf("CancelFlow once every task ended: %v, %v", running, err)
	}

	bf := flowOf("crsb", tidetype.KindBatch, "0", "1", "callback<~0,1")
	bf.Callback = "callback"
	if _, err := fl.CreateFlow(ctx, bf); err != nil {
		t.Fatal(err)
	}
	release(t, fl, "crsb", "0", "1")
	endStep(t, fl, bf, "0", true)
	wantNames(t, "ready after the last member", names(t, bf, endStep(t, fl, bf, "1", false)), "callback")
	if _, err := fl.CancelFlow(ctx, "crsb"); err != nil {
		t.Fatal(err)
	}
	endStep(t, fl, bf, "callback", true)
	binfo := getFlow(t, fl, "crsb", true)
	for _, s := range binfo.Steps {
		if s.Name == "callback" && s.State != tidetype.StepSucceeded {
			t.Fatalf("batch callback whose task succeeded: %s %q, want succeeded", s.State, s.Err)
		}
	}
	if binfo.Succeeded != 1 || binfo.Failed != 1 || binfo.Canceled != 0 {
		t.Fatalf("batch = %+v; want its members' counts untouched by the callback", binfo)
	}
}

func testFlowBatch(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	const n = 1200 // several creation chunks
	specs := make([]string, n+1)
	members := make([]string, n)
	for i := range n {
		specs[i] = fmt.Sprint(i)
		members[i] = specs[i]
	}
	specs[n] = "callback<~" + joinComma(members)
	f := flowOf("batch", tidetype.KindBatch, specs...)
	f.Callback = "callback"
	ready, err := fl.CreateFlow(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ready) != n {
		t.Fatalf("%d ready at creation, want %d", len(ready), n)
	}
	release(t, fl, "batch", members...)
	callbacks := 0
	for i := range n {
		ok := i%100 != 7
		reps := 1 + i%2 // every other end twice, but the last member's once
		if i == n-1 {
			reps = 1
		}
		for range reps {
			for _, r := range endStep(t, fl, f, members[i], ok) {
				if r.Name != "callback" || r.Task == nil || r.Task.ID != "batch.callback" {
					t.Fatalf("ready after member %d: %+v", i, r)
				}
				if i != n-1 {
					t.Fatalf("callback ready after member %d of %d", i, n)
				}
				callbacks++
			}
		}
	}
	if callbacks != 1 { // the last member ended once
		t.Fatalf("callback named %d times, want once", callbacks)
	}
	release(t, fl, "batch", "callback")
	info := getFlow(t, fl, "batch", false)
	if info.Kind != tidetype.KindBatch || info.State != tidetype.FlowRunning || info.Succeeded != n-12 || info.Failed != 12 || len(info.FailedIDs) != 12 || info.FailedIDs[0] != "batch.7" || info.Callback != "batch.callback" {
		t.Fatalf("batch before its callback ended = %+v", info)
	}
	endStep(t, fl, f, "callback", true)
	info = getFlow(t, fl, "batch", false)
	if info.State != tidetype.FlowFailed || info.Succeeded != n-12 || info.FinishedAt.IsZero() {
		t.Fatalf("batch after its callback = %+v (the callback is not counted; a member failed)", info)
	}
	list, total, err := fl.ListFlows(t.Context(), tidetype.KindBatch, 0, 10)
	if err != nil || total != 1 || len(list) != 1 || list[0].ID != "batch" {
		t.Fatalf("ListFlows(batch) = %v, %d, %v", list, total, err)
	}
	if list, total, err := fl.ListFlows(t.Context(), tidetype.KindWorkflow, 0, 10); err != nil || total != 0 || len(list) != 0 {
		t.Fatalf("ListFlows(workflow) = %v, %d, %v", list, total, err)
	}
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

func testFlowRetention(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	f := flowOf("short", tidetype.KindWorkflow, "a")
	f.Retention = 200 * time.Millisecond
	if _, err := fl.CreateFlow(t.Context(), f); err != nil {
		t.Fatal(err)
	}
	release(t, fl, "short", "a")
	endStep(t, fl, f, "a", true)
	eventually(t, waitLong, "the ended flow to be forgotten after its retention", func() bool {
		_, err := fl.GetFlow(context.Background(), "short", false)
		return errors.Is(err, broker.ErrFlowNotFound)
	})
	if list, total, err := fl.ListFlows(t.Context(), tidetype.KindWorkflow, 0, 10); err != nil || len(list) != 0 || total != 0 {
		t.Fatalf("ListFlows after the flow expired: %v, %d, %v", list, total, err)
	}
}

// testFlowRepair: a created flow is on RepairFlows' list until ConfirmFlow;
// ReadySteps gives its unreleased ready steps with their tasks, the same
// that CreateFlow returned, for a repair to release them.
func testFlowRepair(t *testing.T, b broker.Broker) {
	fl := flows(t, b)
	ctx := t.Context()
	f := flowOf("rp", tidetype.KindWorkflow, "a", "b", "c<-a")
	if _, err := fl.CreateFlow(ctx, f); err != nil {
		t.Fatal(err)
	}
	listed := func() bool {
		t.Helper()
		ids, err := fl.RepairFlows(ctx, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(ids, "rp")
	}
	if !listed() {
		t.Fatal("a flow not confirmed is not on RepairFlows' list")
	}
	if ids, err := fl.RepairFlows(ctx, time.Hour, 100); err != nil || slices.Contains(ids, "rp") {
		t.Fatalf("RepairFlows of flows begun an hour ago: %v, %v", ids, err)
	}
	ready, err := fl.ReadySteps(ctx, "rp")
	if err != nil {
		t.Fatal(err)
	}
	wantNames(t, "ready", names(t, f, ready), "a", "b")
	for _, r := range ready {
		if r.Task == nil || r.Task.ID != "rp."+r.Name || string(r.Task.Payload) != r.Name {
			t.Fatalf("ready step %s with task %+v", r.Name, r.Task)
		}
	}
	release(t, fl, "rp", "a")
	ready, err = fl.ReadySteps(ctx, "rp")
	if err != nil {
		t.Fatal(err)
	}
	wantNames(t, "ready after a's release", names(t, f, ready), "b")
	if err := fl.ConfirmFlow(ctx, "rp"); err != nil {
		t.Fatal(err)
	}
	if listed() {
		t.Fatal("a confirmed flow is still on RepairFlows' list")
	}
	if _, err := fl.ReadySteps(ctx, "none"); !errors.Is(err, broker.ErrFlowNotFound) {
		t.Fatalf("ReadySteps of no flow: %v, want ErrFlowNotFound", err)
	}
}
