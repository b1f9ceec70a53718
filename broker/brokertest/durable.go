package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// durableTests cover broker.Durable and SettlePark: records fenced by the
// lease and kept with the task, parking, signals and their race with a
// wait's time-out.
var durableTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker)
}{
	{"DurableStepFenced", testStepFenced},
	{"DurableStepsGoWithTask", testStepsGoWithTask},
	{"DurableParkSleep", testParkSleep},
	{"DurableSignalWakes", testSignalWakes},
	{"DurableSignalFirst", testSignalFirst},
	{"DurableSignalTimeout", testSignalTimeout},
	{"DurableParkedCancel", testParkedCancel},
	{"DurableWaitStoresDeadline", testWaitStoresDeadline},
}

// durableAdminTests need broker.Admin.
var durableAdminTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker, a broker.Admin)
}{
	{"DurableRunParked", testRunParked},
	{"DurableParkFreesGroupSlot", testParkFreesGroupSlot},
	{"DurableListWaiting", testListWaiting},
}

// probeDurable skips the test when b has no Durable part.
func probeDurable(t *testing.T, b broker.Broker) {
	t.Helper()
	err := b.Signal(t.Context(), "probe", "none", "x", nil)
	if errors.Is(err, broker.ErrNotSupported) {
		t.Skip("broker has no Durable part")
	}
}

func stepRec(name, data string) broker.StepRecord {
	now := msTrunc(time.Now())
	return broker.StepRecord{Kind: broker.StepResult, Name: name, Started: now, Finished: now, Data: []byte(data)}
}

func saveStep(t *testing.T, b broker.Broker, d *broker.Delivery, r broker.StepRecord) broker.StepRecord {
	t.Helper()
	got, err := b.SaveStep(t.Context(), leaseOf(d), r)
	if err != nil {
		t.Fatalf("SaveStep(%s): %v", r.Name, err)
	}
	return got
}

func loadSteps(t *testing.T, b broker.Broker, d *broker.Delivery) []broker.StepRecord {
	t.Helper()
	rs, err := b.LoadSteps(t.Context(), leaseOf(d))
	if err != nil {
		t.Fatalf("LoadSteps: %v", err)
	}
	return rs
}

func parkOf(d *broker.Delivery, wait string, at time.Time) broker.Settlement {
	s := outcomeOf(d, broker.SettlePark)
	s.WaitFor, s.RetryAt = wait, at
	return s
}

