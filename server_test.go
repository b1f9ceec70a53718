package tide_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
)

func TestServerProcessesTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()

	type seen struct {
		id, queue, typ, payload string
		retry, max              int
		header                  string
	}
	got := make(chan seen, 10)
	mux := tide.NewServeMux()
	mux.HandleFunc("email:send", func(ctx context.Context, task *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		q, _ := tide.GetQueueName(ctx)
		r, _ := tide.GetRetryCount(ctx)
		m, _ := tide.GetMaxRetry(ctx)
		got <- seen{id, q, task.Type(), string(task.Payload()), r, m, task.Headers()["trace"]}
		return nil
	})
	e.server(tide.Config{Queues: map[string]int{"mail": 1}}, mux)

	task := tide.NewTask("email:send", []byte(`{"to":"a@b"}`), tide.MaxRetry(7))
	task.Headers()["trace"] = "abc"
	info, err := e.c.Enqueue(ctx, task, tide.Queue("mail"))
	if err != nil {
		t.Fatal(err)
	}
	if info.State != tide.StatePending || info.Queue != "mail" || info.MaxRetry != 7 || info.ID == "" {
		t.Fatalf("TaskInfo = %+v", info)
	}
	select {
	case s := <-got:
		want := seen{info.ID, "mail", "email:send", `{"to":"a@b"}`, 0, 7, "abc"}
		if s != want {
			t.Fatalf("handler saw %+v, want %+v", s, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("task not processed")
	}
	e.waitGone("mail", info.ID)
}

func TestDelayedTaskRunsAtDueTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	started := make(chan time.Time, 1)
	e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		started <- time.Now()
		return nil
	}))
	// Let the server settle into its idle wait first.
	time.Sleep(50 * time.Millisecond)
	due := time.Now().Add(300 * time.Millisecond)
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("t", nil), tide.ProcessAt(due))
	if err != nil {
		t.Fatal(err)
	}
	if info.State != tide.StateScheduled {
		t.Fatalf("state = %v, want scheduled", info.State)
	}
	select {
	case at := <-started:
		// Never early: the due time is kept in ms, so allow the truncation.
		if at.Before(due.Truncate(time.Millisecond)) {
			t.Fatalf("started %v before its due time", due.Sub(at))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("scheduled task never ran")
	}
}

func TestRetryThenSucceed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int32
	var errsSeen atomic.Int32
	e.server(tide.Config{
		RetryDelayFunc: tide.RetrySchedule(10 * time.Millisecond),
		ErrorHandler:   func(context.Context, *tide.Task, error) { errsSeen.Add(1) },
	}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		if calls.Add(1) < 3 {
			n, _ := tide.GetRetryCount(ctx)
			return fmt.Errorf("attempt %d failed", n)
		}
		return nil
	}))
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("flaky", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	done := e.waitState("default", info.ID, tide.StateCompleted)
	if done.Retried != 2 || calls.Load() != 3 || errsSeen.Load() != 2 {
		t.Fatalf("retried=%d calls=%d errors=%d, want 2, 3, 2", done.Retried, calls.Load(), errsSeen.Load())
	}
	if done.LastErr != "attempt 1 failed" || done.LastFailedAt.IsZero() || done.CompletedAt.IsZero() {
		t.Fatalf("completed info = %+v", done)
	}
}

func TestArchive(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server(tide.Config{RetryDelayFunc: tide.RetrySchedule(time.Millisecond)},
		tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
			if task.Type() == "poison" {
				return fmt.Errorf("bad payload: %w", tide.SkipRetry)
			}
			return errors.New("always fails")
		}))
	ctx := context.Background()
	poison, err := e.c.Enqueue(ctx, tide.NewTask("poison", nil))
	if err != nil {
		t.Fatal(err)
	}
	failing, err := e.c.Enqueue(ctx, tide.NewTask("failing", nil), tide.MaxRetry(2))
	if err != nil {
		t.Fatal(err)
	}
	p := e.waitState("default", poison.ID, tide.StateArchived)
	if p.Retried != 0 || !strings.Contains(p.LastErr, "bad payload") {
		t.Fatalf("poison: %+v", p)
	}
	f := e.waitState("default", failing.ID, tide.StateArchived)
	if f.Retried != 2 || f.LastErr != "always fails" {
		t.Fatalf("failing: retried=%d err=%q", f.Retried, f.LastErr)
	}
}

