package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestAttemptsAndRunningTask(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	long := strings.Repeat("long ", 100)
	var mu sync.Mutex
	tries := map[string]int{}
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := tide.NewServer(e.b, tide.Config{
		Queues: map[string]int{"q": 1}, ShutdownTimeout: time.Second, Logger: quietLogger(),
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 10 * time.Millisecond },
	})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if task.Type() == "slow" {
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
		mu.Lock()
		tries[task.Type()]++
		n := tries[task.Type()]
		mu.Unlock()
		switch n {
		case 1:
			return errors.New(long)
		case 2:
			return errors.New("second: boom\x1b[2J\nsecond line")
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	// Two failed attempts and one that succeeded, kept as completed.
	e.enqueue("flaky", "{}", tide.Queue("q"), tide.TaskID("f"), tide.Retention(time.Hour))
	var ti *tide.TaskInfo
	testwait.For(t, 15*time.Second, "the flaky task to complete", func() bool {
		var err error
		ti, err = e.in.GetTaskInfo(ctx, "q", "f")
		return err == nil && ti.State == tide.StateCompleted
	})
	if len(ti.Attempts) != 3 || ti.Attempts[0].Server == "" {
		t.Fatalf("attempts: %+v", ti.Attempts)
	}
	server := ti.Attempts[0].Server
	r := e.tide("tasks", "show", "q", "f")
	r.want(t, exitOK, "Attempts (3, oldest first; the latest 10 are kept):", "STARTED", "TOOK", "SERVER", "OUTCOME", "ERROR",
		server, "retry", "done", `second: boom\x1b[2J …`)
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("tasks show prints %s raw:\n%q", c, r.stdout)
	}
	// An attempt's error is bounded (the last error is shown whole).
	if strings.Contains(r.stdout, strings.Repeat("long ", 25)) || !strings.Contains(r.stdout, "long long") {
		t.Errorf("the long error of an attempt is not cut:\n%s", r.stdout)
	}
	r = e.tide("tasks", "show", "q", "f", "--json")
	var tj taskJSON
	if err := json.Unmarshal([]byte(r.stdout), &tj); err != nil || len(tj.Attempts) != 3 {
		t.Fatalf("show --json: %v\n%s", err, r.stdout)
	}
	if a := tj.Attempts; a[0].Error != long || a[0].Outcome != "retry" || a[0].Server != server ||
		a[0].Started == nil || a[0].Ended == nil || a[1].Error != "second: boom\x1b[2J\nsecond line" || a[2].Outcome != "done" || a[2].Error != "" {
		t.Errorf("show --json attempts: %+v", tj.Attempts)
	}
	r = e.tide("tasks", "ls", "q", "--state", "completed", "--json")
	var ts []taskJSON
	if err := json.Unmarshal([]byte(r.stdout), &ts); err != nil || len(ts) != 1 || len(ts[0].Attempts) != 3 {
		t.Errorf("ls --json: %v\n%s", err, r.stdout)
	}

	// A running task: when it started, on which server, when its lease
	// expires, instead of when it was due.
	e.enqueue("slow", "{}", tide.Queue("q"), tide.TaskID("s"))
	<-started
	defer close(release)
	testwait.For(t, 15*time.Second, "a heartbeat with the running task", func() bool {
		ts, err := e.in.ListTasks(ctx, "q", tide.StateActive, 1, 10)
		return err == nil && len(ts) == 1 && !ts[0].StartedAt.IsZero()
	})
	r = e.tide("tasks", "show", "q", "s")
	r.want(t, exitOK, "State:            active", "Started at:", " ago)", "Running for:", "Server:           "+server, "Lease expires:", "Attempts:         - (none recorded")
	if strings.Contains(r.stdout, "Next process at") {
		t.Errorf("a running task shows when it was due:\n%s", r.stdout)
	}
	r = e.tide("tasks", "show", "q", "s", "--json")
	tj = taskJSON{}
	if err := json.Unmarshal([]byte(r.stdout), &tj); err != nil || tj.StartedAt == nil || tj.Server != server || tj.LeaseExpiresAt == nil ||
		!tj.LeaseExpiresAt.After(*tj.StartedAt) {
		t.Errorf("show --json of a running task: %v\n%s", err, r.stdout)
	}
	r = e.tide("tasks", "ls", "q", "--state", "active")
	r.want(t, exitOK, "STARTED", "SERVER", "LEASE EXPIRES", server, " ago", "in ")
	if strings.Contains(r.stdout, "DUE") {
		t.Errorf("ls --state active:\n%s", r.stdout)
	}
	r = e.tide("tasks", "ls", "q", "--state", "active", "--json")
	ts = nil
	if err := json.Unmarshal([]byte(r.stdout), &ts); err != nil || len(ts) != 1 || ts[0].Server != server || ts[0].StartedAt == nil || ts[0].LeaseExpiresAt == nil {
		t.Errorf("ls --state active --json: %v\n%s", err, r.stdout)
	}
}