func testStepFenced(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	enqueue(t, b, newMsg("q", "s"))
	d := dequeueOne(t, b, "q", 200*time.Millisecond)
	if rs := loadSteps(t, b, d); len(rs) != 0 {
		t.Fatalf("a new task has records %+v", rs)
	}
	if !d.StepsLoaded || len(d.Steps) != 0 {
		t.Fatalf("a new task's delivery: StepsLoaded %v, Steps %+v; want true and none", d.StepsLoaded, d.Steps)
	}
	first := stepRec("charge", `{"ok":true}`)
	if got := saveStep(t, b, d, first); string(got.Data) != `{"ok":true}` {
		t.Fatalf("SaveStep returned %q", got.Data)
	}
	// Saved again (a re-sent request, or a second fn run): the first stays.
	if got := saveStep(t, b, d, stepRec("charge", `{"ok":false}`)); string(got.Data) != `{"ok":true}` {
		t.Fatalf("second SaveStep of a name returned %q, want the first", got.Data)
	}
	rs := loadSteps(t, b, d)
	if len(rs) != 1 || rs[0].Name != "charge" || rs[0].Kind != broker.StepResult || string(rs[0].Data) != `{"ok":true}` {
		t.Fatalf("LoadSteps = %+v", rs)
	}
	info := get(t, b, "q", "s")
	if len(info.Steps) != 1 || info.Steps[0].Name != "charge" || info.Steps[0].State != tidetype.StepSucceeded {
		t.Fatalf("GetTask Steps = %+v", info.Steps)
	}

	// The lease expires and the task is recovered: the old lease reads and
	// writes nothing.
	awaitRecovered(t, b, "q", 1)
	if _, err := b.SaveStep(t.Context(), leaseOf(d), stepRec("ship", "1")); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("SaveStep with a lost lease: %v, want ErrLeaseLost", err)
	}
	if _, err := b.LoadSteps(t.Context(), leaseOf(d)); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("LoadSteps with a lost lease: %v, want ErrLeaseLost", err)
	}
	if _, _, err := b.ResolveWait(t.Context(), leaseOf(d), "paid", time.Now()); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("ResolveWait with a lost lease: %v, want ErrLeaseLost", err)
	}
	d2 := redeliver(t, b, "q", time.Minute)
	rs = loadSteps(t, b, d2)
	if len(rs) != 1 || rs[0].Name != "charge" {
		t.Fatalf("after recovery LoadSteps = %+v, want the stored step only", rs)
	}
	// The lease brings the records: a replay needs no LoadSteps.
	if !d2.StepsLoaded || len(d2.Steps) != 1 || d2.Steps[0].Name != "charge" || d2.Steps[0].Kind != broker.StepResult ||
		string(d2.Steps[0].Data) != `{"ok":true}` || !d2.Steps[0].Started.Equal(rs[0].Started) {
		t.Fatalf("the redelivery carries StepsLoaded %v, Steps %+v; want the stored step", d2.StepsLoaded, d2.Steps)
	}
}

