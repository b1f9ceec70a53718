package chaos

import (
	"testing"

	"github.com/tidequeue/tide"
)

// TestFlowModelBulkAcrossCreation: a bulk action that began just before a
// batch was created works through its queue until a chunk finds nothing,
// so it may archive a member of that batch before the member ever ran,
// and the callback may then start before any later action. The model's
// check must count that action as the member's end (it once reported
// "callback started before member 1 ended" for such a run).
func TestFlowModelBulkAcrossCreation(t *testing.T) {
	lines := []modelLine{
		{seq: 1, text: "O 1 archiveall fm-a - pending"},
		{seq: 2, text: "N batch-0"},
		{seq: 3, text: "R 1 ok 1"},
		{seq: 4, text: "S b1/callback m0.1.1 b1"},
		{seq: 5, text: "E b1/callback m0.1.1 ok"},
		{seq: 6, text: "O 2 archiveall fm-a - retry"},
		{seq: 7, text: "R 2 ok 0"},
	}
	l, err := parseModelLog(lines)
	if err != nil {
		t.Fatal(err)
	}
	member := &mStep{name: "0", queue: "fm-a", id: "b1/0", plan: plan{kind: "ok"}}
	cb := &mStep{name: "callback", queue: "fm-a", id: "b1/callback", after: []string{"0"}, runOnFail: true, plan: plan{kind: "ok"}}
	f := &mFlow{id: "b1", batch: true, steps: []*mStep{member, cb}, byName: map[string]*mStep{"0": member, "callback": cb}, callback: cb, createdSeq: 2}
	si := map[string]tide.StepInfo{
		"0":        {Name: "0", State: tide.StepFailed, Err: "tide: archived by an operator"},
		"callback": {Name: "callback", State: tide.StepSucceeded},
	}
	m := &modelRun{t: t}
	if !m.endedBefore(l, f, member, si, 4, 0) {
		t.Fatal("the archive begun before the batch was created and returned after it does not explain the member's end before its callback started")
	}
	if why := m.explain(l, f, member, si["0"], si); why != "" {
		t.Fatalf("the member's archive is not explained: %s", why)
	}
	// An action that returned before the flow was created reached none
	// of its tasks.
	early := &mFlow{id: "b2", batch: true, steps: []*mStep{member}, createdSeq: 3}
	if l.acted(early, member, 6, "archiveall") {
		t.Fatal("an archive that returned before the flow was created counts as reaching it")
	}
}