func TestHandlerPanicIsRecovered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int32
	e.server(tide.Config{RetryDelayFunc: tide.RetrySchedule(time.Millisecond)},
		tide.HandlerFunc(func(context.Context, *tide.Task) error {
			if calls.Add(1) == 1 {
				var m map[string]int
				//lint:ignore SA5000 the handler panics on purpose
				m["boom"] = 1 // nil map write
			}
			return nil
		}))
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("p", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	done := e.waitState("default", info.ID, tide.StateCompleted)
	if done.Retried != 1 {
		t.Fatalf("retried = %d, want 1", done.Retried)
	}
	for _, want := range []string{"tide: handler panic", "assignment to entry in nil map", "server_test.go"} {
		if !strings.Contains(done.LastErr, want) {
			t.Errorf("LastErr lacks %q:\n%s", want, done.LastErr)
		}
	}
}

func TestUnknownTypeIsRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	mux := tide.NewServeMux()
	mux.HandleFunc("known", func(context.Context, *tide.Task) error { return nil })
	e.server(tide.Config{}, mux)
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("unknown", nil))
	if err != nil {
		t.Fatal(err)
	}
	r := e.waitState("default", info.ID, tide.StateRetry)
	if !strings.Contains(r.LastErr, "no handler") || r.Retried != 1 {
		t.Fatalf("retry info: %+v", r)
	}
}

func TestTimeoutAndDeadlineBecomeContextDeadline(t *testing.T) {
	t.Parallel()
	e := setup(t)
	type obs struct {
		left time.Duration
		err  error
	}
	got := make(chan obs, 2)
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		dl, ok := ctx.Deadline()
		if !ok {
			got <- obs{err: errors.New("no deadline")}
			return nil
		}
		<-ctx.Done()
		got <- obs{left: time.Until(dl), err: ctx.Err()}
		return ctx.Err()
	}))
	ctx := context.Background()
	if _, err := e.c.Enqueue(ctx, tide.NewTask("slow", nil), tide.Timeout(100*time.Millisecond), tide.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("slow", nil), tide.Deadline(time.Now().Add(150*time.Millisecond)), tide.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case o := <-got:
			if !errors.Is(o.err, context.DeadlineExceeded) {
				t.Fatalf("handler ctx err = %v, want deadline exceeded", o.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("handler never observed its deadline")
		}
	}
}

func TestShutdownRequeuesWithoutUsingARetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	started := make(chan struct{})
	s := tide.NewServer(e.broker(), tide.Config{ShutdownTimeout: 100 * time.Millisecond, Logger: testLogger(t)})
	if err := s.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})); err != nil {
		t.Fatal(err)
	}
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("long", nil))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	s.Shutdown()
	ti := e.info("default", info.ID)
	if ti.State != tide.StatePending || ti.Retried != 0 {
		t.Fatalf("after shutdown: state=%v retried=%d, want pending, 0", ti.State, ti.Retried)
	}
	if err := s.Start(tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil })); !errors.Is(err, tide.ErrServerClosed) {
		t.Fatalf("Start after Shutdown = %v, want ErrServerClosed", err)
	}
	// Another server picks it up.
	done := make(chan struct{})
	e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error { close(done); return nil }))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("requeued task not processed")
	}
}

func TestShutdownWaitsForInFlightTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	started := make(chan struct{})
	var finished atomic.Bool
	s := tide.NewServer(e.broker(), tide.Config{ShutdownTimeout: 10 * time.Second, Logger: testLogger(t)})
	if err := s.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		close(started)
		time.Sleep(200 * time.Millisecond)
		finished.Store(true)
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("short", nil))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	s.Shutdown()
	if !finished.Load() {
		t.Fatal("Shutdown returned before the in-flight task finished")
	}
	if _, err := tide.NewInspector(e.b).GetTaskInfo(context.Background(), "default", info.ID); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Fatalf("task after graceful shutdown: %v, want it done and deleted", err)
	}
}