func TestTasksSearch(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	for i := range 30 {
		typ := "email:send"
		if i%3 == 0 {
			typ = "order:cancel"
		}
		e.enqueue(typ, fmt.Sprintf(`{"customer":%d}`, i), tide.Queue("s"), tide.TaskID(fmt.Sprintf("t-%02d", i)), tide.ProcessIn(time.Hour))
	}
	ids := func(r result) []string {
		t.Helper()
		var ts []taskJSON
		if err := json.Unmarshal([]byte(r.stdout), &ts); err != nil {
			t.Fatalf("%v\n%s", err, r.stdout)
		}
		out := []string{}
		for _, x := range ts {
			out = append(out, x.ID)
		}
		return out
	}
	if got := ids(e.tide("tasks", "ls", "s", "--state", "scheduled", "--type", "order", "--json")); len(got) != 10 || got[0] != "t-00" || got[1] != "t-03" {
		t.Errorf("--type: %q", got)
	}
	if got := ids(e.tide("tasks", "ls", "s", "--state", "scheduled", "--id", "t-1", "--type", "email", "--json")); strings.Join(got, ",") != "t-10,t-11,t-13,t-14,t-16,t-17,t-19" {
		t.Errorf("--id --type: %q", got)
	}
	if got := ids(e.tide("tasks", "ls", "s", "--state", "scheduled", "--payload", `"customer":25}`, "--json")); strings.Join(got, ",") != "t-25" {
		t.Errorf("--payload: %q", got)
	}
	// Pages count matching tasks, and the next page keeps the filters.
	r := e.tide("tasks", "ls", "s", "--state", "scheduled", "--type", "order:cancel", "--size", "4")
	r.want(t, exitOK, "t-00", "t-09", "Next: tide tasks ls s --state scheduled --type order:cancel --page 2 --size 4")
	if strings.Contains(r.stdout, "t-12") {
		t.Errorf("page 1 holds t-12:\n%s", r.stdout)
	}
	if got := ids(e.tide("tasks", "ls", "s", "--state", "scheduled", "--type", "order:cancel", "--size", "4", "--page", "3", "--json")); strings.Join(got, ",") != "t-24,t-27" {
		t.Errorf("page 3: %q", got)
	}
	r = e.tide("tasks", "ls", "s", "--state", "scheduled", "--type", "order:cancel", "--size", "5", "--page", "2")
	if r.code != exitOK || strings.Contains(r.stdout, "Next:") || !strings.Contains(r.stdout, "t-27") {
		t.Errorf("the last full page offers a next page:\n%s", r.stdout)
	}
	e.tide("tasks", "ls", "s", "--state", "scheduled", "--type", "nope", "--payload", "it's").want(t, exitOK,
		`No scheduled tasks matching --type nope --payload 'it'\''s' in queue s.`)

	// --error, on archived tasks.
	for _, id := range []string{"t-01", "t-02"} {
		if err := e.in.ArchiveTask(ctx, "s", id); err != nil {
			t.Fatal(err)
		}
	}
	e.tide("tasks", "ls", "s", "--state", "archived", "--error", "nothing like it").want(t, exitOK, "No archived tasks matching --error 'nothing like it' in queue s.")

	// Encrypted payloads are searched decrypted: the wrapper filters after
	// reading, so a call returns fewer tasks than asked and the command
	// reads on.
	key, keys := testKey(1, 1)
	c := e.sealedClient(key)
	for i := range 40 {
		if _, err := c.Enqueue(ctx, tide.NewTask("x", fmt.Appendf(nil, `{"n":%d}`, i)), tide.Queue("enc"), tide.TaskID(fmt.Sprintf("e-%02d", i)), tide.ProcessIn(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	e.vars["TIDE_ENCRYPTION_KEYS"] = keys
	if got := ids(e.tide("tasks", "ls", "enc", "--state", "scheduled", "--payload", "3", "--size", "3", "--json")); strings.Join(got, ",") != "e-03,e-13,e-23" {
		t.Errorf("--payload on encrypted tasks, page 1: %q", got)
	}
	if got := ids(e.tide("tasks", "ls", "enc", "--state", "scheduled", "--payload", "3", "--size", "3", "--page", "2", "--json")); strings.Join(got, ",") != "e-30,e-31,e-32" {
		t.Errorf("--payload on encrypted tasks, page 2: %q", got)
	}
}

// tasks show prints a running task's group and progress (the note escaped
// for the terminal), and --json carries them.
func TestTasksShowProgress(t *testing.T) {
	e := setup(t)
	reported := make(chan struct{}, 1)
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"q": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		if err := tide.ReportProgress(ctx, 40, "resized 4 of 10\x1b[2J"); err != nil {
			return err
		}
		reported <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	e.enqueue("resize", "{}", tide.Queue("q"), tide.TaskID("p{acme}"), tide.Group("acme"))
	select {
	case <-reported:
	case <-time.After(20 * time.Second):
		t.Fatal("the task did not report progress")
	}
	r := e.tide("tasks", "show", "q", "p{acme}")
	r.want(t, exitOK, "Group:", "acme", "Progress:", `40%  resized 4 of 10\x1b[2J  (reported`)
	if c := rawControls(r.stdout); c != "" {
		t.Fatalf("raw control characters in the output: %q", c)
	}
	r = e.tide("tasks", "show", "q", "p{acme}", "--json")
	r.want(t, exitOK, `"group": "acme"`, `"percent": 40`, `"note": "resized 4 of 10\u001b[2J"`)
}

// A grouped task with the ID its caller chose (no group tag) is shown,
// archived, run, listed and deleted by that ID, one at a time and in bulk.
func TestGroupedTaskFreeIDActions(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.enqueue("order:cancel", "{}", tide.Queue("shops"), tide.Group("shop-7"), tide.TaskID("order-cancel:42"), tide.ProcessIn(time.Hour))
	e.enqueue("order:cancel", "{}", tide.Queue("shops"), tide.Group("shop-8"), tide.TaskID("order-cancel:43"), tide.ProcessIn(time.Hour))
	e.tide("tasks", "show", "shops", "order-cancel:42").want(t, exitOK, "order-cancel:42", "shop-7")
	e.tide("tasks", "archive", "shops", "order-cancel:42").want(t, exitOK, "Task order-cancel:42 in queue shops archived.")
	e.tide("tasks", "ls", "shops", "--state", "archived").want(t, exitOK, "order-cancel:42")
	e.tide("tasks", "run", "shops", "order-cancel:42").want(t, exitOK, "Task order-cancel:42 in queue shops made pending.")
	if ti, err := e.in.GetTaskInfo(ctx, "shops", "order-cancel:42"); err != nil || ti.State != tide.StatePending || ti.Group != "shop-7" {
		t.Fatalf("after run: %+v, %v", ti, err)
	}
	e.tide("tasks", "archive", "shops", "--all", "--state", "scheduled").want(t, exitOK, "Archived 1 task (scheduled) in queue shops.")
	e.tide("tasks", "delete", "shops", "order-cancel:42").want(t, exitOK, "Task order-cancel:42 in queue shops deleted.")
	e.tide("tasks", "delete", "shops", "--all", "--state", "archived").want(t, exitOK, "Deleted 1 task (archived) in queue shops.")
	for _, id := range []string{"order-cancel:42", "order-cancel:43"} {
		if _, err := e.in.GetTaskInfo(ctx, "shops", id); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("%s after delete: %v", id, err)
		}
	}
}

// tasks show prints what a parked durable handler waits for and its steps,
// and --json carries them; run makes it go on.
func TestTasksShowDurable(t *testing.T) {
	e := setup(t)
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"q": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if task.Type() == "boom" {
			return errors.New("boom")
		}
		if _, err := tide.Step(ctx, "reserve", func(context.Context) (int, error) { return 3, nil }); err != nil {
			return err
		}
		_, err := tide.WaitSignal[int](ctx, "paid", time.Hour)
		return err
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	e.enqueue("order:flow", "{}", tide.Queue("q"), tide.TaskID("o1"))
	e.enqueue("boom", "{}", tide.Queue("q"), tide.TaskID("r1"))
	deadline := time.Now().Add(20 * time.Second)
	for {
		ti, err := e.in.GetTaskInfo(context.Background(), "q", "o1")
		r, err2 := e.in.GetTaskInfo(context.Background(), "q", "r1")
		if err == nil && ti.State == tide.StateWaiting && err2 == nil && r.State == tide.StateRetry {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the task did not park")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.tide("tasks", "show", "q", "o1").want(t, exitOK, "State:", "waiting", "Waiting for:", "signal:paid", "Durable steps:", "reserve", "wait:paid")
	e.tide("tasks", "show", "q", "o1", "--json").want(t, exitOK, `"waiting_for": "signal:paid"`, `"name": "reserve"`)
	// The waiting and the retry tasks lie together; each state lists its
	// own, the waiting ones with what they wait for.
	w := e.tide("tasks", "ls", "q", "--state", "waiting")
	w.want(t, exitOK, "o1", "WAITING FOR", "signal:paid", "UNTIL")
	if strings.Contains(w.stdout, "r1") {
		t.Errorf("--state waiting lists the retry task:\n%s", w.stdout)
	}
	r := e.tide("tasks", "ls", "q", "--state", "retry")
	r.want(t, exitOK, "r1")
	if strings.Contains(r.stdout, "o1") {
		t.Errorf("--state retry lists the waiting task:\n%s", r.stdout)
	}
}