func testStepsGoWithTask(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	cases := []struct {
		name string
		end  func(t *testing.T, d *broker.Delivery)
	}{
		{"done", func(t *testing.T, d *broker.Delivery) { settleOK(t, b, outcomeOf(d, broker.SettleDone)) }},
		{"deleted", func(t *testing.T, d *broker.Delivery) {
			settleOK(t, b, retryOf(d, time.Now().Add(time.Hour), "x"))
			if err := b.Delete(t.Context(), "q", d.Task.ID); err != nil {
				t.Fatal(err)
			}
		}},
		{"cancelled while parked", func(t *testing.T, d *broker.Delivery) {
			settleOK(t, b, parkOf(d, "sleep:s", time.Now().Add(time.Hour)))
			if err := b.Cancel(t.Context(), "q", d.Task.ID); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		enqueue(t, b, newMsg("q", "g"))
		d := dequeueOne(t, b, "q", time.Minute)
		saveStep(t, b, d, stepRec("a", "1"))
		c.end(t, d)
		if _, err := b.GetTask(t.Context(), "q", "g"); !errors.Is(err, broker.ErrTaskNotFound) {
			t.Fatalf("%s: GetTask: %v, want ErrTaskNotFound", c.name, err)
		}
		// The ID created again starts with no records.
		enqueue(t, b, newMsg("q", "g"))
		d = dequeueOne(t, b, "q", time.Minute)
		if rs := loadSteps(t, b, d); len(rs) != 0 {
			t.Fatalf("%s: the task created again has records %+v", c.name, rs)
		}
		if info := get(t, b, "q", "g"); len(info.Steps) != 0 {
			t.Fatalf("%s: GetTask of the task created again shows steps %+v", c.name, info.Steps)
		}
		settleOK(t, b, outcomeOf(d, broker.SettleDone))
	}
}

func testParkSleep(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	enqueue(t, b, newMsg("q", "p"))
	d := dequeueOne(t, b, "q", time.Minute)
	due := msTrunc(b.Now().Add(300 * time.Millisecond))
	saveStep(t, b, d, broker.StepRecord{Kind: broker.StepSleep, Name: "nap", Started: msTrunc(time.Now()), Finished: due})
	settleOK(t, b, parkOf(d, "sleep:nap", due))
	info := get(t, b, "q", "p")
	switch {
	case info.State != tidetype.StateWaiting:
		t.Fatalf("State = %v, want waiting", info.State)
	case info.WaitingFor != "sleep:nap":
		t.Fatalf("WaitingFor = %q", info.WaitingFor)
	case !sameTime(info.NextProcessAt, due):
		t.Fatalf("NextProcessAt = %v, want %v", info.NextProcessAt, due)
	case info.Retried != 0:
		t.Fatalf("Retried = %d: parking uses no retry", info.Retried)
	case len(info.Steps) != 1 || info.Steps[0].Name != "sleep:nap" || !sameTime(info.Steps[0].FinishedAt, due):
		t.Fatalf("Steps = %+v", info.Steps)
	}
	// Never early: nothing is handed out before it is due.
	var d2 *broker.Delivery
	for d2 == nil && b.Now().Before(due.Add(-50*time.Millisecond)) {
		maintain(t, b, "q")
		if ds := dequeue(t, b, []string{"q"}, 1, time.Minute); len(ds) > 0 {
			if b.Now().Before(due) {
				t.Fatalf("parked task handed out at %v, before it was due at %v", b.Now(), due)
			}
			d2 = ds[0] // a slow machine got past the due time in the loop
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d2 == nil {
		d2 = redeliver(t, b, "q", time.Minute)
	}
	if b.Now().Before(due) {
		t.Fatalf("woken at %v, before %v", b.Now(), due)
	}
	if rs := loadSteps(t, b, d2); len(rs) != 2 {
		t.Fatalf("records after waking: %+v, want the sleep and the park", rs)
	}
	if info := get(t, b, "q", "p"); info.WaitingFor != "" {
		t.Fatalf("an active task shows WaitingFor %q", info.WaitingFor)
	}

	// A park whose time has come is pending again at once.
	settleOK(t, b, parkOf(d2, "sleep:nap", time.Now().Add(-time.Second)))
	if st := get(t, b, "q", "p").State; st != tidetype.StatePending {
		t.Fatalf("parked past its time: %v, want pending", st)
	}
}

func testSignalWakes(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	ctx := t.Context()
	if err := b.Signal(ctx, "q", "nobody", "paid", nil); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("Signal to an unknown task: %v, want ErrTaskNotFound", err)
	}
	enqueue(t, b, newMsg("q", "w"))
	d := dequeueOne(t, b, "q", time.Minute)
	deadline := b.Now().Add(time.Hour)
	saveStep(t, b, d, broker.StepRecord{Kind: broker.StepWait, Name: "paid", Finished: deadline})
	if _, ok, err := b.ResolveWait(ctx, leaseOf(d), "paid", deadline); err != nil || ok {
		t.Fatalf("ResolveWait before any signal: ok %v, err %v", ok, err)
	}
	settleOK(t, b, parkOf(d, "signal:paid", deadline))
	if err := b.Signal(ctx, "q", "w", "other", []byte("x")); err != nil {
		t.Fatalf("Signal of another name: %v", err)
	}
	if st := get(t, b, "q", "w").State; st != tidetype.StateWaiting {
		t.Fatalf("a signal of another name woke the task: %v", st)
	}
	if err := b.Signal(ctx, "q", "w", "paid", []byte(`{"amount":42}`)); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if err := b.Signal(ctx, "q", "w", "paid", []byte(`{"amount":1}`)); !errors.Is(err, broker.ErrSignalSent) {
		t.Fatalf("second Signal of a name: %v, want ErrSignalSent", err)
	}
	// Woken at once, without maintenance.
	d2 := dequeueOne(t, b, "q", time.Minute)
	r, ok, err := b.ResolveWait(ctx, leaseOf(d2), "paid", deadline)
	if err != nil || !ok || r.Kind != broker.StepSignal || string(r.Data) != `{"amount":42}` {
		t.Fatalf("ResolveWait = %+v, %v, %v; want the first signal", r, ok, err)
	}
	info := get(t, b, "q", "w")
	sig := false
	for _, s := range info.Steps {
		if s.Name == "signal:paid" && s.ResultSize >= len(`{"amount":42}`) { // a wrapper may store more
			sig = true
		}
	}
	if !sig {
		t.Fatalf("GetTask Steps = %+v, want signal:paid", info.Steps)
	}
	s := outcomeOf(d2, broker.SettleDone)
	s.Task.Retention = time.Hour
	settleOK(t, b, s)
	if err := b.Signal(ctx, "q", "w", "late", nil); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("Signal to a completed task: %v, want ErrTaskNotFound", err)
	}
}

func testSignalFirst(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	ctx := t.Context()
	enqueue(t, b, newMsg("q", "f"))
	// Sent before the handler reached its wait: kept.
	if err := b.Signal(ctx, "q", "f", "paid", []byte("early")); err != nil {
		t.Fatalf("Signal to a pending task: %v", err)
	}
	d := dequeueOne(t, b, "q", time.Minute)
	// Parking for it finds it there: pending at once.
	settleOK(t, b, parkOf(d, "signal:paid", time.Now().Add(time.Hour)))
	if st := get(t, b, "q", "f").State; st != tidetype.StatePending {
		t.Fatalf("parked for a signal already stored: %v, want pending", st)
	}
	d = dequeueOne(t, b, "q", time.Minute)
	r, ok, err := b.ResolveWait(ctx, leaseOf(d), "paid", time.Now().Add(-time.Hour))
	if err != nil || !ok || string(r.Data) != "early" {
		t.Fatalf("ResolveWait past the deadline with a signal stored = %+v, %v, %v; the signal wins", r, ok, err)
	}
}

func testSignalTimeout(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	ctx := t.Context()
	// The deadline passes, then the signal comes: refused, and the wait
	// times out.
	enqueue(t, b, newMsg("q", "t1"))
	d := dequeueOne(t, b, "q", time.Minute)
	deadline := msTrunc(b.Now().Add(150 * time.Millisecond))
	saveStep(t, b, d, broker.StepRecord{Kind: broker.StepWait, Name: "paid", Finished: deadline})
	settleOK(t, b, parkOf(d, "signal:paid", deadline))
	for b.Now().Before(deadline.Add(100 * time.Millisecond)) { // clocks agree to a few ms
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.Signal(ctx, "q", "t1", "paid", []byte("late")); !errors.Is(err, broker.ErrSignalTimeout) {
		t.Fatalf("Signal after the deadline: %v, want ErrSignalTimeout", err)
	}
	d = redeliver(t, b, "q", time.Minute)
	r, ok, err := b.ResolveWait(ctx, leaseOf(d), "paid", deadline)
	if err != nil || !ok || r.Kind != broker.StepTimedOut {
		t.Fatalf("ResolveWait = %+v, %v, %v; want timed out", r, ok, err)
	}
	settleOK(t, b, outcomeOf(d, broker.SettleDone))

	// The handler decides first (the deadline passed): a later signal is
	// refused too.
	enqueue(t, b, newMsg("q", "t2"))
	d = dequeueOne(t, b, "q", time.Minute)
	r, ok, err = b.ResolveWait(ctx, leaseOf(d), "paid", b.Now().Add(-time.Second))
	if err != nil || !ok || r.Kind != broker.StepTimedOut {
		t.Fatalf("ResolveWait past the deadline = %+v, %v, %v; want timed out", r, ok, err)
	}
	if err := b.Signal(ctx, "q", "t2", "paid", nil); !errors.Is(err, broker.ErrSignalTimeout) {
		t.Fatalf("Signal after the time-out was recorded: %v, want ErrSignalTimeout", err)
	}
	// Asked again, the time-out stands.
	if r, ok, err = b.ResolveWait(ctx, leaseOf(d), "paid", b.Now().Add(time.Hour)); err != nil || !ok || r.Kind != broker.StepTimedOut {
		t.Fatalf("ResolveWait again = %+v, %v, %v; want the recorded time-out", r, ok, err)
	}
}

func testParkedCancel(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	// Cancelled while it runs, then parked: archived as cancelled.
	enqueue(t, b, newMsg("q", "c"))
	d := dequeueOne(t, b, "q", time.Minute)
	if err := b.Cancel(t.Context(), "q", "c"); err != nil {
		t.Fatal(err)
	}
	settleOK(t, b, parkOf(d, "sleep:s", time.Now().Add(time.Hour)))
	if info := get(t, b, "q", "c"); info.State != tidetype.StateArchived {
		t.Fatalf("a cancelled task that parked is %v, want archived", info.State)
	}
	// Signals to it are refused as to a finished task.
	if err := b.Signal(t.Context(), "q", "c", "paid", nil); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("Signal to an archived task: %v", err)
	}
}

func testRunParked(t *testing.T, b broker.Broker, a broker.Admin) {
	probeDurable(t, b)
	enqueue(t, b, newMsg("q", "r"))
	d := dequeueOne(t, b, "q", time.Minute)
	due := b.Now().Add(time.Hour)
	saveStep(t, b, d, broker.StepRecord{Kind: broker.StepSleep, Name: "nap", Finished: due})
	settleOK(t, b, parkOf(d, "sleep:nap", due))
	ts, err := a.ListTasks(t.Context(), "q", tidetype.StateWaiting, 0, 10)
	if err != nil || len(ts) != 1 || ts[0].State != tidetype.StateWaiting {
		t.Fatalf("ListTasks(waiting) = %v, %v", ts, err)
	}
	if err := a.RunTask(t.Context(), "q", "r"); err != nil {
		t.Fatalf("RunTask of a parked task: %v", err)
	}
	d = dequeueOne(t, b, "q", time.Minute)
	r, ok := broker.FindStep(loadSteps(t, b, d), broker.StepSleep, "nap")
	// b.Now() estimates the broker's clock (on a cluster, from another
	// node than the one that set the deadline): a second of slack, far
	// under the hour the sleep had left.
	if !ok || r.Finished.After(b.Now().Add(time.Second)) {
		t.Fatalf("after run-now the sleep's deadline is %v, want now or earlier (the sleep was due at %v)", r.Finished, due)
	}
	settleOK(t, b, parkOf(d, "sleep:nap", due))
	if err := a.ArchiveTask(t.Context(), "q", "r"); err != nil {
		t.Fatalf("ArchiveTask of a parked task: %v", err)
	}
	if st := get(t, b, "q", "r").State; st != tidetype.StateArchived {
		t.Fatalf("archived parked task is %v", st)
	}
}

func testParkFreesGroupSlot(t *testing.T, b broker.Broker, a broker.Admin) {
	probeDurable(t, b)
	if err := a.SetQueueLimits(t.Context(), "q", tidetype.QueueLimits{GroupConcurrency: 1}); err != nil {
		if errors.Is(err, broker.ErrNotSupported) {
			t.Skip("no limits")
		}
		t.Fatal(err)
	}
	m1, m2 := newMsg("q", "a{g}"), newMsg("q", "b{g}")
	m1.Group, m2.Group = "g", "g"
	enqueue(t, b, m1, m2)
	d := dequeueOne(t, b, "q", time.Minute)
	if ds := dequeue(t, b, []string{"q"}, 1, time.Minute); len(ds) != 0 {
		t.Fatalf("a second task of the group started under GroupConcurrency 1")
	}
	settleOK(t, b, parkOf(d, "signal:paid", b.Now().Add(time.Hour)))
	d2 := dequeueOne(t, b, "q", time.Minute)
	if d2.Task.ID == d.Task.ID {
		t.Fatalf("the parked task was handed out again")
	}
	settleOK(t, b, outcomeOf(d2, broker.SettleDone))
	// The signal wakes the parked task into its group's ready tasks.
	if err := b.Signal(t.Context(), "q", d.Task.ID, "paid", nil); err != nil {
		t.Fatal(err)
	}
	if d3 := dequeueOne(t, b, "q", time.Minute); d3.Task.ID != d.Task.ID {
		t.Fatalf("woke %q, want %q", d3.Task.ID, d.Task.ID)
	}
}

// testListWaiting: retry and waiting tasks are listed together, a waiting
// one with what it waits for; a search keeps one state only.
func testListWaiting(t *testing.T, b broker.Broker, a broker.Admin) {
	probeDurable(t, b)
	ctx := t.Context()
	enqueue(t, b, newMsg("q", "w"), newMsg("q", "r"))
	at := msTrunc(b.Now().Add(time.Hour))
	for _, d := range dequeue(t, b, []string{"q"}, 2, time.Minute) {
		if d.Task.ID == "w" {
			settleOK(t, b, parkOf(d, "signal:paid", at))
		} else {
			settleOK(t, b, retryOf(d, at.Add(time.Minute), "boom"))
		}
	}
	for _, st := range []tidetype.TaskState{tidetype.StateRetry, tidetype.StateWaiting} {
		ts, err := a.ListTasks(ctx, "q", st, 0, 10)
		if err != nil || len(ts) != 2 {
			t.Fatalf("ListTasks(%v) = %d tasks, %v; want the retry and the waiting task", st, len(ts), err)
		}
		for _, ti := range ts {
			if ti.ID == "w" && (ti.State != tidetype.StateWaiting || ti.WaitingFor != "signal:paid") {
				t.Fatalf("ListTasks(%v): the parked task is %v waiting for %q", st, ti.State, ti.WaitingFor)
			}
		}
	}
	for st, want := range map[tidetype.TaskState]string{tidetype.StateWaiting: "w", tidetype.StateRetry: "r"} {
		ts, _, err := a.SearchTasks(ctx, "q", st, tidetype.TaskFilter{}, 0, 10)
		if err != nil || len(ts) != 1 || ts[0].ID != want || ts[0].State != st {
			t.Fatalf("SearchTasks(%v) = %+v, %v; want %s alone", st, ts, err, want)
		}
		if st == tidetype.StateWaiting && (ts[0].WaitingFor != "signal:paid" || !sameTime(ts[0].NextProcessAt, at)) {
			t.Fatalf("SearchTasks(waiting): waiting for %q until %v, want signal:paid until %v", ts[0].WaitingFor, ts[0].NextProcessAt, at)
		}
	}
}

// testWaitStoresDeadline: a wait's first ResolveWait stores its deadline
// record and returns it; a later one keeps the first.
func testWaitStoresDeadline(t *testing.T, b broker.Broker) {
	probeDurable(t, b)
	ctx := t.Context()
	enqueue(t, b, newMsg("q", "d"))
	d := dequeueOne(t, b, "q", time.Minute)
	deadline := msTrunc(b.Now().Add(time.Hour))
	r, ok, err := b.ResolveWait(ctx, leaseOf(d), "paid", deadline)
	if err != nil || ok || r.Kind != broker.StepWait || r.Name != "paid" || !sameTime(r.Finished, deadline) {
		t.Fatalf("first ResolveWait = %+v, %v, %v; want the deadline record, the wait going on", r, ok, err)
	}
	r, ok, err = b.ResolveWait(ctx, leaseOf(d), "paid", deadline.Add(time.Hour))
	if err != nil || ok || r.Kind != broker.StepWait || !sameTime(r.Finished, deadline) {
		t.Fatalf("second ResolveWait = %+v, %v, %v; want the first deadline record", r, ok, err)
	}
	rs := loadSteps(t, b, d)
	if len(rs) != 1 || rs[0].Kind != broker.StepWait || !sameTime(rs[0].Finished, deadline) {
		t.Fatalf("records = %+v, want the deadline alone", rs)
	}
}