func TestWriteResultAndRetention(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		return tide.WriteResult(ctx, []byte("42"))
	}))
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("calc", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	done := e.waitState("default", info.ID, tide.StateCompleted)
	if string(done.Result) != "42" || done.Retention != time.Hour {
		t.Fatalf("completed: result=%q retention=%v", done.Result, done.Retention)
	}
	if err := tide.WriteResult(context.Background(), nil); err == nil {
		t.Fatal("WriteResult outside a handler succeeded")
	}
}

func TestRetentionExpires(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server(tide.Config{LeaseDuration: time.Second}, tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("x", nil), tide.Retention(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.waitGone("default", info.ID)
}

func TestStrictPriority(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for i := range 20 {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("low", []byte{byte(i)}), tide.Queue("low")); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.Enqueue(ctx, tide.NewTask("high", []byte{byte(i)}), tide.Queue("high")); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var order []string
	done := make(chan struct{})
	e.server(tide.Config{Concurrency: 1, StrictPriority: true, Queues: map[string]int{"high": 5, "low": 1}},
		tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, task.Type())
			if len(order) == 40 {
				close(done)
			}
			return nil
		}))
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("not all tasks processed")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, typ := range order {
		if want := map[bool]string{true: "high", false: "low"}[i < 20]; typ != want {
			t.Fatalf("task %d was %s, want %s; order %v", i, typ, want, order)
		}
	}
}

func TestWeightedPriorityServesBoth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for i := range 200 {
		for _, q := range []string{"heavy", "light"} {
			if _, err := e.c.Enqueue(ctx, tide.NewTask(q, []byte{byte(i)}), tide.Queue(q)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var heavy, light atomic.Int32
	first := make(chan struct{})
	var once sync.Once
	e.server(tide.Config{Concurrency: 1, Queues: map[string]int{"heavy": 9, "light": 1}},
		tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
			if task.Type() == "heavy" {
				heavy.Add(1)
			} else {
				light.Add(1)
			}
			if heavy.Load()+light.Load() == 100 {
				once.Do(func() { close(first) })
			}
			return nil
		}))
	select {
	case <-first:
	case <-time.After(20 * time.Second):
		t.Fatal("tasks not processed")
	}
	// Over the first 100, the heavy queue is tried first ~90% of the time;
	// both must be served, heavy clearly more.
	h, l := heavy.Load(), light.Load()
	if l == 0 || h <= 2*l {
		t.Fatalf("heavy=%d light=%d: want both served, heavy well ahead", h, l)
	}
}

// TestStaleWorkerIsRefused: a worker whose lease expired finishes late; its
// acknowledgement is refused and the newer delivery is not disturbed.
func TestStaleWorkerIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	info, err := e.c.Enqueue(ctx, tide.NewTask("job", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The stale worker: takes the task with a short lease and goes quiet.
	stale := e.broker()
	ds, err := stale.Dequeue(ctx, []string{"default"}, 1, 300*time.Millisecond)
	if err != nil || len(ds) != 1 {
		t.Fatalf("dequeue: %v, %d", err, len(ds))
	}
	// A live server recovers it after the lease and runs it; its handler
	// holds the task until the stale worker has tried to acknowledge.
	running := make(chan struct{})
	release := make(chan struct{})
	e.server(tide.Config{LeaseDuration: time.Second}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		close(running)
		<-release
		return tide.WriteResult(ctx, []byte("fresh"))
	}))
	select {
	case <-running:
	case <-time.After(15 * time.Second):
		t.Fatal("expired task was not recovered and redelivered")
	}
	old := broker.LeaseRef{Queue: "default", ID: info.ID, Token: ds[0].Token}
	errs, err := stale.Settle(ctx, []broker.Settlement{{Lease: old, Kind: broker.SettleDone, Task: ds[0].Task}})
	if err != nil || !errors.Is(errs[0], tide.ErrLeaseLost) {
		t.Fatalf("stale settle: %v %v, want ErrLeaseLost", err, errs)
	}
	if err := stale.SetResult(ctx, old, []byte("stale")); !errors.Is(err, tide.ErrLeaseLost) {
		t.Fatalf("stale SetResult: %v, want ErrLeaseLost", err)
	}
	if st := e.info("default", info.ID); st.State != tide.StateActive || st.Retried != 1 {
		t.Fatalf("newer delivery disturbed: %+v", st)
	}
	close(release)
	done := e.waitState("default", info.ID, tide.StateCompleted)
	if string(done.Result) != "fresh" || !strings.Contains(done.LastErr, "lease expired") {
		t.Fatalf("completed: result=%q lastErr=%q", done.Result, done.LastErr)
	}
}

// TestLeaseKeptAliveForLongTasks: a task running for several lease durations
// is not recovered while its server lives. The lease is long enough that a
// renewal (every third of it) is not late on a starved machine, where a
// lease that really runs out is rightly recovered.
func TestLeaseKeptAliveForLongTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int32
	e.server(tide.Config{LeaseDuration: time.Second}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		calls.Add(1)
		select {
		case <-time.After(4 * time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	info, err := e.c.Enqueue(context.Background(), tide.NewTask("long", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	done := e.waitState("default", info.ID, tide.StateCompleted)
	if done.Retried != 0 || calls.Load() != 1 {
		t.Fatalf("retried=%d calls=%d, want 0 and 1", done.Retried, calls.Load())
	}
}

func TestGarbageRecordIsArchived(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// Plant garbage where task records live, for a header too short and for a
	// valid header with a corrupt body, and push their IDs as pending.
	tkey := e.prefix + ":{default:0}:t"
	plist := e.prefix + ":{default:0}:pending"
	body := append([]byte{1, 1}, make([]byte, 20)...) // version, state, token .. failed-at
	body = append(body, 0, 0, 0, 9, 0, 0)             // body length 9, no unique key
	body = append(body, []byte("\xff\xff\xff\xff\xff\xff\xff\xff\xff")...)
	e.rdb.HSet(ctx, tkey, "junk1", "not a record", "junk2", body)
	e.rdb.LPush(ctx, plist, "junk1", "junk2", "ghost")

	var ran atomic.Int32
	e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error { ran.Add(1); return nil }))
	// The server keeps running: a real task after the garbage is processed.
	info, err := e.c.Enqueue(ctx, tide.NewTask("real", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	e.waitState("default", info.ID, tide.StateCompleted)
	j1 := e.waitState("default", "junk1", tide.StateArchived)
	if !strings.Contains(j1.LastErr, "undecodable") || string(j1.Result) != "not a record" {
		t.Fatalf("junk1: %+v", j1)
	}
	j2 := e.waitState("default", "junk2", tide.StateArchived)
	if !strings.Contains(j2.LastErr, "undecodable") {
		t.Fatalf("junk2: %+v", j2)
	}
	if ran.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1 (garbage must not reach it)", ran.Load())
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil })
	for name, cfg := range map[string]tide.Config{
		"negative concurrency": {Concurrency: -1},
		"bad queue name":       {Queues: map[string]int{"a b": 1}},
		"zero weight":          {Queues: map[string]int{"a": 0}},
		"tiny lease":           {LeaseDuration: time.Millisecond},
		"negative shutdown":    {ShutdownTimeout: -time.Second},
		"short notify secret":  {NotifySecret: "short"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tide.NewServer(e.b, cfg).Start(h)
			if !errors.Is(err, tide.ErrInvalidConfig) {
				t.Fatalf("Start = %v, want ErrInvalidConfig", err)
			}
		})
	}
	t.Run("zero config is valid", func(t *testing.T) {
		s := tide.NewServer(e.broker(), tide.Config{Logger: testLogger(t)})
		if err := s.Start(h); err != nil {
			t.Fatal(err)
		}
		if err := s.Start(h); err == nil {
			t.Fatal("second Start succeeded")
		}
		s.Shutdown()
		s.Shutdown() // idempotent
	})
}
